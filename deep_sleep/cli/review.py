"""The commands that look and undo: replay, replay-range, compare, undo, plan, gc, health, report."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from pathlib import Path

from deep_sleep.cli.common import _as_of, _out_dir, _store, require_scope


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
    from deep_sleep.core.files import fetch_dir

    config = load_config(args.config)
    as_of = _as_of(args.as_of)
    out = _out_dir(args.out)
    args.snapshot_dir = str(fetch_dir(args.snapshot_dir))  # a run's snapshot on an object store: a local copy
    if args.scope is None and _is_shard(Path(args.snapshot_dir)) and not args.compare_config and not args.explain:
        return _replay_shard(Path(args.snapshot_dir), config, as_of, out)
    args.snapshot_dir = _one_scope(Path(args.snapshot_dir), args.scope, out)
    if args.compare_config:
        from deep_sleep.jobs.compare import comparison_markdown, print_comparison
        from deep_sleep.jobs.replay_range import replay_stored

        result = replay_stored(args.snapshot_dir, config, load_config(args.compare_config), as_of=as_of, out=out)
        (out / "comparison.md").write_text(comparison_markdown(result.comparison))
        print_comparison(result.comparison)
        print(f"\ndiffs, reports and the comparison written to {out}")
        return 0
    plan_stage(Path(args.snapshot_dir), config, as_of, out)
    report = validate_stage(Path(args.snapshot_dir), out, config)
    print(report_markdown(report))
    print(f"\ndiff written to {out} (hash {report.diff_hash})")
    if args.explain:
        _explain(out, report)
    return 1 if report.status == "failed" else 0


def _is_shard(snapshot_dir: Path) -> bool:
    import json

    try:
        manifest = json.loads((snapshot_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and len(manifest.get("scopes") or []) > 1


def _replay_shard(snapshot_dir: Path, config, as_of, out: Path) -> int:
    """Replay every scope of a shard snapshot in one pass: a shard diff directory (one scope's diff
    and report read out with ``--scope`` by ``compare``, ``undo`` and the notebooks)."""
    from deep_sleep.core.scope import Scope
    from deep_sleep.core.shard import Shard
    from deep_sleep.run.pipeline import plan_only

    result = plan_only(Shard.read(snapshot_dir), config, as_of, out)
    failed = [s for s, r in result.reports.items() if r.status == "failed"]
    changed = sum(1 for r in result.reports.values() if r.rows_changed)
    print(f"replayed {len(result.reports)} scopes of {snapshot_dir}: {changed} with changes, {len(failed)} failed validation")
    for s in failed[:10]:
        print(f"  failed: {Scope.parse(s)}: {'; '.join(result.reports[s].errors)[:300]}")
    print(f"\nshard diff written to {out} (reports.parquet: one row per scope)")
    return 1 if failed else 0


def _one_scope(snapshot_dir: Path, scope: str | None, out: Path) -> Path:
    """The snapshot directory to replay: ``snapshot_dir`` itself, or for a shard snapshot (SPEC §8) the
    ``--scope`` asked for, written out as a single-scope snapshot beside the diff."""
    from deep_sleep.core.errors import InputError
    from deep_sleep.core.scope import Scope
    from deep_sleep.core.shard import Shard

    import json

    try:
        manifest = json.loads((snapshot_dir / "manifest.json").read_text())
    except (OSError, ValueError):
        manifest = None  # not a shard: the single-scope reader names the problem
    if not (isinstance(manifest, dict) and "scopes" in manifest) and scope is None:
        return snapshot_dir
    shard = Shard.read(snapshot_dir)
    if len(shard.scope_paths) == 1 and scope is None:
        return snapshot_dir
    if scope is None:
        listed = ", ".join(str(Scope.parse(s)) for s in shard.scope_paths[:5])
        raise InputError(f"{snapshot_dir} is a shard snapshot of {len(shard.scope_paths)} scopes ({listed}"
                         f"{'…' if len(shard.scope_paths) > 5 else ''}); choose one with --scope")
    one = shard.scope(Scope.coerce(scope).path)
    return one.write(out.parent / f"{out.name}.snapshot")


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

    _as_of(args.from_), _as_of(args.to)  # bad dates are refused here, by name, before any snapshot is read
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

    from deep_sleep.core.scope import Scope

    cmp = compare_dirs(args.diff_a, args.diff_b, Scope.coerce(args.scope).path if args.scope else None)
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


def cmd_approve(args: argparse.Namespace) -> int:
    from deep_sleep.jobs.approve import approve, decision_text

    print(decision_text(approve(_store(args.dsn), args.run_id, args.phase, decided_by=args.by)))
    return 0


def cmd_reject(args: argparse.Namespace) -> int:
    from deep_sleep.jobs.approve import decision_text, reject

    print(decision_text(reject(_store(args.dsn), args.run_id, args.phase, decided_by=args.by)))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from deep_sleep.core.scope import Scope
    from deep_sleep.run.preview import held_markdown, plan_preview, preview_markdown
    from deep_sleep.run.stages import plan_scope
    from deep_sleep.transforms.config import load_config

    as_of = _as_of(args.as_of)
    config = load_config(args.config)
    store = _store(args.dsn)
    scope = require_scope(store, args.scope)  # an unknown scope names the nearest ones
    planned = plan_scope(store, scope, config, as_of, args.runs_dir)
    # the records, and what the apply stage would hold of them (the same selection, split_holds)
    found = plan_preview(planned.validated, config.holds)
    found.write(planned.diff_dir, single=True)
    records = found.scope(planned.report.scope_path)
    print(preview_markdown(records, per_phase=args.per_phase, title=f"Plan for {Scope.parse(planned.report.scope_path)} at {planned.report.as_of}"))
    print()
    print(held_markdown(records, found.why.get(planned.report.scope_path, ()), per_phase=args.per_phase))
    print(f"\nnothing was applied; snapshot {planned.snapshot_dir}, diff {planned.diff_dir}")
    if planned.report.status == "failed":
        print("validation FAILED — a run would apply nothing:\n" + "\n".join(planned.report.errors))
        return 1
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from deep_sleep.jobs.gc import gc, gc_markdown
    from deep_sleep.run.stages import runs_location
    result = gc(_store(args.dsn), runs_location(args.runs_dir), args.keep_days, force=args.force, dry_run=args.dry_run)
    print(gc_markdown(result))
    return 0


def cmd_health(args: argparse.Namespace) -> int:

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


