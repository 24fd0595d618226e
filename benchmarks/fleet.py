"""A fleet night: many small scopes, against the raw cost of moving the same rows (issue 12).

    python -m benchmarks.fleet --scopes 100000 --nodes 100      # seeds once, then measures
    python -m benchmarks.fleet --scopes 2000 --sample 200        # a quick look

Seeds a fresh database ``deep_sleep_fleet`` on the embedded server (``.deep_sleep/bench-pgdata``;
``--reuse`` keeps a fleet of the same spec from an earlier run) with :func:`deep_sleep.dev.fleet.seed_fleet`,
then measures

- the raw baseline: every fleet row COPYed out to Arrow (ADBC ``fetch_arrow_table``, binary COPY)
  and back in (``adbc_ingest`` into temporary tables), table by table;
- the per-scope path (today's nightly without Prefect's own overhead: extract → plan → validate →
  apply for one scope at a time, in a plain loop) on a sample of ``--sample`` scopes, per stage;
  its seconds per scope extrapolated to the fleet is the night the per-scope design would take;

- the shard night (the nightly's own path without Prefect: gate → shards → per shard extract →
  transform → validate → apply through :mod:`deep_sleep.run.pipeline`), per stage, in a child
  process whose peak RSS is the night's memory;

and writes the figures into ``bench-results.json`` under ``fleet`` (other keys are kept).  The
per-scope sample runs first, so its scopes are consolidated once more by the night (a second run
at the same ``as_of`` that finds little new — the night is, if anything, flattered by them; they
are ``--sample`` of ``--scopes``).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

from benchmarks.run import copy_baseline


def _p(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _status_mb(field: str) -> float | None:
    """A memory figure of this process from ``/proc/self/status`` (``VmHWM``, ``VmRSS``), in MB; None
    off Linux."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        pass
    return None


def _peak_rss_mb() -> float:
    """This process's peak RSS.  ``VmHWM`` belongs to the address space, so a spawned child starts
    afresh; ``ru_maxrss`` (the fallback off Linux) survives ``execve`` and would report the parent's
    peak -- the COPY baseline's -- as the night's."""
    hwm = _status_mb("VmHWM")
    return hwm if hwm is not None else round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)


def seed(admin_dsn: str, spec, reuse: bool):
    """The fleet's store: reused when ``reuse`` and its recorded spec matches, else freshly seeded."""
    from deep_sleep.dev.fleet import seed_fleet
    from deep_sleep.store.db import create_database

    name = "deep_sleep_fleet"
    tag = json.dumps({"scopes": spec.scopes, "nodes": spec.nodes, "templates": spec.templates, "seed": spec.seed,
                      "recalls": spec.recalls, "recall_queries": spec.recall_queries,
                      "feedback_share": spec.feedback_share, "embedding_model": spec.embedding_model})
    if reuse:
        store = create_database(admin_dsn, name, replace=False)  # migrated, rows kept
        with store.pg() as con:
            row = con.execute("SELECT obj_description('memory_nodes'::regclass)").fetchone()
        if row and row[0] and json.loads(row[0]).get("fleet") == json.loads(tag):
            _p(f"reusing fleet {tag}")
            return store, json.loads(row[0])["now"]
        _p("no fleet of this spec to reuse; seeding")
    store = create_database(admin_dsn, name)
    t = time.perf_counter()
    counts = seed_fleet(store, spec, progress=lambda line: _p(f"  {line}"))
    with store.pg(autocommit=True) as con:
        con.execute("VACUUM ANALYZE")
        meta = json.dumps({"fleet": json.loads(tag), "now": spec.now.isoformat()})
        con.execute(f"COMMENT ON TABLE memory_nodes IS '{meta}'")
    _p(f"seeded {spec.scopes:,} scopes, {sum(counts.values()):,} rows in {time.perf_counter() - t:.1f}s")
    return store, spec.now.isoformat()


def fresh_sample(store, scopes: int, k: int) -> list[str]:
    """``k`` scopes spread over the fleet that the fleet itself (not a clone) has never consolidated.
    The sample is consolidated in the fleet before the nights are cloned from it, so on a ``--reuse``d
    fleet the same scopes would run a second night at the same ``as_of`` that finds little to do
    (183 against 462 ms/scope at 100k scopes): each run takes scopes that still have a first night's work."""
    from deep_sleep.dev.fleet import fleet_scope

    with store.pg() as con:
        done = {r[0] for r in con.execute("SELECT DISTINCT scope_path FROM consolidation_runs")}
    fresh = [p for p in (fleet_scope(i).path for i in range(scopes)) if p not in done]
    if len(fresh) < k:
        _p(f"  only {len(fresh):,} scopes of the fleet were never consolidated; seed it afresh for a sample of {k:,}")
    return fresh[:: max(1, len(fresh) // max(1, k))][:k]


def per_scope_path(store, scopes: list[str], as_of: datetime, work: Path) -> dict:
    """The per-scope path (each scope a shard of one: extract → transform → validate → apply, as the
    nightly ran before shards, without Prefect) in a plain loop over ``scopes``; seconds per stage and per scope."""
    from deep_sleep.transforms.config import ConsolidationConfig

    from deep_sleep.run import pipeline

    config = ConsolidationConfig()
    stages = dict.fromkeys(("extract", "transform", "validate", "apply"), 0.0)
    statuses: dict[str, int] = {}
    t0 = time.perf_counter()
    for i, scope in enumerate(scopes):
        run_id = str(uuid.uuid4())
        ctx = pipeline.Context.of(as_of, config, scopes=scope, store=store, base=work / f"s{i}" / run_id,
                                  run_ids={scope: run_id})
        state = pipeline.State()
        for stage in pipeline.NIGHT:
            if stage.name in stages:
                t = time.perf_counter()
                state = pipeline.step(stage, ctx, state)
                stages[stage.name] += time.perf_counter() - t
        report = pipeline.finish(ctx, state).report(scope)
        statuses[report.status] = statuses.get(report.status, 0) + 1
        if (i + 1) % 100 == 0:
            _p(f"  per-scope path: {i + 1}/{len(scopes)} scopes, {(time.perf_counter() - t0) / (i + 1) * 1000:.0f} ms/scope")
    total = time.perf_counter() - t0
    n = len(scopes)
    return {
        "scopes": n,
        "seconds": round(total, 2),
        "ms_per_scope": round(total / n * 1000, 1),
        "ms_per_scope_by_stage": {k: round(v / n * 1000, 1) for k, v in stages.items()},
        "statuses": statuses,
    }


STAGES = ("gating", "extract", "transform", "validate", "recall_gate", "apply")


def run_shard(dsn: str, i: int, scopes: list[str], as_of: datetime, work: str, started: datetime,
              safety: bool, apply_slots: int) -> dict:
    """One shard through the pipeline (extract → transform → validate [→ gate] → apply in one of the
    store-held apply slots): its stage seconds (and this process's CPU seconds in each), the reports'
    statuses and tallies, and this process's peak RSS.  Module-level, so a worker process can run it."""
    from deep_sleep.run import pipeline
    from deep_sleep.store.db import Store
    from deep_sleep.transforms.config import ConsolidationConfig
    from deep_sleep.flows.nightly import apply_slot

    store, config = Store(dsn), ConsolidationConfig()
    seconds, cpu = dict.fromkeys(STAGES, 0.0), dict.fromkeys(STAGES, 0.0)

    # The night's stages (the gate and holds with ``safety``), the apply in one of the store-held slots.
    names = {"extract", "transform", "validate", "apply", *(("gate", "hold") if safety else ())}
    ctx = pipeline.Context.of(as_of, config, scopes=scopes, store=store, base=Path(work) / "night" / f"shard-{i:05d}",
                              started_at=started, holds=safety)
    state = pipeline.State()
    for stage in pipeline.NIGHT:
        if stage.name not in names:
            continue
        key = {"gate": "recall_gate", "hold": "apply"}.get(stage.name, stage.name)
        t, c = time.perf_counter(), time.process_time()
        if stage.name == "apply":
            with apply_slot(dsn, apply_slots):
                state = pipeline.step(stage, ctx, state)
        else:
            state = pipeline.step(stage, ctx, state)
        seconds[key] += time.perf_counter() - t
        cpu[key] += time.process_time() - c
    applied = pipeline.finish(ctx, state)
    statuses: dict[str, int] = {}
    tally = dict.fromkeys(("conflicts", "changes", "held_scopes", "gate_failed", "gated", "queries"), 0)
    for r in applied.reports.values():
        statuses[r.status] = statuses.get(r.status, 0) + 1
        tally["held_scopes"] += bool(r.held)
        tally["gate_failed"] += bool(r.gate and r.gate.get("failed"))
        tally["gated"] += bool(r.gate)
        tally["queries"] += (r.gate or {}).get("queries", 0)
        tally["conflicts"] += r.conflicts
        tally["changes"] += sum(sum(k.values()) for k in r.rows_changed.values())
    return {"seconds": seconds, "cpu": cpu, "statuses": statuses, "tally": tally, "peak_rss_mb": _peak_rss_mb(),
            "pid": os.getpid()}


def _worker_init() -> None:
    """A shard worker process: the imports once, not in its first shard's stage times."""
    import deep_sleep.flows.nightly  # noqa: F401  (imports the pipeline too)


def shard_night(dsn: str, as_of: datetime, work: str, shard_rows: int, shard_scopes: int, queue,
                safety: bool = False, workers: int = 2, apply_slots: int = 2, max_shards: int | None = None,
                processes: bool = False) -> None:
    """One night over every due scope, shard by shard, in this (child) process; puts its figures on
    ``queue``.  ``safety``: with the recall-quality gate and the holds policy (SPEC §9) on.
    ``processes``: the shards in ``workers`` worker processes instead of threads (as the nightly's
    ``task_runner="processes"`` runs them), so no two shards share a GIL.

    As the nightly runs it (``flows/nightly.py``: ``max_workers`` shards at once on threads, each
    apply holding one of ``apply_concurrency`` apply slots in the store), without Prefect:
    ``workers`` threads take the shards in order, and one shard's transform (Python) overlaps
    another's extract or apply (the server).  The stage seconds are summed over the workers, so
    with more than one worker they add up to more than the wall-clock total.  ``cpu_seconds``: the
    CPU the client process and the (local) server spent on the night (:mod:`benchmarks.cpu`) -- on
    a 2-core machine the night is CPU-bound, and these say who spends it."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor, as_completed

    from deep_sleep.jobs.gating import due_scopes, shards_of
    from deep_sleep.store.db import Store
    from deep_sleep.transforms.config import ConsolidationConfig
    from benchmarks.cpu import counters_delta, postmaster_pid, server_counters, server_cpu

    store, config = Store(dsn), ConsolidationConfig()
    seconds = dict.fromkeys(STAGES, 0.0)
    # the client's CPU seconds per stage: the whole process's (Polars works on a thread pool of its
    # own), so only with one worker, where the stages do not overlap
    cpu = dict.fromkeys(seconds, 0.0)
    postmaster = postmaster_pid(store)
    try:
        with store.pg(autocommit=True) as con:
            # start on a clean checkpoint cycle: cloning the fleet (CREATE DATABASE … TEMPLATE, WAL_LOG)
            # wrote every page of it to the WAL, and the checkpoints that forces would land in the night
            con.execute("CHECKPOINT")
    except Exception as exc:  # a user's server may not let this role checkpoint: measure anyway
        _p(f"  (no CHECKPOINT before the night: {exc})")
    pool = (ProcessPoolExecutor(max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                                initializer=_worker_init) if processes
            else ThreadPoolExecutor(max_workers=workers, thread_name_prefix="shard"))
    if processes:  # start the workers (and their imports) before the clock
        list(pool.map(abs, range(workers)))
    counters0 = server_counters(store)
    server0, client0 = server_cpu(postmaster), time.process_time()
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    due = [g for g in due_scopes(store, as_of, config.gating) if g.due]
    shards = shards_of([(g.scope_path, g.rows) for g in due], shard_rows, shard_scopes)
    if max_shards is not None:  # a partial night, for quick comparisons
        shards = shards[:max_shards]
        taken = {s for shard in shards for s in shard}
        due = [g for g in due if g.scope_path in taken]
    seconds["gating"] = time.perf_counter() - t0
    statuses: dict[str, int] = {}
    tally = dict.fromkeys(("conflicts", "changes", "held_scopes", "gate_failed", "gated", "queries", "shards"), 0)
    started = datetime.now(UTC)
    worker_peaks: dict[int, float] = {}
    with pool:
        futures = [pool.submit(run_shard, dsn, i, scopes, as_of, work, started, safety, apply_slots)
                   for i, scopes in enumerate(shards)]
        for f in as_completed(futures):
            got = f.result()  # a shard's error fails the benchmark
            for k in STAGES:
                seconds[k] += got["seconds"][k]
                cpu[k] += got["cpu"][k]
            for k, v in got["statuses"].items():
                statuses[k] = statuses.get(k, 0) + v
            for k, v in got["tally"].items():
                tally[k] += v
            tally["shards"] += 1
            worker_peaks[got["pid"]] = max(worker_peaks.get(got["pid"], 0.0), got["peak_rss_mb"])
            done = sum(statuses.values())
            _p(f"  shard {tally['shards']}/{len(shards)}: {done:,}/{len(due):,} scopes, {time.perf_counter() - t0:.1f}s, "
               f"RSS {_status_mb('VmRSS')} MB" + (f" + workers' peaks {round(sum(worker_peaks.values()))} MB" if processes else ""))
    total = time.perf_counter() - t0
    server = server_cpu(postmaster)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # the worker processes, once the pool is shut down
    child_cpu = (children.ru_utime + children.ru_stime) - (children0.ru_utime + children0.ru_stime)
    cpu_seconds = {"client": round(time.process_time() - client0 + child_cpu, 2),
                   "server": round(server - server0, 2) if server is not None and server0 is not None else None,
                   "client_by_stage": {k: round(v, 2) for k, v in cpu.items() if k != "gating"} if workers == 1 else None}
    queue.put({"scopes": len(due), "shards": len(shards), "workers": workers, "seconds": round(total, 2),
               "cpu_seconds": cpu_seconds, "server_counters": counters_delta(counters0, server_counters(store)),
               "scopes_per_second": round(len(due) / total, 1) if total else None,
               "ms_per_scope": round(total / max(1, len(due)) * 1000, 3),
               "stages_seconds": {k: round(v, 2) for k, v in seconds.items()},
               "statuses": statuses, "conflicts": tally["conflicts"], "rows_changed": tally["changes"],
               "safety": safety, "scopes_with_holds": tally["held_scopes"], "gate_queries": tally["queries"],
               "gate_scopes": tally["gated"], "gate_failed": tally["gate_failed"],
               "processes": processes,
               # with worker processes: this process's peak plus each worker's (an upper bound of the night's)
               "peak_rss_mb": round(_peak_rss_mb() + sum(worker_peaks.values()), 1) if processes else _peak_rss_mb()})


def _night_in_child(dsn: str, args, as_of: datetime, safety: bool, work: str) -> dict:
    """:func:`shard_night` on ``dsn`` in a spawned child process (so its peak RSS is the night's own)."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=shard_night, args=(dsn, as_of, work, args.shard_rows, args.shard_scopes, queue, safety,
                                                  args.workers, args.apply_slots, args.max_shards, args.processes))
    child.start()
    night = queue.get()
    child.join()
    return night


def _night(admin: str, args, as_of: datetime, safety: bool) -> dict:
    """One shard night on a fresh clone of the fleet, in a spawned child (its own peak RSS)."""
    from deep_sleep.store.db import create_database, drop_database

    # Each night on its own clone of the fleet as seeded (and as the sample left it), so both
    # nights consolidate the same rows.  The clone is dropped afterwards (--keep-clones keeps it):
    # after a 100k-scope night it holds ~29 GB, and the next night's clone would need as much again.
    name = "safe" if safety else "plain"
    clone = create_database(admin, f"deep_sleep_fleet_{name}", template="deep_sleep_fleet")
    label = "with the recall gate and holds" if safety else "without the gate and holds"
    _p(f"shard night {label} (shards of ≤ {args.shard_rows:,} rows, ≤ {args.shard_scopes:,} scopes, "
       f"{args.workers} at once)")
    try:
        night = _night_in_child(clone.dsn, args, as_of, safety, f"{args.work}/{name}")
        if args.next_day:
            night["next_day"] = _next_day(clone, args, as_of, safety, name)
    finally:
        if not args.keep_clones:
            drop_database(admin, f"deep_sleep_fleet_{name}")
    return night


def _next_day(clone, args, as_of: datetime, safety: bool, name: str) -> dict:
    """The steady state after a first night: a day of live turns in every scope of the consolidated
    clone (:func:`deep_sleep.dev.fleet.live_day`, set-based, not timed as part of any night), then
    the next night at ``as_of`` + 24 h on the same clone, measured as the first."""
    from datetime import timedelta

    from deep_sleep.dev.fleet import live_day

    _p(f"a day of live turns ({args.turns} a scope) on the consolidated clone")
    t = time.perf_counter()
    written = live_day(clone, as_of, turns=args.turns)
    day_s = round(time.perf_counter() - t, 1)
    _p(f"  {written} in {day_s}s")
    vacuum_s = None
    if args.day_vacuum:
        # a day passes between two nights, and autovacuum visits every table the first night and the
        # day changed by more than its thresholds (a fifth of the rows): VACUUM (ANALYZE) them now
        t = time.perf_counter()
        with clone.pg(autocommit=True) as con:
            con.execute("VACUUM (ANALYZE)")
        vacuum_s = round(time.perf_counter() - t, 1)
        _p(f"  VACUUM (ANALYZE) of the clone, as the day's autovacuum: {vacuum_s}s")
    _p("  the next night at as_of + 24 h")
    night = _night_in_child(clone.dsn, args, as_of + timedelta(days=1), safety, f"{args.work}/{name}-day2")
    night["live_day"] = {"turns_per_scope": args.turns, "rows_written": written, "seconds": day_s,
                         "vacuum_analyze_seconds": vacuum_s}
    return night


def _night_only(admin: str, args, as_of: datetime) -> int:
    night = _night(admin, args, as_of, args.safety)
    print(json.dumps(night, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scopes", type=int, default=100_000)
    ap.add_argument("--nodes", type=int, default=100, help="nodes per scope")
    ap.add_argument("--templates", type=int, default=16, help="distinct generated scopes the fleet copies")
    ap.add_argument("--sample", type=int, default=1000, help="scopes run through the per-scope path")
    ap.add_argument("--reuse", action="store_true", help="keep a seeded fleet of the same spec")
    ap.add_argument("--out", default="bench-results.json")
    ap.add_argument("--work", default="bench-data/fleet")
    ap.add_argument("--shard-rows", type=int, default=500_000)
    ap.add_argument("--shard-scopes", type=int, default=5_000)
    ap.add_argument("--workers", type=int, default=2, help="shards at once (the nightly's --max-workers, default 2)")
    ap.add_argument("--processes", action="store_true",
                    help="run the shards in --workers worker processes instead of threads (no shared GIL)")
    ap.add_argument("--apply-slots", type=int, default=2, help="applies at once (the nightly's apply_concurrency)")
    ap.add_argument("--night-only", action="store_true",
                    help="measure only the shard night (no COPY baseline, no per-scope sample); prints, writes nothing")
    ap.add_argument("--max-shards", type=int, default=None, help="with --night-only: only the first K shards")
    ap.add_argument("--seed-only", action="store_true", help="seed (or check) the fleet and stop; then measure with --reuse")
    ap.add_argument("--keep-clones", action="store_true",
                    help="keep each night's clone of the fleet (deep_sleep_fleet_plain, _safe) for inspection; "
                         "by default it is dropped after the night")
    ap.add_argument("--safety", action="store_true", help="also run the night with the recall gate and holds on (a second clone)")
    ap.add_argument("--next-day", action="store_true",
                    help="after each night, a day of live turns on its clone, then the next night (the steady state)")
    ap.add_argument("--turns", type=int, default=10, help="with --next-day: live turns per scope in the day")
    ap.add_argument("--day-vacuum", action=argparse.BooleanOptionalAction, default=True,
                    help="with --next-day: VACUUM (ANALYZE) the clone after the day, as autovacuum would over it "
                         "(not timed as part of the night)")
    ap.add_argument("--recalls", action=argparse.BooleanOptionalAction, default=True,
                    help="seed the fleet as the live path writes it: every node and event with the hashing embedder's "
                         "vector, recall events with feedback on a tenth (FleetSpec.recalls; default on; --no-recalls: "
                         "the bare fleet of issue 12, no vectors)")
    args = ap.parse_args(argv)
    recalls = args.recalls

    from deep_sleep.dev.fleet import FleetSpec
    from deep_sleep.store.db import embedded_dsn

    admin = os.environ.get("DEEP_SLEEP_BENCH_DSN") or embedded_dsn(
        data_dir=os.path.join(".deep_sleep", "bench-pgdata"), database="postgres")
    spec = FleetSpec(scopes=args.scopes, nodes=args.nodes, templates=args.templates, recalls=recalls)
    store, now = seed(admin, spec, args.reuse)
    as_of = datetime.fromisoformat(now)
    if args.seed_only:
        return 0
    if args.max_shards is not None and not args.night_only:
        ap.error("--max-shards needs --night-only: a partial night has no ratio to the fleet's COPY")
    if args.night_only:
        return _night_only(admin, args, as_of)

    _p("COPY baseline (every row out and back in)")
    copy = copy_baseline(store)  # benchmarks.run's, over whole tables
    _p(f"  COPY out {copy['copy_out']}s + in {copy['copy_in']}s = {copy['copy_total']}s for {sum(copy['rows'].values()):,} rows")

    sample = fresh_sample(store, args.scopes, args.sample)
    _p(f"per-scope path on {len(sample)} of {args.scopes:,} scopes (not consolidated before)")
    old = per_scope_path(store, sample, as_of, Path(args.work))
    old["extrapolated_fleet_seconds"] = round(old["ms_per_scope"] / 1000 * args.scopes, 1)
    _p(f"  {old['ms_per_scope']} ms/scope ({old['ms_per_scope_by_stage']}) → {old['extrapolated_fleet_seconds']:,}s "
       f"for the fleet")

    nights = {}
    for safety in (False, True) if args.safety else (False,):
        night = _night(admin, args, as_of, safety)
        night["ratio_to_copy"] = round(night["seconds"] / copy["copy_total"], 2) if copy["copy_total"] else None
        night["speedup_per_scope"] = round(old["ms_per_scope"] / night["ms_per_scope"], 1) if night["ms_per_scope"] else None
        _p(f"  night {night['seconds']}s for {night['scopes']:,} scopes in {night['shards']} shards "
           f"({night['scopes_per_second']} scopes/s, {night['stages_seconds']}; CPU s {night['cpu_seconds']}; "
           f"server {night['server_counters']}); ratio to COPY {night['ratio_to_copy']}, "
           f"{night['speedup_per_scope']}× faster per scope than the per-scope path; peak RSS {night['peak_rss_mb']} MB "
           f"(the child's own)" + (f"; gate: {night['gate_queries']:,} queries replayed in {night['gate_scopes']:,} scopes, "
                                   f"{night['gate_failed']:,} failed" if safety else ""))
        if night.get("next_day"):
            nxt = night["next_day"]
            nxt["ratio_to_copy"] = round(nxt["seconds"] / copy["copy_total"], 2) if copy["copy_total"] else None
            _p(f"  next night {nxt['seconds']}s for {nxt['scopes']:,} scopes ({nxt['stages_seconds']}; CPU s "
               f"{nxt['cpu_seconds']}; {nxt['rows_changed']:,} rows changed); ratio to COPY {nxt['ratio_to_copy']}")
        nights["safe" if safety else "plain"] = night
    night = nights["plain"]

    result = {
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "scopes": args.scopes, "nodes_per_scope": args.nodes, "templates": args.templates, "recalls": recalls,
        "rows": copy["rows"],
        "copy_seconds": {k: v for k, v in copy.items() if k != "rows"},
        "per_scope_path": old,
        "shard_night": {k: v for k, v in night.items() if k != "next_day"},
        "shard_night_next_day": night.get("next_day"),
        "shard_night_with_gate_and_holds": nights.get("safe"),
        "peak_rss_mb": _peak_rss_mb(),
    }
    out = Path(args.out)
    doc = json.loads(out.read_text()) if out.exists() else {}
    # the fleet's other records (earlier nights measured another way: processes, the Prefect nightly, …) stay
    doc["fleet"] = {**{k: v for k, v in doc.get("fleet", {}).items() if k not in result and k != "note"}, **result}
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
