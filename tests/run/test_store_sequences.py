"""Issue 31 item 6: random sequences of night / live write / approve / reject / undo / kill on random
small fleets, on the real store, with the store's invariants checked after every step.

Each sequence builds a fleet of its own (1–4 sibling scopes under a fresh tenant, a handful to a
few dozen nodes each, with tests/storeutil): recent connected hubs that phase 4 clusters under META
nodes (with a small ``meta_nodes.max_members``, so the cap matters), weak old orphans that phase 3
prunes, working nodes past their TTL with edges, some of them "used" (explicit recall feedback on a
query that is their label, and every node embedded with the live embedder, so the recall-quality
gate measures and fails when they go), and the holds policy and gate threshold drawn per sequence
so that delete-share, delete-count, used-node and gate-failed holds all happen.  Then a random
sequence of steps:

- ``night``: :func:`pipeline.consolidate` over the fleet (or one scope of it) at a later ``as_of``;
  or a *racing* night — the plan, a write between snapshot and apply (a live write as below, a
  change to a row the night deletes, or a plain SQL delete of a node that an edge the night inserts
  needs), then the apply; or a racing *swap* — a node lifted into the
  top of its label group first (so phase 4 swaps a META node's members), the plan, a change to every
  edge the night deletes, then the apply;
- ``live write``: by SQL (a new edge between existing nodes of a scope, a new node with an edge to
  an existing one, a node's properties or importance changed, a node lifted into the top of its
  label group, an edge's weight bumped — often a CLUSTERS edge, a node deleted with its edges, so
  that a held insert of an edge to it is approved, or a deleted edge to it undone, after it went)
  or through the online API
  (:func:`record_turn` upserting an existing label, which bumps the node's version);
- ``approve`` (a random pending run, all its phases or one), ``reject`` (likewise), ``undo`` (a random
  run of the fleet's ledger: a night, an approval, or — refused — an undo);
- ``kill``: a night whose apply dies inside its transaction after its k-th write statement.  Most
  kills are in-process: ``deep_sleep.run.apply._write`` raises a ``BaseException`` (which, like a
  dying process, no ``except Exception`` in the product catches) after the k-th statement, so the
  apply's transaction is rolled back by the connection's context manager — cheap (no interpreter
  start, no imports).  The first kill steps of the test, until :data:`REAL_KILLS` nights have been
  killed so (at most twice as many tries), are a real ``SIGKILL`` of a child process paused inside
  the open transaction at its first write (test_apply.py's pattern): Postgres rolls the dead
  backend's transaction back.  Both must leave the store (graph, ledger, archive) as before the night.

A refusal (``HoldError``, ``UndoError``) is a legitimate outcome of a step; any other exception,
and any night reported ``failed``, fails the test.  After every step, over every scope of the fleet:
no edge whose source or target node is missing (same scope_path); no duplicate edge key (the table's
unique key ``memory_edges_natural_key``: scope_path, source_id, target_id, relation); no META node
with more than ``meta_nodes.max_members`` ``CLUSTERS`` edges; the ledger's ``hold_status`` of every
applied or undone run agrees with its ``held`` phases and its ``consolidation_decisions`` rows, and
every approval decision names an approval run of that run; every undone run has its undo row; every
run's ``rows_changed`` deletes equal its archived before-images; and no row archived as deleted by
a run that is still applied is in the live table (the live writes here never re-use an id, and
re-inserting a deleted row is undo's, which marks that run undone).

Size: :data:`SEQUENCES` = 24 sequences, each a first night and then 6–11 drawn steps (7–12 steps, at
most :data:`STEPS`), derandomized (conftest's profile); a failure shrinks for at most
:data:`SHRINK_SECONDS` s and :data:`MAX_SHRINKS` shrinks.  Run on the code before the fixes that came
with it, these sequences fail on a racing swap night that leaves a META node over its CLUSTERS cap (and
an earlier version of them on an undo that crashed on a META node's refreshed vector); both bugs are
pinned by miniature tests (test_graph_integrity.py, test_holds_store.py, jobs/test_undo.py).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import deep_sleep.run.apply as apply_mod
from deep_sleep.core.embedding import default_embedder
from deep_sleep.core.scope import Scope
from deep_sleep.jobs.approve import approve, read_holds, reject
from deep_sleep.jobs.errors import HoldError, UndoError
from deep_sleep.jobs.undo import undo
from deep_sleep.online.turn import record_turn
from deep_sleep.run import pipeline
from deep_sleep.transforms.config import ConsolidationConfig
from tests.storeutil import access, edge, insert, node

SEQUENCES = 24
STEPS = 12
REAL_KILLS = 2  # real SIGKILLs per test run (each starts an interpreter); the other kills are in-process
SHRINK_SECONDS = 20
MAX_SHRINKS = 25
NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
EMBEDDER = default_embedder()
_real_kills_left = [REAL_KILLS]
_real_attempts_left = [2 * REAL_KILLS]  # a night with fewer writes than k runs through: tried again, this often at most


# -- the fleet ---------------------------------------------------------------------------------------
@dataclass
class Fleet:
    scopes: list[Scope]
    config: ConsolidationConfig
    runs_dir: Path
    as_of: datetime = NOW
    steps: list[str] = field(default_factory=list)  # what ran, for the failure message

    @property
    def paths(self) -> list[str]:
        return [s.path for s in self.scopes]


def _vec(labels: list[str]) -> list[str]:
    return ["[" + ",".join(f"{x:.7f}" for x in v) + "]" for v in EMBEDDER.embed(labels)]


def build_scope(store, scope: Scope, data) -> None:
    """Hubs (recent, connected, some read twice: strengthen), weak old orphans (prune), expired
    working nodes with edges (TTL), some of them used by recall (holds, the gate), all embedded."""
    n_hubs = data.draw(st.integers(3, 12), label="hubs")
    n_weak = data.draw(st.integers(0, 8), label="weak")
    n_expired = data.draw(st.integers(0, 4), label="expired")
    n_used = data.draw(st.integers(0, n_expired), label="used")
    n_used_weak = data.draw(st.integers(0, min(n_weak, 2)), label="used weak")
    prefixes = ("project", "topic")
    hubs = [node(scope, f"{prefixes[i % 2]}: hub {i} {scope.levels[-1][1]}", NOW - timedelta(hours=3 + i),
                 importance=6.0 + (i % 4) * 0.5) for i in range(n_hubs)]
    weak = [node(scope, f"trivia: weak {i}", NOW - timedelta(days=30 + i), importance=2.0) for i in range(n_weak)]
    expired = [node(scope, f"note: scratch {i}", NOW - timedelta(hours=2), layer="working", properties={"ttl_hours": 1})
               for i in range(n_expired)]
    nodes = [*hubs, *weak, *expired]
    insert(store, "memory_nodes", nodes)
    with store.pg() as con:
        con.cursor().executemany("UPDATE memory_nodes SET embedding = %s::vector, embedding_model = %s WHERE id = %s",
                                 [(v, EMBEDDER.name, n["id"]) for v, n in zip(_vec([n["label"] for n in nodes]), nodes,
                                                                             strict=True)])
        con.commit()
    edges = [edge(scope, hubs[i]["id"], hubs[i + 1]["id"], at=NOW - timedelta(hours=3)) for i in range(n_hubs - 1)]
    edges += [edge(scope, hubs[i % n_hubs]["id"], x["id"], at=NOW - timedelta(hours=2)) for i, x in enumerate(expired)]
    for i, w in enumerate(weak):  # some weak nodes hang off a hub by one edge (still orphans: degree 1)
        if data.draw(st.booleans(), label=f"weak {i} tied"):
            edges.append(edge(scope, w["id"], hubs[i % n_hubs]["id"], at=NOW - timedelta(days=30)))
    insert(store, "memory_edges", edges)
    insert(store, "memory_access_log", [access(scope, h["id"], NOW - timedelta(minutes=m)) for h in hubs[:3] for m in (5, 30)])
    used = expired[:n_used] + weak[:n_used_weak]
    if used:
        insert(store, "recall_events", [{
            "id": str(uuid.uuid4()), "scope_path": scope.path, "tenant_id": scope.tenant_id, "query": u["label"],
            "node_id": u["id"], "similarity": 0.9, "score": 0.8, "features": [0.0] * 12, "label": 1.0,
            "label_source": "explicit", "created_at": NOW - timedelta(hours=1)} for u in used])


def fleet_config(data) -> ConsolidationConfig:
    holds = data.draw(st.sampled_from([
        {},  # the defaults: 5 % / 500, used nodes, SOUL
        {"max_delete_share": 1.0, "used_deletes": False},  # only the gate holds
        {"max_delete_share": 1.0, "max_deletes": 2},
        {"max_delete_share": 0.2},
        {"enabled": False},
    ]), label="holds")
    gate = data.draw(st.sampled_from([2.0, 0.0, 100.0]), label="gate.max_drop_pp")
    members = data.draw(st.sampled_from([2, 3, 10]), label="meta_nodes.max_members")
    return ConsolidationConfig(holds=holds, gate={"max_drop_pp": gate}, meta_nodes={"min_group": 2, "max_members": members})


# -- invariants --------------------------------------------------------------------------------------
def _rows(con, sql: str, *params) -> list[tuple]:
    return con.execute(sql, params).fetchall()


def check_invariants(store, fleet: Fleet) -> None:
    paths, cap = fleet.paths, fleet.config.meta_nodes.max_members
    where = f"after {' → '.join(fleet.steps)}"
    with store.pg() as con:
        dangling = _rows(con, "SELECT e.id::text, e.relation FROM memory_edges e WHERE e.scope_path = ANY(%s) AND NOT ("
                              " EXISTS (SELECT 1 FROM memory_nodes n WHERE n.id = e.source_id AND n.scope_path = e.scope_path)"
                              " AND EXISTS (SELECT 1 FROM memory_nodes n WHERE n.id = e.target_id AND n.scope_path = e.scope_path))",
                         paths)
        assert not dangling, f"edges without a node {where}: {dangling}"
        dup = _rows(con, "SELECT scope_path, source_id, target_id, relation, count(*) FROM memory_edges WHERE scope_path = ANY(%s)"
                         " GROUP BY 1, 2, 3, 4 HAVING count(*) > 1", paths)
        assert not dup, f"duplicate edge keys {where}: {dup}"
        over = _rows(con, "SELECT n.label, count(*) FROM memory_nodes n JOIN memory_edges e ON e.source_id = n.id"
                          " AND e.scope_path = n.scope_path AND e.relation = 'CLUSTERS' WHERE n.scope_path = ANY(%s)"
                          " AND n.label LIKE 'META:%%' GROUP BY n.id, n.label HAVING count(*) > %s", paths, cap)
        assert not over, f"META nodes over their cap of {cap} CLUSTERS edges {where}: {over}"
        # the ledger: hold_status from the held rows and the rows decided (decisions are by row: issue 37)
        runs = _rows(con, "SELECT r.run_id::text, r.mode, r.status, r.held, r.hold_status,"
                          " coalesce(jsonb_object_agg(d.decision, d.n) FILTER (WHERE d.decision IS NOT NULL), '{}'::jsonb),"
                          " (SELECT coalesce(jsonb_agg(DISTINCT c.phase), '[]'::jsonb) FROM consolidation_decisions c"
                          "  WHERE c.run_id = r.run_id)"
                          " FROM consolidation_runs r LEFT JOIN (SELECT run_id, decision, count(*) AS n"
                          "  FROM consolidation_decided_rows GROUP BY 1, 2) d USING (run_id)"
                          " WHERE r.scope_path = ANY(%s) GROUP BY r.run_id", paths)
        for run_id, mode, status, held, hold_status, decided, decided_phases in runs:
            if status == "failed":
                continue
            phases = held.get("phases", {}) if held else {}
            if not phases:
                assert hold_status == "none" and not decided, (run_id, mode, hold_status, decided, where)
                continue
            assert set(decided_phases) <= set(phases), (run_id, decided_phases, phases, where)
            n, total = sum(decided.values()), sum(phases.values())
            assert n <= total, (run_id, decided, phases, where)
            want = ("pending" if not n else "partial" if n < total
                    else "approved" if set(decided) == {"approved"} else "rejected" if set(decided) == {"rejected"}
                    else "decided")
            assert hold_status == want, f"run {run_id}: hold_status {hold_status}, its decided rows {decided} of {phases} {where}"
        bad = _rows(con, "SELECT d.run_id::text, d.phase FROM consolidation_decisions d JOIN consolidation_runs r USING (run_id)"
                         " LEFT JOIN consolidation_runs a ON a.run_id = d.approval_run_id WHERE r.scope_path = ANY(%s) AND"
                         " (d.decision = 'approved') <> (a.run_id IS NOT NULL AND a.mode = 'approve'"
                         " AND a.approval_of = d.run_id AND a.status <> 'failed')", paths)
        assert not bad, f"decisions without (or with a stray) approval run {where}: {bad}"
        orphan_undone = _rows(con, "SELECT r.run_id::text FROM consolidation_runs r WHERE r.scope_path = ANY(%s) AND r.status = 'undone'"
                                   " AND NOT EXISTS (SELECT 1 FROM consolidation_runs u WHERE u.undo_of = r.run_id"
                                   " AND u.mode = 'undo')", paths)
        assert not orphan_undone, f"undone runs without an undo row {where}: {orphan_undone}"
        # the archive: every run's deletes are its archived before-images, and none of an applied run is live
        counts = _rows(con, "SELECT r.run_id::text, t.key, coalesce((t.value ->> 'deletes')::bigint, 0),"
                            " (SELECT count(*) FROM consolidation_archive a WHERE a.run_id = r.run_id AND a.table_name = t.key"
                            "  AND a.op = 'delete')"
                            " FROM consolidation_runs r, jsonb_each(r.rows_changed) t WHERE r.scope_path = ANY(%s)"
                            " AND r.mode <> 'undo' AND r.status <> 'failed'", paths)
        wrong = [c for c in counts if c[2] != c[3]]
        assert not wrong, f"(run, table, deletes, archived) that disagree {where}: {wrong}"
        for table in ("memory_nodes", "memory_edges"):
            back = _rows(con, f"SELECT a.run_id::text, a.row_id FROM consolidation_archive a JOIN consolidation_runs r USING (run_id)"
                              f" JOIN {table} t ON t.id::text = a.row_id AND t.scope_path = r.scope_path"
                              " WHERE r.scope_path = ANY(%s) AND r.status = 'applied' AND a.op = 'delete' AND a.table_name = %s",
                         paths, table)
            assert not back, f"{table} rows archived as deleted by an applied run but live {where}: {back}"
    check_queue(store, fleet)


# -- steps -------------------------------------------------------------------------------------------
class Killed(BaseException):
    """Raised inside the apply's transaction: the process "dies" there (no ``except Exception`` catches it)."""


@contextmanager
def dying_after(k: int):
    real, calls = apply_mod._write, [0]

    def dying(cur, s, guarded, fast):
        got = real(cur, s, guarded, fast)
        calls[0] += 1
        if calls[0] == k:
            raise Killed(s.sql[:60] if s.sql else s.step)
        return got

    apply_mod._write = dying
    try:
        yield
    finally:
        apply_mod._write = real


CRASHER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import deep_sleep.run.apply as ap
    from deep_sleep.run import pipeline
    from deep_sleep.store.db import Store
    from deep_sleep.transforms.config import ConsolidationConfig

    dsn, scopes, runs, marker, after, as_of, config = sys.argv[1:8]
    scopes, after, marker = scopes.split(","), int(after), Path(marker)
    real, calls = ap._write, []

    def pausing(cur, s, guarded, fast):
        got = real(cur, s, guarded, fast)
        calls.append(s.step)
        if len(calls) == after:
            marker.write_text(s.step)
            time.sleep(600)  # inside the open transaction, until the test kills us
        return got

    ap._write = pausing
    pipeline.consolidate(Store(dsn), scopes, as_of, ConsolidationConfig.model_validate_json(config), runs_dir=runs)
    """
)


def _ledger_count(store, fleet: Fleet) -> int:
    with store.pg() as con:
        return con.execute("SELECT count(*) FROM consolidation_runs WHERE scope_path = ANY(%s)", (fleet.paths,)).fetchone()[0]


def _store_rows(store, fleet: Fleet) -> list:
    """Every row of the fleet's graph, its ledger and its archive (a kill must leave them as they were)."""
    with store.pg() as con:
        out = [con.execute(f"SELECT coalesce(array_agg(to_jsonb(t)::text ORDER BY t.id), '{{}}') FROM {table} t"
                           " WHERE scope_path = ANY(%s)", (fleet.paths,)).fetchone()[0]
               for table in ("memory_nodes", "memory_edges")]
        out += [con.execute(f"SELECT coalesce(array_agg(to_jsonb(t)::text ORDER BY t.run_id), '{{}}') FROM consolidation_runs t"
                            " WHERE scope_path = ANY(%s)", (fleet.paths,)).fetchone()[0],
                con.execute("SELECT count(*) FROM consolidation_archive a JOIN consolidation_runs r USING (run_id)"
                            " WHERE r.scope_path = ANY(%s)", (fleet.paths,)).fetchone()[0]]
    return out


def step_kill(store, fleet: Fleet, data) -> str:
    k = data.draw(st.integers(1, 6), label="kill after k writes")
    scopes = _night_scopes(fleet, data)
    before, runs_before = _store_rows(store, fleet), _ledger_count(store, fleet)
    fleet.as_of += timedelta(hours=data.draw(st.integers(1, 30), label="hours"))
    if _real_kills_left[0] > 0 and _real_attempts_left[0] > 0:
        _real_attempts_left[0] -= 1
        k = 1  # killed at its first write; two fresh reads of a node make sure the night writes (strengthen's
        scope = Scope.parse(scopes[0])  # update, which no hold or gate keeps back)
        with store.pg() as con:
            hub = con.execute("SELECT id::text FROM memory_nodes WHERE scope_path = %s AND layer = 'semantic' ORDER BY label, id"
                              " LIMIT 1", (scope.path,)).fetchone()
        if hub:
            insert(store, "memory_access_log", [access(scope, hub[0], fleet.as_of - timedelta(minutes=m)) for m in (5, 30)])
        before, runs_before = _store_rows(store, fleet), _ledger_count(store, fleet)
        done = _sigkill_night(store, fleet, scopes, k)
        _real_kills_left[0] -= not done
        how = "SIGKILL"
    else:
        with dying_after(k):
            try:
                _night(store, fleet, scopes)
                done = True  # fewer than k writes: the night ran through
            except Killed:
                done = False
        how = "raise"
    if not done:
        assert _store_rows(store, fleet) == before, f"a night killed ({how}) after {k} writes changed the store"
        assert _ledger_count(store, fleet) == runs_before
    return f"kill({how}, k={k}, {'ran through' if done else 'killed'})"


def _sigkill_night(store, fleet: Fleet, scopes: list[str], k: int) -> bool:
    tmp = Path(tempfile.mkdtemp(prefix="ds-kill-"))
    marker = tmp / "in-transaction"
    script = tmp / "crash.py"
    script.write_text(CRASHER)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, str(script), store.dsn, ",".join(scopes), str(fleet.runs_dir), str(marker),
                             str(k), fleet.as_of.isoformat(), fleet.config.model_dump_json()], env=env)
    try:
        deadline = time.monotonic() + 120
        while not marker.exists():
            if proc.poll() is not None:
                assert proc.returncode == 0, f"the night's process failed ({proc.returncode})"
                return True  # fewer than k writes: it ran through
            assert time.monotonic() < deadline, "the applying process never reached the pause point"
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    deadline = time.monotonic() + 30  # Postgres notices the dead backend and rolls its transaction back
    with store.pg(autocommit=True) as con:
        while con.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
                          " AND state LIKE 'idle in transaction%%'").fetchone()[0] and time.monotonic() < deadline:
            time.sleep(0.05)
    return False


def _night_scopes(fleet: Fleet, data) -> list[str]:
    if len(fleet.paths) > 1 and data.draw(st.booleans(), label="one scope only"):
        return [data.draw(st.sampled_from(fleet.paths), label="scope")]
    return fleet.paths


def _night(store, fleet: Fleet, scopes: list[str]) -> None:
    state = pipeline.consolidate(store, scopes, fleet.as_of, fleet.config, runs_dir=fleet.runs_dir)
    _check_reports(state)


def _check_reports(state) -> None:
    bad = {s: r.errors for s, r in state.reports.items() if r.status != "applied"}
    assert not bad, f"nights that did not apply: {bad}"


def step_night(store, fleet: Fleet, data) -> str:
    """A plain night; a racing one (a write between its snapshot and its apply: a live write, or a change
    to a row it deletes); or a racing swap (a member lifted first, so phase 4 swaps a META node's
    members, then every edge the night deletes changed before its apply)."""
    scopes = _night_scopes(fleet, data)
    fleet.as_of += timedelta(hours=data.draw(st.integers(1, 30), label="hours"))
    mode = data.draw(st.sampled_from(["plain", "racing", "swap"]), label="night")
    if mode == "plain":
        _night(store, fleet, scopes)
        return f"night({len(scopes)})"
    lifted = step_live(store, fleet, data, kind="lift") + ", " if mode == "swap" else ""
    ctx = pipeline.Context.of(fleet.as_of, fleet.config, scopes=scopes, store=store,
                              base=fleet.runs_dir / f"racing-{uuid.uuid4().hex[:8]}")
    planned = pipeline.run(pipeline.PLAN, ctx)
    doomed = sorted((t, i) for t in ("memory_nodes", "memory_edges")
                    for i in planned.tonight.table(t).deletes.get_column("id").cast(str).to_list())
    ends = _new_edge_ends(store, planned) if mode == "racing" else []
    rows, what = None, None
    if mode == "swap":
        rows = [(t, i) for t, i in doomed if t == "memory_edges"]
    elif ends and data.draw(st.booleans(), label="delete a node a new edge needs"):
        _delete_node(store, data.draw(st.sampled_from(ends), label="node a new edge needs"))
        what = "deleted a node a new edge needs"
    elif doomed and data.draw(st.booleans(), label="touch a row it deletes"):
        rows = [data.draw(st.sampled_from(doomed), label="doomed row")]
    if what is None and rows is None:
        what = step_live(store, fleet, data)
    elif rows is not None:
        with store.pg() as con:
            for table, rid in rows:
                con.execute(f"UPDATE {table} SET properties = properties || '{{\"touched\": 1}}' WHERE id = %s", (rid,))
            con.commit()
        what = f"touched {len(rows)} row(s) it deletes"
    _check_reports(pipeline.run((pipeline.Apply(),), ctx, planned))
    return f"{mode} night({len(scopes)}, {lifted}{what})"


def _new_edge_ends(store, planned) -> list[str]:
    """The stored nodes (not ones the night inserts) that an edge the night inserts needs."""
    new = planned.tonight.table("memory_edges").inserts
    if not new.height:
        return []
    ends = sorted(set(new.get_column("source_id").cast(str).to_list()) | set(new.get_column("target_id").cast(str).to_list()))
    if not ends:
        return []
    with store.pg() as con:
        return [r[0] for r in con.execute("SELECT id::text FROM memory_nodes WHERE id = ANY(%s::uuid[]) ORDER BY id", (ends,))]


def _delete_node(store, node_id: str) -> None:
    """A live writer deletes a node by plain SQL, with the edges that touch it (one that deleted only
    the node would leave its own edges dangling); any edge a night, an approval or an undo would add to
    it later must then be a conflict (issue 37)."""
    with store.pg() as con:
        con.execute("DELETE FROM memory_edges WHERE source_id = %s OR target_id = %s", (node_id, node_id))
        con.execute("DELETE FROM memory_nodes WHERE id = %s", (node_id,))
        con.commit()


def step_live(store, fleet: Fleet, data, kind: str | None = None) -> str:
    scope = data.draw(st.sampled_from(fleet.scopes), label="live scope")
    at = fleet.as_of
    with store.pg() as con:
        nodes = [r[0] for r in con.execute("SELECT id::text FROM memory_nodes WHERE scope_path = %s ORDER BY label, id",
                                           (scope.path,))]
        edges = [r[0] for r in con.execute("SELECT id::text FROM memory_edges WHERE scope_path = %s ORDER BY relation, source_id,"
                                           " target_id", (scope.path,))]
        clusters = [r[0] for r in con.execute("SELECT id::text FROM memory_edges WHERE scope_path = %s AND relation = 'CLUSTERS'"
                                              " ORDER BY source_id, target_id", (scope.path,))]
        # lifted into the top of its group, a node its META node does not cluster yet makes phase 4 swap members
        members = [r[0] for r in con.execute(
            "SELECT n.id::text FROM memory_nodes n WHERE n.scope_path = %s AND n.layer = 'semantic' AND n.label NOT LIKE 'META:%%'"
            " AND NOT EXISTS (SELECT 1 FROM memory_edges e WHERE e.scope_path = n.scope_path AND e.target_id = n.id"
            " AND e.relation = 'CLUSTERS') ORDER BY EXISTS (SELECT 1 FROM memory_nodes m WHERE m.scope_path = n.scope_path"
            " AND m.label = 'META:' || split_part(n.label, ':', 1)) DESC, n.label, n.id", (scope.path,))]
    kinds = (["new node"] + (["new edge", "node bump", "turn", "node delete"] if nodes else []) + (["lift"] if members else [])
             + (["edge bump"] if edges else []))
    kind = kind if kind in kinds else data.draw(st.sampled_from(kinds), label="live write")
    with store.pg() as con:
        if kind == "new edge":
            a, b = (data.draw(st.sampled_from(nodes), label=f"end {i}") for i in range(2))
            relation = data.draw(st.sampled_from(["RELATED_TO", "MENTIONS"]), label="relation")
            con.execute("INSERT INTO memory_edges (id, scope_path, tenant_id, source_id, target_id, relation, created_at, updated_at)"
                        " VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING",
                        (str(uuid.uuid4()), scope.path, scope.tenant_id, a, b, relation, at, at))
        elif kind == "new node":
            prefix = data.draw(st.sampled_from(["project", "topic", "trivia"]), label="prefix")
            importance = data.draw(st.sampled_from([3.0, 9.0]), label="importance")  # 9: into its group's top members
            new = node(scope, f"{prefix}: live {uuid.uuid4().hex[:6]}", at)
            con.execute("INSERT INTO memory_nodes (id, scope_path, tenant_id, layer, label, importance, created_at, updated_at)"
                        " VALUES (%s, %s, %s, 'semantic', %s, %s, %s, %s)",
                        (new["id"], scope.path, scope.tenant_id, new["label"], importance, at, at))
            if nodes:
                con.execute("INSERT INTO memory_edges (id, scope_path, tenant_id, source_id, target_id, relation)"
                            " VALUES (%s, %s, %s, %s, %s, 'MENTIONS')", (str(uuid.uuid4()), scope.path, scope.tenant_id,
                                                                       new["id"], data.draw(st.sampled_from(nodes), label="to")))
        elif kind == "node bump":  # a property, or the importance (which moves the node in or out of its META's top)
            importance = data.draw(st.sampled_from([None, 1.0, 9.5]), label="importance")
            con.execute("UPDATE memory_nodes SET properties = properties || '{\"touched\": 1}',"
                        " importance = coalesce(%s, importance) WHERE id = %s",
                        (importance, data.draw(st.sampled_from(nodes), label="node")))
        elif kind == "lift":  # a node rises to the top of its group: phase 4 swaps it into its META node's members
            lifted = members[0] if data.draw(st.booleans(), label="of a clustered group") else data.draw(
                st.sampled_from(members), label="lifted")  # members: nodes of groups with a META node first
            con.execute("UPDATE memory_nodes SET importance = %s WHERE id = %s",
                        (data.draw(st.sampled_from([9.5, 9.7]), label="importance"), lifted))
        elif kind == "node delete":  # by plain SQL, with its edges: later inserts of edges to it are conflicts
            con.commit()
            _delete_node(store, data.draw(st.sampled_from(nodes), label="deleted node"))
        elif kind == "edge bump":  # often a CLUSTERS edge: the one a night may be about to drop
            pool = clusters if clusters and data.draw(st.booleans(), label="a CLUSTERS edge") else edges
            con.execute("UPDATE memory_edges SET weight = weight + 0.5 WHERE id = %s", (data.draw(st.sampled_from(pool), label="edge"),))
        con.commit()
    if kind == "turn":
        with store.pg() as con:
            label = con.execute("SELECT label FROM memory_nodes WHERE id = %s", (data.draw(st.sampled_from(nodes), label="node"),)
                                ).fetchone()[0]
        record_turn(store, scope, [{"op": "upsert_node", "label": label, "importance": 6.0}], now=at, nap=False,
                    config=fleet.config)
    return f"live({kind})"


def _runs(store, fleet: Fleet, where: str = "TRUE") -> list[tuple[str, str, str]]:
    with store.pg() as con:
        return [tuple(r) for r in con.execute(
            f"SELECT run_id::text, mode, hold_status FROM consolidation_runs WHERE scope_path = ANY(%s) AND {where}"
            " ORDER BY started_at, scope_path, mode", (fleet.paths,))]


def step_decide(store, fleet: Fleet, data, verb: str) -> str:
    pending = _runs(store, fleet, "hold_status IN ('pending', 'partial') AND status = 'applied'")
    pool = pending if pending and data.draw(st.integers(0, 4), label="any run") else _runs(store, fleet)
    if not pool:
        return f"{verb}(nothing)"
    run_id, mode, status = data.draw(st.sampled_from(pool), label="run")
    phase = None
    if status in ("pending", "partial") and data.draw(st.booleans(), label="one phase"):
        h = read_holds(store, run_id)
        phase = data.draw(st.sampled_from(sorted(h.phases)), label="phase")  # a decided one is refused
    try:
        if verb == "approve":
            d = approve(store, run_id, phase=phase, config=fleet.config)
            return f"approve({mode}, {phase or 'all'}: {d.applied}, {d.conflicts} conflicts)"
        reject(store, run_id, phase=phase)
        return f"reject({mode}, {phase or 'all'})"
    except HoldError as exc:  # refused, by name: nothing was written (the invariants check the store)
        return f"{verb}(refused: {str(exc)[:60]})"


def step_undo(store, fleet: Fleet, data) -> str:
    pool = _runs(store, fleet)
    if len(pool) > 3 and data.draw(st.booleans(), label="a recent run"):
        pool = pool[-3:]
    if not pool:
        return "undo(nothing)"
    run_id, mode, _ = data.draw(st.sampled_from(pool), label="run")
    try:
        result = undo(store, run_id, fleet.config)
    except UndoError as exc:
        return f"undo({mode} refused: {str(exc)[:60]})"
    return f"undo({mode}: {result.reverted}, {result.not_restored.height} not restored)"


# -- decisions by reason and supersession (issue 37 items 2-4) -------------------------------------
# A bulk decision of one reason over the fleet (`deep-sleep approve|reject --reason R --scope <tenant>`),
# and the queue's invariants after every step: one current run per scope and phase (the newest that
# held it, pending or decided), counted rows = the current runs' undecided rows; no approved row of a
# (run, phase) that a newer run had superseded when it was approved; a decision by reason takes rows
# of other reasons only as the closure's.
def check_queue(store, fleet: Fleet) -> None:
    from deep_sleep.jobs.queue import Selection, pending

    where = f"after {' → '.join(fleet.steps)}"
    root = fleet.scopes[0].parent or fleet.scopes[0]
    every = pending(store, Selection(scope=root), include_superseded=True)
    current = every.filter(pl.col("superseded_by").is_null())
    dup = current.group_by("scope_path", "phase").len().filter(pl.col("len") > 1)
    assert not dup.height, f"more than one current run per scope and phase {where}: {dup.to_dicts()}"
    with store.pg() as con:
        newest = {(s, p): r for s, p, r in _rows(
            con, "SELECT DISTINCT ON (r.scope_path, p.phase) r.scope_path, p.phase, r.run_id::text FROM consolidation_runs r,"
                 " jsonb_object_keys(r.held -> 'phases') p(phase) WHERE r.scope_path = ANY(%s) AND r.status = 'applied'"
                 " AND r.mode NOT IN ('approve', 'undo') ORDER BY r.scope_path, p.phase, r.as_of DESC, r.started_at DESC",
            fleet.paths)}
        stale = _rows(con, "SELECT d.run_id::text, d.phase, d.row_id FROM consolidation_decided_rows d"
                           " JOIN consolidation_decisions c ON c.decision_id = d.decision_id AND c.run_id = d.run_id"
                           " AND c.phase = d.phase JOIN consolidation_runs r ON r.run_id = d.run_id"
                           " WHERE r.scope_path = ANY(%s) AND d.decision = 'approved' AND EXISTS ("
                           "  SELECT 1 FROM consolidation_runs n WHERE n.scope_path = r.scope_path AND n.status = 'applied'"
                           "  AND n.mode NOT IN ('approve', 'undo') AND (n.as_of, n.started_at) > (r.as_of, r.started_at)"
                           "  AND n.held -> 'phases' ? d.phase AND n.finished_at < c.decided_at)", fleet.paths)
    for run_id, path, phase in current.select("run_id", "scope_path", "phase").iter_rows():
        assert newest[(path, phase)] == run_id, f"run {run_id} current for {phase} but {newest[(path, phase)]} is newer {where}"
    assert not stale, f"approved rows of superseded runs {where}: {stale}"


def step_decide_by_reason(store, fleet: Fleet, data, verb: str) -> str:
    from deep_sleep.jobs.queue import Selection, decide, grouped, pending

    root = fleet.scopes[0].parent or fleet.scopes[0]
    queue = pending(store, Selection(scope=root))
    reasons = sorted(grouped(queue)["reason"].get_column("reason").to_list()) if queue.height else []
    if not reasons:
        return f"{verb}_reason(nothing)"
    reason = data.draw(st.sampled_from(reasons), label="reason")
    before = grouped(queue)["reason"]
    out = decide(store, verb, Selection(reason=reason, scope=root), decided_by="seq")
    with store.pg() as con:
        other = _rows(con, "SELECT row_id, reason FROM consolidation_decided_rows WHERE decision_id = ANY(%s::uuid[])"
                           " AND NOT closure AND reason <> %s", [d.decision_id for d in out.decided], reason)
    assert not other, f"{verb} --reason {reason} took rows of other reasons as selected: {other}"
    after = grouped(pending(store, Selection(scope=root)))["reason"]
    untouched = {r: m for r, _, m in before.iter_rows() if r != reason}
    closure: dict[str, int] = {}
    current = set(queue.select("run_id", "phase").iter_rows())
    for row in out.closure:  # the closure's rows of current phases (a rejection's may reach expired ones)
        if (row["run_id"], row["phase"]) in current:
            closure[row["reason"]] = closure.get(row["reason"], 0) + 1
    for r, m in untouched.items():  # other reasons lose only the closure's rows
        left = dict((x, z) for x, _, z in after.iter_rows()).get(r, 0)
        assert left == m - closure.get(r, 0) or out.refused, (verb, reason, r, m, left, closure, out.refused)
    return f"{verb}_reason({reason}: {len(out.decided)} run(s), {len(out.closure)} closure row(s), {len(out.refused)} refused)"
# -- end of decisions by reason and supersession -----------------------------------------------------


STEP_KINDS = ("night", "night", "night", "live", "live", "approve", "approve", "reject", "undo", "kill",
              "approve_reason", "reject_reason")


@pytest.fixture
def bounded_shrinking(monkeypatch):
    """A failing sequence shrinks for at most SHRINK_SECONDS and MAX_SHRINKS steps, not Hypothesis's 300 s."""
    from hypothesis.internal.conjecture import engine

    monkeypatch.setattr(engine, "MAX_SHRINKING_SECONDS", SHRINK_SECONDS)
    monkeypatch.setattr(engine, "MAX_SHRINKS", MAX_SHRINKS)


@settings(max_examples=SEQUENCES, deadline=None, report_multiple_bugs=False,
          phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_random_sequences_keep_the_graph_the_ledger_and_the_archive_consistent(store, bounded_shrinking, data):
    tenant = f"q{uuid.uuid4().hex[:10]}"
    n = data.draw(st.integers(1, 4), label="scopes")
    scopes = [Scope.root("org", tenant).child("brand", f"b{i}") for i in range(n)]
    runs_dir = Path(tempfile.mkdtemp(prefix="ds-seq-"))
    fleet = Fleet(scopes, fleet_config(data), runs_dir)
    try:
        for s in scopes:
            build_scope(store, s, data)
        check_invariants(store, fleet)
        fleet.steps.append("night")  # every sequence starts with a night: the holds, runs and archive exist
        _night(store, fleet, fleet.paths)
        check_invariants(store, fleet)
        for _ in range(data.draw(st.integers(STEPS // 2, STEPS - 1), label="steps")):
            kind = data.draw(st.sampled_from(STEP_KINDS), label="step")
            fleet.steps.append(kind)
            if kind == "night":
                fleet.steps[-1] = step_night(store, fleet, data)
            elif kind == "live":
                fleet.steps[-1] = step_live(store, fleet, data)
            elif kind in ("approve", "reject"):
                fleet.steps[-1] = step_decide(store, fleet, data, kind)
            elif kind in ("approve_reason", "reject_reason"):
                fleet.steps[-1] = step_decide_by_reason(store, fleet, data, kind.split("_")[0])
            elif kind == "undo":
                fleet.steps[-1] = step_undo(store, fleet, data)
            else:
                fleet.steps[-1] = step_kill(store, fleet, data)
            check_invariants(store, fleet)
    finally:
        shutil.rmtree(runs_dir, ignore_errors=True)
