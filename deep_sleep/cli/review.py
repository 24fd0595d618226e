"""The commands that look and undo: replay, replay-range, compare, undo, plan, gc, health, report."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

from deep_sleep.cli.common import _as_of, _out_dir, _store, require_scope
from deep_sleep.core.errors import InputError
from deep_sleep.core.scope import Scope


def cmd_replay(args: argparse.Namespace) -> int:
    """Transform and validate a stored snapshot (:data:`~deep_sleep.run.pipeline.REPLAY`: the night
    without extract and apply); write the diff and report.  Touches no database.

    With ``--compare-config`` the snapshot is replayed under both configurations and compared;
    with ``--explain`` the stages and the statements an apply of the diff would run are printed too.
    """
    from deep_sleep.core.errors import InputError
    from deep_sleep.core.files import fetch_dir
    from deep_sleep.core.scope import Scope
    from deep_sleep.core.shard import Shard
    from deep_sleep.run import pipeline
    from deep_sleep.run.console import report_markdown
    from deep_sleep.cli.common import config_of

    if args.explain and args.compare_config:
        raise InputError("replay: --explain prints the statements of one diff; leave out --compare-config to use it")
    config = config_of(args.config)
    as_of = _as_of(args.as_of)
    out = _out_dir(args.out)
    snapshot_dir = fetch_dir(args.snapshot_dir)  # a run's snapshot on an object store: a local copy
    shard = Shard.read(snapshot_dir)
    if args.scope is not None:
        one = Scope.coerce(args.scope).path
        shard = Shard.of(shard.scope(one))
    if args.compare_config:
        from deep_sleep.jobs.compare import comparison_markdown, print_comparison
        from deep_sleep.jobs.replay_range import replay_stored

        if len(shard.scope_paths) != 1:
            raise InputError(f"{snapshot_dir} is a shard snapshot of {len(shard.scope_paths)} scopes; choose one with --scope")
        stored = snapshot_dir
        if args.scope is not None:  # the scope's slice of a shard snapshot, written beside the diff
            stored = shard.write(out.parent / f"{out.name}.snapshot")
        result = replay_stored(stored, config, config_of(args.compare_config), as_of=as_of, out=out)
        (out / "comparison.md").write_text(comparison_markdown(result.comparison))
        print_comparison(result.comparison)
        print(f"\ndiffs, reports and the comparison written to {out}")
        return 0
    ctx = pipeline.Context.of(as_of, config, diff_dir=out, mode="replay")
    if args.explain:
        print("-- the stages of a replay:\n" + "\n".join(f"--   {line}" for line in pipeline.explain(pipeline.REPLAY, ctx).splitlines()))
    state = pipeline.run(pipeline.REPLAY, ctx, pipeline.State(shard=shard))
    failed = [s for s in state.reports if s not in state.ok]
    if len(state.reports) == 1:
        report = state.report()
        print(report_markdown(report))
        print(f"\ndiff written to {out} (hash {report.diff_hash})")
    else:
        changed = sum(1 for r in state.reports.values() if r.rows_changed)
        print(f"replayed {len(state.reports)} scopes of {snapshot_dir}: {changed} with changes, {len(failed)} failed validation")
        for s in failed[:10]:
            print(f"  failed: {Scope.parse(s)}: {'; '.join(state.reports[s].errors)[:300]}")
        print(f"\nshard diff written to {out} (reports.parquet: one row per scope)")
    if args.explain:
        _explain(state, config.meta_nodes.max_members)
    return 1 if failed else 0


def _explain(state, cluster_cap: int | None = None) -> None:
    """Print the statements an apply of what the replay would apply tonight would run (no database)."""
    from deep_sleep.run.apply import batch_statements
    from deep_sleep.run.statements import explain

    ok = {s: r.with_(run_id=r.run_id or "<run id of the apply>") for s, r in state.reports.items() if r.status != "failed"}
    if not ok:
        print("\n-- validation failed: an apply would only record the run as failed; no statements run")
        return
    q = state.transformed.quarantined
    todo = batch_statements(state.tonight, ok, q if q.height else None, cluster_cap).statements
    print(f"\n-- the apply would run {len(todo)} statement(s) in one transaction:\n")
    print(explain(todo), end="")


def cmd_replay_range(args: argparse.Namespace) -> int:
    """Replay every stored snapshot of a scope taken in [--from, --to]; optionally compare two configs."""
    from deep_sleep.jobs.replay_range import range_markdown, replay_range
    from deep_sleep.cli.common import config_of

    _as_of(args.from_), _as_of(args.to)  # bad dates are refused here, by name, before any snapshot is read
    results = replay_range(
        args.runs_dir, args.scope, args.from_, args.to, config_of(args.config),
        config_of(args.compare_config) if args.compare_config else None,
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


def _selection(args: argparse.Namespace):
    """The queue selection of ``held`` / bulk ``approve`` / ``reject`` (None when no flag names one)."""
    from datetime import timedelta

    from deep_sleep.jobs.queue import Selection

    from deep_sleep.run.holds import RULES

    if args.older_than is not None and not 0 <= args.older_than <= MAX_OLDER_THAN_DAYS:  # nan compares false
        raise InputError(f"--older-than must be a number of days from 0 to {MAX_OLDER_THAN_DAYS:,}, got {args.older_than:g}")
    if args.reason is not None and args.reason not in RULES:
        raise InputError(f"--reason {args.reason!r} is no hold reason; one of {', '.join(RULES)}")
    if not any((args.reason, args.phase, args.scope, args.older_than is not None)):
        return None
    return Selection(reason=args.reason, phase=args.phase, scope=args.scope,
                     older_than=timedelta(days=args.older_than) if args.older_than is not None else None,
                     now=datetime.now(UTC))


PAST = {"approve": "approved", "reject": "rejected"}
#: ``--older-than`` at most this many days (a thousand years: older than anything a store holds).
MAX_OLDER_THAN_DAYS = 365_000


def _decide(args: argparse.Namespace, verb: str) -> int:
    from deep_sleep.jobs import approve as approvals
    from deep_sleep.jobs.queue import decide

    store = _store(args.dsn)
    if args.run_id is not None:
        if any((args.scope, args.older_than is not None, args.include_superseded)):
            raise InputError(f"{verb}: give a RUN_ID (with --phase, --reason) or a selection (--scope, --older-than), not both")
        if args.reason is not None:
            _selection(args)  # the reason is checked by name
        act = approvals.approve if verb == "approve" else approvals.reject
        print(approvals.decision_text(act(store, args.run_id, args.phase, decided_by=args.by, reason=args.reason)))
        return 0
    selection = _selection(args)
    if selection is None:
        raise InputError(f"{verb}: give a RUN_ID, or a selection (--reason, --phase, --scope, --older-than); "
                         "`deep-sleep held` lists what is pending")
    if selection.scope is not None:  # a prefix: it may hold no rows of its own
        selection = replace(selection, scope=Scope.coerce(selection.scope))
    out = decide(store, verb, selection, decided_by=args.by, include_superseded=args.include_superseded,
                 progress=lambda m: print(m, file=sys.stderr))
    rows = sum(sum(n for kinds in d.held_rows.values() for n in kinds.values()) for d in out.decided)
    closure = out.closure
    print(f"{PAST[verb]} {rows} held row(s) in {len(out.decided)} run(s): {sum(d.selected for d in out.decided)} selected, "
          f"{len(closure)} added by the closure under the graph; selection: {selection.describe()}"
          + (f"; {out.skipped_superseded} superseded (run, phase) pair(s) expired and left alone" if out.skipped_superseded else ""))
    if verb == "approve":
        print(f"applied {sum(sum(k.values()) for d in out.decided for k in d.applied.values())} row(s), "
              f"{sum(d.conflicts for d in out.decided)} conflict(s)")
    for d in out.decided[:50]:
        if d.closure:
            print(f"  run {d.run_id[:8]}: " + "; ".join(n for n in d.notes if n.startswith("the closure")))
    if sum(1 for d in out.decided if d.closure) > 50:
        print(f"  … the closure rows of every run are in consolidation_decided_rows (closure = true)")
    for run_id, why in out.refused:
        print(f"refused {run_id[:8]}: {why}", file=sys.stderr)
    return 0 if out.ok else 1


def cmd_approve(args: argparse.Namespace) -> int:
    return _decide(args, "approve")


def cmd_reject(args: argparse.Namespace) -> int:
    return _decide(args, "reject")


def cmd_held(args: argparse.Namespace) -> int:
    import json

    import polars as pl

    from deep_sleep.jobs.queue import Selection, by_run, grouped, pending, queue_markdown

    store = _store(args.dsn)
    selection = _selection(args) or Selection()
    if selection.scope is not None:
        selection = replace(selection, scope=Scope.coerce(selection.scope))
    every = pending(store, selection, include_superseded=True)
    queue = every.filter(pl.col("superseded_by").is_null())
    expired = every.filter(pl.col("superseded_by").is_not_null())
    if args.json:
        g = grouped(queue)
        print(json.dumps({k: v.to_dicts() for k, v in g.items()}
                         | {"runs": by_run(queue).head(args.limit).to_dicts(),
                            "expired": {"runs": expired.get_column("run_id").n_unique(),
                                        "rows": int(expired.get_column("rows").sum())}},
                         default=str, indent=2))
    else:
        print(queue_markdown(queue, selection, runs=args.runs, limit=args.limit, expired=expired))
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    """What tonight's run of one scope would change, record by record (:data:`~deep_sleep.run.pipeline.PLAN`
    and the Preview stage: the night without its apply)."""
    from deep_sleep.core.scope import Scope
    from deep_sleep.run import pipeline
    from deep_sleep.run.layout import runs_dir
    from deep_sleep.run.preview import Preview, held_markdown, preview_markdown
    from deep_sleep.cli.common import config_of

    as_of = _as_of(args.as_of)
    config = config_of(args.config)
    store = _store(args.dsn)
    scope = require_scope(store, args.scope)  # an unknown scope names the nearest ones
    runs_dir(args.runs_dir)  # a plan keeps its files on local disk: a URL is refused by name
    state = pipeline.consolidate(store, scope, as_of, config, runs_dir=args.runs_dir, stages=(*pipeline.PLAN, Preview()))
    report = state.report(scope.path)
    records = state.preview.scope(scope.path)
    print(preview_markdown(records, per_phase=args.per_phase, title=f"Plan for {Scope.parse(scope.path)} at {report.as_of}"))
    print()
    print(held_markdown(records, state.preview.why.get(scope.path, ()), per_phase=args.per_phase))
    print(f"\nnothing was applied; snapshot {report.snapshot_uri}, diff {report.diff_uri}")
    if report.status == "failed":
        print("validation FAILED — a run would apply nothing:\n" + "\n".join(report.errors))
        return 1
    return 0


def cmd_gc(args: argparse.Namespace) -> int:
    from deep_sleep.jobs.gc import gc, gc_markdown
    from deep_sleep.run.layout import runs_location
    result = gc(_store(args.dsn), runs_location(args.runs_dir), args.keep_days, force=args.force, dry_run=args.dry_run)
    print(gc_markdown(result))
    return 0


def cmd_reembed(args: argparse.Namespace) -> int:
    import json

    from deep_sleep.jobs.reembed import reembed
    from deep_sleep.cli.common import config_of

    store = _store(args.dsn)
    config = config_of(args.config, {"embedding": {"model": args.model}} if args.model else None)
    scopes = [require_scope(store, s) for s in args.scope] if args.scope else None
    report = reembed(store, config, scopes, batch_size=args.batch_size)
    print(json.dumps(report.to_dict(), indent=2))
    return 0


def cmd_health(args: argparse.Namespace) -> int:

    from deep_sleep.core.scope import Scope
    from deep_sleep.jobs.health import health, health_markdown
    from deep_sleep.cli.common import config_of

    config = config_of(args.config)
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


