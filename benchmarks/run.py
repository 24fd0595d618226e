"""End-to-end benchmark of one scope's nightly run against the raw cost of moving its rows.

    make bench SCALE=1000000            # or: python -m benchmarks.run --scale 100000 --scale 1000000

For each scale it seeds one scope with that many nodes (plus the edges, events, access log …
the generator makes for it) into a fresh database, then times

- the stages of a real run: extract (ADBC, one REPEATABLE READ transaction, + Parquet),
  transform (all phases, + Parquet), validate (pandera), apply (one transaction), total;
- each phase, and the rest of the transform stage: reading the snapshot, quarantine, folding
  each phase's diff into the next phase's view, combining, hashing and writing the diff;
- the raw baseline on the same rows: COPY out (ADBC ``fetch_arrow_table`` of the same SELECTs,
  which ADBC runs as binary COPY) and COPY in (ADBC ``adbc_ingest`` of those Arrow tables into
  temporary tables);
- the CPU seconds of this process per stage (all its threads; the database server's are not in
  them): CPU-seconds over seconds says how much of the machine's cores a stage keeps busy;
- the CPU seconds of the local database server per stage and for the COPY (``benchmarks/cpu.py``:
  every process of the embedded server), and ``ratio_cpu_to_copy``: the run's CPU seconds (this
  process and the server) over the COPY's — on a shared machine far steadier than the wall-time ratio;

and writes ``bench-results.json`` (results of other scales already in the file are kept).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

# Parts of the transform stage besides the phases (see ConsolidationReport.timings).
TRANSFORM_PARTS = ("read_snapshot", "quarantine", "fold", "combine", "diff_hash", "write_diff")


def _p(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def _fresh_store(admin_dsn: str, name: str):
    from deep_sleep.store.db import create_database

    return create_database(admin_dsn, name)


def copy_baseline(store, scope_path: str | None = None) -> dict:
    """Seconds to COPY the extracted columns of every table out to Arrow and back in (temporary
    tables), table by table: the scope's rows, or with ``scope_path`` None every row (a fleet)."""
    from deep_sleep.core import tables
    from deep_sleep.store.extract import select_sql

    from benchmarks.cpu import postmaster_pid, server_cpu

    out_s = in_s = 0.0
    rows = {}
    server = postmaster_pid(store)
    cpu0, server0 = time.process_time(), server_cpu(server)
    with store.adbc() as con:
        cur = con.cursor()
        for table in tables.TABLES:
            t = time.perf_counter()
            if scope_path is None:
                cur.execute(f"SELECT {', '.join(c.select_sql for c in tables.TABLES[table])} FROM {table}")
            else:
                cur.execute(select_sql(table, bounded=False), parameters=(scope_path,))
            data = cur.fetch_arrow_table()
            out_s += time.perf_counter() - t
            rows[table] = data.num_rows
            if data.num_rows:
                # the opaque pgvector extension type cannot be ingested as-is; drop it (no embeddings in the bench)
                keep = [f.name for f in data.schema if "opaque" not in str(f.type)]
                t = time.perf_counter()
                cur.adbc_ingest(f"_bench_{table}", data.select(keep), mode="create", temporary=True)
                in_s += time.perf_counter() - t
                cur.execute(f"DROP TABLE _bench_{table}")
            del data  # one table in memory at a time
        con.rollback()
    cpu = {"cpu": round(time.process_time() - cpu0, 3)}
    if server0 is not None:
        cpu["server_cpu"] = round(server_cpu(server) - server0, 3)
    return {"copy_out": round(out_s, 3), "copy_in": round(in_s, 3), "copy_total": round(out_s + in_s, 3), **cpu,
            "rows": rows}


def bench_scale(admin_dsn: str, scale: int, work: Path, now: datetime | None = None) -> dict:
    from deep_sleep.transforms import phase_names
    from deep_sleep.transforms.config import ConsolidationConfig

    from deep_sleep.core.report import ConsolidationReport
    from deep_sleep.dev.seed import SeedSpec, generate, load, scopes_of
    from deep_sleep.run import pipeline

    store = _fresh_store(admin_dsn, "deep_sleep_bench")
    now = now or datetime.now(UTC).replace(microsecond=0)  # the seed is relative to it; --now fixes the diff hash
    spec = SeedSpec(tenants=1, scopes_per_tenant=0, nodes_per_scope=scale, seed=11, now=now)
    _p(f"scale {scale:,}: generating")
    t = time.perf_counter()
    frames = generate(spec)
    gen_s = time.perf_counter() - t
    _p(f"scale {scale:,}: generated in {gen_s:.1f}s; loading")
    t = time.perf_counter()
    loaded = load(store, frames)
    load_s = time.perf_counter() - t
    with store.pg(autocommit=True) as con:
        con.execute("VACUUM ANALYZE")
        scope_path = con.execute(
            "SELECT scope_path FROM memory_nodes GROUP BY 1 ORDER BY count(*) DESC LIMIT 1").fetchone()[0]
    _p(f"scale {scale:,}: loaded {sum(loaded.values()):,} rows in {load_s:.1f}s; scope {scope_path!r}")
    del frames
    _ = scopes_of

    config = ConsolidationConfig()
    run_id = str(uuid.uuid4())
    base = work / f"scale-{scale}" / run_id
    snap_dir, diff_dir = base / "snapshot", base / "diff"
    # The night's stages without the safety stages (gate, holds): the work this benchmark has always timed.
    ctx = pipeline.Context.of(now, config, scopes=scope_path, store=store, base=base, run_ids={scope_path: run_id})
    state = pipeline.State()
    from benchmarks.cpu import postmaster_pid, server_cpu

    stages: dict[str, float] = {}
    cpu: dict[str, float] = {}  # CPU seconds of this process (all threads) per stage
    server: dict[str, float] = {}  # CPU seconds of the local server per stage
    postmaster = postmaster_pid(store)
    t0, c0, s0 = time.perf_counter(), time.process_time(), server_cpu(postmaster)
    for stage in (s for s in pipeline.NIGHT if s.name in ("extract", "transform", "validate", "apply")):
        t, c, sc = time.perf_counter(), time.process_time(), server_cpu(postmaster)
        state = pipeline.step(stage, ctx, state)
        stages[stage.name] = time.perf_counter() - t
        cpu[stage.name] = time.process_time() - c  # the apply's: this process only, not the server's work
        if sc is not None:
            server[stage.name] = server_cpu(postmaster) - sc
        report = state.reports.get(scope_path)
        _p(f"{stage.name:<9} {stages[stage.name]:.2f}s ({cpu[stage.name]:.2f} CPU-s on {os.cpu_count()} cores"
           + (f", server {server[stage.name]:.2f} CPU-s)" if stage.name in server else ")")
           + (f" ({report.status})" if stage.name == "validate" else ""))
        if stage.name == "transform":
            inside = report.timings
            _p("          " + ", ".join(f"{k} {inside[k]:.2f}s" for k in TRANSFORM_PARTS if k in inside)
               + f", phases {sum(v for k, v in inside.items() if k in phase_names()):.2f}s")
        if stage.name == "validate" and report.status == "failed":
            raise SystemExit("validation failed:\n" + "\n".join(report.errors))
    state = pipeline.finish(ctx, state)
    stages["total"] = time.perf_counter() - t0
    cpu["total"] = time.process_time() - c0
    if s0 is not None:
        server["total"] = server_cpu(postmaster) - s0
    report = state.report(scope_path)
    _p(f"total     {stages['total']:.2f}s")
    _p("          " + ", ".join(f"{k.removeprefix('apply.')} {v:.2f}s" for k, v in report.timings.items() if k.startswith("apply.")))
    report = ConsolidationReport.read(diff_dir)
    phases = {p: report.timings[p] for p in phase_names() if p in report.timings}
    _p("COPY baseline")
    copy = copy_baseline(store, scope_path)
    # The nodes the run consolidated (the snapshot's); the COPY baseline runs after the apply, on fewer.
    extracted = {t: e["rows"] for t, e in json.loads((snap_dir / "manifest.json").read_text())["tables"].items()}
    nodes = extracted["memory_nodes"]
    transform_phases_s = sum(phases.values())
    result = {
        "scale": scale,
        "nodes": nodes,
        "rows_extracted": extracted,
        "rows_copied": copy["rows"],
        "seed_seconds": {"generate": round(gen_s, 3), "load": round(load_s, 3)},
        "stages_seconds": {k: round(v, 3) for k, v in stages.items()},
        "stages_cpu_seconds": {k: round(v, 3) for k, v in cpu.items()},
        "stages_server_cpu_seconds": {k: round(v, 3) for k, v in server.items()},
        "phases_seconds": {k: round(v, 4) for k, v in phases.items()},
        "transform_parts_seconds": {k: round(report.timings[k], 4) for k in TRANSFORM_PARTS if k in report.timings},
        "apply_parts_seconds": {k.removeprefix("apply."): round(v, 3) for k, v in report.timings.items() if k.startswith("apply.")},
        # the phases alone; the phases with folding each diff into the next phase's view; the stage
        "transform_nodes_per_second": round(nodes / transform_phases_s) if transform_phases_s else None,
        "phases_and_fold_nodes_per_second": round(nodes / (transform_phases_s + report.timings.get("fold", 0.0))),
        "transform_stage_nodes_per_second": round(nodes / stages["transform"]),
        "copy_seconds": {k: v for k, v in copy.items() if k != "rows"},
        "ratio_total_to_copy": round(stages["total"] / copy["copy_total"], 2) if copy["copy_total"] else None,
        # CPU seconds (this process + the server) of the run over the COPY's: steadier than wall time under load
        "ratio_cpu_to_copy": (round((cpu["total"] + server["total"]) / (copy["cpu"] + copy["server_cpu"]), 2)
                              if "total" in server and copy.get("server_cpu") else None),
        "diff_hash": report.diff_hash,
        "diff_rows": report.rows_changed,
        "conflicts": report.conflicts,
        "counters": {k: v for k, v in report.counters.items() if v},
    }
    _p(f"ratio total/COPY = {result['ratio_total_to_copy']}  (COPY out {copy['copy_out']}s + in {copy['copy_in']}s)")
    if result["ratio_cpu_to_copy"] is not None:
        _p(f"CPU ratio = {result['ratio_cpu_to_copy']}  (run {cpu['total']:.2f} + server {server['total']:.2f} CPU-s; "
           f"COPY {copy['cpu']:.2f} + server {copy['server_cpu']:.2f} CPU-s)")
    return result


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=int, action="append", help="nodes in the scope (repeatable); default 100000")
    ap.add_argument("--now", type=datetime.fromisoformat, default=None,
                    help="the seed's and the run's clock (ISO 8601 with offset); default: now. Two commits' diff hashes "
                         "compare only at the same --now")
    ap.add_argument("--out", default="bench-results.json")
    ap.add_argument("--work", default="bench-data", help="where snapshots and diffs of the bench runs go")
    args = ap.parse_args(argv)
    scales = args.scale or [100_000]

    from deep_sleep.store.db import embedded_dsn

    admin = os.environ.get("DEEP_SLEEP_BENCH_DSN") or embedded_dsn(
        data_dir=os.path.join(".deep_sleep", "bench-pgdata"), database="postgres")
    out = Path(args.out)
    doc = json.loads(out.read_text()) if out.exists() else {}
    doc["machine"] = {"cpus": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform()}
    runs = {r["scale"]: r for r in doc.get("runs", [])}
    for scale in scales:
        result = bench_scale(admin, scale, Path(args.work), args.now)
        result["measured_at"] = datetime.now(UTC).isoformat(timespec="seconds")
        runs[scale] = result
        doc["runs"] = [runs[k] for k in sorted(runs)]
        out.write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps({r["scale"]: {"stages": r["stages_seconds"], "copy": r["copy_seconds"], "ratio": r["ratio_total_to_copy"],
                                   "cpu_ratio": r.get("ratio_cpu_to_copy")}
                      for r in doc["runs"]}, indent=2))
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
