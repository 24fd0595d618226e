"""record_turn on the real store (SPEC §5): a turn is written, read back, recalled within its scope
only and consolidated by the next nightly run; an upsert updates one node of its label; a call
that is not a list of operations, or a bad session id, is an error of ours."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from deep_sleep.core.errors import DeepSleepError
from deep_sleep.core.scope import Scope
from deep_sleep.online.errors import OnlineArgumentError
from deep_sleep.online.recall import feedback, recall
from deep_sleep.online.turn import record_turn
from deep_sleep.run.pipeline import consolidate
from deep_sleep.transforms.config import ConsolidationConfig
from tests.online.helpers import NOW, rows, sibling
from tests.storeutil import insert, node, scalar

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
    path, layer, label, props, importance, access_count, has_vec = rows(
        store, "SELECT scope_path, layer, label, properties, importance, access_count, embedding IS NOT NULL"
               " FROM memory_nodes WHERE id = %s", node_id)[0]
    assert (path, layer, label, importance, access_count, has_vec) == (scope.path, "semantic", "project: billing migration", 6.0, 1, True)
    assert props == {"owner": "Ada", "api_key": "[REDACTED]"}
    events = rows(store, "SELECT id::text, content, session_id, metadata->>'kind', embedding_model FROM episodic_events"
                          " WHERE scope_path = %s", scope.path)
    # the turn's own event is its episodic record: no turn-summary event beside it (issue 30)
    assert events == [(receipt.ids("create_event")[0], "Ada asked to move billing to the new cluster.", "s-1", None,
                       "hashing-char3gram-blake2b-256")]
    assert receipt.summary_event_id == receipt.ids("create_event")[0]
    assert scalar(store, "SELECT embedding_model FROM memory_nodes WHERE id = %s", node_id) == "hashing-char3gram-blake2b-256"
    thought = rows(store, "SELECT layer, properties->'ttl_hours' FROM memory_nodes WHERE id = %s", receipt.ids("thinking")[0])
    assert thought == [("working", 24)]
    assert sorted(rows(store, "SELECT node_id::text, kind FROM memory_access_log WHERE scope_path = %s", scope.path)) == sorted(
        [(node_id, "write"), (receipt.ids("thinking")[0], "write")])

    # recall: in the scope and a child scope, never in a sibling, a parent, or a string-prefix path
    hits = recall(store, scope, "billing migration", k=3, now=NOW + timedelta(minutes=1))
    mine = [h for h in hits if h.node_id == node_id]
    assert mine and mine[0].scope_path == scope.path and mine[0].kind == "node"
    child = recall(store, scope.child("conversation", "c1"), "billing migration", k=3, now=NOW + timedelta(minutes=2))
    assert node_id in [h.node_id for h in child]
    assert child[[h.node_id for h in child].index(node_id)].features[9] == pytest.approx(1 / 3)  # one level up of three
    outsiders = [
        sibling(scope, "b2"),                                     # sibling
        sibling(scope, scope.levels[-1][1][:-1]),                  # org/…/brand/b  (string prefix of brand/b1)
        Scope.from_path(scope.levels[:1]),                         # the parent: rows of a child are not its own
        Scope.root("org", scope.tenant_id[:-1]),                  # org/ac vs org/acme: a string prefix of the path
        Scope.root("org", scope.tenant_id[:-1]).child("brand", "b1"),
    ]
    for other in outsiders:
        assert node_id not in [h.node_id for h in recall(store, other, "billing migration", k=5, now=NOW)], other.display()

    # every hit is logged, with 12 features; reads reach the access log under the node's scope
    logged = rows(store, "SELECT id::text, node_id::text, cardinality(features), label FROM recall_events WHERE scope_path = %s", scope.path)
    assert sorted(r[0] for r in logged) == sorted(h.recall_id for h in hits)
    assert all(r[2] == 12 and r[3] is None for r in logged)
    assert scalar(store, "SELECT count(*) FROM memory_access_log WHERE node_id = %s AND kind = 'read'", node_id) == 2
    assert feedback(store, mine[0].recall_id, used=True) is True
    assert feedback(store, str(uuid.uuid4()), used=False) is False

    # the next nightly run consolidates what the turn and the recalls left
    as_of = NOW + timedelta(hours=1)
    # holds off: the nightly's drift of the SOUL traits is what this test reads back (issue 16 holds SOUL changes)
    report = consolidate(store, scope, as_of, ConsolidationConfig(holds={"enabled": False}), runs_dir=runs_dir).report()
    assert report.status == "applied", report.errors
    assert report.counters["nodes_strengthened"] == 1          # one write + two reads in the window
    assert scalar(store, "SELECT importance FROM memory_nodes WHERE id = %s", node_id) == 6.5
    assert report.counters["recalls_labelled"] == len(hits) - 1  # all but the explicit one
    assert report.counters["reranker_steps"] == 1
    assert report.counters["identity_drifts"] == 5              # the thought moved every trait a step from 0.5
    assert dict(rows(store, "SELECT key, value FROM soul_profiles WHERE scope_path = %s", scope.path)) == {
        f"trait:{t}": "0.4750" for t in ("caution", "curiosity", "directness", "formality", "warmth")}
    weights, steps = rows(store, "SELECT weights, steps FROM reranker_models WHERE scope_path = %s", scope.path)[0]
    assert steps == 1 and any(w != 0 for w in weights)
    label, source, trained_at = rows(store, "SELECT label, label_source, trained_at FROM recall_events WHERE id = %s", mine[0].recall_id)[0]
    assert (label, source, trained_at) == (1.0, "explicit", as_of)
    # the explicit label pulled the model towards "used": its hit now scores above its similarity (the
    # base score of vector recall alone)
    vector_only = ConsolidationConfig(recall={"lexical": False, "events": False})
    again = recall(store, scope, "billing migration", k=1, now=as_of, config=vector_only)
    assert again[0].node_id == node_id and again[0].score > again[0].similarity


def test_an_upsert_of_a_label_several_nodes_share_updates_only_the_first_of_them(store, scope):
    """By importance, then the most recent, then the smallest id; the others are not touched."""
    nodes = [node(scope, "project: shared", NOW - timedelta(days=d), importance=imp) for d, imp in ((1, 3.0), (3, 7.0), (2, 7.0), (2, 7.0))]
    insert(store, "memory_nodes", nodes)
    tied = sorted(n["id"] for n in nodes[2:])
    receipt = record_turn(store, scope, [{"op": "upsert_node", "label": "project: shared", "properties": {"k": 1}}], now=NOW, nap=False)
    assert receipt.landed[0].action == "updated" and receipt.ids() == [tied[0]]
    changed = rows(store, "SELECT id::text FROM memory_nodes WHERE label = 'project: shared' AND scope_path = %s AND properties ? 'k'", scope.path)
    assert changed == [(tied[0],)]


def test_a_call_that_is_not_a_list_of_operations_is_an_error(store, scope):
    with pytest.raises(TypeError, match="ops must be a list"):
        record_turn(store, scope, {"op": "upsert_node", "label": "x"}, nap=False)


def test_a_bad_session_id_is_an_input_error_and_nothing_is_stored(store, scope):
    with pytest.raises(OnlineArgumentError, match="record_turn: field 'session_id' contains control character") as caught:
        record_turn(store, scope, [{"op": "create_event", "content": "kept out"}], session_id="s\n1", nap=False)
    assert isinstance(caught.value, DeepSleepError) and isinstance(caught.value, ValueError)
    assert scalar(store, "SELECT count(*) FROM scope_turns WHERE scope_path = %s", scope.path) == 0
