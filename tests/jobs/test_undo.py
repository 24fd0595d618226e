"""Undo on the real store: byte-for-byte restore where unchanged, reported and left alone where changed."""

from __future__ import annotations

import shutil
import uuid
from datetime import UTC, datetime, timedelta

import polars as pl
import pytest
from deep_sleep.transforms.config import ConsolidationConfig

from deep_sleep.core.diff import Diff
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.tables import TABLES
from deep_sleep.dev.seed import SeedSpec, generate, load
from deep_sleep.jobs.errors import UndoError
from deep_sleep.jobs.ledger import get_run, last_runs, runs_markdown
from deep_sleep.jobs.undo import undo, undo_markdown
from deep_sleep.jobs.undo_sql import CHANGED, GONE, KEY_EXISTS, NOT_WRITTEN_UPDATE
from deep_sleep.run.apply import record_run
from deep_sleep.run import pipeline
from deep_sleep.run.pipeline import consolidate
from tests.storeutil import dump, edge, insert, node, scalar, small_graph

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
VECTOR = "[" + ",".join(f"{(i * 0.7311) % 1 - 0.5:.7f}" for i in range(256)) + "]"
# Undo is about what a run applied: these runs apply everything (no holds, issue 16).
# Nothing held: no holds policy, and no gate probes (on this 9-row scope one pruned fact is 11 % of its
# memory, over their 10 pp limit — tests/run/test_probes.py tests that verdict).
NO_HOLDS = ConsolidationConfig(holds={"enabled": False}, gate={"probes": 0})


def rich_graph(store, scope) -> dict[str, list[str]]:
    """small_graph plus rows that make every kind of change: a risk node (properties updated), an old
    node (importance and a NULL last_decayed_at updated), an old orphan with an embedding (pruned)."""
    ids = small_graph(store, scope, NOW)
    risky = node(scope, "deploy warning: disk", NOW - timedelta(hours=5))
    old = node(scope, "fact: the sky", NOW - timedelta(days=40), importance=6.0)
    orphan = node(scope, "trivia: lint", NOW - timedelta(days=10), importance=2.0, properties={"nested": {"a": [1, 2.5, "x"]}})
    insert(store, "memory_nodes", [risky, old, orphan])
    with store.pg() as con:  # embeddings on a row the run deletes and on one it keeps
        con.execute("UPDATE memory_nodes SET embedding = %s::vector WHERE id = ANY(%s::uuid[])",
                    (VECTOR, [orphan["id"], ids["expired"][0]]))
        con.commit()
    return {**ids, "risky": [risky["id"]], "old": [old["id"]], "orphan": [orphan["id"]]}


def rows(store, scope, without_version: bool = False) -> dict[str, dict[str, str]]:
    """table → id → to_jsonb(row) text, for every table of the scope."""
    expr = "(to_jsonb(t) - 'version')::text" if without_version else "to_jsonb(t)::text"
    out = {}
    with store.pg() as con:
        for table in TABLES:
            out[table] = dict(con.execute(f"SELECT id::text, {expr} FROM {table} t WHERE scope_path = %s", (scope.path,)).fetchall())
    return out


def test_undo_restores_unchanged_rows_byte_for_byte_and_reports_the_changed_ones(store, scope, runs_dir):
    ids = rich_graph(store, scope)
    before, before_nv = rows(store, scope), rows(store, scope, without_version=True)
    run = consolidate(store, scope, NOW, NO_HOLDS, runs_dir=runs_dir).report()
    assert run.status == "applied", run.errors
    changed = {t: k for t, k in run.rows_changed.items()}
    assert changed["memory_nodes"]["updates"] >= 5 and changed["memory_nodes"]["deletes"] == 2
    assert changed["memory_nodes"]["inserts"] == 1 and changed["memory_edges"]["inserts"] >= 1
    diff = Diff.read(run.diff_uri)
    updated = set(diff.table("memory_nodes").updates["id"])
    assert {*ids["hot"], *ids["risky"], *ids["old"]} <= updated
    meta_id = diff.table("memory_nodes").inserts["id"][0]
    old_edge = diff.table("memory_edges").deletes["id"][0]

    # After the run, live writers (their own connection): edit an updated row, edit an inserted row,
    # and re-create the deleted edge's natural key under a new id.
    hot0 = ids["hot"][0]
    with store.pg() as live:
        live.execute("UPDATE memory_nodes SET label = 'project: hot 0 (edited)' WHERE id = %s", (hot0,))
        live.execute("UPDATE memory_nodes SET properties = properties || '{\"pinned\": true}' WHERE id = %s", (meta_id,))
        live.commit()
    again = edge(scope, hot0, ids["expired"][0])
    insert(store, "memory_edges", [again])
    live_hot0 = scalar(store, "SELECT to_jsonb(t)::text FROM memory_nodes t WHERE id = %s", hot0)
    live_meta = scalar(store, "SELECT to_jsonb(t)::text FROM memory_nodes t WHERE id = %s", meta_id)

    result = undo(store, run.run_id)

    reported = {(r["table"], r["kind"], r["id"], r["reason"]) for r in result.not_restored.iter_rows(named=True)}
    assert reported == {("memory_nodes", "updates", hot0, CHANGED), ("memory_nodes", "inserts", meta_id, CHANGED),
                        ("memory_edges", "deletes", old_edge, KEY_EXISTS)}
    assert result.reverted["memory_nodes"] == {"updates": len(updated) - 1, "deletes": 2}
    after, after_nv = rows(store, scope), rows(store, scope, without_version=True)
    for table in TABLES:
        expected = dict(before[table])
        if table == "memory_nodes":
            expected[hot0] = live_hot0
            expected[meta_id] = live_meta
        if table == "memory_edges":
            del expected[old_edge]
            expected[again["id"]] = after[table][again["id"]]
        assert set(after[table]) == set(expected), table
        for rid, value in expected.items():
            if table == "memory_nodes" and rid in updated and rid != hot0:
                # restored updates: every column byte for byte, the version bumped once more
                assert after_nv[table][rid] == before_nv[table][rid], (table, rid)
                assert scalar(store, "SELECT version FROM memory_nodes WHERE id = %s", rid) == 3
            else:
                assert after[table][rid] == value, (table, rid)
    # the live edits survived
    assert scalar(store, "SELECT label FROM memory_nodes WHERE id = %s", hot0) == "project: hot 0 (edited)"
    assert scalar(store, "SELECT importance FROM memory_nodes WHERE id = %s", hot0) == 5.5
    # re-inserted rows kept their version and embedding (INSERT fires no version trigger)
    assert scalar(store, "SELECT embedding = %s::vector FROM memory_nodes WHERE id = %s", VECTOR, ids["orphan"][0]) is True
    assert scalar(store, "SELECT version FROM memory_nodes WHERE id = %s", ids["expired"][0]) == 2

    # the ledger: the run is undone, the undo is a row of its own naming it
    undone = get_run(store, run.run_id)
    assert undone.status == "undone" and undone.undone_by == result.undo_run_id
    record = get_run(store, result.undo_run_id)
    assert (record.mode, record.status, record.undo_of, record.conflicts) == ("undo", "applied", run.run_id, 3)
    assert record.not_restored["memory_nodes"]["updates"] == {CHANGED: 1}
    assert record.rows_changed["memory_nodes"]["inserts"] == 2  # the undo re-inserted the two deleted nodes
    # inserted rows the undo removed are archived under the undo's id, so nothing is lost
    assert scalar(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s AND op = 'undo'",
                  result.undo_run_id) == sum(k.get("inserts", 0) for k in result.reverted.values())
    assert [r.run_id for r in last_runs(store, scope)][:2] == [result.undo_run_id, run.run_id]
    assert "undone by" in runs_markdown(last_runs(store, scope))
    assert "a row with the same natural key exists" in undo_markdown(result)

    # refusals name the run and why; nothing is written
    snapshot = dump(store, scope)
    with pytest.raises(UndoError, match=f"run {run.run_id} .*already undone by undo run {result.undo_run_id}"):
        undo(store, run.run_id)
    with pytest.raises(UndoError, match="itself an undo"):
        undo(store, result.undo_run_id)
    unknown = str(uuid.uuid4())
    with pytest.raises(UndoError, match=f"run {unknown} is not in the ledger"):
        undo(store, unknown)
    with pytest.raises(UndoError, match="'yesterday' is not a UUID"):
        undo(store, "yesterday")
    assert dump(store, scope) == snapshot


def test_rows_the_apply_skipped_as_conflicts_are_not_undone(store, scope, tmp_path):
    ids = small_graph(store, scope, NOW)
    two = ("strengthen", "working_ttl")
    ctx = pipeline.Context.of(NOW, ConsolidationConfig(), scopes=scope, store=store, base=tmp_path, phases=two)
    planned = pipeline.run(pipeline.PLAN, ctx)  # extract, transform, gate, hold, validate: everything but the apply
    assert planned.report().status != "failed", planned.report().errors
    target = ids["hot"][0]
    with store.pg() as live:  # the one change since the snapshot is a live writer's: the apply skips the row
        live.execute("UPDATE memory_nodes SET importance = 7.25 WHERE id = %s", (target,))
        live.commit()
    run = pipeline.run((pipeline.Apply(),), ctx, planned).report()  # the apply, later, on the planned state
    assert run.status == "applied" and run.conflicts == 1
    gone = ids["hot"][1]
    with store.pg() as live:  # and after the run a live writer deletes a row the run updated
        live.execute("DELETE FROM memory_nodes WHERE id = %s", (gone,))
        live.commit()
    result = undo(store, run.run_id)
    assert sorted(result.not_restored.select("id", "reason").rows()) == sorted([(target, NOT_WRITTEN_UPDATE), (gone, GONE)])
    assert scalar(store, "SELECT importance FROM memory_nodes WHERE id = %s", target) == 7.25
    assert scalar(store, "SELECT array_agg(DISTINCT importance) FROM memory_nodes WHERE id = ANY(%s::uuid[])", ids["hot"][2:]) == [5.0]
    assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE id = %s", ids["expired"][0]) == 1


def test_failed_runs_and_runs_whose_snapshot_is_gone_are_refused(store, scope, runs_dir):
    failed = ConsolidationReport(scope_path=scope.path, as_of="2026-11-20T03:00:00Z", run_id=str(uuid.uuid4()), status="failed")
    record_run(store, failed, "nightly", NOW, "failed")
    with pytest.raises(UndoError, match=f"run {failed.run_id} .*status 'failed'"):
        undo(store, failed.run_id)

    small_graph(store, scope, NOW)
    run = consolidate(store, scope, NOW, runs_dir=runs_dir, phases=("strengthen", "working_ttl")).report()
    shutil.rmtree(run.snapshot_uri)
    before = dump(store, scope)
    with pytest.raises(UndoError, match="its snapshot .* is not there.*Nothing was changed"):
        undo(store, run.run_id)
    assert dump(store, scope) == before
    assert get_run(store, run.run_id).status == "applied"


def test_undo_of_a_whole_synthetic_scope_restores_every_table(store, scope, runs_dir):
    """Every table and column type (embeddings, float arrays, JSON, episodic deletes, pending
    connections, recall labels) through a full nightly run and its undo."""
    spec = SeedSpec(tenants=1, scopes_per_tenant=0, nodes_per_scope=150, seed=90417, now=NOW, embeddings=True)
    frames = {t: f.with_columns(pl.lit(scope.path).alias("scope_path"), pl.lit(scope.tenant_id).alias("tenant_id"))
              for t, f in generate(spec).items()}
    load(store, frames)
    before = rows(store, scope, without_version=True)
    run = consolidate(store, scope, NOW, NO_HOLDS, runs_dir=runs_dir).report()
    assert run.status == "applied", run.errors
    assert {"memory_nodes", "memory_edges", "episodic_events", "pending_connections", "recall_events"} <= set(run.rows_changed)
    result = undo(store, run.run_id)
    assert result.complete, result.not_restored
    assert rows(store, scope, without_version=True) == before


def test_undo_of_a_run_that_held_rows_undoes_what_it_applied_and_leaves_the_held_rows_alone(store, scope, runs_dir):
    """The held rows (SPEC §9) never applied with the run: its undo is complete without them (a held
    insert is not "not in the store"), and it restores the rest."""
    small_graph(store, scope, NOW)
    insert(store, "memory_nodes", [node(scope, "SOUL:name", NOW - timedelta(hours=2),
                                        properties={"_last_edited_by": "user_manual_edit", "value": "Ada"})])
    before = rows(store, scope, without_version=True)
    run = consolidate(store, scope, NOW, runs_dir=runs_dir).report()  # the default config holds SOUL changes
    # the SOUL correction's row is held; identity drift's 5 soul_profiles rows apply (HoldsConfig.drift_changes is off)
    assert run.status == "applied" and run.held["rows"] == {"soul_profiles": {"inserts": 1}}, run.held
    assert run.rows_changed["soul_profiles"] == {"inserts": 5}, run.rows_changed
    result = undo(store, run.run_id)
    assert result.complete, undo_markdown(result)
    assert rows(store, scope, without_version=True) == before


def test_undo_of_a_night_that_refreshed_a_meta_summary_restores_it_and_clears_the_vector_it_wrote(store, scope, runs_dir):
    """Found probing undo with the CLUSTERS cap (issue 31 item 6): a night that refreshes a
    META node's summary also writes its vector (a column snapshots do not carry), and undoing that night
    failed with polars' ColumnNotFoundError "embedding".  The summary and the CLUSTERS edges are put back;
    the vector the night wrote for the new summary is cleared (its before-image is not in the snapshot)
    — only on the META node, not on the nodes the same night strengthened — and ``reembed`` computes it."""
    from deep_sleep.jobs.reembed import reembed
    from tests.storeutil import access, embed_labels

    config = ConsolidationConfig(meta_nodes={"min_group": 2, "max_members": 3})
    members = [node(scope, f"project: part {i}", NOW - timedelta(hours=3), importance=8.0 - i * 0.5) for i in range(5)]
    insert(store, "memory_nodes", members)
    embed_labels(store, scope)
    phases = ("strengthen", "meta_nodes")
    pipeline.consolidate(store, scope, NOW, config, runs_dir=runs_dir, phases=phases)
    meta = scalar(store, "SELECT id::text FROM memory_nodes WHERE scope_path = %s AND label = 'META:project'", scope.path)

    def text_rows() -> dict[str, dict[str, str]]:  # every row but its version and vector
        with store.pg() as con:
            return {t: dict(con.execute(f"SELECT id::text, (to_jsonb(t) - 'version' - 'embedding' - 'embedding_model')::text"
                                        f" FROM {t} t WHERE scope_path = %s", (scope.path,)).fetchall()) for t in TABLES}

    before = text_rows()
    with store.pg() as con:  # a live turn lifts the weakest member into the top 3 and reads another one twice
        con.execute("UPDATE memory_nodes SET importance = 9.5 WHERE id = %s", (members[4]["id"],))
        con.commit()
    insert(store, "memory_access_log", [access(scope, members[1]["id"], NOW + timedelta(hours=2, minutes=m)) for m in (5, 30)])
    lifted = text_rows()
    night = consolidate(store, scope, NOW + timedelta(hours=3), config, runs_dir=runs_dir, phases=phases).report()
    assert night.rows_changed == {"memory_edges": {"deletes": 1, "inserts": 1}, "memory_nodes": {"updates": 2}}, night.rows_changed
    assert scalar(store, "SELECT embedding IS NOT NULL FROM memory_nodes WHERE id = %s", meta) is True

    result = undo(store, night.run_id)
    assert result.complete, undo_markdown(result)
    after = text_rows()
    assert after["memory_nodes"][meta] == before["memory_nodes"][meta]  # night 1's summary and members
    assert after == lifted
    assert scalar(store, "SELECT embedding IS NULL AND embedding_model IS NULL FROM memory_nodes WHERE id = %s", meta) is True
    assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE scope_path = %s AND embedding IS NULL", scope.path) == 1
    reembed(store, config, [scope])
    assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE scope_path = %s AND embedding IS NULL", scope.path) == 0


def test_undo_gives_a_meta_node_no_more_clusters_edges_than_its_cap(store, scope, runs_dir):
    """Issue 31 item 5 (caps hold after undo, SPEC §9): a night swaps a META node's weakest member for a
    lifted one (one CLUSTERS edge deleted, one inserted); a live writer then changes the inserted edge,
    so its undo cannot remove it — and re-inserting the deleted edge would give the META node 4 members
    over its cap of 3.  The undo leaves that edge out, by name and reason, and restores the rest."""
    from deep_sleep.jobs.undo_sql import CLUSTER_FULL

    cap = 3
    config = ConsolidationConfig(meta_nodes={"min_group": 2, "max_members": cap})
    members = [node(scope, f"project: part {i}", NOW - timedelta(hours=3), importance=8.0 - i * 0.5) for i in range(5)]
    insert(store, "memory_nodes", members)
    pipeline.consolidate(store, scope, NOW, config, runs_dir=runs_dir, phases=("meta_nodes",))
    with store.pg() as con:
        con.execute("UPDATE memory_nodes SET importance = 9.5 WHERE id = %s", (members[4]["id"],))
        con.commit()
    night = consolidate(store, scope, NOW + timedelta(hours=3), config, runs_dir=runs_dir, phases=("meta_nodes",)).report()
    assert night.rows_changed["memory_edges"] == {"deletes": 1, "inserts": 1}
    dropped = Diff.read(night.diff_uri).table("memory_edges").deletes["id"][0]
    with store.pg() as con:
        con.execute("UPDATE memory_edges SET weight = 2 WHERE target_id = %s AND relation = 'CLUSTERS'", (members[4]["id"],))
        con.commit()
    result = undo(store, night.run_id, config)
    clusters = "SELECT count(*) FROM memory_edges WHERE scope_path = %s AND relation = 'CLUSTERS'"
    assert scalar(store, clusters, scope.path) == cap
    left = {(r["table"], r["kind"], r["id"], r["reason"]) for r in result.not_restored.iter_rows(named=True)}
    assert ("memory_edges", "deletes", dropped, CLUSTER_FULL) in left
    assert scalar(store, "SELECT count(*) FROM memory_edges WHERE id = %s", dropped) == 0
    assert result.reverted["memory_nodes"] == {"updates": 1}  # the META node's summary is put back


def test_approving_an_undo_is_refused_as_an_undo(store, scope, runs_dir):
    """An undo's ledger row holds nothing to approve: the refusal says what it is, not that a snapshot is missing."""
    from deep_sleep.jobs.approve import approve
    from deep_sleep.jobs.errors import HoldError

    small_graph(store, scope, NOW)
    run = consolidate(store, scope, NOW, runs_dir=runs_dir).report()
    result = undo(store, run.run_id)
    with pytest.raises(HoldError, match=r"\(undo\): only an applied run's held rows can be approved"):
        approve(store, result.undo_run_id)
