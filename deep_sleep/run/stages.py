"""The stages of one scope's run as plain functions over directories.

extract → plan → validate → apply, each reading what the previous one wrote (a snapshot
directory, a diff directory with ``report.json``), so the Prefect flow passes paths between
tasks, replay is "extract skipped, apply skipped", and every stage can be re-run by hand on
the files of a failed night.

    run_dir/
      snapshot/            manifest.json + <table>.parquet          (SPEC §8)
      diff/                report.json + <table>.<kind>.parquet     (SPEC §8)
      diff/validation.parquet   failing checks, when validation failed
      diff/quarantine.parquet   rows set aside from the snapshot, with reasons, when any
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import quote

import polars as pl

from deep_sleep.core.diff import Diff
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.scope import Scope
from deep_sleep.core.snapshot import Snapshot, utc
from deep_sleep.core.summary import Summarizer
from deep_sleep.run import handoff
from deep_sleep.run.apply import apply_diff, record_run
from deep_sleep.run.gate import recall_gate
from deep_sleep.run.llm import summarizer_for
from deep_sleep.run.plan import plan
from deep_sleep.store.db import Store
from deep_sleep.store.extract import extract
from deep_sleep.store.vectors import node_embeddings
from deep_sleep.transforms.config import ConsolidationConfig
from deep_sleep.validation import SNAPSHOT_COLUMNS, validate_diff

QUARANTINE_FILE = "quarantine.parquet"
# Files of a diff directory that later stages rewrite (the report; validation's failures).
_REWRITTEN = frozenset({"report.json", "validation.parquet"})

DEFAULT_RUNS_DIR = Path(".deep_sleep") / "runs"


def runs_dir(value: str | Path | None = None) -> Path:
    return Path(value or os.environ.get("DEEP_SLEEP_RUNS_DIR") or DEFAULT_RUNS_DIR)


def run_dir(base: str | Path | None, scope: Scope, as_of: datetime, run_id: str) -> Path:
    """``<runs>/<scope as kind/id…, URL-quoted>/<as_of>_<run_id>``."""
    stamp = utc(as_of).strftime("%Y%m%dT%H%M%S.%fZ")
    return runs_dir(base) / quote(scope.display(), safe="") / f"{stamp}_{run_id}"


def _rows(value: Snapshot | Diff) -> int:
    if isinstance(value, Snapshot):
        return sum(f.height for f in value.frames.values())
    return sum(n for counts in value.row_counts().values() for n in counts.values())


def extract_stage(store: Store, scope: Scope | str, as_of: datetime, config: ConsolidationConfig, out: Path) -> Path:
    """Extract the scope and write its snapshot to ``out``; returns ``out``."""
    log_since = utc(as_of) - timedelta(hours=config.lookback_hours)
    snap = extract(store, scope, log_since=log_since)
    snap.write(out)
    handoff.put("snapshot", out, snap.as_read(out), rows=_rows(snap))
    return out


def plan_stage(snapshot_dir: Path, config: ConsolidationConfig, as_of: datetime, out: Path,
               run_id: str | None = None, phases: tuple[str, ...] | None = None,
               timings: dict[str, float] | None = None, summarizer: Summarizer | None = None) -> Path:
    """Run the phases on a stored snapshot; write the diff and ``report.json`` to ``out``.

    ``timings`` (e.g. the extract's seconds) are carried into the report; ``summarizer`` goes to
    phases 4 and 10 (:func:`deep_sleep.run.llm.summarizer_for`; None: the deterministic text).
    """
    t0 = time.perf_counter()
    snap = handoff.take("snapshot", snapshot_dir)
    if snap is None:
        snap = Snapshot.read(snapshot_dir)
    t1 = time.perf_counter()
    result = plan(snap, config, as_of, phases, write_to=out, summarizer=summarizer)  # writes the diff while hashing it
    if result.quarantined.height:
        result.quarantined.write_parquet(Path(out) / QUARANTINE_FILE)
    handoff.put("plan", out, (result.snapshot, result.diff), rows=_rows(result.snapshot) + _rows(result.diff),
                ignore=_REWRITTEN)
    t3 = time.perf_counter()
    seconds = {**(timings or {}), **result.report.timings, "read_snapshot": round(t1 - t0, 6),
               "transform": round(t3 - t0, 6)}
    report = result.report.with_(run_id=run_id, snapshot_uri=str(Path(snapshot_dir).resolve()),
                                 diff_uri=str(Path(out).resolve()), timings=seconds)
    report.write(out)
    return Path(out)


def validate_stage(snapshot_dir: Path, diff_dir: Path, config: ConsolidationConfig | None = None) -> ConsolidationReport:
    """Validate the diff against its snapshot.  On failure, write ``validation.parquet`` and mark the report failed."""
    t0 = time.perf_counter()
    report = ConsolidationReport.read(diff_dir)
    planned = handoff.take("plan", diff_dir)
    if planned is not None:
        snap, diff = planned
    else:  # the snapshot the plan saw, in the columns the checks read
        snap = _clean_snapshot(Snapshot.read(snapshot_dir, columns=SNAPSHOT_COLUMNS), Path(diff_dir))
        diff = Diff.read(diff_dir)
    failures = validate_diff(diff, snap, config)
    timings = {**report.timings, "validate": round(time.perf_counter() - t0, 6)}
    if failures.height:
        failures.write_parquet(Path(diff_dir) / "validation.parquet")
        summary = (
            failures.group_by("check", "table", "kind", "phase").agg(pl.len().alias("rows"), pl.col("id").head(5).alias("example_ids"))
            .sort("table", "kind", "check")
        )
        errors = [
            f"validation failed: {r['check']} — {r['table']}.{r['kind']} from phase {r['phase']}: {r['rows']} row(s), e.g. {', '.join(x for x in r['example_ids'] if x)}"
            for r in summary.iter_rows(named=True)
        ]
        report = report.with_(status="failed", errors=report.errors + errors, validation=failures.head(200).to_dicts(), timings=timings)
    else:
        report = report.with_(timings=timings)
        handoff.put("diff", diff_dir, diff, rows=_rows(diff), ignore=_REWRITTEN)
    report.write(diff_dir)
    return report


def gate_stage(store: Store, snapshot_dir: Path, diff_dir: Path, config: ConsolidationConfig) -> ConsolidationReport:
    """The recall-quality gate (SPEC §9, :func:`deep_sleep.run.gate.recall_gate`) of a validated
    diff, its figures put in the report (``gate``; nothing when the gate is off or had no query).
    A report that failed validation is left as it is.  The nodes' embeddings are read from the store."""
    report = ConsolidationReport.read(diff_dir)
    if report.status == "failed" or not config.gate.enabled:
        return report
    t0 = time.perf_counter()
    diff = handoff.take("diff", diff_dir)
    if diff is None:
        diff = Diff.read(diff_dir)
    else:  # leave it for the apply stage
        handoff.put("diff", diff_dir, diff, rows=_rows(diff), ignore=_REWRITTEN)
    snap = _clean_snapshot(Snapshot.read(snapshot_dir), Path(diff_dir))
    result = recall_gate(snap, diff, config, node_embeddings(store, [snap.scope_path]), now=utc(report.as_of))
    report = report.with_(gate=result.to_report(), timings={**report.timings, "gate": round(time.perf_counter() - t0, 6)})
    report.write(diff_dir)
    return report


def _clean_snapshot(snap: Snapshot, diff_dir: Path) -> Snapshot:
    """The snapshot minus the rows the plan stage quarantined (listed in the diff directory)."""
    qfile = diff_dir / QUARANTINE_FILE
    if not qfile.exists():
        return snap
    gone = pl.read_parquet(qfile)
    frames = {}
    for (table,), rows in gone.group_by("table"):
        ids = rows.get_column("id")
        keep = ~pl.col("id").cast(pl.String).is_in(ids.drop_nulls().implode())
        if ids.null_count():
            keep = keep & pl.col("id").is_not_null()
        frames[table] = snap.table(table).filter(keep.fill_null(True) if not ids.null_count() else keep)
    return snap.with_frames(frames)


def apply_stage(store: Store, diff_dir: Path, mode: str = "nightly", started_at: datetime | None = None) -> ConsolidationReport:
    """Apply a validated diff and record the run; a report marked failed is recorded, not applied."""
    report = ConsolidationReport.read(diff_dir)
    if report.status == "failed":
        record_run(store, report, mode, started_at or datetime.now(tz=utc(report.as_of).tzinfo), "failed")
        return report
    t0 = time.perf_counter()
    qfile = Path(diff_dir) / QUARANTINE_FILE
    quarantined = pl.read_parquet(qfile) if qfile.exists() else None
    diff = handoff.take("diff", diff_dir)
    if diff is None:
        diff = Diff.read(diff_dir)
    result = apply_diff(store, diff, report, mode=mode, started_at=started_at, quarantined=quarantined)
    report = report.with_(
        status="applied",
        rows_changed=result.applied,
        conflicts=result.conflicts,
        timings={**report.timings, "apply": round(time.perf_counter() - t0, 6),
                 **{f"apply.{part}": v for part, v in (result.seconds or {}).items()}},
    )
    report.write(diff_dir)
    return report


def consolidate_scope(
    store: Store,
    scope: Scope | str,
    config: ConsolidationConfig | None = None,
    as_of: datetime | None = None,
    base_dir: str | Path | None = None,
    mode: str = "nightly",
    phases: tuple[str, ...] | None = None,
) -> ConsolidationReport:
    """All four stages in this process, without Prefect (used by tests and the benchmark)."""
    planned = plan_scope(store, scope, config, as_of, base_dir, phases)
    return apply_stage(store, planned.diff_dir, mode=mode, started_at=planned.started_at)


@dataclass(frozen=True)
class PlannedRun:
    """A run up to its last stage: where its snapshot and diff went, and its validated report."""

    snapshot_dir: Path
    diff_dir: Path
    report: ConsolidationReport
    started_at: datetime


def plan_scope(store: Store, scope: Scope | str, config: ConsolidationConfig | None = None,
               as_of: datetime | None = None, base_dir: str | Path | None = None,
               phases: tuple[str, ...] | None = None) -> PlannedRun:
    """Extract, transform and validate exactly as a run does, and stop before the apply (SPEC §9
    "Plan"): the same stages, no ``dry_run`` flag anywhere.  ``deep-sleep plan`` shows the result."""
    from datetime import UTC

    scope = Scope.coerce(scope)
    config = config or ConsolidationConfig()
    started = datetime.now(UTC)
    as_of = utc(as_of or started)
    run_id = str(uuid.uuid4())
    base = run_dir(base_dir, scope, as_of, run_id)
    t = time.perf_counter()
    snap_dir = extract_stage(store, scope, as_of, config, base / "snapshot")
    extract_seconds = {"extract": round(time.perf_counter() - t, 6)}
    summarizer = summarizer_for(config, store)  # None unless the model is enabled (SPEC §7)
    diff_dir = plan_stage(snap_dir, config, as_of, base / "diff", run_id=run_id, phases=phases, timings=extract_seconds,
                          summarizer=summarizer)
    validate_stage(snap_dir, diff_dir, config)
    report = gate_stage(store, snap_dir, diff_dir, config)
    return PlannedRun(snap_dir, diff_dir, report, started)
