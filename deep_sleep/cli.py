"""``deep-sleep`` — the command line.

    deep-sleep demo                                   seed a small store, consolidate every scope
    deep-sleep seed --tenants 3 --nodes 200           seed synthetic scopes
    deep-sleep run org/acme                           one scope's run (the same stages as the flow; Prefect if asked)
    deep-sleep snapshot org/acme --out DIR            extract a snapshot directory
    deep-sleep replay DIR --as-of ISO --out DIFF_DIR  transform + validate a stored snapshot (no database)

Scopes are written ``kind/id/kind/id`` (or as the raw ``\\x1f``-joined scope_path); a ``/`` inside
an id is written ``%2F``.  Every argument is checked — scope known to the store, ``--as-of`` within
bounds, ``--out`` usable, DSN reachable — before any Prefect machinery starts; every command that
touches a store says which one on stderr, and no message ever shows a password.
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
    # Tasks waiting for an apply slot poll at most every 0.5 s (Prefect's default 30 s idles slots).
    os.environ.setdefault("PREFECT_SERVER_CONCURRENCY_MAXIMUM_CONCURRENCY_SLOT_WAIT_SECONDS", "0.5")


def _as_of(value: str | None) -> datetime | None:
    from deep_sleep.core.snapshot import utc

    return utc(value) if value else None


def _store(dsn: str | None):
    """Connect (checking the DSN first) and say on stderr which store this command uses."""
    from deep_sleep.store.db import connect_store, describe

    store = connect_store(dsn)
    print(f"deep-sleep: store {describe(store)}", file=sys.stderr)
    return store


def _hide_dsn(dsn: str | None) -> None:
    """Hand a DSN to the flows through the environment, never as a flow parameter: Prefect keeps
    parameters in its database and shows them in the UI."""
    if dsn:
        os.environ["DEEP_SLEEP_DSN"] = dsn


def _out_dir(value: str, what: str = "--out") -> Path:
    from deep_sleep.core.errors import InputError

    out = Path(value)
    if out.exists() and not out.is_dir():
        raise InputError(f"{what} {out} is an existing file; give a directory (it is created if missing)")
    return out


_SCOPED = ("memory_nodes", "episodic_events", "memory_edges", "recall_events", "procedural_skills", "soul_profiles",
           "pending_connections", "prospective_triggers", "memory_access_log")


def known_scopes(store) -> list[str]:
    """Every scope_path that holds a row of any table, sorted."""
    sql = " UNION ".join(f"SELECT DISTINCT scope_path FROM {t} WHERE scope_path IS NOT NULL" for t in _SCOPED)
    with store.pg() as con:
        return sorted(r[0] for r in con.execute(sql))


def require_scope(store, text: str):
    """The scope ``text`` names, if the store holds rows of it; else an error naming the nearest
    existing scopes ("did you mean")."""
    import difflib

    from deep_sleep.core.errors import InputError
    from deep_sleep.core.scope import Scope

    scope = Scope.coerce(text)
    exists = " OR ".join(f"EXISTS (SELECT 1 FROM {t} WHERE scope_path = %(p)s)" for t in _SCOPED)
    if scope.depth == 1 and scope.levels[0][0] == "tenant":  # legacy rows (scope_path NULL) read as tenant/<id> (SPEC §1)
        exists += " OR EXISTS (SELECT 1 FROM memory_nodes WHERE scope_path IS NULL AND tenant_id = %(t)s)"
    with store.pg() as con:
        if con.execute(f"SELECT {exists}", {"p": scope.path, "t": scope.tenant_id}).fetchone()[0]:
            return scope
    names = [Scope.parse(p).display() for p in known_scopes(store)]
    near = difflib.get_close_matches(scope.display(), names, n=3, cutoff=0.4) or names[:3]
    hint = f" Did you mean {', '.join(near)}?" if near else " The store holds no scope at all: seed one with `deep-sleep demo`."
    raise InputError(f"scope {scope.display()} has no rows in this store; nothing to consolidate.{hint}")


AS_OF_MARGIN_HOURS = float(os.environ.get("DEEP_SLEEP_AS_OF_MARGIN_HOURS", "1"))


def check_as_of(store, as_of: datetime | None, scope=None, *, force: bool = False,
                margin_hours: float | None = None, now: datetime | None = None) -> None:
    """Refuse an ``as_of`` more than ``margin_hours`` (``DEEP_SLEEP_AS_OF_MARGIN_HOURS``, 1) past the
    wall clock, or earlier than ``scope``'s last applied run, unless ``force``."""
    from datetime import timedelta

    from deep_sleep.core.errors import InputError

    if as_of is None or force:
        return
    margin = AS_OF_MARGIN_HOURS if margin_hours is None else margin_hours
    now = now or datetime.now(UTC)
    if as_of > now + timedelta(hours=margin):
        raise InputError(f"--as-of {as_of.isoformat()} is {(as_of - now).total_seconds() / 3600:.1f} h after the wall clock "
                         f"(the margin is {margin:g} h, DEEP_SLEEP_AS_OF_MARGIN_HOURS); a run there would decay and prune "
                         "as if that time had come. Pass --force if you mean it.")
    if scope is not None:
        with store.pg() as con:
            last = con.execute("SELECT max(as_of) FROM consolidation_runs WHERE scope_path = %s AND status = 'applied'",
                               (scope.path,)).fetchone()[0]
        if last is not None and as_of < last:
            raise InputError(f"--as-of {as_of.isoformat()} is earlier than {scope.display()}'s last applied run "
                             f"(as_of {last.isoformat()}); its window would re-consolidate what that run did. "
                             "Pass --force if you mean it.")


def _consolidate(store, scope, as_of: datetime | None, config_file: str | None, dsn: str | None, runs_dir: str | None,
                 prefect: bool):
    """One scope's run: through the Prefect flow when ``prefect`` (or PREFECT_API_URL is set), else the
    very same stages in this process (stages.consolidate_scope) — no temporary Prefect server to start,
    so a one-scope run answers in seconds."""
    from deep_sleep.transforms.config import load_config
    from deep_sleep.core.report import ConsolidationReport
    from deep_sleep.run.stages import consolidate_scope

    if prefect or os.environ.get("PREFECT_API_URL"):
        _hide_dsn(dsn)
        from deep_sleep.core.errors import ValidationFailed

        try:
            return ConsolidationReport.from_dict(_run_flow(scope.display(), as_of, config_file, None, runs_dir))
        except ValidationFailed as exc:
            print(f"deep-sleep run: {exc}", file=sys.stderr)
            return None
    return consolidate_scope(store, scope, load_config(config_file), as_of, runs_dir)


def _print_run(report) -> None:
    """Where a run's files went and what quarantine set aside — on every run's terminal output."""
    if report.quarantined:
        rows = sum(n for reasons in report.quarantined.values() for n in reasons.values())
        print(f"\nquarantined {rows} row(s) (left untouched in the store, not consolidated):")
        for table, reasons in sorted(report.quarantined.items()):
            for reason, n in sorted(reasons.items()):
                print(f"  {table}: {n} × {reason}")
    if report.snapshot_uri:
        print(f"snapshot: {report.snapshot_uri}")
    if report.diff_uri:
        print(f"diff and report.json: {report.diff_uri}")


def cmd_seed(args: argparse.Namespace) -> int:
    from deep_sleep.dev.seed import SeedSpec, scopes_of, seed_store

    spec = SeedSpec(tenants=args.tenants, scopes_per_tenant=args.scopes_per_tenant, nodes_per_scope=args.nodes,
                    seed=args.seed, now=_as_of(args.now) or datetime.now(UTC).replace(microsecond=0))
    store = _store(args.dsn)
    counts = seed_store(store, spec)
    for table, n in counts.items():
        print(f"{table:24s} {n:>10,d}")
    print("scopes:", ", ".join(s.display() for s in scopes_of(spec)))
    return 0


def _run_flow(scope: str, as_of: datetime | None, config_file: str | None, dsn: str | None, runs_dir: str | None):
    from deep_sleep.core.scope import Scope
    from deep_sleep.transforms.config import load_config

    # Bad input is refused here, before the flow starts: a failing flow run logs its traceback.
    Scope.coerce(scope)
    load_config(config_file)
    _quiet_prefect()
    from deep_sleep.flows.consolidate import DeepSleepParameters, deep_sleep

    return deep_sleep(DeepSleepParameters(scope=scope, as_of=as_of, config_file=config_file, dsn=dsn, runs_dir=runs_dir))


def cmd_run(args: argparse.Namespace) -> int:
    """One scope.  Every input is checked first (scope, --as-of, config, store); then the run."""
    from deep_sleep.transforms.config import load_config
    from deep_sleep.run.console import print_summary, report_markdown

    as_of = _as_of(args.as_of)
    load_config(args.config)  # a bad file fails here, not inside a flow
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


def cmd_replay(args: argparse.Namespace) -> int:
    """Transform and validate a stored snapshot; write the diff and report.  Touches no database.

    With ``--compare-config`` the snapshot is replayed under both configurations and compared;
    with ``--explain`` the statements an apply of the diff would run are printed too.
    """
    from deep_sleep.run.console import report_markdown
    from deep_sleep.run.stages import plan_stage, validate_stage
    from deep_sleep.transforms.config import load_config

    if args.explain and args.compare_config:
        from deep_sleep.core.errors import InputError

        raise InputError("replay: --explain prints the statements of one diff; leave out --compare-config to use it")
    config = load_config(args.config)
    out = _out_dir(args.out)
    if args.compare_config:
        from deep_sleep.jobs.compare import comparison_markdown, print_comparison
        from deep_sleep.jobs.replay_range import replay_stored

        result = replay_stored(args.snapshot_dir, config, load_config(args.compare_config), as_of=_as_of(args.as_of), out=out)
        (out / "comparison.md").write_text(comparison_markdown(result.comparison))
        print_comparison(result.comparison)
        print(f"\ndiffs, reports and the comparison written to {out}")
        return 0
    plan_stage(Path(args.snapshot_dir), config, _as_of(args.as_of), out)
    report = validate_stage(Path(args.snapshot_dir), out, config)
    print(report_markdown(report))
    print(f"\ndiff written to {out} (hash {report.diff_hash})")
    if args.explain:
        _explain(out, report)
    return 1 if report.status == "failed" else 0


def _explain(diff_dir: Path, report) -> None:
    """Print the statements an apply of the diff directory would run (no database)."""
    import polars as pl

    from deep_sleep.core.diff import Diff
    from deep_sleep.run.apply import planned_statements
    from deep_sleep.run.stages import QUARANTINE_FILE
    from deep_sleep.run.statements import explain

    if report.status == "failed":
        print("\n-- validation failed: an apply would only record the run as failed; no statements run")
        return
    qfile = diff_dir / QUARANTINE_FILE
    todo = planned_statements(Diff.read(diff_dir), report.scope_path, report.run_id or "<run id of the apply>",
                              pl.read_parquet(qfile) if qfile.exists() else None)
    print(f"\n-- the apply would run {len(todo)} statement(s) in one transaction:\n")
    print(explain(todo), end="")


def cmd_replay_range(args: argparse.Namespace) -> int:
    """Replay every stored snapshot of a scope taken in [--from, --to]; optionally compare two configs."""
    from deep_sleep.jobs.replay_range import range_markdown, replay_range
    from deep_sleep.transforms.config import load_config

    results = replay_range(
        args.runs_dir, args.scope, args.from_, args.to, load_config(args.config),
        load_config(args.compare_config) if args.compare_config else None,
        store=_store(args.dsn) if args.ledger else None, out=args.out,
    )
    print(range_markdown(results))
    bad = [r for r in results if r.reproduces is False or r.report.status == "failed"]
    return 1 if bad else 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Compare two diff directories (two configs, or two code versions, on the same snapshot)."""
    from deep_sleep.jobs.compare import (
        compare_dirs,
        comparison_markdown,
        print_comparison,
    )

    cmp = compare_dirs(args.diff_a, args.diff_b)
    if args.markdown:
        print(comparison_markdown(cmp))
    else:
        print_comparison(cmp)
    if args.out:
        cmp.write(args.out)
    return 0 if cmp.identical else 1


def cmd_undo(args: argparse.Namespace) -> int:
    from deep_sleep.jobs.undo import undo, undo_markdown

    result = undo(_store(args.dsn), args.run_id)
    print(undo_markdown(result))
    return 0 if result.complete else 1


def cmd_plan(args: argparse.Namespace) -> int:
    from deep_sleep.core.diff import Diff
    from deep_sleep.core.scope import Scope
    from deep_sleep.core.snapshot import Snapshot
    from deep_sleep.run.preview import PREVIEW_FILE, preview, preview_markdown
    from deep_sleep.run.stages import plan_scope
    from deep_sleep.store.db import connect_store
    from deep_sleep.transforms.config import load_config

    planned = plan_scope(connect_store(args.dsn), args.scope, load_config(args.config), _as_of(args.as_of),
                         args.runs_dir)
    records = preview(Snapshot.read(planned.snapshot_dir), Diff.read(planned.diff_dir))
    records.write_parquet(planned.diff_dir / PREVIEW_FILE)
    print(preview_markdown(records, per_phase=args.per_phase, title=f"Plan for {Scope.parse(planned.report.scope_path)} at {planned.report.as_of}"))
    print(f"\nnothing was applied; snapshot {planned.snapshot_dir}, diff {planned.diff_dir}")
    if planned.report.status == "failed":
        print("validation FAILED — a run would apply nothing:\n" + "\n".join(planned.report.errors))
        return 1
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from deep_sleep.jobs.gc import gc, gc_markdown
    from deep_sleep.run.stages import runs_dir
    result = gc(_store(args.dsn), runs_dir(args.runs_dir), args.keep_days, force=args.force, dry_run=args.dry_run)
    print(gc_markdown(result))
    return 0


def cmd_health(args: argparse.Namespace) -> int:
    from datetime import UTC, datetime

    from deep_sleep.core.scope import Scope
    from deep_sleep.jobs.health import health, health_markdown
    from deep_sleep.transforms.config import load_config

    config = load_config(args.config)
    alerts = health(_store(args.dsn), _as_of(args.as_of) or datetime.now(UTC), config.health,
                    config.gating.min_interval_hours)
    if args.scope:
        alerts = [a for a in alerts if a.scope_path == Scope.coerce(args.scope).path]
    print(health_markdown(alerts))
    return 1 if alerts else 0


def cmd_report(args: argparse.Namespace) -> int:
    from deep_sleep.jobs.ledger import last_runs, print_runs, runs_markdown

    records = last_runs(_store(args.dsn), args.scope, args.limit)
    if args.markdown:
        print(runs_markdown(records))
    else:
        print_runs(records)
    return 0


def cmd_nightly(args: argparse.Namespace) -> int:
    """One night over the fleet (every due scope), in Prefect's local mode unless PREFECT_API_URL is set."""
    from deep_sleep.transforms.config import load_config

    as_of = _as_of(args.as_of)
    load_config(args.config)
    check_as_of(_store(args.dsn), as_of, force=args.force)  # per scope, the gate skips scopes run later
    _hide_dsn(args.dsn)
    _quiet_prefect()
    from deep_sleep.flows.nightly import NightlyParameters, run_nightly

    summary = run_nightly(NightlyParameters(
        as_of=as_of, config_file=args.config, dsn=None, runs_dir=args.runs_dir,
        max_workers=args.max_workers, apply_concurrency=args.apply_concurrency, data_quality=not args.no_data_quality,
        task_runner=args.task_runner, dask_address=args.dask_address, prefect_apply_limit=not args.no_prefect_apply_limit,
        progress=True,
    ))
    from deep_sleep.run.console import markdown_table

    rows = [[r["scope"], r["status"], str(r.get("changes", "")), str(r.get("conflicts", "")), str(r.get("quarantined", "")),
             r.get("reason", "")[:80]] for r in summary["rows"]]
    print(markdown_table(["scope", "status", "changes", "conflicts", "quarantined", "reason"], rows))
    held = sum(r.get("quarantined") or 0 for r in summary["rows"])
    if held:
        print(f"\nquarantined {held} row(s) in all (left untouched; per scope and reason: deep-sleep report SCOPE, "
              "or consolidation_quarantine)")
    dq = summary["data_quality"]
    print(f"\n{summary['scopes']} scopes: {summary['due']} due, {summary['applied']} applied, {summary['failed']} failed, "
          f"{summary['skipped']} skipped" + (f"; data quality {'passed' if dq['success'] else 'FAILED'} ({dq['data_docs_path']})" if dq else ""))
    if summary.get("health"):
        from deep_sleep.jobs.health import Alert, health_markdown

        print("\n" + health_markdown([Alert(**a) for a in summary["health"]]))
    if summary.get("retention"):
        r = summary["retention"]
        print(f"retention: removed {r['directories']} run directories ({r['bytes'] / 1e6:.1f} MB), "
              f"{r['archive_rows']} archive rows")
    return nightly_exit_code(summary)


def nightly_exit_code(summary: dict) -> int:
    """1 when the night found a problem — a failed scope, a data-quality suite that failed, a
    run-health alert — else 0."""
    dq = summary.get("data_quality")
    return 1 if summary.get("failed") or (dq and not dq.get("success")) or summary.get("health") else 0


def cmd_serve(args: argparse.Namespace) -> int:
    """Serve the nightly (on its cron), replay and backfill deployments from this process (no work pool)."""
    _quiet_prefect()
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
    d.add_argument("--reset", action="store_true", help="drop and recreate the store's database first")
    d.add_argument("--prefect", action="store_true", help="run each scope through the Prefect flow")
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
    r.add_argument("--force", action="store_true", help="accept an --as-of before the last applied run or far in the future")
    r.add_argument("--prefect", action="store_true",
                   help="run through the Prefect flow even without PREFECT_API_URL (starts a temporary server: ~20 s)")
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
    y.add_argument("--compare-config", default=None, help="replay again under this config and compare (per phase)")
    y.add_argument("--explain", action="store_true", help="also print the statements an apply of the diff would run")
    y.set_defaults(func=cmd_replay)

    rr = sub.add_parser("replay-range", help="replay the stored snapshots of a scope over a date range (no writes)")
    rr.add_argument("scope")
    rr.add_argument("--from", dest="from_", required=True)
    rr.add_argument("--to", required=True)
    rr.add_argument("--runs-dir", default=None)
    rr.add_argument("--config", default=None)
    rr.add_argument("--compare-config", default=None)
    rr.add_argument("--out", default=None)
    rr.add_argument("--ledger", action="store_true", help="take each run's as_of and recorded hash from the store's ledger")
    rr.set_defaults(func=cmd_replay_range)

    c = sub.add_parser("compare", help="compare two diff directories per phase")
    c.add_argument("diff_a")
    c.add_argument("diff_b")
    c.add_argument("--out", default=None)
    c.add_argument("--markdown", action="store_true")
    c.set_defaults(func=cmd_compare)

    u = sub.add_parser("undo", help="restore a run's before-images unless rows changed since")
    u.add_argument("run_id")
    u.set_defaults(func=cmd_undo)

    pl_ = sub.add_parser("plan", help="what tonight's run of SCOPE would change, record by record (applies nothing)")
    pl_.add_argument("scope")
    pl_.add_argument("--as-of", default=None)
    pl_.add_argument("--config", default=None)
    pl_.add_argument("--per-phase", type=int, default=10, help="records shown per phase (all are in preview.parquet)")
    pl_.add_argument("--runs-dir", default=None)
    pl_.set_defaults(func=cmd_plan)

    g = sub.add_parser("gc", help="remove run directories and archive rows older than --keep-days "
                                  "(runs that can still be undone are kept unless --force)")
    g.add_argument("--keep-days", type=float, required=True)
    g.add_argument("--force", action="store_true", help="also remove what an undoable run needs; it is then "
                                                          "marked not undoable in the ledger")
    g.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    g.add_argument("--runs-dir", default=None)
    g.set_defaults(func=cmd_gc)

    h = sub.add_parser("health", help="run-health alerts over the ledger and the store (exit 1 when one fires)")
    h.add_argument("--as-of", default=None)
    h.add_argument("--scope", default=None, help="only this scope's alerts")
    h.add_argument("--config", default=None)
    h.set_defaults(func=cmd_health)

    rp = sub.add_parser("report", help="the last runs from the ledger")
    rp.add_argument("scope", nargs="?", default=None)
    rp.add_argument("--limit", type=int, default=20)
    rp.add_argument("--markdown", action="store_true")
    rp.set_defaults(func=cmd_report)

    ni = sub.add_parser("nightly", help="one night over every due scope (deep_sleep_nightly)")
    ni.add_argument("--as-of", default=None)
    ni.add_argument("--config", default=None)
    ni.add_argument("--runs-dir", default=None)
    ni.add_argument("--force", action="store_true", help="accept an --as-of far in the future")
    ni.add_argument("--max-workers", type=int, default=4)
    ni.add_argument("--apply-concurrency", type=int, default=2)
    ni.add_argument("--no-data-quality", action="store_true")
    ni.add_argument("--no-prefect-apply-limit", action="store_true",
                    help="cap applies only with the store's apply slots, not also with the Prefect tag limit")
    ni.add_argument("--task-runner", choices=["threads", "dask"], default="threads")
    ni.add_argument("--dask-address", default=None)
    ni.set_defaults(func=cmd_nightly)

    bf = sub.add_parser("backfill", help="write scope_path for legacy rows (resumable, small batches)")
    bf.add_argument("--job", default="scope-backfill", help="checkpoint name: rerun with the same name to resume")
    bf.add_argument("--batch-size", type=int, default=5000)
    bf.add_argument("--lock-timeout-ms", type=int, default=200)
    bf.add_argument("--pause-ms", type=int, default=0, help="sleep between batches, to yield to live traffic")
    bf.add_argument("--max-retries", type=int, default=50)
    bf.add_argument("--table", action="append", default=None, help="only this table (repeatable)")
    bf.add_argument("--dry-run", action="store_true", help="count legacy rows per table and tenant; write nothing")
    bf.add_argument("--validate-only", action="store_true")
    bf.add_argument("--json", action="store_true")
    bf.add_argument("--no-progress", action="store_true")
    bf.set_defaults(func=cmd_backfill)

    sv = sub.add_parser("serve", help="serve the nightly/replay/backfill deployments (needs PREFECT_API_URL)")
    sv.add_argument("--cron", default="0 3 * * *", help="nightly schedule (default 03:00 UTC)")
    sv.add_argument("--runs-dir", default=None)
    sv.set_defaults(func=cmd_serve)
    return p


def main(argv: list[str] | None = None) -> int:
    from deep_sleep.core.errors import DeepSleepError

    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except DeepSleepError as exc:  # ours, raised on purpose: the message names the input and the fix
        print(f"deep-sleep {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
