"""Latency of the online path (SPEC §5) on one big scope with an HNSW index.

    python -m benchmarks.online                       # 100k nodes, 200+ calls of each, into bench-results.json
    python -m benchmarks.online --nodes 20000 --turns 500 --reuse

Seeds a fresh database on the embedded server (or ``$DEEP_SLEEP_BENCH_DSN``) with one tenant whose
leaf scope holds ``--nodes`` nodes with embeddings (``deep_sleep.dev.seed``, which builds the HNSW
index after the bulk load), then drives the scope like a live agent, each call on its own
transaction through one psycopg connection:

- ``--turns`` turns through :func:`record_turn` (an update of a seeded label, a new label, an
  event, a thinking note; ``nap=False`` so the turn is timed alone);
- after every 10th turn, the quick nap that turn would trigger, timed on its own
  (:func:`quick_nap`, with the same ``as_of`` as the turn);
- two :func:`recall` calls per turn (k = 5) on words of the seeded vocabulary;
- then up to 300 more turns with ``durable=False`` (no wait for the WAL flush), for comparison.

The first 20 calls of each kind warm caches up and are not counted.  p50/p95 in milliseconds
are merged into ``bench-results.json`` under ``"online"`` (other keys are kept), with the
quick nap's per-stage medians, whether the recall plan uses the HNSW index, and the machine's
load average (other work on the machine shows in the tails).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg

TARGETS_MS = {"record_turn": 10.0, "recall": 20.0, "quick_nap": 50.0}
WARMUP = 20
DATABASE = "deep_sleep_bench_online"


def _p(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _pct(xs: list[float]) -> dict[str, float]:
    xs = sorted(xs)
    pick = lambda q: xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]  # noqa: E731
    return {"n": len(xs), "p50": round(pick(0.50), 2), "p95": round(pick(0.95), 2), "max": round(xs[-1], 2)}


def _store(admin_dsn: str, reuse: bool):
    from deep_sleep.store.db import create_database, migrate

    store = create_database(admin_dsn, DATABASE, replace=not reuse)
    migrate(store.dsn)  # a reused database may predate a migration
    return store


def _seed(store, nodes: int, now: datetime) -> str:
    from deep_sleep.dev.seed import SeedSpec, generate, load

    with psycopg.connect(store.dsn) as con:
        found = con.execute("SELECT scope_path, count(*) FROM memory_nodes GROUP BY 1 ORDER BY 2 DESC LIMIT 1").fetchone()
    if found and found[1] >= nodes:
        _p(f"reusing the seeded scope ({found[1]:,} nodes)")
        return found[0]
    spec = SeedSpec(tenants=1, scopes_per_tenant=1, nodes_per_scope=nodes, embeddings=True, seed=11, now=now)
    t = time.perf_counter()
    frames = generate(spec)
    _p(f"generated {sum(f.height for f in frames.values()):,} rows in {time.perf_counter() - t:.1f}s; loading (builds the HNSW index)")
    t = time.perf_counter()
    load(store, frames)
    with store.pg(autocommit=True) as con:
        con.execute("VACUUM ANALYZE")
        path = con.execute("SELECT scope_path FROM memory_nodes GROUP BY 1 ORDER BY count(*) DESC LIMIT 1").fetchone()[0]
    _p(f"loaded in {time.perf_counter() - t:.1f}s")
    return path


def _uses_hnsw(con: psycopg.Connection, scope, query: str) -> bool:
    """Whether recall's candidate statement, with recall's own settings and parameters, plans the HNSW index."""
    from deep_sleep.core.embedding import default_embedder
    from deep_sleep.online.pg import vector_text
    from deep_sleep.online.recall import _SETTINGS_SQL, candidate_params, candidates_sql

    params = candidate_params(scope, [], vector_text(default_embedder().embed([query])[0]), 5)
    with con.transaction():
        con.execute(_SETTINGS_SQL, (str(max(40, params["n_seed"])),))
        plan = con.execute("EXPLAIN " + candidates_sql(scope.levels[0][0] == "tenant"), params).fetchall()
    return any("memory_nodes_embedding_hnsw" in row[0] for row in plan)


def run(store, scope_path: str, turns: int, seed: int = 5) -> dict:
    from deep_sleep.transforms.config import ConsolidationConfig
    from deep_sleep.core.scope import Scope
    from deep_sleep.dev.seed import WORDS
    from deep_sleep.online import quick_nap, recall, record_turn

    rng = random.Random(seed)
    scope = Scope.parse(scope_path)
    config = ConsolidationConfig()
    con = psycopg.connect(store.dsn)
    labels = [r[0] for r in con.execute(
        "SELECT label FROM memory_nodes WHERE scope_path = %s AND layer = 'semantic' ORDER BY id LIMIT 2000", (scope_path,))]
    con.commit()
    times: dict[str, list[float]] = {"record_turn": [], "recall": [], "quick_nap": []}
    stages: dict[str, list[float]] = {}
    counters: dict[str, int] = {}
    statuses: dict[str, int] = {}
    # Turns are stamped 50 ms apart, faster than they run: a run's clock ends ahead of the wall
    # clock.  Start after the scope's latest run so a rerun (--reuse) does not nap over windows that
    # begin in the future, and therefore empty, which would make its naps cheaper than the first run's.
    last = con.execute("SELECT max(as_of) FROM consolidation_runs WHERE scope_path = %s", (scope_path,)).fetchone()[0]
    con.commit()
    start = datetime.now(UTC)
    if last is not None and last >= start:
        start = last + timedelta(seconds=1)
    for i in range(turns):
        now = start + timedelta(milliseconds=50 * i)
        w = rng.sample(WORDS, 4)
        ops = [
            {"op": "upsert_node", "label": rng.choice(labels), "properties": {"seen_in_turn": i}},
            {"op": "upsert_node", "label": f"note: {w[0]} {w[1]} {i}", "properties": {"source": "bench", "token": "t-1"}},
            {"op": "create_event", "content": f"The user talked about {w[2]} and {w[3]}."},
        ]
        t = time.perf_counter()
        receipt = record_turn(con, scope, ops, now=now, thinking=[f"maybe {w[1]} matters for {w[2]}"], nap=False, config=config)
        times["record_turn"].append((time.perf_counter() - t) * 1000)
        assert not receipt.rejected, receipt.rejected
        for _ in range(2):
            q = " ".join(rng.sample(WORDS, 2))
            t = time.perf_counter()
            recall(con, scope, q, k=5, now=now)
            times["recall"].append((time.perf_counter() - t) * 1000)
        if receipt.turn % config.quick_nap_interval == 0:
            t = time.perf_counter()
            report = quick_nap(con, scope, config=config, as_of=now)
            times["quick_nap"].append((time.perf_counter() - t) * 1000)
            statuses[report.status] = statuses.get(report.status, 0) + 1
            for k, v in report.counters.items():
                counters[k] = counters.get(k, 0) + v
            for k in ("extract", "transform", "validate", "apply"):
                stages.setdefault(k, []).append(report.timings.get(k, 0.0) * 1000)
        if i and i % 500 == 0:
            _p(f"{i} turns: turn p95 {_pct(times['record_turn'][WARMUP:])['p95']} ms, "
               f"recall p95 {_pct(times['recall'][WARMUP:])['p95']} ms, nap p95 {_pct(times['quick_nap'][2:] or [0])['p95']} ms")
    # the same turns without waiting for the WAL flush (record_turn(durable=False))
    times["record_turn_async_commit"] = []
    for i in range(min(turns, 300)):
        w = rng.sample(WORDS, 3)
        ops = [{"op": "upsert_node", "label": rng.choice(labels), "properties": {"seen_in_turn": i}},
               {"op": "create_event", "content": f"The user talked about {w[0]} and {w[1]}."}]
        t = time.perf_counter()
        record_turn(con, scope, ops, now=datetime.now(UTC), thinking=[f"maybe {w[2]}"], nap=False, durable=False, config=config)
        times["record_turn_async_commit"].append((time.perf_counter() - t) * 1000)
    hnsw = _uses_hnsw(con, scope, "billing checkout")
    nodes = con.execute("SELECT count(*) FROM memory_nodes WHERE scope_path = %s", (scope_path,)).fetchone()[0]
    con.close()
    warm = {k: v[WARMUP:] if len(v) > 2 * WARMUP else v[2:] for k, v in times.items()}
    result = {k: _pct(v) for k, v in warm.items()}
    return {
        "scope_nodes": nodes,
        "turns": turns,
        "latency_ms": result,
        "targets_p95_ms": TARGETS_MS,
        "met": {k: result[k]["p95"] <= TARGETS_MS[k] for k in TARGETS_MS},
        "quick_nap_stage_p50_ms": {k: _pct(v)["p50"] for k, v in stages.items()},
        "quick_nap_statuses": statuses,
        "quick_nap_counters": {k: v for k, v in counters.items() if v},
        "recall_uses_hnsw": hnsw,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=100_000, help="nodes in the scope (default 100000)")
    ap.add_argument("--turns", type=int, default=2_200, help="turns to record (a nap every 10; default 2200 → 220 naps, 4400 recalls)")
    ap.add_argument("--out", default="bench-results.json")
    ap.add_argument("--reuse", action="store_true", help="keep the database of a previous run if it holds the scope")
    args = ap.parse_args(argv)

    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    from deep_sleep.store.db import embedded_dsn

    admin = os.environ.get("DEEP_SLEEP_BENCH_DSN") or embedded_dsn(
        data_dir=os.path.join(".deep_sleep", "bench-pgdata"), database="postgres")
    store = _store(admin, args.reuse)
    now = datetime.now(UTC).replace(microsecond=0)
    scope_path = _seed(store, args.nodes, now)
    _p(f"driving scope {scope_path!r}")
    load_before = os.getloadavg()
    result = run(store, scope_path, args.turns)
    result.update({
        "nodes_per_scope": args.nodes,
        "measured_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "load_average_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)],
        "machine": {"cpus": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform()},
    })
    out = Path(args.out)
    doc = json.loads(out.read_text()) if out.exists() else {}
    doc["online"] = result
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("latency_ms", "met", "quick_nap_stage_p50_ms", "recall_uses_hnsw")}, indent=2))
    print(f"written to {out} (key 'online')")
    return 0


if __name__ == "__main__":
    sys.exit(main())
