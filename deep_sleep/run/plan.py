"""Build a run's plan: run the phases over a snapshot and collect one diff and one report.

``plan`` touches no database and reads no clock (beyond timing itself): it is the transform
stage of the nightly flow, of the quick nap and of replay alike.

    >>> from deep_sleep.core.snapshot import Snapshot
    >>> snap = Snapshot.empty("org\\x1facme", taken_at=datetime(2026, 1, 2, tzinfo=UTC))
    >>> p = plan(snap, ConsolidationConfig(), datetime(2026, 1, 2, tzinfo=UTC))
    >>> p.diff.has_changes, p.report.phases_run[:1]
    (False, ['strengthen'])
"""

from __future__ import annotations

import inspect
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from deep_sleep.core.diff import Diff
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.snapshot import Snapshot, iso, utc
from deep_sleep.core.summary import Summarizer
from deep_sleep.transforms import COUNTERS, Phase, PhaseResult, roster
from deep_sleep.transforms.config import ConsolidationConfig
from deep_sleep.transforms.errors import PhaseError
from deep_sleep.validation.quarantine import QUARANTINE_SCHEMA, quarantine, summarise


@dataclass(frozen=True)
class Plan:
    """The diff a run would apply, the (clean) snapshot it was computed from, the rows quarantined
    out of it, and the report."""

    snapshot: Snapshot
    diff: Diff
    report: ConsolidationReport
    quarantined: pl.DataFrame


def _arguments(phase: Phase, snapshot: Snapshot, config: ConsolidationConfig, as_of: datetime,
               extracted: Snapshot, summarizer: Summarizer | None = None) -> dict:
    wanted = inspect.signature(phase.fn).parameters
    offered = {
        "snapshot": snapshot,
        "config": config.phase(phase.name),
        "as_of": as_of,
        "lookback_hours": config.lookback_hours,
        "scope_path": snapshot.scope_path,
        "settings": config,  # the whole configuration, for a phase that must keep another phase's invariant
        "extracted": extracted,  # the snapshot before any phase (for evidence an earlier phase archived)
        "summarizer": summarizer,  # phases 4 and 10 (SPEC §7); None: the deterministic text
    }
    if "embedder" in wanted:  # built only for the phases that ask (phase 12)
        from deep_sleep.core.embedding import default_embedder

        offered["embedder"] = default_embedder()
    missing = [name for name in wanted if name not in offered]
    if missing:
        raise PhaseError(f"phase {phase.name} asks for {missing}; phases may ask for {sorted(offered)}")
    return {name: offered[name] for name in wanted}


# From this many snapshot rows on, the row checks run beside the phases (see :func:`plan`).
OVERLAP_ROWS = 200_000


@dataclass
class _Phased:
    """What running the roster gave: the phases' diffs and report fields."""

    diffs: list[Diff]
    counters: dict[str, int]
    by_phase: dict[str, dict[str, int]]
    run: list[str]
    skipped: dict[str, str]
    notes: dict[str, list[str]]
    timings: dict[str, float]


def _run_phases(snapshot: Snapshot, config: ConsolidationConfig, as_of: datetime,
                phases: tuple[str, ...] | list[str] | None, summarizer: Summarizer | None = None) -> _Phased:
    view = snapshot
    out = _Phased([], dict.fromkeys(COUNTERS, 0), {}, [], {}, {}, {})
    folding = 0.0
    for phase in roster(phases):
        if not config.phase(phase.name).enabled:
            out.skipped[phase.name] = "disabled by config"
            continue
        t0 = time.perf_counter()
        result: PhaseResult = phase.fn(**_arguments(phase, view, config, as_of, snapshot, summarizer))
        out.timings[phase.name] = round(time.perf_counter() - t0, 6)
        if result.skipped:
            out.skipped[phase.name] = result.skipped
            continue
        out.run.append(phase.name)
        if result.notes:
            out.notes[phase.name] = list(result.notes)
        for name, value in result.counters.items():
            if name not in phase.counters:  # a phase reports only the counters its roster entry declares
                raise PhaseError(f"phase {phase.name} reported counter {name!r}, which its module does not "
                                 f"declare (its COUNTERS are {', '.join(phase.counters)})")
            out.counters[name] += int(value)
        out.by_phase[phase.name] = {k: int(v) for k, v in result.counters.items() if v}
        if result.diff.has_changes:
            out.diffs.append(result.diff)
            t0 = time.perf_counter()
            view = result.diff.fold(view)
            folding += time.perf_counter() - t0
    out.timings["fold"] = round(folding, 6)
    return out


def _timed_write(diff: Diff, out: Path) -> float:
    t0 = time.perf_counter()
    diff.write(out)
    return round(time.perf_counter() - t0, 6)


def _checked(snapshot: Snapshot, as_of: datetime, config: ConsolidationConfig) -> tuple[Snapshot, pl.DataFrame, float]:
    t0 = time.perf_counter()
    clean, quarantined = quarantine(snapshot, as_of, config.quarantine)
    return clean, quarantined, round(time.perf_counter() - t0, 6)


def plan(
    snapshot: Snapshot,
    config: ConsolidationConfig,
    as_of: datetime,
    phases: tuple[str, ...] | list[str] | None = None,
    check_rows: bool = True,
    write_to: str | Path | None = None,
    summarizer: Summarizer | None = None,
) -> Plan:
    """Quarantine rows that break the store's invariants (``check_rows``), then run the roster (or
    the named ``phases``) in order, folding each diff in before the next phase.  With
    ``write_to``, the diff is written there (:meth:`Diff.write`) while its hash is computed.

    On a snapshot of :data:`OVERLAP_ROWS` rows or more the row checks run in a second thread while
    the phases already run on the snapshot as extracted.  Almost always nothing is quarantined: the
    clean snapshot *is* the extracted one (same frames), so the phases' result stands.  When some
    row is quarantined, that result is thrown away and the phases run again on the clean snapshot —
    the diff is always the clean snapshot's, only the time differs.  (A phase that fails on a row
    the checks quarantine is rerun the same way; with nothing quarantined its error is raised.)

    ``summarizer`` is handed to the phases that ask for one (4 and 10; :mod:`deep_sleep.run.llm`);
    when it counts its work (``counters()``), what this plan cost goes into ``report.llm``.
    """
    as_of = utc(as_of)
    counted = getattr(summarizer, "counters", None)
    llm_before = counted() if counted else {}
    quarantined = pl.DataFrame(schema=QUARANTINE_SCHEMA)
    check_seconds: dict[str, float] = {}
    if not check_rows:
        phased = _run_phases(snapshot, config, as_of, phases, summarizer)
    elif sum(f.height for f in snapshot.frames.values()) < OVERLAP_ROWS:
        snapshot, quarantined, check_seconds["quarantine"] = _checked(snapshot, as_of, config)
        phased = _run_phases(snapshot, config, as_of, phases, summarizer)
    else:
        failure: Exception | None = None
        with ThreadPoolExecutor(1, thread_name_prefix="deep-sleep-quarantine") as pool:
            checking = pool.submit(_checked, snapshot, as_of, config)
            try:
                optimistic: _Phased | None = _run_phases(snapshot, config, as_of, phases, summarizer)
            except Exception as e:  # maybe a row the checks quarantine; decided below
                optimistic, failure = None, e
            snapshot, quarantined, check_seconds["quarantine"] = checking.result()
        if quarantined.height:
            phased = _run_phases(snapshot, config, as_of, phases, summarizer)
        elif optimistic is None:
            raise failure  # type: ignore[misc]
        else:
            phased = optimistic
    timings = {**check_seconds, **phased.timings}
    t0 = time.perf_counter()
    diff = Diff.combine(phased.diffs)
    timings["combine"] = round(time.perf_counter() - t0, 6)
    t0 = time.perf_counter()
    if write_to is None:
        diff_hash = diff.content_hash()
    else:  # Parquet encoding and hashing release the GIL: the two overlap on two cores
        with ThreadPoolExecutor(1, thread_name_prefix="deep-sleep-write-diff") as pool:
            writing = pool.submit(_timed_write, diff, Path(write_to))
            diff_hash = diff.content_hash()
            timings["write_diff"] = writing.result()
    timings["diff_hash"] = round(time.perf_counter() - t0, 6)
    report = ConsolidationReport(
        scope_path=snapshot.scope_path,
        as_of=iso(as_of) or "",
        counters=phased.counters,
        counters_by_phase=phased.by_phase,
        phases_run=phased.run,
        phases_skipped=phased.skipped,
        timings=timings,
        rows_changed=diff.row_counts(),
        notes=phased.notes,
        diff_hash=diff_hash,
        quarantined=summarise(quarantined),
        llm={k: v - llm_before.get(k, 0) for k, v in counted().items()} if counted else {},
    )
    return Plan(snapshot=snapshot, diff=diff, report=report, quarantined=quarantined)


__all__ = ["Plan", "plan", "UTC"]
