"""The shard apply alone, per statement, on fresh clones of the benchmark fleet (issue 12).

    python -m benchmarks.fleet --scopes 2000 --nodes 100 --sample 100   # seeds deep_sleep_fleet once
    python -m benchmarks.apply_shard --trials 2 [--batch-scopes 500] [--explain] [--max-shards K] [--no-fast-inserts]

Plans the night of ``benchmarks.fleet`` once (gating, shards, extract → transform → validate on the
fleet ``deep_sleep_fleet`` as it stands), then per trial clones the fleet afresh into
``deep_sleep_fleet_apply`` and applies every shard with :func:`deep_sleep.run.apply.apply` (what
the plain night's apply stage runs), printing the seconds per statement kind summed over the batches,
the WAL the apply wrote (bytes, full-page images) and the node and edge tables' updates and how many
of them were HOT (``pg_stat_user_tables``).  ``--fleet NAME`` clones another seeded database instead
(e.g. a copy of the fleet rewritten with other storage settings, to compare the two back to back).
``--explain`` also runs the first batch's statements once inside a transaction that is rolled back,
each write under ``EXPLAIN (ANALYZE, BUFFERS, WAL)``, and prints the plans.  Writes nothing into
``bench-results.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.cpu import proc_cpu


def _p(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def plan_night(store, as_of: datetime, work: Path, shard_rows: int, shard_scopes: int,
               max_shards: int | None = None) -> list:
    """The night's shards (as ``benchmarks.fleet.shard_night`` plans them), each as the (diff, reports,
    quarantined rows) its apply is given; ``max_shards``: only the first K (a 100k-scope fleet's
    night is 74 shards)."""
    from deep_sleep.transforms.config import ConsolidationConfig

    from deep_sleep.jobs.gating import due_scopes, shards_of
    from deep_sleep.run import pipeline

    config = ConsolidationConfig()
    due = [g for g in due_scopes(store, as_of, config.gating) if g.due]
    out = []
    for i, scopes in enumerate(shards_of([(g.scope_path, g.rows) for g in due], shard_rows, shard_scopes)[:max_shards]):
        ctx = pipeline.Context.of(as_of, config, scopes=scopes, store=store, base=work / f"shard-{i:05d}", holds=False)
        v = pipeline.run(tuple(s for s in pipeline.PLAN if s.name in ("extract", "transform", "validate")), ctx)
        out.append((v.tonight, dict(v.reports), v.transformed.quarantined))
    return out


def _plain(value):
    """``value`` with every mapping a dict (a report's read-only mappings do not pickle)."""
    import types

    if isinstance(value, (dict, types.MappingProxyType)):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_plain(v) for v in value)
    return value


def save_plan(path: Path, shards: list) -> None:
    import dataclasses
    import pickle

    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(pickle.dumps([
        ({n: td.frames() for n, td in diff.tables.items()},
         {s: {f.name: _plain(getattr(r, f.name)) for f in dataclasses.fields(r)} for s, r in reports.items()}, q)
        for diff, reports, q in shards]))


def load_plan(path: Path) -> list:
    import pickle

    from deep_sleep.core.diff import Diff, TableDiff
    from deep_sleep.core.report import ConsolidationReport

    return [(Diff({n: TableDiff(**f) for n, f in d.items()}), {s: ConsolidationReport(**r) for s, r in rs.items()}, q)
            for d, rs, q in pickle.loads(path.read_bytes())]


class StepClock(dict):
    """Seconds per step (what apply_shard's ``step_seconds`` adds up) that also adds up, in ``cpu``, the
    CPU seconds the apply's server backend spent on each step — a measure the other load on a shared
    machine disturbs far less than wall time.  The backend is the one client session on ``database``.
    ``wal``: the bytes of WAL written during each step (the server's insert position, read from a
    second session: on the benchmark's own embedded server nothing else writes much)."""

    def __init__(self, store, database: str):
        super().__init__()
        self.store, self.database, self.cpu, self._pid, self._last = store, database, {}, None, 0.0
        self.wal: dict[str, int] = {}
        self._wal_con = store.pg(autocommit=True)
        self._wal_last = self._lsn()

    def _lsn(self) -> int:
        return int(self._wal_con.execute("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')").fetchone()[0])

    def _backend(self) -> int | None:
        with self.store.pg(autocommit=True) as con:
            row = con.execute("SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
                              " AND backend_type = 'client backend' ORDER BY backend_start DESC LIMIT 1",
                              (self.database,)).fetchone()
        return row[0] if row else None

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        if key == "plan":
            return
        lsn = self._lsn()
        self.wal[key] = self.wal.get(key, 0) + lsn - self._wal_last
        self._wal_last = lsn
        if key == "connect" or self._pid is None:
            pid = self._backend()
            if pid != self._pid:
                self._pid, self._last = pid, proc_cpu(pid) if pid else 0.0
            return
        try:
            now = proc_cpu(self._pid)
        except FileNotFoundError:
            self._pid = None
            return
        self.cpu[key] = self.cpu.get(key, 0.0) + now - self._last
        self._last = now


def apply_night(store, shards: list, batch_scopes: int, database: str,
                fast_inserts: bool = True, cluster_cap: int | None = None) -> tuple[float, StepClock, dict[str, int]]:
    """Every shard through apply_shard; (seconds, seconds and backend CPU per statement kind, statuses).
    ``cluster_cap``: as the night's apply stage passes it (``meta_nodes.max_members``)."""
    from deep_sleep.run.apply import apply as apply_shard

    steps = StepClock(store, database)
    statuses: dict[str, int] = {}
    with store.transaction() as cur:  # the night's process has its pooled connection already: not timed
        cur.execute("SELECT 1")
        cur.fetch_arrow_table()
    started = datetime.now(UTC)
    t0 = time.perf_counter()
    for diff, reports, q in shards:
        got = apply_shard(store, diff, reports, started_at=started,
                          quarantined=q if q.height else None, batch_scopes=batch_scopes, step_seconds=steps,
                          fast_inserts=fast_inserts, cluster_cap=cluster_cap)
        for r in got.values():
            statuses[r.status] = statuses.get(r.status, 0) + 1
    return time.perf_counter() - t0, steps, statuses


_WAL_SQL = "SELECT wal_bytes, wal_fpi FROM pg_stat_wal"
_UPDATES_SQL = ("SELECT relname, n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                " WHERE relname IN ('memory_nodes', 'memory_edges') ORDER BY relname")


def wal_now(store) -> tuple[int, int]:
    """(WAL bytes, full-page images) the server has written so far (pg_stat_wal, server-wide)."""
    with store.pg(autocommit=True) as con:
        con.execute("SELECT pg_stat_clear_snapshot()")
        b, f = con.execute(_WAL_SQL).fetchone()
    return int(b), int(f)


def hot_updates(store) -> dict[str, tuple[int, int]]:
    """(updates, HOT updates) per node and edge table of ``store`` — the clone's own counts, so the
    night's — once the apply's connection has flushed its statistics (asked to on its next commit;
    read again for up to ~3 s until the counts stop moving)."""
    with store.transaction() as cur:
        cur.execute("SELECT pg_stat_force_next_flush()")
        cur.fetch_arrow_table()
    last = None
    with store.pg(autocommit=True) as con:
        for _ in range(30):
            con.execute("SELECT pg_stat_clear_snapshot()")
            got = {r[0]: (r[1], r[2]) for r in con.execute(_UPDATES_SQL)}
            if got == last:
                break
            last = got
            time.sleep(0.1)
    return last or {}


def explain_first_batch(store, shard, batch_scopes: int) -> None:
    """The first batch's statements in one rolled-back transaction, each write under EXPLAIN (ANALYZE, BUFFERS, WAL)."""
    from deep_sleep.run import apply as ap

    diff, reports, _ = shard
    scopes = sorted(reports, key=str.encode)[:batch_scopes]
    diffs, _ = ap._batches(diff, None, sorted(reports, key=str.encode), batch_scopes, set())
    planned = ap.batch_statements(diffs[0], {s: reports[s] for s in scopes})
    with store.adbc() as con:
        cur = con.cursor()
        try:
            for s in planned.statements:
                t = time.perf_counter()
                if s.is_write:
                    # ADBC wraps a query in COPY … TO STDOUT, which EXPLAIN cannot be inside
                    cur.adbc_statement.set_options(**{"adbc.postgresql.use_copy": "false"})
                    cur.execute("EXPLAIN (ANALYZE, BUFFERS, WAL) " + s.sql)
                    plan = "\n".join(r[0] for r in cur.fetchall())
                    print(f"\n-- {ap._step_key(s)} ({s.rows} rows, {time.perf_counter() - t:.3f}s)\n{plan}")
                elif s.step == "ledger":
                    continue
                else:
                    ap._run(cur, s) if s.step != "lock" else (cur.execute(s.sql, parameters=ap._bind(s.params)),
                                                               cur.fetch_arrow_table())
                    print(f"-- {ap._step_key(s)}: {time.perf_counter() - t:.3f}s")
        finally:
            con.rollback()
            cur.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=2)
    ap.add_argument("--batch-scopes", type=int, default=500)
    ap.add_argument("--explain", action="store_true")
    ap.add_argument("--work", default="bench-data/apply_shard")
    ap.add_argument("--shard-rows", type=int, default=500_000)
    ap.add_argument("--shard-scopes", type=int, default=5_000)
    ap.add_argument("--plan-cache", help="a file: the planned night is read from it if it exists, else written to it")
    ap.add_argument("--no-fast-inserts", action="store_true",
                    help="every insert guarded (INSERT … ON CONFLICT DO NOTHING): apply(fast_inserts=False)")
    ap.add_argument("--no-cluster-cap", action="store_true",
                    help="new CLUSTERS edges not checked against meta_nodes.max_members (the night checks them)")
    ap.add_argument("--max-shards", type=int, default=None,
                    help="plan and apply only the night's first K shards (a 100k-scope fleet's night is 74)")
    ap.add_argument("--fleet", default="deep_sleep_fleet",
                    help="the seeded fleet database the trials clone (e.g. a copy with other storage settings)")
    ap.add_argument("--keep-clone", action="store_true",
                    help="keep the last trial's clone (deep_sleep_fleet_apply) for inspection; by default it is dropped")
    args = ap.parse_args(argv)

    import json

    from deep_sleep.store.db import Store, create_database, drop_database, embedded_dsn, with_database

    admin = os.environ.get("DEEP_SLEEP_BENCH_DSN") or embedded_dsn(
        data_dir=os.path.join(".deep_sleep", "bench-pgdata"), database="postgres")
    fleet = Store(with_database(admin, args.fleet))
    with fleet.pg() as con:
        row = con.execute("SELECT obj_description('memory_nodes'::regclass)").fetchone()
    if not row or not row[0]:
        raise SystemExit("no seeded fleet: run python -m benchmarks.fleet --scopes 2000 --nodes 100 first")
    as_of = datetime.fromisoformat(json.loads(row[0])["now"])
    from deep_sleep.transforms.config import ConsolidationConfig

    cap = ConsolidationConfig().meta_nodes.max_members
    t = time.perf_counter()
    cache = Path(args.plan_cache) if args.plan_cache else None
    if cache is not None and cache.exists():
        shards = load_plan(cache)
    else:
        shards = plan_night(fleet, as_of, Path(args.work), args.shard_rows, args.shard_scopes, args.max_shards)
        if cache is not None:
            save_plan(cache, shards)
    rows = sum(f.height for d, _, _ in shards for td in d.tables.values() for f in td.frames().values())
    _p(f"planned {sum(len(r) for _, r, _ in shards):,} scopes in {len(shards)} shard(s), {rows:,} diff rows, "
       f"in {time.perf_counter() - t:.1f}s")
    try:
        for trial in range(args.trials):
            store = create_database(admin, "deep_sleep_fleet_apply", template=args.fleet)
            with store.pg(autocommit=True) as con:
                con.execute("CHECKPOINT")  # the clone's copy is not charged to the apply
            if args.explain and trial == 0:
                explain_first_batch(store, shards[0], args.batch_scopes)
            own, wal = time.process_time(), wal_now(store)
            seconds, steps, statuses = apply_night(store, shards, args.batch_scopes, "deep_sleep_fleet_apply",
                                                     fast_inserts=not args.no_fast_inserts,
                                                     cluster_cap=None if args.no_cluster_cap else cap)
            own = time.process_time() - own
            hot = hot_updates(store)  # also has the apply's backend flush its WAL counts
            wal = tuple(a - b for a, b in zip(wal_now(store), wal))
            _p(f"trial {trial + 1}: apply {seconds:.2f}s wall, backend CPU {sum(steps.cpu.values()):.2f}s, "
               f"client CPU {own:.2f}s (batch_scopes={args.batch_scopes}) {statuses}")
            _p(f"    WAL {wal[0] / 2**20:,.0f} MB, {wal[1]:,} full-page images; "
               + ", ".join(f"{t} {u:,} updates, {h:,} HOT ({h / max(u, 1):.1%})" for t, (u, h) in hot.items()))
            print(f"    {'step':45s} {'wall':>8s} {'backend CPU':>12s} {'WAL MB':>8s}")
            for key, s in sorted(steps.items(), key=lambda kv: -kv[1]):
                print(f"    {key:45s} {s:7.3f}s {steps.cpu.get(key, 0.0):11.2f}s {steps.wal.get(key, 0) / 1e6:8.1f}")
    finally:  # a clone of the whole fleet (~18 GB for the 100k fleet): not left behind by a failed trial either
        if not args.keep_clone:
            drop_database(admin, "deep_sleep_fleet_apply")
    return 0


if __name__ == "__main__":
    sys.exit(main())
