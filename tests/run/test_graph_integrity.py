"""Issue 31 in miniature, on the real store: no sequence of writes — a night's apply, a live write
between its snapshot and its apply, an undo after a later run — leaves an edge whose node is gone.
Each test states the behaviour (the store read back), not a comparison of two code paths; each runs
with the rows inline (JSON parameters) and staged (temporary tables)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from deep_sleep.transforms.config import ConsolidationConfig

from deep_sleep.core.scope import Scope
from deep_sleep.jobs.undo import undo
from deep_sleep.run import pipeline
from tests.storeutil import edge, insert, node, scalar

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
TTL = ("working_ttl",)  # a phase whose deletes are exactly known: working nodes past their ttl_hours


@pytest.fixture(params=[2_000, 0], ids=["inline-json", "staging-tables"])
def small_rows(request, monkeypatch):
    import deep_sleep.run.apply

    monkeypatch.setattr(deep_sleep.run.apply, "SMALL_STAGE_ROWS", request.param)
    return request.param


def _dangling(store, scope: Scope) -> int:
    return scalar(store, "SELECT count(*) FROM memory_edges e WHERE e.scope_path = %s AND NOT (EXISTS (SELECT 1 FROM"
                         " memory_nodes n WHERE n.id = e.source_id AND n.scope_path = e.scope_path) AND EXISTS (SELECT 1"
                         " FROM memory_nodes n WHERE n.id = e.target_id AND n.scope_path = e.scope_path))", scope.path)


def _expired_with_edge(store, scope: Scope) -> tuple[str, str, str]:
    """A working node past its TTL (phase 8 deletes it, with its edge) tied to a semantic hub."""
    hub = node(scope, "project: hub", NOW - timedelta(hours=3))
    gone = node(scope, "note: scratch", NOW - timedelta(hours=2), layer="working", properties={"ttl_hours": 1})
    e = edge(scope, hub["id"], gone["id"], at=NOW - timedelta(hours=2))
    insert(store, "memory_nodes", [hub, gone])
    insert(store, "memory_edges", [e])
    return hub["id"], gone["id"], e["id"]


def _plan(store, scope, tmp_path, as_of=NOW):
    ctx = pipeline.Context.of(as_of, ConsolidationConfig(), scopes=scope, store=store, base=tmp_path / str(uuid.uuid4()),
                              phases=TTL)
    state = pipeline.run(pipeline.PLAN, ctx)
    assert state.report().status != "failed", state.report().errors
    return ctx, state


def _apply(ctx, state):
    return pipeline.run((pipeline.Apply(),), ctx, state).report()


def test_an_edge_whose_delete_lost_to_a_live_write_keeps_its_node(store, scope, tmp_path, small_rows):
    """Issue 31 (1): a live writer changes the edge after the snapshot; its guarded delete is skipped —
    so the node must stay too, or the edge would point at nothing."""
    hub, gone, e = _expired_with_edge(store, scope)
    ctx, state = _plan(store, scope, tmp_path)
    with store.pg() as live:
        live.execute("UPDATE memory_edges SET weight = 2 WHERE id = %s", (e,))
        live.commit()
    report = _apply(ctx, state)
    assert report.status == "applied" and report.conflicts == 2  # the edge's delete and its node's
    assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE id = %s", gone) == 1
    assert scalar(store, "SELECT weight FROM memory_edges WHERE id = %s", e) == 2.0
    assert _dangling(store, scope) == 0
    assert scalar(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s", report.run_id) == 0


def test_an_edge_added_after_the_snapshot_keeps_its_node(store, scope, tmp_path, small_rows):
    """Issue 31 (2): an edge written to the node after the snapshot (by SQL here; pending connections
    become such edges in a later night) is not in the diff: the node stays with it (a conflict; the
    next night sees both), while the edge the night listed goes, archived."""
    hub, gone, e = _expired_with_edge(store, scope)
    ctx, state = _plan(store, scope, tmp_path)
    late = edge(scope, gone, hub, relation="MENTIONS")
    insert(store, "memory_edges", [late])
    report = _apply(ctx, state)
    assert report.status == "applied" and report.conflicts == 1
    assert report.rows_changed == {"memory_edges": {"deletes": 1}, "memory_nodes": {"deletes": 0}}
    assert scalar(store, "SELECT count(*) FROM memory_edges WHERE id = %s", late["id"]) == 1
    assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE id = %s", gone) == 1
    assert _dangling(store, scope) == 0
    # the next night takes the node and the edge that held it back
    again = _apply(*_plan(store, scope, tmp_path, NOW + timedelta(minutes=5)))
    assert again.conflicts == 0 and again.rows_changed == {"memory_edges": {"deletes": 1}, "memory_nodes": {"deletes": 1}}
    assert _dangling(store, scope) == 0


def test_a_clean_apply_deletes_the_node_and_its_edge_and_archives_both(store, scope, tmp_path, small_rows):
    """Nothing changed since the snapshot: the rule takes both, edge first, each archived."""
    hub, gone, e = _expired_with_edge(store, scope)
    report = _apply(*_plan(store, scope, tmp_path))
    assert report.status == "applied" and report.conflicts == 0
    assert report.rows_changed == {"memory_edges": {"deletes": 1}, "memory_nodes": {"deletes": 1}}
    archived = scalar(store, "SELECT array_agg(table_name || ':' || row_id ORDER BY table_name) FROM consolidation_archive"
                             " WHERE run_id = %s", report.run_id)
    assert archived == [f"memory_edges:{e}", f"memory_nodes:{gone}"]
    assert _dangling(store, scope) == 0


def test_one_scopes_live_write_is_that_scopes_conflict_only_in_a_shard(store, scope, tmp_path, small_rows):
    """A clean two-scope shard apply with a live write to a node it deletes in one scope: that node and
    its edge stay (one scope's conflicts), nothing of it archived; the other scope applies whole."""
    other = Scope.from_path([*scope.levels[:-1], (scope.levels[-1][0], scope.levels[-1][1] + "x")])
    mine, theirs = _expired_with_edge(store, scope), _expired_with_edge(store, other)
    ctx = pipeline.Context.of(NOW, ConsolidationConfig(), scopes=[scope, other], store=store, base=tmp_path / "shard",
                              phases=TTL)
    state = pipeline.run(pipeline.PLAN, ctx)
    with store.pg() as live:
        live.execute("UPDATE memory_nodes SET properties = properties || '{\"touched\": 1}' WHERE id = %s", (mine[1],))
        live.commit()
    reports = pipeline.run((pipeline.Apply(),), ctx, state).reports
    assert (reports[scope.path].conflicts, reports[other.path].conflicts) == (2, 0)
    assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE id = ANY(%s::uuid[])", [mine[1], theirs[1]]) == 1
    assert scalar(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s", reports[scope.path].run_id) == 0
    assert scalar(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s", reports[other.path].run_id) == 2
    assert _dangling(store, scope) == _dangling(store, other) == 0


def test_undo_does_not_bring_back_an_edge_whose_other_node_a_later_run_deleted(store, scope, runs_dir):
    """Issue 31 (3): run 1 deletes B and B→X; run 2 deletes X; undoing run 1 re-inserts B but refuses
    B→X, by name and reason."""
    b = node(scope, "note: b", NOW - timedelta(hours=2), layer="working", properties={"ttl_hours": 1})
    x = node(scope, "note: x", NOW - timedelta(minutes=10), layer="working", properties={"ttl_hours": 24})
    bx = edge(scope, b["id"], x["id"], at=NOW - timedelta(hours=2))
    insert(store, "memory_nodes", [b, x])
    insert(store, "memory_edges", [bx])
    first = pipeline.consolidate(store, scope, NOW, runs_dir=runs_dir, phases=TTL).report()
    assert first.rows_changed == {"memory_edges": {"deletes": 1}, "memory_nodes": {"deletes": 1}}
    second = pipeline.consolidate(store, scope, NOW + timedelta(hours=25), runs_dir=runs_dir, phases=TTL).report()
    assert second.rows_changed == {"memory_nodes": {"deletes": 1}}
    result = undo(store, first.run_id)
    assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE id = %s", b["id"]) == 1
    assert scalar(store, "SELECT count(*) FROM memory_edges WHERE id = %s", bx["id"]) == 0
    refused = result.not_restored.filter(result.not_restored["table"] == "memory_edges")
    assert refused["id"].to_list() == [bx["id"]] and "would dangle" in refused["reason"][0]
    assert not result.complete and _dangling(store, scope) == 0


def _meta_group(store, scope: Scope, cap: int) -> list[dict]:
    """Five "project:" nodes, importance 8.0 down to 6.0: phase 4's META:project clusters the top ``cap``."""
    members = [node(scope, f"project: part {i}", NOW - timedelta(hours=3), importance=8.0 - i * 0.5) for i in range(5)]
    insert(store, "memory_nodes", members)
    return members


def _clusters(store, scope: Scope) -> int:
    return scalar(store, "SELECT count(*) FROM memory_edges WHERE scope_path = %s AND relation = 'CLUSTERS'", scope.path)


def test_a_meta_nodes_new_member_waits_when_the_stale_members_delete_lost_to_a_live_write(store, scope, tmp_path, small_rows):
    """Issue 31 (8) through a live write: the night swaps META:project's weakest member for a lifted one
    (one CLUSTERS edge deleted, one inserted); a live writer changes the stale edge after the snapshot,
    so its delete is a conflict — and the new edge must not land either, or the META node would have
    4 members over its cap of 3.  Both are conflicts; the next night plans the group again."""
    cap = 3
    config = ConsolidationConfig(meta_nodes={"min_group": 2, "max_members": cap})
    members = _meta_group(store, scope, cap)
    pipeline.consolidate(store, scope, NOW, config, runs_dir=tmp_path / "runs", phases=("meta_nodes",))
    assert _clusters(store, scope) == cap
    with store.pg() as con:
        con.execute("UPDATE memory_nodes SET importance = 9.5 WHERE id = %s", (members[4]["id"],))
        con.commit()
    ctx = pipeline.Context.of(NOW + timedelta(hours=1), config, scopes=scope, store=store, base=tmp_path / "r", phases=("meta_nodes",))
    state = pipeline.run(pipeline.PLAN, ctx)
    assert state.tonight.row_counts()["memory_edges"] == {"inserts": 1, "updates": 0, "deletes": 1}
    with store.pg() as live:
        live.execute("UPDATE memory_edges SET weight = 2 WHERE target_id = %s AND relation = 'CLUSTERS'", (members[2]["id"],))
        live.commit()
    report = _apply(ctx, state)
    assert report.status == "applied" and report.conflicts == 2
    assert report.rows_changed["memory_edges"] == {"deletes": 0, "inserts": 0}
    assert _clusters(store, scope) == cap
    assert scalar(store, "SELECT count(*) FROM memory_edges WHERE target_id = %s", members[4]["id"]) == 0
    # the next night sees the live write and makes the swap
    again = pipeline.consolidate(store, scope, NOW + timedelta(hours=2), config, runs_dir=tmp_path / "runs",
                                 phases=("meta_nodes",)).report()
    assert again.conflicts == 0 and again.rows_changed["memory_edges"] == {"deletes": 1, "inserts": 1}
    assert _clusters(store, scope) == cap
    assert scalar(store, "SELECT count(*) FROM memory_edges WHERE target_id = %s", members[4]["id"]) == 1
