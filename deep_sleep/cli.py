"""``deep-sleep`` — the command line.

    deep-sleep demo                                   seed a small store, consolidate every scope
    deep-sleep seed --tenants 3 --nodes 200           seed synthetic scopes
    deep-sleep run org/acme/brand/b1                  the nightly flow for one scope (Prefect, local mode)
    deep-sleep snapshot org/acme/brand/b1 --out DIR   extract a snapshot directory
    deep-sleep replay DIR --as-of ISO --out DIFF_DIR  transform + validate a stored snapshot (no database)

Scopes are written ``kind/id/kind/id`` (or as the raw ``\\x1f``-joined scope_path).
"""

from __future__ import annotations

import argparse
import os
import sys
from datetime import UTC, datetime
from pathlib import Path


def _quiet_prefect() -> None:
    # Before Prefect is imported: no telemetry (the network is closed here), quiet logs.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "WARNING")
    # The temporary local server migrates its SQLite database on first start; on a busy 2-core
    # machine that can take longer than Prefect's default 20 s.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")


def _as_of(value: str | None) -> datetime | None:
    from deep_sleep.snapshot import utc

    return utc(value) if value else None


def cmd_seed(args: argparse.Namespace) -> int:
    from deep_sleep.db import connect_store
    from deep_sleep.seed import SeedSpec, scopes_of, seed_store

    spec = SeedSpec(tenants=args.tenants, scopes_per_tenant=args.scopes_per_tenant, nodes_per_scope=args.nodes,
                    seed=args.seed, now=_as_of(args.now) or datetime.now(UTC).replace(microsecond=0))
    store = connect_store(args.dsn)
    counts = seed_store(store, spec)
    for table, n in counts.items():
        print(f"{table:24s} {n:>10,d}")
    print("scopes:", ", ".join(s.display() for s in scopes_of(spec)))
    return 0


def _run_flow(scope: str, as_of: datetime | None, config_file: str | None, dsn: str | None, runs_dir: str | None):
    _quiet_prefect()
    from flows.deep_sleep import DeepSleepParameters, deep_sleep

    return deep_sleep(DeepSleepParameters(scope=scope, as_of=as_of, config_file=config_file, dsn=dsn, runs_dir=runs_dir))


def cmd_run(args: argparse.Namespace) -> int:
    from deep_sleep.render import print_summary, report_markdown
    from deep_sleep.report import ConsolidationReport

    report = ConsolidationReport.from_dict(_run_flow(args.scope, _as_of(args.as_of), args.config, args.dsn, args.runs_dir))
    print(report_markdown(report))
    print_summary([report])
    return 0


def cmd_snapshot(args: argparse.Namespace) -> int:
    from deep_sleep.db import connect_store
    from deep_sleep.extract import extract

    snap = extract(connect_store(args.dsn), args.scope)
    out = snap.write(args.out)
    counts = ", ".join(f"{t}={n}" for t, n in snap.row_counts().items() if n)
    print(f"snapshot of {snap.scope.display()} at {snap.taken_at.isoformat()} written to {out} ({counts or 'no rows'})")
    return 0


def cmd_replay(args: argparse.Namespace) -> int:
    """Transform and validate a stored snapshot; write the diff and report.  Touches no database."""
    from deep_sleep.config import load_config
    from deep_sleep.render import report_markdown
    from deep_sleep.stages import plan_stage, validate_stage

    config = load_config(args.config)
    out = Path(args.out)
    plan_stage(Path(args.snapshot_dir), config, _as_of(args.as_of), out)
    report = validate_stage(Path(args.snapshot_dir), out, config)
    print(report_markdown(report))
    print(f"\ndiff written to {out} (hash {report.diff_hash})")
    return 1 if report.status == "failed" else 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Seed a fresh demo database, consolidate every demo scope through the flow, print the reports."""
    import psycopg

    from deep_sleep.db import connect_store, embedded_dsn, ensure_database, resolve_dsn, with_database
    from deep_sleep.render import print_summary
    from deep_sleep.report import ConsolidationReport
    from deep_sleep.seed import SeedSpec, scopes_of, seed_store

    admin = resolve_dsn(args.dsn) if args.dsn else embedded_dsn(database="postgres")
    with psycopg.connect(admin, autocommit=True) as con:
        con.execute("DROP DATABASE IF EXISTS deep_sleep_demo WITH (FORCE)")
    ensure_database(admin, "deep_sleep_demo")
    dsn = with_database(admin, "deep_sleep_demo")
    store = connect_store(dsn)
    now = datetime.now(UTC).replace(microsecond=0)
    spec = SeedSpec(tenants=args.tenants, scopes_per_tenant=args.scopes_per_tenant, nodes_per_scope=args.nodes, seed=args.seed, now=now)
    counts = seed_store(store, spec)
    print("seeded:", ", ".join(f"{t}={n:,}" for t, n in counts.items()))
    reports = []
    scopes = scopes_of(spec)
    for i, scope in enumerate(scopes, 1):
        print(f"[{i}/{len(scopes)}] consolidating {scope.display()} …", flush=True)
        reports.append(ConsolidationReport.from_dict(_run_flow(scope.display(), now, None, dsn, args.runs_dir)))
    print_summary(reports, title=f"Deep Sleep demo — as_of {now.isoformat()}")
    failed = [r for r in reports if r.status != "applied"]
    runs = Path(reports[0].diff_uri or ".").parent.parent.parent if reports else None
    print(f"snapshots, diffs and reports (report.json) of these runs are under {runs}")
    return 1 if failed else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="deep-sleep", description="Offline memory consolidation for agent memory stores.")
    p.add_argument("--dsn", default=None, help="PostgreSQL DSN (default: $DEEP_SLEEP_DSN, else the embedded server)")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="seed a small realistic store and consolidate every scope")
    d.add_argument("--tenants", type=int, default=2)
    d.add_argument("--scopes-per-tenant", type=int, default=2)
    d.add_argument("--nodes", type=int, default=300, help="nodes per scope")
    d.add_argument("--seed", type=int, default=7)
    d.add_argument("--runs-dir", default=None)
    d.set_defaults(func=cmd_demo)

    s = sub.add_parser("seed", help="generate and bulk-load synthetic scopes")
    s.add_argument("--tenants", type=int, default=3)
    s.add_argument("--scopes-per-tenant", type=int, default=2)
    s.add_argument("--nodes", type=int, default=200, help="nodes per scope")
    s.add_argument("--seed", type=int, default=7)
    s.add_argument("--now", default=None, help="ISO time the synthetic history ends at (default: now)")
    s.set_defaults(func=cmd_seed)

    r = sub.add_parser("run", help="run the deep_sleep flow for one scope")
    r.add_argument("scope")
    r.add_argument("--as-of", default=None)
    r.add_argument("--config", default=None, help="TOML configuration file")
    r.add_argument("--runs-dir", default=None)
    r.set_defaults(func=cmd_run)

    n = sub.add_parser("snapshot", help="extract one scope into a snapshot directory")
    n.add_argument("scope")
    n.add_argument("--out", required=True)
    n.set_defaults(func=cmd_snapshot)

    y = sub.add_parser("replay", help="transform + validate a snapshot directory into a diff directory (no database)")
    y.add_argument("snapshot_dir")
    y.add_argument("--as-of", required=True)
    y.add_argument("--out", required=True)
    y.add_argument("--config", default=None)
    y.set_defaults(func=cmd_replay)
    return p


def main(argv: list[str] | None = None) -> int:
    from deep_sleep.errors import DeepSleepError
    from deep_sleep.scope import ScopeError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except (DeepSleepError, ScopeError, ValueError) as exc:
        print(f"deep-sleep {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
