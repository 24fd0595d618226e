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
from deep_sleep.core.shard import Shard
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
        "scope_path": getattr(snapshot, "scope_path", None),  # a Shard has none (see below)
        "settings": config,  # the whole configuration, for a phase that must keep another phase's invariant
        "extracted": extracted,  # the snapshot before any phase (for evidence an earlier phase archived)
        "summarizer": summarizer,  # phases 4 and 10 (SPEC §7); None: the deterministic text
    }
    if "embedder" in wanted:  # built only for the phases that ask (phase 12)
        from deep_sleep.core.embedding import default_embedder

        offered["embedder"] = default_embedder()
    if "scope_path" in wanted and isinstance(snapshot, Shard):
        raise PhaseError(f"phase {phase.name} is shard_native but asks for scope_path; it must read each row's scope_path")
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




# -- many scopes in one pass (SPEC §2 "Scale") ------------------------------------------------------
@dataclass(frozen=True)
class ShardPlan:
    """What a run of a shard would do: the clean shard, the shard's diff (every frame has a
    ``scope_path`` column), each scope's report (the same as a run of that scope alone gives, but
    for the timings, which are the shard's) and the quarantined rows (with ``scope_path``)."""

    shard: Shard
    diff: Diff
    reports: dict[str, ConsolidationReport]
    quarantined: pl.DataFrame

    def scope_diffs(self) -> dict[str, Diff]:
        """Every scope's diff, as a run of that scope alone gives it (scopes without changes: empty)."""
        parts = self.diff.by_scope()
        return {s: parts.get(s, Diff.empty()) for s in self.shard.scope_paths}

    def scope_plan(self, scope_path: str) -> Plan:
        """One scope's :class:`Plan` (for code that handles one scope)."""
        q = self.quarantined
        mine = q.filter(pl.col("scope_path") == scope_path).drop("scope_path") if q.height else q.drop("scope_path")
        return Plan(snapshot=self.shard.scope(scope_path), diff=self.diff.by_scope((scope_path,)).get(scope_path, Diff.empty()),
                    report=self.reports[scope_path], quarantined=mine)


def _quarantine_shard(shard: Shard, as_of: datetime, config: ConsolidationConfig) -> tuple[Shard, pl.DataFrame]:
    """The shard without the rows that break the store's invariants, and those rows (with ``scope_path``)."""
    native = getattr(quarantine, "shard_native", False)
    if native or len(shard.scope_paths) == 1:
        clean, found = quarantine(shard if native else shard.scope(shard.scope_paths[0]), as_of, config.quarantine)
        if not native:
            found = found.with_columns(pl.lit(shard.scope_paths[0]).alias("scope_path"))
            clean = Shard.of(clean)
        return clean, found
    cleaned, found, held = [], [], set()
    for s in shard.scope_paths:
        snap, q = quarantine(shard.scope(s), as_of, config.quarantine)
        cleaned.append(snap)
        held |= snap.held_nodes
        if q.height:
            found.append(q.with_columns(pl.lit(s).alias("scope_path")))
    if not found:
        return shard, pl.DataFrame(schema={**QUARANTINE_SCHEMA, "scope_path": pl.String})
    clean = Shard.from_snapshots(cleaned)
    return (Shard(clean.scope_paths, shard.taken_at, shard.previous_run_as_of, clean.frames, shard.source,
                  shard.schema_version, frozenset(held)), pl.concat(found))


def _with_scope(diff: Diff, view: Shard) -> Diff:
    """``diff`` with a ``scope_path`` on every update and delete (inserts carry theirs), from the row
    each one names in ``view``."""
    from deep_sleep.core.diff import TableDiff

    out = {}
    for name, td in diff.tables.items():
        frames = td.frames()
        for kind in ("updates", "deletes"):
            frame = frames[kind]
            if not frame.height or "scope_path" in frame.columns:
                continue
            if len(view.scope_paths) == 1:
                frames[kind] = frame.with_columns(pl.lit(view.scope_paths[0]).alias("scope_path"))
                continue
            owners = view.table(name).select("id", "scope_path").unique("id", keep="first")
            got = frame.join(owners, on="id", how="left", maintain_order="left")
            if got.get_column("scope_path").null_count():
                missing = got.filter(pl.col("scope_path").is_null()).get_column("id").head(3).to_list()
                raise PhaseError(f"{name}.{kind}: rows {missing} name no row of the shard")
            frames[kind] = got
        out[name] = TableDiff(**frames)
    return Diff(out)


def _per_scope(phase: Phase, view: Shard, config: ConsolidationConfig, as_of: datetime, extracted: Shard,
               summarizer: Summarizer | None) -> PhaseResult:
    """An unmarked phase run once per scope, on that scope's slice; the results as one shard result."""
    diffs, rows, skipped, notes = [], [], {}, {}
    for s in view.scope_paths:
        snap = view.scope(s)
        r = phase.fn(**_arguments(phase, snap, config, as_of, extracted.scope(s), summarizer))
        if r.skipped:
            skipped[s] = r.skipped
            continue
        rows.append({"scope_path": s, **{c: int(r.counters.get(c, 0)) for c in phase.counters}})
        if r.notes:
            notes[s] = tuple(r.notes)
        if r.diff.has_changes:
            diffs.append(_with_scope(r.diff, Shard.of(snap)))
    counts = pl.DataFrame(rows, schema={"scope_path": pl.String, **dict.fromkeys(phase.counters, pl.Int64)})
    return PhaseResult(diff=Diff.combine(diffs), counters={c: int(counts.get_column(c).sum()) for c in phase.counters},
                       by_scope=counts, skipped_scopes=skipped, scope_notes=notes)


def plan_shard(shard: Shard, config: ConsolidationConfig, as_of: datetime,
               phases: tuple[str, ...] | list[str] | None = None, check_rows: bool = True,
               summarizer: Summarizer | None = None) -> ShardPlan:
    """:func:`plan` for many scopes in one pass: quarantine, then each phase once over the whole shard
    (a phase marked :func:`~deep_sleep.transforms._common.shard_native`; any other once per scope on
    its slice), folding each diff in before the next phase.  Every scope gets the diff, counters,
    skips, notes and content hash a run of that scope alone gives (tested differentially)."""
    as_of = utc(as_of)
    paths = shard.scope_paths
    timings: dict[str, float] = {}
    if check_rows:
        t0 = time.perf_counter()
        shard, quarantined = _quarantine_shard(shard, as_of, config)
        timings["quarantine"] = round(time.perf_counter() - t0, 6)
    else:
        quarantined = pl.DataFrame(schema={**QUARANTINE_SCHEMA, "scope_path": pl.String})
    counters = {s: dict.fromkeys(COUNTERS, 0) for s in paths}
    by_phase: dict[str, dict[str, dict[str, int]]] = {s: {} for s in paths}
    run: dict[str, list[str]] = {s: [] for s in paths}
    skipped: dict[str, dict[str, str]] = {s: {} for s in paths}
    notes: dict[str, dict[str, list[str]]] = {s: {} for s in paths}
    view, diffs, folding = shard, [], 0.0
    for phase in roster(phases):
        if not config.phase(phase.name).enabled:
            for s in paths:
                skipped[s][phase.name] = "disabled by config"
            continue
        t0 = time.perf_counter()
        if getattr(phase.fn, "shard_native", False):
            result = phase.fn(**_arguments(phase, view, config, as_of, shard, summarizer))
        else:
            result = _per_scope(phase, view, config, as_of, shard, summarizer)
        timings[phase.name] = round(time.perf_counter() - t0, 6)
        for name in result.counters:
            if name not in phase.counters:
                raise PhaseError(f"phase {phase.name} reported counter {name!r}, which its module does not "
                                 f"declare (its COUNTERS are {', '.join(phase.counters)})")
        if result.skipped:
            for s in paths:
                skipped[s][phase.name] = result.skipped
            continue
        counts = result.by_scope
        if counts is None:
            if len(paths) > 1 and any(result.counters.values()):
                raise PhaseError(f"phase {phase.name} ran on a shard of {len(paths)} scopes but reported no by_scope counters")
            counts = pl.DataFrame([{"scope_path": paths[0], **result.counters}]) if result.counters else None
        per = {r["scope_path"]: r for r in counts.iter_rows(named=True)} if counts is not None else {}
        for s in paths:
            reason = result.skipped_scopes.get(s)
            if reason:
                skipped[s][phase.name] = reason
                continue
            run[s].append(phase.name)
            row = per.get(s)
            if row:
                mine = {c: int(row.get(c) or 0) for c in phase.counters}
                for c, v in mine.items():
                    counters[s][c] += v
                by_phase[s][phase.name] = {c: v for c, v in mine.items() if v}
            else:
                by_phase[s][phase.name] = {}
            if s in result.scope_notes:
                notes[s][phase.name] = list(result.scope_notes[s])
            elif len(paths) == 1 and result.notes:
                notes[s][phase.name] = list(result.notes)
        if result.diff.has_changes:
            diffs.append(_with_scope(result.diff, view))
            t0 = time.perf_counter()
            view = result.diff.fold(view)
            folding += time.perf_counter() - t0
    timings["fold"] = round(folding, 6)
    t0 = time.perf_counter()
    diff = Diff.combine(diffs)
    timings["combine"] = round(time.perf_counter() - t0, 6)
    t0 = time.perf_counter()
    parts = diff.by_scope()
    hashes = {s: d.content_hash() for s, d in parts.items()}
    empty_hash = Diff.empty().content_hash()
    timings["diff_hash"] = round(time.perf_counter() - t0, 6)
    quarantined_by = ({s: q.drop("scope_path") for (s,), q in quarantined.partition_by("scope_path", as_dict=True).items()}
                      if quarantined.height else {})
    reports = {}
    for s in paths:
        part = parts.get(s)
        reports[s] = ConsolidationReport(
            scope_path=s,
            as_of=iso(as_of) or "",
            counters=counters[s],
            counters_by_phase=by_phase[s],
            phases_run=run[s],
            phases_skipped=skipped[s],
            timings=timings,
            rows_changed=part.row_counts() if part is not None else {},
            notes=notes[s],
            diff_hash=hashes.get(s, empty_hash),
            quarantined=summarise(quarantined_by[s]) if s in quarantined_by else {},
        )
    return ShardPlan(shard=shard, diff=diff, reports=reports, quarantined=quarantined)


__all__ = ["Plan", "plan", "ShardPlan", "plan_shard", "UTC"]
