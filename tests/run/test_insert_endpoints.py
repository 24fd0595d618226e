"""Issue 37 item 1 on the real store: every edge a night, an approval or an undo inserts is valid
against the store *at apply time* — it lands only while both of its nodes are there; else it is a
conflict, counted, and no edge points at nothing.

The reproductions: a night's co-occurrence edge and its pending-connection edge to a node a live writer
deleted (plain SQL) between the snapshot and the apply; an approval of a held CLUSTERS insert whose
member a later night pruned by its TTL; and the race itself — a live delete of the node that has not
committed when the apply's insert probes it is waited for, and then wins (the insert is a conflict).
Each runs with the rows inline (JSON parameters) and staged (temporary tables), the staged edges'
nodes checked as one set (the fast path) and per row (its plain version)."""

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


@pytest.fixture(params=[(2_000, True), (0, True), (0, False)],
                ids=["inline-json", "staging-tables", "staging-tables-per-row-probes"])
def small_rows(request, monkeypatch):
    """Rows inline (each edge's nodes probed per row), staged (the nodes the edges name locked as one set,
    the fast path), and staged with the per-row probes (the plain version): each rule holds on all three."""
    import deep_sleep.run.apply

    rows, set_endpoints = request.param
    monkeypatch.setattr(deep_sleep.run.apply, "SMALL_STAGE_ROWS", rows)
    monkeypatch.setattr(deep_sleep.run.apply, "SET_ENDPOINTS", set_endpoints)
    return rows


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


def _landed(store, planned, scopes: list[str]) -> tuple[list, list]:
    """Run a batch's statements in one transaction that is rolled back: (rows each write returned, the
    ids of the scopes' edges after the writes)."""
    from deep_sleep.run import apply as ap

    with store.adbc() as con:
        cur = con.cursor()
        try:
            counts = []
            for s in planned.statements:
                if s.is_write:
                    cur.execute(s.sql, parameters=ap._bind(s.params)) if s.params else cur.execute(s.sql)
                    counts += sorted(cur.fetch_arrow_table().to_pylist(), key=str)
                elif s.step == "lock":
                    cur.execute(s.sql, parameters=ap._bind(s.params))
                    cur.fetch_arrow_table()
                elif s.step != "ledger":
                    ap._run(cur, s)
            cur.execute("SELECT id::text AS id FROM memory_edges WHERE scope_path = ANY($1::text[]) ORDER BY 1",
                        parameters=("{" + ",".join(f'"{p}"' for p in scopes) + "}",))
            return counts, [r["id"] for r in cur.fetch_arrow_table().to_pylist()]
        finally:
            con.rollback()
            cur.close()


def test_the_set_of_locked_nodes_lands_exactly_the_edges_the_per_row_probes_land(store, scope):
    """The fast path (a staged batch's edges checked against the nodes they name, locked as one set)
    against its plain version (two probes per row) on one store: edges between live nodes of their own
    scope, to a node deleted since, to a node that never was, to a node of another scope, a loop; two
    scopes of two column signatures.  Both land exactly the edges whose two nodes are live nodes of the
    edge's scope, with the same per-scope counts."""
    import random

    import polars as pl

    from deep_sleep.core.diff import Diff, TableDiff
    from deep_sleep.core.scope import Scope as S
    from deep_sleep.run.statements import statements

    rng = random.Random(7)
    other = S.root("org", f"t{uuid.uuid4().hex[:10]}").child("brand", "b2")
    third = S.root("org", scope.tenant_id).child("brand", "b3")
    mine = {s.path: [node(s, f"n {i}", NOW - timedelta(hours=1)) for i in range(30)] for s in (scope, other, third)}
    insert(store, "memory_nodes", [n for ns in mine.values() for n in ns])
    gone = [n["id"] for n in mine[scope.path][:4]]
    with store.pg() as con:
        con.execute("DELETE FROM memory_nodes WHERE id = ANY(%s::uuid[])", (gone,))
        con.commit()
    rows, expected = [], set()
    for s in (scope, third):
        live = [n["id"] for n in mine[s.path] if n["id"] not in gone]
        for i in range(120):
            kind = rng.choice(["live", "live", "live", "gone", "never", "foreign", "loop"])
            a = rng.choice(live)
            b = {"live": rng.choice(live), "gone": rng.choice(gone), "never": str(uuid.uuid4()),
                 "foreign": rng.choice(mine[other.path])["id"], "loop": a}[kind]
            if rng.random() < 0.5:
                a, b = b, a
            row = {**edge(s, a, b, relation=f"R{i}"), "phase": "cooccurrence",
                   "weight": 0.5 if s is scope else None}
            rows.append(row)
            if kind in ("live", "loop"):
                expected.add(row["id"])
    diff = Diff({"memory_edges": TableDiff(inserts=pl.DataFrame(rows, schema_overrides={"weight": pl.Float64}))})
    run_ids = {scope.path: str(uuid.uuid4()), third.path: str(uuid.uuid4())}
    got = {}
    for set_endpoints in (True, False):
        planned = statements(diff, run_ids, small_rows=0, set_endpoints=set_endpoints)
        assert any("_ds_live_ends" in (s.sql or "") for s in planned.statements) is set_endpoints
        got[set_endpoints] = _landed(store, planned, [scope.path, third.path])
    assert got[True] == got[False]
    counts, landed = got[True]
    assert set(landed) == expected and len(expected) > 100
    assert sum(r["n"] for r in counts) == len(expected) and {r["scope_path"] for r in counts} == set(run_ids)
