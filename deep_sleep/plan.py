"""Build a run's plan: run the phases over a snapshot and collect one diff and one report.

``plan`` touches no database and reads no clock (beyond timing itself): it is the transform
stage of the nightly flow, of the quick nap and of replay alike.

    >>> from deep_sleep.snapshot import Snapshot
    >>> snap = Snapshot.empty("org\\x1facme", taken_at=datetime(2026, 1, 2, tzinfo=UTC))
    >>> p = plan(snap, ConsolidationConfig(), datetime(2026, 1, 2, tzinfo=UTC))
    >>> p.diff.has_changes, p.report.phases_run[:1]
    (False, ['strengthen'])
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import polars as pl

from deep_sleep.config import ConsolidationConfig
from deep_sleep.diff import Diff
from deep_sleep.report import COUNTERS, ConsolidationReport
from deep_sleep.snapshot import Snapshot, iso, utc
from transforms import Phase, PhaseResult, roster
from validation.quarantine import QUARANTINE_SCHEMA, quarantine, summarise


@dataclass(frozen=True)
class Plan:
    """The diff a run would apply, the (clean) snapshot it was computed from, the rows quarantined
    out of it, and the report."""

    snapshot: Snapshot
    diff: Diff
    report: ConsolidationReport
    quarantined: pl.DataFrame


def _arguments(phase: Phase, snapshot: Snapshot, config: ConsolidationConfig, as_of: datetime,
               extracted: Snapshot) -> dict:
    wanted = inspect.signature(phase.fn).parameters
    offered = {
        "snapshot": snapshot,
        "config": config.phase(phase.name),
        "as_of": as_of,
        "lookback_hours": config.lookback_hours,
        "scope_path": snapshot.scope_path,
        "settings": config,  # the whole configuration, for a phase that must keep another phase's invariant
        "extracted": extracted,  # the snapshot before any phase (for evidence an earlier phase archived)
    }
    if "embedder" in wanted:  # built only for the phases that ask (phase 12)
        from deep_sleep.embedding import default_embedder

        offered["embedder"] = default_embedder()
    missing = [name for name in wanted if name not in offered]
    if missing:
        raise TypeError(f"phase {phase.name} asks for {missing}; phases may ask for {sorted(offered)}")
    return {name: offered[name] for name in wanted}


def plan(
    snapshot: Snapshot,
    config: ConsolidationConfig,
    as_of: datetime,
    phases: tuple[str, ...] | list[str] | None = None,
    check_rows: bool = True,
) -> Plan:
    """Quarantine rows that break the store's invariants (``check_rows``), then run the roster (or
    the named ``phases``) in order, folding each diff in before the next phase."""
    as_of = utc(as_of)
    timings: dict[str, float] = {}
    quarantined = pl.DataFrame(schema=QUARANTINE_SCHEMA)
    if check_rows:
        t0 = time.perf_counter()
        snapshot, quarantined = quarantine(snapshot, as_of)
        timings["quarantine"] = round(time.perf_counter() - t0, 6)
    view = snapshot
    diffs: list[Diff] = []
    counters = dict.fromkeys(COUNTERS, 0)
    by_phase: dict[str, dict[str, int]] = {}
    run: list[str] = []
    skipped: dict[str, str] = {}
    folding = 0.0
    notes: dict[str, list[str]] = {}
    for phase in roster(phases):
        if not config.phase(phase.name).enabled:
            skipped[phase.name] = "disabled by config"
            continue
        t0 = time.perf_counter()
        result: PhaseResult = phase.fn(**_arguments(phase, view, config, as_of, snapshot))
        timings[phase.name] = round(time.perf_counter() - t0, 6)
        if result.skipped:
            skipped[phase.name] = result.skipped
            continue
        run.append(phase.name)
        if result.notes:
            notes[phase.name] = list(result.notes)
        for name, value in result.counters.items():
            if name not in counters:
                raise ValueError(f"phase {phase.name} reported unknown counter {name!r}")
            counters[name] += int(value)
        by_phase[phase.name] = {k: int(v) for k, v in result.counters.items() if v}
        if result.diff.has_changes:
            diffs.append(result.diff)
            t0 = time.perf_counter()
            view = result.diff.fold(view)
            folding += time.perf_counter() - t0
    timings["fold"] = round(folding, 6)
    t0 = time.perf_counter()
    diff = Diff.combine(diffs)
    timings["combine"] = round(time.perf_counter() - t0, 6)
    t0 = time.perf_counter()
    diff_hash = diff.content_hash()
    timings["diff_hash"] = round(time.perf_counter() - t0, 6)
    report = ConsolidationReport(
        scope_path=snapshot.scope_path,
        as_of=iso(as_of) or "",
        counters=counters,
        counters_by_phase=by_phase,
        phases_run=run,
        phases_skipped=skipped,
        timings=timings,
        rows_changed=diff.row_counts(),
        notes=notes,
        diff_hash=diff_hash,
        quarantined=summarise(quarantined),
    )
    return Plan(snapshot=snapshot, diff=diff, report=report, quarantined=quarantined)


__all__ = ["Plan", "plan", "UTC"]
