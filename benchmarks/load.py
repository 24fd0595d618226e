"""The online path under load (issue 14, item 6): many clients on many scopes while a nightly applies.

    python -m benchmarks.load                                   # 32 clients, 200 scopes, 120 s
    python -m benchmarks.load --clients 32 --seconds 120 --procs 8
    python -m benchmarks.load --clients 4 --seconds 10          # a smoke run

Into a fresh database on the embedded server (or ``$DEEP_SLEEP_BENCH_DSN``) it seeds 200 scopes
(``deep_sleep.dev.seed``: 20 tenants, an org scope and 9 leaves each, ~100 nodes per leaf, with
embeddings and the HNSW index), then, loopback only, bounded in time (``--seconds``) and count
(``--max-turns`` per client):

- ``--clients`` clients (threads spread over ``--procs`` processes, one psycopg connection each:
  the online API is synchronous) loop: pick a scope at random, :func:`record_turn` (an upsert of
  the client's own node of that scope with a counter ``n`` in its properties, a new note node, an
  event; ``nap=False`` so the turn is timed alone), then one :func:`recall` (k = 5);
- one more process runs the nightly's stages (extract → plan → validate → apply, no Prefect) over
  the same 200 scopes in a loop with ``as_of`` = the wall clock, counting each run's conflicts;
- the main process samples ``pg_stat_activity`` every 0.25 s (what the busy backends wait on:
  nothing = CPU, ``IO:WalSync`` = commit flush, ``Lock:*`` = row/tuple locks, ``LWLock:*``).

At the end it reads every write back from the store: each client's last counter on each of its
own nodes, every node and event it inserted (a row the nightly deleted must be in
``consolidation_archive``).  Lost writes and errors must be 0.  It prints turns/s and
p50/p95/p99 of both calls and merges the figures into ``bench-results.json`` under ``"load"``
(other keys kept), with the load average before and after (the machine may be shared).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import random
import shutil
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import psycopg

DATABASE = "deep_sleep_bench_load"
GOAL = {"turns_per_s": 200.0, "p99_ms": 100.0}


def _p(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _pct(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    if not xs:
        return {"n": 0}
    pick = lambda q: xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]  # noqa: E731
    return {"n": len(xs), "p50": round(pick(0.50), 2), "p95": round(pick(0.95), 2), "p99": round(pick(0.99), 2),
            "max": round(xs[-1], 2)}


# ------------------------------------------------------------------------------------------------
# clients


def _client(cid: int, dsn: str, scopes: list[str], go, seconds: float, max_turns: int, out: dict) -> None:
    from deep_sleep.transforms.config import ConsolidationConfig

    from deep_sleep.dev.seed import WORDS
    from deep_sleep.online import recall, record_turn

    rng = random.Random(cid)
    config = ConsolidationConfig()
    times = {"record_turn": [], "recall": []}
    own: dict[str, int] = {}  # scope -> the last counter this client committed on its own node there
    inserted_nodes: list[str] = []
    inserted_events: list[str] = []
    errors: list[str] = []
    con = psycopg.connect(dsn)
    go.wait()
    began = time.time()
    deadline = began + seconds
    n = 0
    while time.time() < deadline and n < max_turns:
        scope = scopes[rng.randrange(len(scopes))]
        n += 1
        w = rng.sample(WORDS, 4)
        ops = [
            {"op": "upsert_node", "label": f"client {cid}: own node", "properties": {"n": n}},
            {"op": "upsert_node", "label": f"note: {w[0]} {w[1]} c{cid} t{n}", "properties": {"source": "load"}},
            {"op": "create_event", "content": f"The user talked about {w[2]} and {w[3]}."},
        ]
        t = time.perf_counter()
        try:
            receipt = record_turn(con, scope, ops, now=datetime.now(UTC), nap=False, config=config)
        except Exception as exc:  # counted and reported; the client carries on
            errors.append(f"record_turn: {type(exc).__name__}: {exc}")
            if con.closed or con.broken:
                con = psycopg.connect(dsn)
            else:
                con.rollback()
            continue
        times["record_turn"].append((time.perf_counter() - t) * 1000)
        if receipt.rejected:
            errors.append(f"record_turn rejected: {receipt.rejected}")
        own[scope] = n
        landed = {x.index: x for x in receipt.landed}
        inserted_nodes.append(landed[1].id)
        inserted_events += [landed[2].id, receipt.summary_event_id]
        t = time.perf_counter()
        try:
            recall(con, scope, f"{w[0]} {w[2]}", k=5)
        except Exception as exc:
            errors.append(f"recall: {type(exc).__name__}: {exc}")
            if con.closed or con.broken:
                con = psycopg.connect(dsn)
            else:
                con.rollback()
            continue
        times["recall"].append((time.perf_counter() - t) * 1000)
    con.close()
    out[cid] = {"times": times, "own": own, "nodes": inserted_nodes, "events": inserted_events, "errors": errors, "turns": n,
               "elapsed": time.time() - began}


def _client_proc(cids: list[int], dsn: str, scopes: list[str], go, seconds: float, max_turns: int, q) -> None:
    import deep_sleep.online.turn  # noqa: F401 - imported before the clock starts

    out: dict[int, dict] = {}
    threads = [threading.Thread(target=_client, args=(c, dsn, scopes, go, seconds, max_turns, out)) for c in cids]
    for t in threads:
        t.start()
    q.put(("ready", cids[0], None))
    for t in threads:
        t.join()
    cpu = os.times()
    for c in cids:
        q.put(("client", c, out.get(c) or {"times": {"record_turn": [], "recall": []}, "own": {}, "nodes": [], "events": [],
                                           "errors": ["client thread died"], "turns": 0}))
    q.put(("cpu", cids[0], cpu.user + cpu.system))


# ------------------------------------------------------------------------------------------------
# the nightly


def _nightly_proc(dsn: str, scopes: list[str], go, seconds: float, q) -> None:
    import uuid

    from deep_sleep.transforms.config import ConsolidationConfig

    from deep_sleep.run import pipeline
    from deep_sleep.store.db import Store

    store, config = Store(dsn), ConsolidationConfig()
    work = Path(tempfile.mkdtemp(prefix="ds-load-nightly-"))
    runs: list[dict] = []
    errors: list[str] = []
    q.put(("ready", -1, None))
    go.wait()
    deadline = time.time() + seconds
    passes = 0
    try:
        while time.time() < deadline:
            for path in scopes:
                if time.time() >= deadline:
                    break
                d = work / uuid.uuid4().hex
                t = time.perf_counter()
                try:
                    as_of = datetime.now(UTC)
                    ctx = pipeline.Context.of(as_of, config, scopes=path, store=store, base=d,
                                              run_ids={path: str(uuid.uuid4())})
                    planned = pipeline.run(pipeline.PLAN, ctx)
                    verdict = planned.report(path)
                    report = pipeline.run((pipeline.Apply(),), ctx, planned).report(path)
                    runs.append({"run_id": report.run_id, "status": report.status, "conflicts": report.conflicts,
                                 "validated": verdict.status, "rows": sum(sum(v.values()) for v in report.rows_changed.values()),
                                 "seconds": time.perf_counter() - t})
                except Exception as exc:
                    errors.append(f"{path!r}: {type(exc).__name__}: {exc}")
                finally:
                    shutil.rmtree(d, ignore_errors=True)
            passes += 1
    except Exception:
        errors.append(traceback.format_exc())
    shutil.rmtree(work, ignore_errors=True)
    cpu = os.times()
    q.put(("nightly", 0, {"runs": runs, "errors": errors, "passes": passes, "cpu_s": cpu.user + cpu.system}))


# ------------------------------------------------------------------------------------------------
# setup, sampling, read-back


def _seed(admin_dsn: str, reuse: bool) -> tuple[str, list[str]]:
    from deep_sleep.dev.seed import SeedSpec, scopes_of, seed_store
    from deep_sleep.store.db import create_database, migrate

    store = create_database(admin_dsn, DATABASE, replace=not reuse)
    migrate(store.dsn)
    spec = SeedSpec(tenants=20, scopes_per_tenant=9, nodes_per_scope=100, embeddings=True, seed=14,
                    now=datetime.now(UTC).replace(microsecond=0))
    scopes = [s.path for s in scopes_of(spec)]
    with psycopg.connect(store.dsn) as con:
        have = con.execute("SELECT count(DISTINCT scope_path) FROM memory_nodes").fetchone()[0]
    if have < len(scopes):
        t = time.perf_counter()
        rows = seed_store(store, spec)
        with psycopg.connect(store.dsn, autocommit=True) as con:
            con.execute("VACUUM ANALYZE")
        _p(f"seeded {len(scopes)} scopes, {sum(rows.values()):,} rows in {time.perf_counter() - t:.1f}s")
    return store.dsn, scopes


def _sample(dsn: str, stop: threading.Event, waits: Counter, lock_waiters: list[int]) -> None:
    with psycopg.connect(dsn, autocommit=True) as con:
        while not stop.wait(0.25):
            rows = con.execute(
                "SELECT coalesce(wait_event_type || ':' || wait_event, 'CPU (no wait)') FROM pg_stat_activity "
                "WHERE datname = current_database() AND state = 'active' AND pid <> pg_backend_pid()").fetchall()
            waits.update(r[0] for r in rows)
            lock_waiters.append(sum(1 for r in rows if r[0].startswith("Lock:")))


def _read_back(dsn: str, clients: dict[int, dict]) -> dict:
    """Every client write, looked up in the store (or, if a nightly deleted it, in the archive)."""
    lost_counters, nodes, events = [], [], []
    for c in clients.values():
        nodes += c["nodes"]
        events += c["events"]
    with psycopg.connect(dsn) as con:
        own = {(r[0], r[1]): r[2] for r in con.execute(
            "SELECT scope_path, label, (properties->>'n')::int FROM memory_nodes WHERE label LIKE 'client %: own node'")}
        for cid, c in clients.items():
            for scope, n in c["own"].items():
                if own.get((scope, f"client {cid}: own node")) != n:
                    lost_counters.append((cid, scope, n, own.get((scope, f"client {cid}: own node"))))
        have_nodes = {r[0] for r in con.execute("SELECT id::text FROM memory_nodes WHERE id = ANY(%s::uuid[])", (nodes,))}
        have_events = {r[0] for r in con.execute("SELECT id::text FROM episodic_events WHERE id = ANY(%s::uuid[])", (events,))}
        gone = [i for i in nodes if i not in have_nodes] + [i for i in events if i not in have_events]
        archived = {r[0] for r in con.execute(
            "SELECT a.row_id::text FROM consolidation_archive a JOIN consolidation_runs r USING (run_id) "
            "WHERE r.status = 'applied' AND a.row_id = ANY(%s::uuid[])", (gone,))} if gone else set()
        ledger = con.execute("SELECT count(*), coalesce(sum(conflicts), 0) FROM consolidation_runs WHERE mode = 'nightly'").fetchone()
    lost_rows = [i for i in gone if i not in archived]
    return {"own_counters_checked": sum(len(c["own"]) for c in clients.values()), "own_counters_lost": len(lost_counters),
            "own_counters_lost_examples": lost_counters[:5], "nodes_inserted": len(nodes), "events_inserted": len(events),
            "rows_deleted_by_nightly_and_archived": len(gone) - len(lost_rows), "rows_lost": len(lost_rows),
            "lost_writes": len(lost_counters) + len(lost_rows), "ledger_nightly_runs": ledger[0], "ledger_conflicts": int(ledger[1])}


def run(dsn: str, scopes: list[str], clients: int, procs: int, seconds: float, max_turns: int, nightly: bool) -> dict:
    ctx = mp.get_context("spawn")  # fork copied a lock of the embedded server and hung the nightly
    q, go = ctx.Queue(), ctx.Event()  # the clock starts once every process has imported and connected
    groups = [list(range(clients))[i::procs] for i in range(min(procs, clients))]
    ps = [ctx.Process(target=_client_proc, args=(g, dsn, scopes, go, seconds, max_turns, q)) for g in groups]
    if nightly:
        ps.append(ctx.Process(target=_nightly_proc, args=(dsn, scopes, go, seconds, q)))
    for p in ps:
        p.start()
    stop, waits, lock_waiters = threading.Event(), Counter(), []
    sampler = threading.Thread(target=_sample, args=(dsn, stop, waits, lock_waiters), daemon=True)
    for _ in range(len(ps)):
        kind, _key, _ = q.get(timeout=600)
        assert kind == "ready", kind
    go.set()
    load_start = os.getloadavg()[0]
    sampler.start()
    results: dict[int, dict] = {}
    night: dict = {"runs": [], "errors": [], "passes": 0, "cpu_s": 0.0}
    client_cpu = 0.0
    expected = clients + len(groups) + (1 if nightly else 0)
    got = 0
    while got < expected:
        kind, key, value = q.get(timeout=seconds + 600)
        got += 1
        if kind == "client":
            results[key] = value
        elif kind == "cpu":
            client_cpu += value
        else:
            night = value
    wall = max([c.get("elapsed", 0.0) for c in results.values()] + [1e-9])  # the clients' clock, not the nightly's last run
    stop.set()
    sampler.join(timeout=5)
    for p in ps:
        p.join(timeout=60)
    load_end = os.getloadavg()[0]

    turn_ms = [x for c in results.values() for x in c["times"]["record_turn"]]
    recall_ms = [x for c in results.values() for x in c["times"]["recall"]]
    errors = [e for c in results.values() for e in c["errors"]] + night["errors"]
    back = _read_back(dsn, results)
    samples = sum(waits.values())
    conflicted = [r for r in night["runs"] if r["conflicts"]]
    result = {
        "clients": clients, "processes": len(groups), "scopes": len(scopes), "seconds": round(wall, 1),
        "turns": len(turn_ms), "turns_per_s": round(len(turn_ms) / wall, 1), "recalls": len(recall_ms),
        "latency_ms": {"record_turn": _pct(turn_ms), "recall": _pct(recall_ms)},
        "errors": len(errors), "error_examples": errors[:5],
        "lost_writes": back["lost_writes"], "read_back": back,
        "nightly": {
            "runs": len(night["runs"]), "passes_over_the_scopes": night["passes"],
            "applied": sum(1 for r in night["runs"] if r["status"] == "applied"),
            "conflicts": sum(r["conflicts"] for r in night["runs"]), "runs_with_conflicts": len(conflicted),
            "rows_changed": sum(r["rows"] for r in night["runs"]),
            "seconds_per_scope_p50": _pct([r["seconds"] * 1000 for r in night["runs"]]).get("p50"),
            "cpu_s": round(night["cpu_s"], 1),
            "how_conflicts_are_handled": "version-guarded apply: a row a live turn changed after the snapshot is skipped, "
                                         "counted in the run's conflicts (report and ledger) and left to the next run",
        },
        "client_cpu_s": round(client_cpu, 1),
        "backend_wait_share": {k: round(v / samples, 3) for k, v in waits.most_common(8)} if samples else {},
        "lock_waiters_p95": _pct([float(x) for x in lock_waiters]).get("p95"),
        "goal": GOAL,
        "met": {"turns_per_s": len(turn_ms) / wall >= GOAL["turns_per_s"],
                "record_turn_p99": (_pct(turn_ms).get("p99") or 1e9) <= GOAL["p99_ms"],
                "recall_p99": (_pct(recall_ms).get("p99") or 1e9) <= GOAL["p99_ms"]},
        "load_average_start_end": [round(load_start, 2), round(load_end, 2)],
    }
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--procs", type=int, default=8, help="processes the clients are spread over (threads in each)")
    ap.add_argument("--seconds", type=float, default=120.0)
    ap.add_argument("--max-turns", type=int, default=100_000, help="per client")
    ap.add_argument("--no-nightly", action="store_true", help="clients only (a baseline)")
    ap.add_argument("--reuse", action="store_true", help="keep the seeded database of a previous run")
    ap.add_argument("--out", default="bench-results.json")
    ap.add_argument("--key", default="load")
    args = ap.parse_args(argv)

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from deep_sleep.store.db import embedded_dsn

    admin = os.environ.get("DEEP_SLEEP_BENCH_DSN") or embedded_dsn(
        data_dir=os.path.join(".deep_sleep", "bench-pgdata"), database="postgres")
    dsn, scopes = _seed(admin, args.reuse)
    _p(f"{args.clients} clients in {args.procs} processes on {len(scopes)} scopes for {args.seconds:.0f} s"
       f"{'' if args.no_nightly else ', a nightly looping over the same scopes'}; uptime: {os.getloadavg()}")
    result = run(dsn, scopes, args.clients, args.procs, args.seconds, args.max_turns, not args.no_nightly)
    result.update({
        "command": "python -m benchmarks.load " + " ".join(argv if argv is not None else sys.argv[1:]),
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform()},
    })
    out = Path(args.out)
    doc = json.loads(out.read_text()) if out.exists() else {}
    doc[args.key] = result
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("turns_per_s", "latency_ms", "errors", "lost_writes", "nightly", "backend_wait_share",
                                             "met", "load_average_start_end")}, indent=2))
    print(f"written to {out} (key {args.key!r})")
    return 0 if result["errors"] == 0 and result["lost_writes"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
