"""The stages of one scope's run as plain functions over directories, and the one-scope entry points.

``extract_stage`` → ``plan_stage`` → ``validate_stage`` → ``apply_stage`` each read what the
previous one wrote (a snapshot directory, a diff directory with ``report.json``): every stage can
be re-run by hand on the files of a failed night, and ``deep-sleep replay`` runs the middle two.
A run in one process (:func:`consolidate_scope`, :func:`plan_scope`, the flows, the benchmarks)
goes through the pipeline of stage values instead (:mod:`deep_sleep.run.pipeline`), which writes
the same files and passes the values on without reading them back.

    run_dir/
      snapshot/            manifest.json + <table>.parquet          (SPEC §8)
      diff/                report.json + <table>.<kind>.parquet     (SPEC §8)
      diff/validation.parquet   failing checks, when validation failed
      diff/quarantine.parquet   rows set aside from the snapshot, with reasons, when any
      diff/held/           rows held for approval (a diff directory + reasons.parquet), when any
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

from deep_sleep.core import files
from deep_sleep.core.diff import Diff
from deep_sleep.core.errors import InputError
from deep_sleep.core.holds_config import HoldsConfig
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.scope import Scope
from deep_sleep.core.snapshot import Snapshot, utc
from deep_sleep.core.summary import Summarizer
from deep_sleep.run import holds as holds_mod
from deep_sleep.run import pipeline
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

DEFAULT_RUNS_DIR = Path(".deep_sleep") / "runs"


def runs_location(value: str | Path | None = None) -> str:
    """The runs directory as given (``value``, else ``$DEEP_SLEEP_RUNS_DIR``, else ``.deep_sleep/runs``):
    a local path, or an object-store URL kept whole (``s3://bucket/runs``; ``Path`` would fold its
    ``//``).  The nightly, ``gc`` and the readers of a run's files take either."""
    return str(value or os.environ.get("DEEP_SLEEP_RUNS_DIR") or DEFAULT_RUNS_DIR)


def runs_dir(value: str | Path | None = None) -> Path:
    """The runs directory as a local path (:func:`runs_location`).  An object-store URL is refused by
    name: the commands that write through this (``run``, ``plan``, the one-scope flow, ``replay-range``)
    keep their files on local disk; only the nightly stages and publishes to a URL."""
    location = runs_location(value)
    if files.is_remote(location):
        raise InputError(f"runs directory {location} is an object-store URL; this command reads and writes a local "
                         "runs directory — give a local path (--runs-dir / DEEP_SLEEP_RUNS_DIR), or use the nightly, "
                         "which stages each shard locally and publishes it to the URL")
    return files.local_path(location)


def run_dir(base: str | Path | None, scope: Scope, as_of: datetime, run_id: str) -> Path:
    """``<runs>/<scope as kind/id…, URL-quoted>/<as_of>_<run_id>``."""
    stamp = utc(as_of).strftime("%Y%m%dT%H%M%S.%fZ")
    return runs_dir(base) / quote(scope.display(), safe="") / f"{stamp}_{run_id}"


def extract_stage(store: Store, scope: Scope | str, as_of: datetime, config: ConsolidationConfig, out: Path) -> Path:
    """Extract the scope and write its snapshot to ``out``; returns ``out``."""
    log_since = utc(as_of) - timedelta(hours=config.lookback_hours)
    snap = extract(store, scope, log_since=log_since)
    snap.write(out)
    return out


def plan_stage(snapshot_dir: Path, config: ConsolidationConfig, as_of: datetime, out: Path,
               run_id: str | None = None, phases: tuple[str, ...] | None = None,
               timings: dict[str, float] | None = None, summarizer: Summarizer | None = None) -> Path:
    """Run the phases on a stored snapshot; write the diff and ``report.json`` to ``out``.

    ``timings`` (e.g. the extract's seconds) are carried into the report; ``summarizer`` goes to
    phases 4 and 10 (:func:`deep_sleep.run.llm.summarizer_for`; None: the deterministic text).
    """
    t0 = time.perf_counter()
    snap = Snapshot.read(snapshot_dir)
    t1 = time.perf_counter()
    result = plan(snap, config, as_of, phases, write_to=out, summarizer=summarizer)  # writes the diff while hashing it
    if result.quarantined.height:
        result.quarantined.write_parquet(Path(out) / QUARANTINE_FILE)
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
    # the snapshot the plan saw, in the columns the checks read
    snap = _clean_snapshot(Snapshot.read(snapshot_dir, columns=SNAPSHOT_COLUMNS), Path(diff_dir))
    diff = Diff.read(diff_dir)
    failures = validate_diff(diff, snap, config)
    timings = {**report.timings, "validate": round(time.perf_counter() - t0, 6)}
    if failures.height:
        failures.write_parquet(Path(diff_dir) / "validation.parquet")
        errors = pipeline.failure_messages(failures)
        report = report.with_(status="failed", errors=report.errors + errors, validation=failures.head(200).to_dicts(), timings=timings)
    else:
        report = report.with_(timings=timings)
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
    diff = Diff.read(diff_dir)
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


def apply_stage(store: Store, diff_dir: Path, mode: str = "nightly", started_at: datetime | None = None,
                holds: HoldsConfig | None = None, gate_failed: bool = False) -> ConsolidationReport:
    """Apply a validated diff and record the run; a report marked failed is recorded, not applied.

    ``holds`` (the configuration's ``holds`` section; None: its defaults) and ``gate_failed`` (the
    recall-quality gate said recall@k dropped) decide which rows wait for approval
    (:func:`deep_sleep.run.holds.split_holds`, on the run's snapshot): they are written to
    ``<diff_dir>/held/`` (a diff directory plus ``reasons.parquet``), listed in the report's ``held``
    and the ledger (``held``, ``hold_status = 'pending'``), and the rest is applied.
    ``deep-sleep approve`` / ``reject`` decide them later (:mod:`deep_sleep.jobs.approve`)."""
    report = ConsolidationReport.read(diff_dir)
    if report.status == "failed":
        record_run(store, report, mode, started_at or datetime.now(tz=utc(report.as_of).tzinfo), "failed")
        return report
    t0 = time.perf_counter()
    qfile = Path(diff_dir) / QUARANTINE_FILE
    quarantined = pl.read_parquet(qfile) if qfile.exists() else None
    diff = Diff.read(diff_dir)
    diff, report = _hold(diff, report, Path(diff_dir), HoldsConfig() if holds is None else holds, gate_failed)
    result = apply_diff(store, diff, report, mode=mode, started_at=started_at, quarantined=quarantined)
    if report.held:
        record_holds(store, report.run_id, report.held)
    report = report.with_(
        status="applied",
        rows_changed=result.applied,
        conflicts=result.conflicts,
        timings={**report.timings, "apply": round(time.perf_counter() - t0, 6),
                 **{f"apply.{part}": v for part, v in (result.seconds or {}).items()}},
    )
    report.write(diff_dir)
    return report


def _hold(diff: Diff, report: ConsolidationReport, diff_dir: Path, policy: HoldsConfig,
          gate_failed: bool) -> tuple[Diff, ConsolidationReport]:
    """The part of ``diff`` to apply now, and the report with its ``held`` rows (written to ``held/``)."""
    if not (policy.enabled or gate_failed) or not diff.has_changes:
        return diff, report
    if not report.snapshot_uri:
        raise InputError(f"{diff_dir}: the report names no snapshot (snapshot_uri), which the holds policy reads; "
                         "plan the run with the plan stage, or pass holds=HoldsConfig(enabled=False)")
    snap = Snapshot.read(report.snapshot_uri, columns=holds_mod.COLUMNS)
    return holds_mod.hold(diff, snap, report, policy, diff_dir / holds_mod.HELD_DIR, gate_failed)


record_holds = holds_mod.record_holds


def consolidate_scope(
    store: Store,
    scope: Scope | str,
    config: ConsolidationConfig | None = None,
    as_of: datetime | None = None,
    base_dir: str | Path | None = None,
    mode: str = "nightly",
    phases: tuple[str, ...] | None = None,
) -> ConsolidationReport:
    """All four stages in this process, without Prefect (``deep-sleep run``, tests, the benchmark):
    the pipeline of stage values (:mod:`deep_sleep.run.pipeline`) on a shard of one, with the
    configuration's holds policy."""
    config = config or ConsolidationConfig()
    planned = plan_scope(store, scope, config, as_of, base_dir, phases)
    applied = pipeline.apply(store, planned.validated, mode=mode, started_at=planned.started_at, holds=config.holds)
    return applied.reports[Scope.coerce(scope).path]


@dataclass(frozen=True)
class PlannedRun:
    """A run up to its last stage: where its snapshot and diff went, its validated report, and the
    stage values (``validated``) the apply takes."""

    snapshot_dir: Path
    diff_dir: Path
    report: ConsolidationReport
    started_at: datetime
    validated: pipeline.Validated | None = None


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
    extracted = pipeline.extract(store, scope, as_of, config, base / "snapshot")
    summarizer = summarizer_for(config, store)  # None unless the model is enabled (SPEC §7)
    planned = pipeline.transform(extracted, config, as_of, base / "diff", run_ids={scope.path: run_id}, phases=phases,
                                 summarizer=summarizer)
    validated = pipeline.gate(store, pipeline.validate(planned, config), config)
    return PlannedRun(base / "snapshot", base / "diff", validated.reports[scope.path], started, validated)
