"""The online path on the real store (SPEC §5): a turn is written, read back, recalled within its
scope only, consolidated by the next nightly run; malformed operations are rejected by name and
no secret is stored; every 10th turn naps; recall's spreading activation, reranker cap and log."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from deep_sleep.core.scope import Scope
from deep_sleep.online.turn import (
    MAX_LABEL_CHARS,
    MAX_OP_BYTES,
    MAX_TEXT_CHARS,
    feedback,
    is_credential_key,
    nap_snapshot,
    quick_nap,
    recall,
    record_turn,
)
from deep_sleep.run.stages import consolidate_scope
from tests.storeutil import edge, insert, node, scalar

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


def _rows(store, sql: str, *params) -> list[tuple]:
    with store.pg() as con:
        return con.execute(sql, params).fetchall()


def _sibling(scope: Scope, id: str) -> Scope:
    return Scope.from_path([*scope.levels[:-1], (scope.levels[-1][0], id)])


# ---------------------------------------------------------------------------------------------
# capability is not occurrence: one turn, end to end


def test_a_turn_is_stored_recalled_in_its_scope_only_and_consolidated_by_the_next_nightly(store, scope, runs_dir):
    receipt = record_turn(
        store, scope,
        [
            {"op": "upsert_node", "label": "project: billing migration", "importance": 6,
             "properties": {"owner": "Ada", "api_key": "sk-live-e2e-1234"}},
            {"op": "create_event", "content": "Ada asked to move billing to the new cluster."},
        ],
        now=NOW, session_id="s-1", thinking=["the billing migration needs a rollback plan"],
    )
    assert receipt.turn == 1 and not receipt.rejected
    assert [x.op for x in receipt.landed] == ["upsert_node", "create_event", "thinking"]
    assert receipt.redacted == ("ops[0].properties.api_key",)
    node_id = receipt.ids("upsert_node")[0]

    # read back from the store
    path, layer, label, props, importance, access_count, has_vec = _rows(
        store, "SELECT scope_path, layer, label, properties, importance, access_count, embedding IS NOT NULL"
               " FROM memory_nodes WHERE id = %s", node_id)[0]
    assert (path, layer, label, importance, access_count, has_vec) == (scope.path, "semantic", "project: billing migration", 6.0, 1, True)
    assert props == {"owner": "Ada", "api_key": "[REDACTED]"}
    events = _rows(store, "SELECT content, session_id, metadata->>'kind', embedding IS NOT NULL FROM episodic_events"
                          " WHERE scope_path = %s ORDER BY metadata->>'kind' NULLS FIRST", scope.path)
    assert events[0] == ("Ada asked to move billing to the new cluster.", "s-1", None, True)
    assert events[1][1:] == ("s-1", "turn_summary", True) and events[1][0].startswith("turn 1: 1 node(s) written (project: billing migration)")
    assert scalar(store, "SELECT metadata FROM episodic_events WHERE id = %s", receipt.summary_event_id) == {
        "kind": "turn_summary", "turn": 1, "landed": {"create_event": 1, "thinking": 1, "upsert_node": 1}, "rejected": {}}
    thought = _rows(store, "SELECT layer, properties->'ttl_hours' FROM memory_nodes WHERE id = %s", receipt.ids("thinking")[0])
    assert thought == [("working", 24)]
    assert sorted(_rows(store, "SELECT node_id::text, kind FROM memory_access_log WHERE scope_path = %s", scope.path)) == sorted(
        [(node_id, "write"), (receipt.ids("thinking")[0], "write")])

    # recall: in the scope and a child scope, never in a sibling, a parent, or a string-prefix path
    hits = recall(store, scope, "billing migration", k=3, now=NOW + timedelta(minutes=1))
    assert hits[0].node_id == node_id and hits[0].scope_path == scope.path
    child = recall(store, scope.child("conversation", "c1"), "billing migration", k=3, now=NOW + timedelta(minutes=2))
    assert node_id in [h.node_id for h in child]
    assert child[[h.node_id for h in child].index(node_id)].features[9] == pytest.approx(1 / 3)  # one level up of three
    outsiders = [
        _sibling(scope, "b2"),                                     # sibling
        _sibling(scope, scope.levels[-1][1][:-1]),                  # org/…/brand/b  (string prefix of brand/b1)
        Scope.from_path(scope.levels[:1]),                         # the parent: rows of a child are not its own
        Scope.root("org", scope.tenant_id[:-1]),                  # org/ac vs org/acme: a string prefix of the path
        Scope.root("org", scope.tenant_id[:-1]).child("brand", "b1"),
    ]
    for other in outsiders:
        assert node_id not in [h.node_id for h in recall(store, other, "billing migration", k=5, now=NOW)], other.display()

    # every hit is logged, with 12 features; reads reach the access log under the node's scope
    logged = _rows(store, "SELECT id::text, node_id::text, cardinality(features), label FROM recall_events WHERE scope_path = %s", scope.path)
    assert sorted(r[0] for r in logged) == sorted(h.recall_id for h in hits)
    assert all(r[2] == 12 and r[3] is None for r in logged)
    assert scalar(store, "SELECT count(*) FROM memory_access_log WHERE node_id = %s AND kind = 'read'", node_id) == 2
    assert feedback(store, hits[0].recall_id, used=True) is True
    assert feedback(store, str(uuid.uuid4()), used=False) is False

    # the next nightly run consolidates what the turn and the recalls left
    as_of = NOW + timedelta(hours=1)
    report = consolidate_scope(store, scope, as_of=as_of, base_dir=runs_dir)
    assert report.status == "applied", report.errors
    assert report.counters["nodes_strengthened"] == 1          # one write + two reads in the window
    assert scalar(store, "SELECT importance FROM memory_nodes WHERE id = %s", node_id) == 6.5
    assert report.counters["recalls_labelled"] == len(hits) - 1  # all but the explicit one
    assert report.counters["reranker_steps"] == 1
    assert report.counters["identity_drifts"] == 5              # the thought moved every trait a step from 0.5
    assert dict(_rows(store, "SELECT key, value FROM soul_profiles WHERE scope_path = %s", scope.path)) == {
        f"trait:{t}": "0.4750" for t in ("caution", "curiosity", "directness", "formality", "warmth")}
    weights, steps = _rows(store, "SELECT weights, steps FROM reranker_models WHERE scope_path = %s", scope.path)[0]
    assert steps == 1 and any(w != 0 for w in weights)
    label, source, trained_at = _rows(store, "SELECT label, label_source, trained_at FROM recall_events WHERE id = %s", hits[0].recall_id)[0]
    assert (label, source, trained_at) == (1.0, "explicit", as_of)
    # the explicit label pulled the model towards "used": its hit now scores above its similarity
    again = recall(store, scope, "billing migration", k=1, now=as_of)
    assert again[0].node_id == node_id and again[0].score > again[0].similarity


def test_feedback_keeps_training_an_existing_model(store, scope, runs_dir):
    receipt = record_turn(store, scope, [{"op": "upsert_node", "label": "topic: garden roses"}], now=NOW, nap=False)
    first = recall(store, scope, "garden roses", k=1, now=NOW)
    feedback(store, first[0].recall_id, used=True)
    consolidate_scope(store, scope, as_of=NOW + timedelta(hours=1), base_dir=runs_dir)
    w1 = scalar(store, "SELECT weights FROM reranker_models WHERE scope_path = %s", scope.path)
    second = recall(store, scope, "garden roses", k=1, now=NOW + timedelta(hours=2))
    feedback(store, second[0].recall_id, used=False)
    report = consolidate_scope(store, scope, as_of=NOW + timedelta(hours=3), base_dir=runs_dir)
    assert report.conflicts == 0 and report.counters["reranker_steps"] == 1
    w2, steps = _rows(store, "SELECT weights, steps FROM reranker_models WHERE scope_path = %s", scope.path)[0]
    assert steps == 2 and w2 != w1
    assert receipt.ids()


# ---------------------------------------------------------------------------------------------
# malformed operations: rejected by name, valid ones land, no secret stored

SECRETS = ("sk-live-AAA111secret", "hunter2-BBB222", "Bearer eyJCCC333.tok", "ghp_DDD444token", "pw-EEE555-nested", "cookie-FFF666")


def _corpus(scope_path_of_invisible: str) -> list[tuple[object, str | None]]:
    """(operation, expected reason fragment — None when it must land)."""
    deep: dict = {}
    cur = deep
    for _ in range(40):
        cur["x"] = {}
        cur = cur["x"]
    return [
        # valid, with credentials to redact
        ({"op": "upsert_node", "label": "user: Ada", "properties": {"api_key": SECRETS[0], "name": "Ada",
          "nested": {"Password": SECRETS[1], "list": [{"authToken": SECRETS[3]}]}}}, None),
        ({"op": "create_event", "content": "Ada logged in", "metadata": {"Authorization": SECRETS[2], "client": {"credentials": {"pw": SECRETS[4]}}}}, None),
        ({"op": "register_skill", "name": "rotate keys", "status": "active", "steps": [{"cmd": "rotate", "cookie": SECRETS[5]}]}, None),
        ({"op": "set_trigger", "condition": "monday", "action": "review", "due_at": "2026-11-23T09:00:00"}, None),
        ({"op": "thinking", "text": "nothing secret here"}, None),
        # wrong types
        ({"op": "upsert_node", "label": 42}, "field 'label' must be a string, got int"),
        ({"op": "upsert_node", "label": "x", "properties": ["a"]}, "field 'properties' must be a JSON object, got list"),
        ({"op": "upsert_node", "label": "x", "importance": "high"}, "field 'importance' must be a number in [1, 10], got str"),
        ({"op": "upsert_node", "label": "x", "importance": True}, "field 'importance' must be a number in [1, 10], got bool"),
        ({"op": "upsert_node", "label": "x", "importance": 0.5}, "it must be within [1, 10]"),
        ({"op": "upsert_node", "label": "x", "importance": float("nan")}, "it must be within [1, 10]"),
        ({"op": "create_event", "content": 7}, "field 'content' must be a string, got int"),
        ({"op": "register_skill", "name": "s", "steps": "do it"}, "field 'steps' must be a list, got str"),
        ({"op": "set_trigger", "condition": "c", "action": "a", "due_at": "next tuesday"}, "not an ISO 8601 timestamp"),
        ({"op": "read_node", "id": "not-a-uuid"}, "not a UUID"),
        ({"op": 5}, "field 'op' must be a string, got int"),
        ("upsert_node", "an operation must be a JSON object, got str"),
        (None, "an operation must be a JSON object, got NoneType"),
        # missing fields
        ({"op": "upsert_node", "properties": {"password": "never-stored-1"}}, "field 'label' is missing"),
        ({"op": "create_event"}, "field 'content' is missing"),
        ({"op": "set_trigger", "condition": "c"}, "field 'action' is missing"),
        ({"op": "register_skill"}, "field 'name' is missing"),
        ({"op": "thinking", "text": "   "}, "field 'text' is blank"),
        ({"label": "x"}, "field 'op' is missing"),
        # unknown op / layer
        ({"op": "delete_everything"}, "unknown op 'delete_everything'"),
        ({"op": "create_event", "content": "c", "layer": "dreams"}, "unknown layer 'dreams'"),
        ({"op": "create_event", "content": "c", "layer": "semantic"}, "layer 'semantic' does not fit create_event"),
        # huge payloads
        ({"op": "upsert_node", "label": "big", "properties": {"blob": "x" * (MAX_OP_BYTES + 1)}}, f"the limit is {MAX_OP_BYTES} bytes"),
        ({"op": "upsert_node", "label": "L" * (MAX_LABEL_CHARS + 1)}, f"the limit is {MAX_LABEL_CHARS}"),
        ({"op": "create_event", "content": "c" * (MAX_TEXT_CHARS + 1)}, f"the limit is {MAX_TEXT_CHARS}"),
        ({"op": "upsert_node", "label": "deep", "properties": deep}, "nested more than 16 levels deep"),
        # control characters, NUL, broken unicode, non-finite numbers, non-JSON values
        ({"op": "upsert_node", "label": "evil\x00label", "properties": {"secret": "never-stored-2"}}, "control character '\\x00' at position 4"),
        ({"op": "upsert_node", "label": "tab\tlabel"}, "control character '\\t'"),
        ({"op": "register_skill", "name": "two\nlines"}, "control character '\\n'"),
        ({"op": "create_event", "content": "nul\x00here"}, "NUL character"),
        ({"op": "upsert_node", "label": "x", "properties": {"s": "\ud800"}}, "lone surrogate"),
        ({"op": "upsert_node", "label": "x", "properties": {"n": float("inf")}}, "numbers must be finite"),
        ({"op": "upsert_node", "label": "x", "properties": {"when": datetime(2026, 1, 1)}}, "a datetime is not a JSON value"),
        # a node the scope cannot see
        ({"op": "read_node", "id": scope_path_of_invisible}, "is not visible from scope"),
    ]


def test_malformed_operations_are_rejected_by_name_and_no_secret_is_stored(store, scope):
    stranger = record_turn(store, _sibling(scope, "other"), [{"op": "upsert_node", "label": "sibling node"}], now=NOW, nap=False)
    corpus = _corpus(stranger.ids()[0])
    ops = [op for op, _ in corpus]
    receipt = record_turn(store, scope, ops, now=NOW, nap=False)

    landed = {x.index: x for x in receipt.landed}
    rejected = {x.index: x for x in receipt.rejected}
    assert set(landed) | set(rejected) == set(range(len(ops))) and not set(landed) & set(rejected)
    for i, (op, reason) in enumerate(corpus):
        if reason is None:
            assert i in landed, (op, rejected.get(i))
        else:
            assert i in rejected, op
            assert reason in rejected[i].reason, (rejected[i].reason, reason)
            assert rejected[i].op == (op.get("op") if isinstance(op, dict) and isinstance(op.get("op"), str) else "?")
    assert set(receipt.redacted) == {
        "ops[0].properties.api_key", "ops[0].properties.nested.Password", "ops[0].properties.nested.list[0].authToken",
        "ops[1].metadata.Authorization", "ops[1].metadata.client.credentials", "ops[2].steps[0].cookie",
    }
    assert receipt.notes and "status 'active' ignored" in receipt.notes[0]
    assert scalar(store, "SELECT status FROM procedural_skills WHERE id = %s", receipt.ids("register_skill")[0]) == "draft"
    assert scalar(store, "SELECT properties FROM memory_nodes WHERE id = %s", receipt.ids("upsert_node")[0]) == {
        "api_key": "[REDACTED]", "name": "Ada", "nested": {"Password": "[REDACTED]", "list": [{"authToken": "[REDACTED]"}]}}

    # a second turn in the same scope: valid ops land beside bad ones, turn counter moves on
    second = record_turn(store, scope, [{"op": "upsert_node", "label": "user: Ada", "properties": {"secret_key": SECRETS[0]}},
                                        {"op": "nope"}, {"op": "register_skill", "name": "Rotate Keys"}], now=NOW, nap=False)
    assert second.turn == 2 and [x.op for x in second.rejected] == ["nope"]
    assert [(x.op, x.action) for x in second.landed] == [("upsert_node", "updated"), ("register_skill", "existing")]
    assert second.ids("register_skill") == receipt.ids("register_skill")

    # grep the whole store: no secret anywhere, in any table
    with store.pg() as con:
        tables = [r[0] for r in con.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")]
        for secret in (*SECRETS, "never-stored-1", "never-stored-2"):
            for table in tables:
                n = con.execute(f'SELECT count(*) FROM "{table}" t WHERE t::text LIKE %s', (f"%{secret}%",)).fetchone()[0]
                assert n == 0, (secret, table)
    assert not any(s in repr(receipt) for s in SECRETS)


def test_credential_keys():
    yes = ["password", "PASSWORD", "db_password", "passwordHash", "secret", "clientSecret", "client_secret", "token",
           "access_token", "refreshToken", "api_key", "apiKey", "API-KEY", "x-api-key", "apikey", "access_key",
           "AWS_SECRET_ACCESS_KEY", "private_key", "privateKey", "Authorization", "credential", "credentials", "auth",
           "session cookie", "Bearer", "connection_string", "dsn", "max_tokens"]
    no = ["author", "authority", "tokenizer", "name", "keyboard", "key", "monkey", "passage", "secretary", "pinned"]
    assert [k for k in yes if not is_credential_key(k)] == []
    assert [k for k in no if is_credential_key(k)] == []


def test_a_call_that_is_not_a_list_of_operations_is_an_error(store, scope):
    with pytest.raises(TypeError, match="ops must be a list"):
        record_turn(store, scope, {"op": "upsert_node", "label": "x"}, nap=False)


# ---------------------------------------------------------------------------------------------
# the quick nap


def test_quick_nap_fires_on_the_10th_turn_and_its_window_starts_at_the_previous_nap(store, scope):
    receipts = []
    for turn in range(1, 21):
        ops = [{"op": "upsert_node", "label": "project: alpha", "properties": {"turn": turn}}]
        if turn in (5, 15):
            ops.append({"op": "upsert_node", "label": "project: beta"})
        if turn == 3:
            ops.append({"op": "upsert_node", "label": "SOUL:name", "properties": {"_last_edited_by": "user_manual_edit", "value": "Nova"}})
        if turn <= 10:
            ops += [{"op": "create_event", "content": f"turn {turn} event {e}"} for e in range(12)]
        receipts.append(record_turn(store, scope, ops, now=NOW + timedelta(minutes=turn)))

    assert [r.turn for r in receipts] == list(range(1, 21))
    assert [r.turn for r in receipts if r.quick_nap is not None] == [10, 20]
    first, second = receipts[9].quick_nap, receipts[19].quick_nap
    assert first.status == "applied" and second.status == "applied", (first.errors, second.errors)
    assert first.phases_run == ["strengthen", "soul_corrections", "episodic_summary"]
    # 10 turns: alpha written 10 times (beta once), one SOUL edit, 120 events + 10 turn summaries > 100
    assert {k: v for k, v in first.counters.items() if v} == {"nodes_strengthened": 1, "soul_updates": 1, "episodes_summarized": 50}
    # turns 11-20: alpha again; beta's second access is alone in this window, its first was counted by nap 1
    assert {k: v for k, v in second.counters.items() if v} == {"nodes_strengthened": 1}

    alpha, beta = receipts[0].ids("upsert_node")[0], receipts[4].ids("upsert_node")[1]
    assert scalar(store, "SELECT importance FROM memory_nodes WHERE id = %s", alpha) == 6.0
    assert scalar(store, "SELECT importance FROM memory_nodes WHERE id = %s", beta) == 5.0
    assert scalar(store, "SELECT value FROM soul_profiles WHERE scope_path = %s AND key = 'name'", scope.path) == "Nova"
    assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE scope_path = %s AND label = 'META:episodic_summary'", scope.path) == 1
    assert scalar(store, "SELECT count(*) FROM episodic_events WHERE scope_path = %s", scope.path) == 130 - 50 + 10
    runs = _rows(store, "SELECT mode, status, as_of, counters->'nodes_strengthened' FROM consolidation_runs WHERE scope_path = %s ORDER BY as_of", scope.path)
    assert runs == [("quick_nap", "applied", NOW + timedelta(minutes=10), 1), ("quick_nap", "applied", NOW + timedelta(minutes=20), 1)]
    assert scalar(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s AND table_name = 'episodic_events'", first.run_id) == 50

    # the targeted snapshot holds only what phases 1, 5, 10 read
    with psycopg.connect(store.dsn) as con:
        from deep_sleep.core.config import ConsolidationConfig

        snap = nap_snapshot(con, scope, NOW + timedelta(minutes=25), ConsolidationConfig())
    assert snap.previous_run_as_of == NOW + timedelta(minutes=20)
    assert snap.table("memory_access_log").height == 0 and snap.table("memory_nodes").height == 0
    assert snap.table("episodic_events").height == 90 and snap.table("soul_profiles").height == 1


@pytest.mark.parametrize("count,threshold,batch,batches", [(130, 100, 50, 1), (99, 100, 50, 1), (400, 100, 50, 3), (151, 100, 25, 4), (260, 10, 50, 9)])
def test_summary_candidates_are_the_ids_phase_10_writes(count, threshold, batch, batches):
    """The targeted extract fetches existing summary nodes by the ids phase 10 would write: the
    same rule as the phase, checked against the phase itself (same-instant events tie on id)."""
    import polars as pl
    from deep_sleep.transforms.episodic_summary import episodic_summary

    from deep_sleep.core.config import EpisodicSummaryConfig
    from deep_sleep.core.snapshot import Snapshot
    from deep_sleep.core.tables import conform
    from deep_sleep.online.turn import summary_candidates

    cfg = EpisodicSummaryConfig(threshold=threshold, batch_size=batch, max_batches=batches)
    ids = sorted(str(uuid.uuid4()) for _ in range(count))
    events = conform("episodic_events", pl.DataFrame({
        "id": ids, "scope_path": "org\x1fa", "tenant_id": "a", "content": "x", "metadata": "{}", "version": 1,
        "created_at": [NOW - timedelta(minutes=i // 3) for i in range(count)],
    })).sort("created_at", "id")
    expected = episodic_summary(Snapshot("org\x1fa", NOW, frames={"episodic_events": events}), cfg, NOW).diff.table("memory_nodes").inserts
    got = summary_candidates("org\x1fa", events.head(threshold + batch * batches), cfg)
    assert got == (expected.get_column("id").to_list() if expected.height else [])


def test_the_nightly_does_not_restrengthen_what_a_nap_counted(store, scope, runs_dir):
    for turn in range(1, 11):
        record_turn(store, scope, [{"op": "upsert_node", "label": "project: alpha"}], now=NOW + timedelta(minutes=turn))
    alpha = scalar(store, "SELECT id::text FROM memory_nodes WHERE scope_path = %s AND label = 'project: alpha'", scope.path)
    assert scalar(store, "SELECT importance FROM memory_nodes WHERE id = %s", alpha) == 5.5
    report = consolidate_scope(store, scope, as_of=NOW + timedelta(hours=1), base_dir=runs_dir)
    assert report.status == "applied"
    assert report.counters["nodes_strengthened"] == 0
    assert scalar(store, "SELECT importance FROM memory_nodes WHERE id = %s", alpha) == 5.5


def test_quick_nap_on_a_connection_and_a_live_write_conflict(store, scope):
    """A nap through a caller's connection; a node changed by a live turn between the nap's
    snapshot and its apply keeps the live value and is counted as a conflict."""
    from deep_sleep.transforms import QUICK_NAP

    from deep_sleep.core.config import ConsolidationConfig
    from deep_sleep.online.turn import _store_of
    from deep_sleep.run.apply import apply_diff
    from deep_sleep.run.plan import plan

    for turn in range(1, 3):
        record_turn(store, scope, [{"op": "upsert_node", "label": "project: gamma"}], now=NOW + timedelta(minutes=turn), nap=False)
    with psycopg.connect(store.dsn) as con:
        config = ConsolidationConfig()
        snap = nap_snapshot(con, scope, NOW + timedelta(minutes=5), config)
        planned = plan(snap, config, NOW + timedelta(minutes=5), phases=QUICK_NAP)
        record_turn(con, scope, [{"op": "upsert_node", "label": "project: gamma", "importance": 9}], now=NOW + timedelta(minutes=4), nap=False)
        result = apply_diff(_store_of(con), planned.diff, planned.report.with_(run_id=str(uuid.uuid4())), mode="quick_nap")
        assert result.conflicts == 1
        assert scalar(store, "SELECT importance FROM memory_nodes WHERE scope_path = %s AND label = 'project: gamma'", scope.path) == 9.0
        report = quick_nap(con, scope, as_of=NOW + timedelta(minutes=6))
    assert report.status == "applied" and report.counters["nodes_strengthened"] == 0  # the window starts at the last nap


def test_an_upsert_of_a_label_several_nodes_share_updates_only_the_first_of_them(store, scope):
    """By importance, then the most recent, then the smallest id; the others are not touched."""
    nodes = [node(scope, "project: shared", NOW - timedelta(days=d), importance=imp) for d, imp in ((1, 3.0), (3, 7.0), (2, 7.0), (2, 7.0))]
    insert(store, "memory_nodes", nodes)
    tied = sorted(n["id"] for n in nodes[2:])
    receipt = record_turn(store, scope, [{"op": "upsert_node", "label": "project: shared", "properties": {"k": 1}}], now=NOW, nap=False)
    assert receipt.landed[0].action == "updated" and receipt.ids() == [tied[0]]
    changed = _rows(store, "SELECT id::text FROM memory_nodes WHERE label = 'project: shared' AND scope_path = %s AND properties ? 'k'", scope.path)
    assert changed == [(tied[0],)]


def test_one_round_trip_transactions_commit_roll_back_and_leave_the_connection_as_it_was(store, scope):
    """record_turn / recall / nap_snapshot send BEGIN and COMMIT themselves in pipeline mode on an
    idle connection: committed for other sessions; an error rolls all of it back; the connection's
    autocommit setting is restored; inside a caller's transaction the work is the caller's to commit."""
    from deep_sleep.online.turn import _pipelined_transaction

    for autocommit in (False, True):
        with psycopg.connect(store.dsn, autocommit=autocommit) as con:
            receipt = record_turn(con, scope, [{"op": "upsert_node", "label": f"project: rt {autocommit}"}], now=NOW, nap=False)
            assert con.autocommit is autocommit
            assert con.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE id = %s", receipt.ids("upsert_node")[0]) == 1
            assert recall(con, scope, f"project rt {autocommit}", k=1)
            assert con.autocommit is autocommit

            label = f"project: rolled back {autocommit}"
            with pytest.raises(psycopg.errors.DivisionByZero):
                with _pipelined_transaction(con):
                    con.execute("INSERT INTO memory_nodes (id, scope_path, tenant_id, layer, label) VALUES (%s, %s, %s, 'semantic', %s)",
                                (str(uuid.uuid4()), scope.path, scope.tenant_id, label))
                    con.execute("SELECT 1 / 0")
            assert con.autocommit is autocommit and con.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            with pytest.raises(RuntimeError):
                with _pipelined_transaction(con):
                    con.execute("INSERT INTO memory_nodes (id, scope_path, tenant_id, layer, label) VALUES (%s, %s, %s, 'semantic', %s)",
                                (str(uuid.uuid4()), scope.path, scope.tenant_id, label))
                    raise RuntimeError("the block failed")
            assert con.autocommit is autocommit and con.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE label = %s", label) == 0
            assert record_turn(con, scope, [{"op": "create_event", "content": "still usable"}], now=NOW, nap=False).landed

    with psycopg.connect(store.dsn) as con:  # inside the caller's transaction: a savepoint, the caller decides
        con.execute("SELECT 1")
        receipt = record_turn(con, scope, [{"op": "upsert_node", "label": "project: callers"}], now=NOW, nap=False)
        assert con.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        con.rollback()
    assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE id = %s", receipt.ids("upsert_node")[0]) == 0


# ---------------------------------------------------------------------------------------------
# recall details


def test_recall_spreads_one_hop_within_visible_paths_and_caps_the_reranker(store, scope):
    hub = record_turn(store, scope, [{"op": "upsert_node", "label": "alpha topic one"}], now=NOW, nap=False).ids()[0]
    near = node(scope, "zzz unrelated words", NOW)                   # no embedding: reachable only by the edge
    sib = _sibling(scope, "b9")
    far = node(sib, "alpha topic one in a sibling", NOW)
    insert(store, "memory_nodes", [near, far])
    insert(store, "memory_edges", [edge(scope, hub, near["id"]), edge(sib, hub, far["id"])])

    hits = recall(store, scope, "alpha topic one", k=3, now=NOW)
    by_id = {h.node_id: h for h in hits}
    assert set(by_id) == {hub, near["id"]}                            # the sibling's node never appears
    hop = by_id[near["id"]]
    assert hop.via == hub and hop.features[5] == 1.0 and hop.similarity == 0.0
    assert hop.features[6] == pytest.approx(0.5 * by_id[hub].similarity)
    assert by_id[hub].features[4] > 0                                 # degree counts the visible edge
    assert all(h.score == pytest.approx(h.similarity if h.via is None else h.features[6]) for h in hits)  # no model: no adjustment

    for weight, bound in ((100.0, 0.25), (-100.0, -0.25)):
        with store.pg() as con:
            con.execute("DELETE FROM reranker_models WHERE scope_path = %s", (scope.path,))
            con.execute("INSERT INTO reranker_models (id, scope_path, tenant_id, weights, bias) VALUES (%s, %s, %s, %s, %s)",
                        (str(uuid.uuid4()), scope.path, scope.tenant_id, [weight] * 12, weight))
            con.commit()
        capped = recall(store, scope, "alpha topic one", k=1, now=NOW)
        assert capped[0].score - capped[0].similarity == pytest.approx(bound)

    n = scalar(store, "SELECT count(*) FROM recall_events WHERE scope_path = %s", scope.path)
    assert n == len(hits) + 2
    assert scalar(store, "SELECT count(*) FROM memory_access_log WHERE node_id = %s AND kind = 'read'", near["id"]) == 1


def test_recall_on_a_tenant_root_sees_that_tenants_legacy_rows(store):
    tid = f"t{uuid.uuid4().hex[:8]}"
    tenant = Scope.root("tenant", tid)
    nid = record_turn(store, tenant, [{"op": "upsert_node", "label": "legacy fact about kiwis"}], now=NOW, nap=False).ids()[0]
    with store.pg() as con:
        con.execute("UPDATE memory_nodes SET scope_path = NULL WHERE id = %s", (nid,))
        con.commit()
    assert nid in [h.node_id for h in recall(store, tenant.child("conversation", "c1"), "kiwis", now=NOW)]
    assert nid not in [h.node_id for h in recall(store, Scope.root("tenant", tid + "x"), "kiwis", now=NOW)]
    assert nid not in [h.node_id for h in recall(store, Scope.root("org", tid), "kiwis", now=NOW)]


def test_recall_rejects_bad_arguments_and_blank_queries(store, scope):
    with pytest.raises(ValueError, match="k must be a positive integer"):
        recall(store, scope, "x", k=0)
    with pytest.raises(TypeError):
        recall(store, scope, None)  # type: ignore[arg-type]
    assert recall(store, scope, "   ") == []


def test_recall_logs_a_query_with_a_lone_surrogate_or_nul_as_well_formed_text(store, scope):
    record_turn(store, scope, [{"op": "upsert_node", "label": "surrogate probe", "properties": {"note": "probe"}}])
    hits = recall(store, scope, "surrogate\ud800 pro\x00be", k=3)
    assert hits and hits[0].label == "surrogate probe"
    logged = scalar(store, "SELECT query FROM recall_events WHERE id = %s", hits[0].recall_id)
    assert logged == "surrogate\ufffd probe"
