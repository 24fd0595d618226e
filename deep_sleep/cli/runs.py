"""The commands that consolidate: seed, run, snapshot, nightly, serve, backfill, demo."""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from deep_sleep.cli import common
from deep_sleep.cli.common import (
    _SCOPED,
    _as_of,
    _consolidate,
    _hide_dsn,
    _out_dir,
    _print_run,
    _store,
    check_as_of,
    require_scope,
)


def cmd_seed(args: argparse.Namespace) -> int:
    """A synthetic store as the live path writes it: every node, event and skill with the configured
    embedder's vector (``embedding.model`` of ``--config``), the recall log with explicit feedback."""
    from deep_sleep.dev.seed import SeedSpec, scopes_of, seed_store
    from deep_sleep.transforms.config import load_config

    model = load_config(args.config).embedding.model
    if args.fleet is not None:
        return _seed_fleet(args, model)
    spec = SeedSpec(tenants=args.tenants, scopes_per_tenant=args.scopes_per_tenant, nodes_per_scope=args.nodes,
                    seed=args.seed, now=_as_of(args.now) or datetime.now(UTC).replace(microsecond=0),
                    embedding_model=model)
    store = _store(args.dsn)
    t = time.perf_counter()
    counts = seed_store(store, spec)
    for table, n in counts.items():
        print(f"{table:24s} {n:>10,d}")
    scopes = scopes_of(spec)
    shown = ", ".join(s.display() for s in scopes[:3]) + (f", … {scopes[-1].display()}" if len(scopes) > 3 else "")
    print(f"{len(scopes):,} scope{'s' if len(scopes) != 1 else ''} ({shown}), vectors of {model}: "
          f"{sum(counts.values()):,} rows in {time.perf_counter() - t:.1f}s")
    return 0


def _seed_fleet(args: argparse.Namespace, model: str) -> int:
    from deep_sleep.dev.fleet import FleetSpec, fleet_scope, seed_fleet

    spec = FleetSpec(scopes=args.fleet, nodes=args.nodes, seed=args.seed, recalls=True, embedding_model=model,
                     now=_as_of(args.now) or datetime.now(UTC).replace(microsecond=0))
    store = _store(args.dsn)
    t = time.perf_counter()
    counts = seed_fleet(store, spec, progress=lambda line: print(f"  {line}", flush=True))
    print(f"fleet of {spec.scopes:,} scopes ({fleet_scope(0).display()} … {fleet_scope(spec.scopes - 1).display()}), "
          f"vectors of {model}: {sum(counts.values()):,} rows in {time.perf_counter() - t:.1f}s")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """One scope.  Every input is checked first (scope, --as-of, config, store); then the run."""
    from deep_sleep.run.console import print_summary, report_markdown
    from deep_sleep.cli.common import config_of

    as_of = _as_of(args.as_of)
    config_of(args.config)  # a bad file fails here, not inside a flow
    store = _store(args.dsn)
    scope = require_scope(store, args.scope)
    check_as_of(store, as_of, scope, force=args.force)
    report = _consolidate(store, scope, as_of, args.config, args.dsn, args.runs_dir, args.prefect)
    if report is None:
        return 1
    print(report_markdown(report))
    print_summary([report])
    _print_run(report)
    return 0 if report.status != "failed" else 1


def cmd_snapshot(args: argparse.Namespace) -> int:
    from deep_sleep.store.extract import extract

    out = _out_dir(args.out)
    store = _store(args.dsn)
    snap = extract(store, require_scope(store, args.scope))
    out = snap.write(out)
    counts = ", ".join(f"{t}={n}" for t, n in snap.row_counts().items() if n)
    print(f"snapshot of {snap.scope.display()} at {snap.taken_at.isoformat()} written to {out} ({counts or 'no rows'})")
    return 0


def cmd_nightly(args: argparse.Namespace) -> int:
    """One night over the fleet (every due scope): the flow, on the Prefect server PREFECT_API_URL names
    or on a temporary one; a night with no due scope and no such server runs without Prefect
    (:mod:`deep_sleep.cli.night`)."""
    from deep_sleep.cli.common import config_of

    started = time.perf_counter()
    as_of = _as_of(args.as_of)
    config = config_of(args.config)
    store = _store(args.dsn)
    check_as_of(store, as_of, force=args.force)  # per scope, the gate skips scopes run later
    _hide_dsn(args.dsn)
    common._quiet_prefect()
    from deep_sleep.cli.night import run_night
    from deep_sleep.jobs.night import NightlyParameters

    summary = run_night(NightlyParameters(
        as_of=as_of, config_file=args.config, dsn=None, runs_dir=args.runs_dir,
        max_workers=args.max_workers, apply_concurrency=args.apply_concurrency, data_quality=not args.no_data_quality,
        task_runner=args.task_runner, dask_address=args.dask_address, prefect_apply_limit=args.prefect_apply_limit,
        progress=True, shard_rows=args.shard_rows, shard_scopes=args.shard_scopes, plan=args.plan,
        plan_scopes=args.plan_scopes, plan_per_phase=args.per_phase,
    ), config, store)
    from deep_sleep.run.console import markdown_table

    if args.plan:  # the very text of the deep-sleep-night-plan artifact
        print(summary["markdown"])
        print(f"\n{summary['scopes']} scopes: {summary['due']} due, {summary['planned']} planned, "
              f"{summary['failed']} failed, {summary['skipped']} skipped; {summary['records']} record(s) would change, "
              f"{summary['held_rows']} would be held; nothing was applied")
        return 1 if summary["failed"] else 0

    from deep_sleep.run.console import night_lines, scope_table

    if args.table:
        print(markdown_table(*scope_table(summary["rows"])) + "\n")
    summary["seconds"] = {"all": time.perf_counter() - started, **summary.get("seconds", {})}  # this command's, too
    print("\n".join(night_lines(summary)))
    if summary.get("health"):
        from deep_sleep.jobs.health import Alert, health_markdown

        print("\n" + health_markdown([Alert(**a) for a in summary["health"]]))
    if summary.get("retention"):
        r = summary["retention"]
        print(f"retention: removed {r['directories']} run directories ({r['bytes'] / 1e6:.1f} MB), "
              f"{r['archive_rows']} archive rows")
    return nightly_exit_code(summary, fail_on_alerts=config.health.fail_nightly)


def nightly_exit_code(summary: dict, fail_on_alerts: bool = True) -> int:
    """1 when the night found a problem — a failed scope, a data-quality suite that failed, a
    run-health alert (unless ``health.fail_nightly`` is off: then the alerts are printed and the
    night, like its flow run, still succeeds) — else 0."""
    dq = summary.get("data_quality")
    alerts = fail_on_alerts and summary.get("health")
    return 1 if summary.get("failed") or (dq and not dq.get("success")) or alerts else 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve the nightly (on its cron), replay and backfill deployments from this process (no work pool)."""
    common._quiet_prefect()
    if not os.environ.get("PREFECT_API_URL"):
        print("deep-sleep serve: error: schedules need a Prefect server. Start one with `prefect server start` "
              "and set PREFECT_API_URL=http://127.0.0.1:4200/api", file=sys.stderr)
        return 2
    api = os.environ["PREFECT_API_URL"].rstrip("/")
    import httpx

    try:
        httpx.get(f"{api}/health", timeout=5).raise_for_status()
    except httpx.HTTPError as exc:
        print(f"deep-sleep serve: error: the Prefect API at {api} does not answer ({type(exc).__name__}: {exc}). "
              "Start it with `prefect server start`, or fix PREFECT_API_URL.", file=sys.stderr)
        return 2
    from deep_sleep.flows.deployments import serve

    _hide_dsn(args.dsn)
    serve(cron=args.cron, dsn=None, runs_dir=args.runs_dir)
    return 0


def cmd_backfill(args: argparse.Namespace) -> int:
    """Write scope_path for legacy rows in small resumable batches (or count them: --dry-run)."""
    from deep_sleep.jobs import backfill as bf
    from deep_sleep.run.console import markdown_table

    dsn = _store(args.dsn).dsn
    if args.validate_only:
        outcome = bf.validate_backfill(dsn, tables=args.table)
        print("\n".join(outcome.messages()) or "ok: every row has a path, no row is in another tenant")
        return 0 if outcome.ok else 1
    kwargs = dict(batch_size=args.batch_size, lock_timeout_ms=args.lock_timeout_ms, dry_run=args.dry_run, job=args.job,
                  tables=args.table, pause_ms=args.pause_ms, max_retries=args.max_retries)
    if args.no_progress or args.json:
        result = bf.backfill(dsn, **kwargs)
    else:
        with bf.rich_progress() as show:
            result = bf.backfill(dsn, progress=show, **kwargs)
    if args.json:
        print(bf.dumps(result))
    else:
        header, rows = bf.result_rows(result)
        print(markdown_table(header, rows))
        if result.validation is not None:
            print("\n".join(result.validation.messages()) or "validation: ok")
    return 0 if result.dry_run or (result.validation is not None and result.validation.ok) else 1


def cmd_demo(args: argparse.Namespace) -> int:
    """Seed the store every other command uses (database ``deep_sleep``), consolidate every demo scope,
    print the reports.  A store that already holds scopes is left alone unless ``--reset``, which
    drops and recreates that database first."""
    from deep_sleep.core.errors import InputError
    from deep_sleep.dev.seed import SeedSpec, scopes_of, seed_store
    from deep_sleep.run.console import print_summary
    from deep_sleep.store.db import DEFAULT_DATABASE, create_database, describe, embedded_dsn, with_database

    store = _store(args.dsn)
    with store.pg() as con:
        holds_scopes = con.execute("SELECT " + " OR ".join(f"EXISTS (SELECT 1 FROM {t})" for t in _SCOPED)).fetchone()[0]
    if holds_scopes:
        if not args.reset:
            raise InputError(f"the store {describe(store)} already holds scopes; `deep-sleep demo --reset` drops and "
                             "recreates it with the demo data (or pass --dsn for another database)")
        from urllib.parse import urlsplit

        name = urlsplit(store.dsn).path.lstrip("/") or DEFAULT_DATABASE if "://" in store.dsn else None
        if name is None:
            raise InputError("--reset needs a postgresql:// URL DSN (its database is dropped and recreated)")
        admin = with_database(store.dsn, "postgres") if args.dsn or os.environ.get("DEEP_SLEEP_DSN") else embedded_dsn(database="postgres")
        store = create_database(admin, name)
    dsn = store.dsn
    now = datetime.now(UTC).replace(microsecond=0)
    spec = SeedSpec(tenants=args.tenants, scopes_per_tenant=args.scopes_per_tenant, nodes_per_scope=args.nodes, seed=args.seed, now=now)
    counts = seed_store(store, spec)
    print("seeded:", ", ".join(f"{t}={n:,}" for t, n in counts.items()))
    reports = []
    scopes = scopes_of(spec)
    import time

    t0 = time.perf_counter()
    for i, scope in enumerate(scopes, 1):
        print(f"[{i}/{len(scopes)}] consolidating {scope.display()} … ({time.perf_counter() - t0:.1f} s)", flush=True)
        report = _consolidate(store, scope, now, None, dsn, args.runs_dir, args.prefect)
        if report is not None:
            reports.append(report)
    print_summary(reports, title=f"Deep Sleep demo — as_of {now.isoformat()}")
    failed = [r for r in reports if r.status != "applied"]
    runs = Path(reports[0].diff_uri or ".").parent.parent.parent if reports else None
    print(f"snapshots, diffs and reports (report.json) of these runs are under {runs}")
    print(f"next: deep-sleep report; deep-sleep run {scopes[0].display()}; deep-sleep nightly (same store, no flags)")
    return 1 if failed or len(reports) < len(scopes) else 0


