"""Issue 37 item 1 on the real store: every edge a night, an approval or an undo inserts is valid
against the store *at apply time* — it lands only while both of its nodes are there; else it is a
conflict, counted, and no edge points at nothing.

The reproductions: a night's co-occurrence edge and its pending-connection edge to a node a live writer
deleted (plain SQL) between the snapshot and the apply; an approval of a held CLUSTERS insert whose
member a later night pruned by its TTL; and the race itself — a live delete of the node that has not
committed when the apply's insert probes it is waited for, and then wins (the insert is a conflict).
Each runs with the rows inline (JSON parameters) and staged (temporary tables)."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from deep_sleep.core.scope import Scope
from deep_sleep.jobs.approve import approve
from deep_sleep.run import pipeline
from deep_sleep.transforms.config import ConsolidationConfig
from tests.storeutil import edge, embed_labels, insert, node, scalar, used

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


@pytest.fixture(params=[2_000, 0], ids=["inline-json", "staging-tables"])
def small_rows(request, monkeypatch):
    import deep_sleep.run.apply

    monkeypatch.setattr(deep_sleep.run.apply, "SMALL_STAGE_ROWS", request.param)
    return request.param


def dangling(store, scope: Scope) -> int:
    return scalar(store, "SELECT count(*) FROM memory_edges e WHERE e.scope_path = %s AND NOT (EXISTS (SELECT 1 FROM"
                         " memory_nodes n WHERE n.id = e.source_id AND n.scope_path = e.scope_path) AND EXISTS (SELECT 1"
                         " FROM memory_nodes n WHERE n.id = e.target_id AND n.scope_path = e.scope_path))", scope.path)


def edges_of(store, scope: Scope) -> int:
    return scalar(store, "SELECT count(*) FROM memory_edges WHERE scope_path = %s", scope.path)


def plan(store, scope: Scope, tmp_path, phases: tuple[str, ...], as_of: datetime = NOW, config=None):
    ctx = pipeline.Context.of(as_of, config or ConsolidationConfig(), scopes=scope, store=store,
                              base=tmp_path / str(uuid.uuid4()), phases=phases)
    state = pipeline.run(pipeline.PLAN, ctx)
    assert state.report().status != "failed", state.report().errors
    return ctx, state


def apply(ctx, state):
    return pipeline.run((pipeline.Apply(),), ctx, state).report()


def delete_node(store, node_id: str) -> None:
    """A live writer's plain SQL delete of a node (one without edges: the writer leaves none dangling)."""
    with store.pg() as live:
        assert live.execute("DELETE FROM memory_nodes WHERE id = %s", (node_id,)).rowcount == 1
        live.commit()


def cooccurring(store, scope: Scope) -> tuple[str, str]:
    """Two semantic nodes touched a minute apart, no edge yet: phase 1.5 links them."""
    a = node(scope, "project: alpha", NOW - timedelta(minutes=30))
    b = node(scope, "project: bravo", NOW - timedelta(minutes=29))
    insert(store, "memory_nodes", [a, b])
    return a["id"], b["id"]


def test_a_cooccurrence_edge_to_a_node_deleted_after_the_snapshot_is_a_conflict(store, scope, tmp_path, small_rows):
    a, b = cooccurring(store, scope)
    ctx, state = plan(store, scope, tmp_path, ("cooccurrence",))
    assert state.tonight.table("memory_edges").inserts.height == 1  # the night links a and b
    delete_node(store, b)
    report = apply(ctx, state)
    assert report.status == "applied"
    assert report.rows_changed == {"memory_edges": {"inserts": 0}} and report.conflicts == 1
    assert edges_of(store, scope) == 0 and dangling(store, scope) == 0
    assert scalar(store, "SELECT conflicts FROM consolidation_runs WHERE run_id = %s", report.run_id) == 1


def test_a_pending_connection_edge_to_a_node_deleted_after_the_snapshot_is_a_conflict(store, scope, tmp_path, small_rows):
    a = node(scope, "alpha", NOW - timedelta(days=2))
    b = node(scope, "bravo", NOW - timedelta(days=2))
    insert(store, "memory_nodes", [a, b])
    insert(store, "pending_connections", [{"id": str(uuid.uuid4()), "scope_path": scope.path, "tenant_id": scope.tenant_id,
                                           "source_label": "alpha", "target_label": "bravo", "relation": "RELATED_TO",
                                           "created_at": NOW - timedelta(hours=1)}])
    ctx, state = plan(store, scope, tmp_path, ("pending_edges",))
    assert state.tonight.table("memory_edges").inserts.height == 1
    delete_node(store, b["id"])
    report = apply(ctx, state)
    assert report.status == "applied" and report.rows_changed["memory_edges"] == {"inserts": 0} and report.conflicts == 1
    assert edges_of(store, scope) == 0 and dangling(store, scope) == 0
    # the connection is consumed all the same (docs/semantics.md): its node is gone, nothing to retry
    assert scalar(store, "SELECT outcome FROM pending_connections WHERE scope_path = %s", scope.path) == "created"


def test_an_edge_whose_nodes_are_both_there_lands(store, scope, tmp_path, small_rows):
    """The guard takes nothing a clean night would insert (the other side of the two tests above)."""
    cooccurring(store, scope)
    report = apply(*plan(store, scope, tmp_path, ("cooccurrence",)))
    assert report.rows_changed == {"memory_edges": {"inserts": 1}} and report.conflicts == 0
    assert edges_of(store, scope) == 1 and dangling(store, scope) == 0


def test_a_live_delete_racing_the_insert_is_waited_for_and_wins(store, scope, tmp_path, small_rows):
    """The live delete of the node is in flight (not committed) when the apply's insert probes the node:
    the probe (FOR KEY SHARE, as a foreign key's check) waits for it and, once it commits, finds the node
    gone — the edge is a conflict.  A probe that read the node without locking it would insert the
    edge beside the committing delete: a dangling edge."""
    a, b = cooccurring(store, scope)
    ctx, state = plan(store, scope, tmp_path, ("cooccurrence",))
    live = psycopg.connect(store.dsn)
    try:
        assert live.execute("DELETE FROM memory_nodes WHERE id = %s", (b,)).rowcount == 1  # not committed yet
        writer = live.info.backend_pid
        out: list = []
        applying = threading.Thread(target=lambda: out.append(apply(ctx, state)), daemon=True)
        applying.start()
        with psycopg.connect(store.dsn, autocommit=True) as watch:
            deadline = time.monotonic() + 60
            while applying.is_alive() and not watch.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))", (writer,)).fetchone()[0]:
                assert time.monotonic() < deadline, "the apply neither waited for the live delete nor finished"
                time.sleep(0.02)
        live.commit()  # the delete commits while the apply waits on it (or after it finished: the bug)
    finally:
        live.close()
    applying.join(60)
    assert out, "the apply did not finish"
    assert dangling(store, scope) == 0
    assert out[0].rows_changed == {"memory_edges": {"inserts": 0}} and out[0].conflicts == 1


def test_approving_a_held_clusters_insert_after_a_later_night_pruned_its_member_is_a_conflict(store, scope, runs_dir):
    """Night 2's gate fails and holds META:project's member swap (part 2 out, part 4 in); night 3 prunes
    part 4 by its TTL.  Approving night 2 then must not insert the CLUSTERS edge to part 4: a conflict,
    counted, and no edge to a missing node (before issue 37: ``inserts: 1`` and a dangling edge)."""
    cap = 3
    config = ConsolidationConfig(meta_nodes={"min_group": 2, "max_members": cap}, holds={"used_deletes": False})
    no_gate = ConsolidationConfig(meta_nodes={"min_group": 2, "max_members": cap}, gate={"enabled": False},
                                  holds={"used_deletes": False, "max_delete_share": 1.0})  # night 3 holds nothing
    members = [node(scope, f"project: part {i}", NOW - timedelta(hours=3), importance=8.0 - i * 0.5) for i in range(5)]
    insert(store, "memory_nodes", members)
    phases = ("working_ttl", "meta_nodes")
    pipeline.consolidate(store, scope, NOW, config, runs_dir=runs_dir, phases=phases)
    part4 = members[4]["id"]
    with store.pg() as con:  # part 4 rises into the top three
        con.execute("UPDATE memory_nodes SET importance = 9.5 WHERE id = %s", (part4,))
        con.commit()
    scratch = node(scope, "note: scratch billing retry", NOW + timedelta(hours=1), layer="working", properties={"ttl_hours": 1})
    insert(store, "memory_nodes", [scratch])
    embed_labels(store, scope)
    insert(store, "recall_events", [used(scope, scratch["id"], "scratch billing retry", NOW + timedelta(hours=2))])
    held = pipeline.consolidate(store, scope, NOW + timedelta(hours=3), config, runs_dir=runs_dir, phases=phases).report()
    assert held.gate["failed"] is True and held.held["rows"]["memory_edges"] == {"deletes": 1, "inserts": 1}, held.held

    with store.pg() as con:  # part 4 gets a TTL that has run out by night 3
        con.execute("UPDATE memory_nodes SET properties = properties || '{\"ttl_hours\": 1}' WHERE id = %s", (part4,))
        con.commit()
    third = pipeline.consolidate(store, scope, NOW + timedelta(hours=4), no_gate, runs_dir=runs_dir,
                                 phases=("prune_orphans",)).report()
    assert third.rows_changed.get("memory_nodes") == {"deletes": 1}, (third.rows_changed, third.counters, third.phases_skipped, third.errors, third.held)
    assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE id = %s", part4) == 0

    d = approve(store, held.run_id, config=config)
    assert d.applied["memory_edges"]["inserts"] == 0 and d.conflicts >= 1, (d.applied, d.conflicts)
    assert scalar(store, "SELECT count(*) FROM memory_edges WHERE scope_path = %s AND target_id = %s", scope.path, part4) == 0
    assert dangling(store, scope) == 0
    assert scalar(store, "SELECT conflicts FROM consolidation_runs WHERE run_id = %s", d.approval_run_id) == d.conflicts
