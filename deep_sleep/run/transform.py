"""The transform stage: run the phases over a shard and collect its diff and every scope's report.

A single scope is a shard of one and runs exactly this code (SPEC §2: "A single-scope run is a
shard of one").  :func:`transform` touches no database and reads no clock (beyond timing itself): it is
the transform of the nightly, of ``deep-sleep run`` and ``plan``, of the quick nap and of replay.

Every phase runs once over all the scopes of the shard: it partitions every group, join, rank, cap,
window and threshold by ``scope_path`` and reports counters, skips and notes per scope
(:class:`~deep_sleep.transforms._common.PhaseResult` ``by_scope``, ``skipped_scopes``,
``scope_notes``).  Each scope gets the diff, counters, skips, notes and content hash a shard of that
scope alone gives (tests/run/test_transform_shard.py: random fleets against each scope alone).

    >>> from deep_sleep.core.snapshot import Snapshot
    >>> p = transform(Snapshot.empty("org\\x1facme", taken_at=datetime(2026, 1, 2, tzinfo=UTC)),
    ...          ConsolidationConfig(), datetime(2026, 1, 2, tzinfo=UTC))
    >>> p.diff.has_changes, p.report.phases_run[:1]
    (False, ['strengthen'])
"""

from __future__ import annotations

import functools
import inspect
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import polars as pl

from deep_sleep.core import tables
from deep_sleep.core.diff import KINDS, Diff, TableDiff
from deep_sleep.core.errors import InputError
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot, iso, utc
from deep_sleep.core.summary import Summarizer
from deep_sleep.transforms import COUNTERS, Phase, PhaseResult, roster
from deep_sleep.transforms.config import ConsolidationConfig
from deep_sleep.transforms.errors import PhaseError
from deep_sleep.validation.quarantine import SHARD_QUARANTINE_SCHEMA, quarantine, summarise

#: From this many snapshot rows on, the row checks run beside the phases (see :func:`plan`).
OVERLAP_ROWS = 200_000


@dataclass(frozen=True)
class Transformed:
    """What the transform of a shard gives (the plan, SPEC §9, is the night up to its apply: this and
    the stages after it).

    shard: the clean shard (the quarantined rows left out) the phases ran on.
    diff: the shard's diff; every frame has a ``scope_path`` column (each row its own scope).
    reports: scope → its report (the same as a shard of that scope alone gives, but for the timings,
        which are the shard's).
    quarantined: the rows set aside (table, id, reason, row JSON, scope_path).

    The ``scope_*`` readers give one scope's part as a run of that scope alone sees it; with no
    scope named, the shard must hold exactly one.
    """

    shard: Shard
    diff: Diff
    reports: dict[str, ConsolidationReport]
    quarantined: pl.DataFrame

    def _one(self, scope_path: str | None) -> str:
        if scope_path is not None:
            return scope_path
        if len(self.shard.scope_paths) != 1:
            raise InputError(f"this plan holds {len(self.shard.scope_paths)} scopes; name one")
        return self.shard.scope_paths[0]

    @property
    def report(self) -> ConsolidationReport:
        """The report of a shard of one."""
        return self.reports[self._one(None)]

    def scope_diff(self, scope_path: str | None = None) -> Diff:
        """One scope's diff, as :meth:`Diff.by_scope` cuts it (no ``scope_path`` on updates and deletes)."""
        s = self._one(scope_path)
        return self.diff.by_scope((s,)).get(s, Diff.empty())

    def scope_snapshot(self, scope_path: str | None = None) -> Snapshot:
        return self.shard.scope(self._one(scope_path))

    def scope_quarantined(self, scope_path: str | None = None) -> pl.DataFrame:
        s = self._one(scope_path)
        q = self.quarantined
        return (q.filter(pl.col("scope_path") == s) if q.height else q).drop("scope_path")


@functools.lru_cache(maxsize=None)
def _parameters(fn) -> tuple[str, ...]:
    """The names a phase function takes (read once per function: ``inspect.signature`` costs ~0.1 ms)."""
    return tuple(inspect.signature(fn).parameters)


def _arguments(phase: Phase, shard: Shard, config: ConsolidationConfig, as_of: datetime,
               extracted: Shard, summarizer: Summarizer | None = None) -> dict:
    wanted = _parameters(phase.fn)
    offered = {
        "snapshot": shard,
        "config": config.phase(phase.name),
        "as_of": as_of,
        "lookback_hours": config.lookback_hours,
        "settings": config,  # the whole configuration, for a phase that must keep another phase's invariant
        "extracted": extracted,  # the shard before any phase (for evidence an earlier phase archived)
        "summarizer": summarizer,  # phases 4 and 10 (SPEC §7); None: the deterministic text
    }
    if "embedder" in wanted:  # built only for the phases that ask (phase 12): the configured one
        from deep_sleep.core.embedding import embedder_for

        offered["embedder"] = embedder_for(config)
    missing = [name for name in wanted if name not in offered]
    if missing:
        raise PhaseError(f"phase {phase.name} asks for {missing}; phases may ask for {sorted(offered)} "
                         "(each row's scope is its scope_path column)")
    return {name: offered[name] for name in wanted}


def with_scope(diff: Diff, view: Shard) -> Diff:
    """``diff`` with a ``scope_path`` on every update and delete (inserts carry theirs), from the row
    each one names in ``view``."""
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


@dataclass
class _Phased:
    """What running the roster over a shard gave, per scope."""

    diffs: list[Diff]
    counters: dict[str, dict[str, int]]
    by_phase: dict[str, dict[str, dict[str, int]]]
    run: dict[str, list[str]]
    skipped: dict[str, dict[str, str]]
    notes: dict[str, dict[str, list[str]]]
    timings: dict[str, float]


def _run_phases(shard: Shard, config: ConsolidationConfig, as_of: datetime, phases: tuple[str, ...] | list[str] | None,
                summarizer: Summarizer | None) -> _Phased:
    paths = shard.scope_paths
    out = _Phased([], {s: dict.fromkeys(COUNTERS, 0) for s in paths}, {s: {} for s in paths}, {s: [] for s in paths},
                  {s: {} for s in paths}, {s: {} for s in paths}, {})
    view, folding = shard, 0.0
    for phase in roster(phases):
        if not config.phase(phase.name).enabled:
            for s in paths:
                out.skipped[s][phase.name] = "disabled by config"
            continue
        t0 = time.perf_counter()
        result: PhaseResult = phase.fn(**_arguments(phase, view, config, as_of, shard, summarizer))
        out.timings[phase.name] = round(time.perf_counter() - t0, 6)
        for name in result.counters:
            if name not in phase.counters:  # a phase reports only the counters its roster entry declares
                raise PhaseError(f"phase {phase.name} reported counter {name!r}, which its module does not "
                                 f"declare (its COUNTERS are {', '.join(phase.counters)})")
        if result.skipped:
            for s in paths:
                out.skipped[s][phase.name] = result.skipped
            continue
        _count(phase, result, paths, out)
        if result.diff.has_changes:
            out.diffs.append(with_scope(result.diff, view))
            t0 = time.perf_counter()
            view = result.diff.fold(view)
            folding += time.perf_counter() - t0
    out.timings["fold"] = round(folding, 6)
    return out


def _count(phase: Phase, result: PhaseResult, paths: tuple[str, ...], out: _Phased) -> None:
    """Put one phase's per-scope counters, runs, skips and notes into ``out``."""
    counts = result.by_scope
    if counts is None:  # a phase that counted nothing per scope may leave by_scope out
        if any(result.counters.values()) and len(paths) > 1:
            raise PhaseError(f"phase {phase.name} ran on a shard of {len(paths)} scopes but reported no by_scope counters")
        counts = pl.DataFrame([{"scope_path": paths[0], **result.counters}]) if result.counters else None
    per = {r["scope_path"]: r for r in counts.iter_rows(named=True)} if counts is not None else {}
    for s in paths:
        reason = result.skipped_scopes.get(s)
        if reason:
            out.skipped[s][phase.name] = reason
            continue
        out.run[s].append(phase.name)
        mine = {c: int(per[s].get(c) or 0) for c in phase.counters} if s in per else {}
        for c, v in mine.items():
            out.counters[s][c] += v
        out.by_phase[s][phase.name] = {c: v for c, v in mine.items() if v}
        notes = result.scope_notes.get(s) or (result.notes if len(paths) == 1 else ())
        if notes:
            out.notes[s][phase.name] = list(notes)


def _checked(shard: Shard, as_of: datetime, config: ConsolidationConfig) -> tuple[Shard, pl.DataFrame, float]:
    t0 = time.perf_counter()
    clean, quarantined = quarantine(shard, as_of, config.quarantine)
    return clean, quarantined, round(time.perf_counter() - t0, 6)


def transform(
    shard: Shard | Snapshot,
    config: ConsolidationConfig,
    as_of: datetime,
    phases: tuple[str, ...] | list[str] | None = None,
    check_rows: bool = True,
    summarizer: Summarizer | None = None,
    write_to: str | Path | None = None,
    embed: bool = True,
) -> Transformed:
    """Quarantine rows that break the store's invariants (``check_rows``), then run the roster (or
    the named ``phases``) in order over the whole shard, folding each diff in before the next phase.
    A :class:`Snapshot` is planned as a shard of one.

    On a shard of :data:`OVERLAP_ROWS` rows or more the row checks run in a second thread while the
    phases already run on the shard as extracted.  Almost always nothing is quarantined: the clean
    shard *is* the extracted one (same frames), so the phases' result stands.  When some row is
    quarantined, that result is thrown away and the phases run again on the clean shard — the diff
    is always the clean shard's, only the time differs.  (A phase that fails on a row the checks
    quarantine is rerun the same way; with nothing quarantined its error is raised.)

    ``write_to``: write the diff directory's frames there (:func:`write_diff`) while the hashes are
    computed (Parquet encoding and hashing release the GIL: the two overlap on two cores).
    ``embed``: the nodes the diff creates or whose text it changes carry their vector
    (:func:`embedded`, the configured embedder) — part of the diff and its hash, written by the apply.
    ``summarizer`` is handed to the phases that ask for one (4 and 10; :mod:`deep_sleep.run.llm`);
    when it counts its work (``counters()``), what this plan cost goes into each report's ``llm``
    (a shard of one; on a shard of many the cost is the shard's and is left out of the reports).
    """
    shard = Shard.of(shard) if isinstance(shard, Snapshot) else shard
    as_of = utc(as_of)
    counted = getattr(summarizer, "counters", None)
    llm_before = counted() if counted else {}
    quarantined = pl.DataFrame(schema=SHARD_QUARANTINE_SCHEMA)
    timings: dict[str, float] = {}
    if not check_rows:
        phased = _run_phases(shard, config, as_of, phases, summarizer)
    elif sum(f.height for f in shard.frames.values()) < OVERLAP_ROWS:
        shard, quarantined, timings["quarantine"] = _checked(shard, as_of, config)
        phased = _run_phases(shard, config, as_of, phases, summarizer)
    else:
        failure: Exception | None = None
        with ThreadPoolExecutor(1, thread_name_prefix="deep-sleep-quarantine") as pool:
            checking = pool.submit(_checked, shard, as_of, config)
            try:
                optimistic: _Phased | None = _run_phases(shard, config, as_of, phases, summarizer)
            except Exception as e:  # maybe a row the checks quarantine; decided below
                optimistic, failure = None, e
            shard, quarantined, timings["quarantine"] = checking.result()
        if quarantined.height:
            phased = _run_phases(shard, config, as_of, phases, summarizer)
        elif optimistic is None:
            raise failure  # type: ignore[misc]
        else:
            phased = optimistic
    timings.update(phased.timings)
    t0 = time.perf_counter()
    diff = Diff.combine(phased.diffs)
    timings["combine"] = round(time.perf_counter() - t0, 6)
    if embed:
        t0 = time.perf_counter()
        diff = embedded(diff, shard, config)
        timings["embed"] = round(time.perf_counter() - t0, 6)
    t0 = time.perf_counter()
    if write_to is None:
        hashes = diff.scope_hashes()
    else:
        with ThreadPoolExecutor(1, thread_name_prefix="deep-sleep-write-diff") as pool:
            writing = pool.submit(_timed_write, diff, shard.scope_paths, Path(write_to))
            hashes = diff.scope_hashes()
            timings["write_diff"] = writing.result()
    changed = diff.scope_row_counts()
    timings["diff_hash"] = round(time.perf_counter() - t0, 6)
    empty_hash = Diff.empty().content_hash()
    quarantined_by = ({s: q for (s,), q in quarantined.partition_by("scope_path", as_dict=True).items()}
                      if quarantined.height else {})
    llm = {k: v - llm_before.get(k, 0) for k, v in counted().items()} if counted and len(shard.scope_paths) == 1 else {}
    reports = {
        s: ConsolidationReport(
            scope_path=s,
            as_of=iso(as_of) or "",
            counters=phased.counters[s],
            counters_by_phase=phased.by_phase[s],
            phases_run=phased.run[s],
            phases_skipped=phased.skipped[s],
            timings=timings,
            rows_changed=changed.get(s, {}),
            notes=phased.notes[s],
            diff_hash=hashes.get(s, empty_hash),
            quarantined=summarise(quarantined_by[s]) if s in quarantined_by else {},
            llm=llm,
        )
        for s in shard.scope_paths
    }
    return Transformed(shard=shard, diff=diff, reports=reports, quarantined=quarantined)


# -- vectors of what consolidation writes (SPEC §5 as amended) ------------------------------------
def node_text(label: pl.Expr, properties: pl.Expr) -> pl.Expr:
    """What a node's vector embeds (:func:`deep_sleep.core.embedding.node_text`, the rule of the live
    path and of ``reembed``): a ``META:`` node's label and text (``properties.summary``); another
    node's label and its string property values (computed row by row: no phase writes one today)."""
    from deep_sleep.core.embedding import node_text as one

    keywords = properties.str.json_path_match("$.keywords")
    meta = pl.concat_str([label.fill_null(""), properties.str.json_path_match("$.summary").fill_null("")], separator=" ")
    meta = pl.when(keywords.fill_null("") != "").then(pl.concat_str([meta, keywords], separator=" ")).otherwise(meta)
    other = pl.struct(label.alias("l"), properties.alias("p")).map_elements(
        lambda r: None if (r["l"] or "").startswith("META:") else one(r["l"] or "", json.loads(r["p"]) if r["p"] else {}),
        return_dtype=pl.String)
    return pl.when(label.str.starts_with("META:")).then(meta).otherwise(other)


def embedded(diff: Diff, shard: Shard, config: ConsolidationConfig) -> Diff:
    """``diff`` with ``embedding`` and ``embedding_model`` on every node it inserts (a summary, a META
    cluster) and on every node update that changes what its vector embeds (:func:`node_text`: a new
    label; a META node's new ``properties.summary`` — a refreshed cluster), so that what consolidation
    writes is found by recall like what a live turn writes.  The configured embedder
    (``embedding.model``) computes them deterministically: the same diff, the same vectors, the same
    hash.  An update's label, when it does not change it, is the shard's; an update that changes only
    other properties of a node (a risk tag) keeps its vector."""
    from deep_sleep.core.embedding import embedder_for

    td = diff.table("memory_nodes")
    frames = td.frames()
    todo = {}
    if frames["inserts"].height and "label" in frames["inserts"].columns:
        ins = frames["inserts"]
        props = pl.col("properties") if "properties" in ins.columns else pl.lit(None, pl.String)
        todo["inserts"] = ins.select(node_text(pl.col("label"), props).alias("_text")).to_series()
    ups = frames["updates"]
    if ups.height and ({"label", "properties"} & set(ups.columns)):
        known = shard.table("memory_nodes").select("scope_path", "id", pl.col("label").alias("_label"))
        with_label = ups.join(known, on=["scope_path", "id"], how="left", maintain_order="left")
        label = pl.col("label") if "label" in ups.columns else pl.lit(None, pl.String)
        props = pl.col("properties") if "properties" in ups.columns else pl.lit(None, pl.String)
        current = pl.coalesce(label, pl.col("_label"))
        changes = label.is_not_null() | (current.str.starts_with("META:")
                                         & props.str.json_path_match("$.summary").is_not_null())
        if with_label.select(changes.any()).item():
            todo["updates"] = with_label.select(pl.when(changes).then(node_text(current, props)).alias("_text")).to_series()
    if not todo:
        return diff
    embedder = embedder_for(config)
    dtype = tables.diff_columns("memory_nodes")["embedding"].dtype
    for kind, texts in todo.items():
        wanted = texts.is_not_null().to_numpy()
        vectors = embedder.embed([t for t in texts.to_list() if t is not None])
        full = np.zeros((texts.len(), dtype.size), dtype=np.float32)
        full[wanted] = vectors
        usable = wanted & full.any(axis=1)
        frames[kind] = frames[kind].with_columns(
            pl.when(pl.Series(usable)).then(pl.Series(full).cast(dtype)).otherwise(None).alias("embedding"),
            pl.when(pl.Series(usable)).then(pl.lit(embedder.name))
            .otherwise(pl.lit(None, pl.String)).alias("embedding_model"))
    return Diff({**diff.tables, "memory_nodes": TableDiff(**frames)})


# -- the diff directory's frames (SPEC §8) -------------------------------------------------------
def write_diff(diff: Diff, scope_paths: tuple[str, ...], out: Path) -> Path:
    """Write a shard's diff frames to ``out``: a shard of many in the shard layout (every scope's rows
    in one ``<table>.<kind>.parquet``, sorted by ``scope_path``, each row with it); a shard of one in
    the single-scope layout (:meth:`Diff.by_scope`: no ``scope_path`` on updates and deletes), which
    SPEC §8 keeps valid and ``deep-sleep run``'s users read.  Stale frames are removed."""
    out.mkdir(parents=True, exist_ok=True)
    for kind in KINDS:
        for stale in out.glob(f"*.{kind}.parquet"):
            stale.unlink()
    if len(scope_paths) == 1:
        diff = diff.by_scope(scope_paths).get(scope_paths[0], Diff.empty())
    for name, td in diff.tables.items():
        for kind, frame in td.frames().items():
            if frame.height:
                if len(scope_paths) > 1:
                    frame = frame.sort("scope_path", maintain_order=True)
                frame.write_parquet(out / f"{name}.{kind}.parquet", **tables.PARQUET_OPTIONS)
    return out


def _timed_write(diff: Diff, scope_paths: tuple[str, ...], out: Path) -> float:
    t0 = time.perf_counter()
    write_diff(diff, scope_paths, out)
    return round(time.perf_counter() - t0, 6)


def as_shard_diff(diff: Diff, scope_path: str) -> Diff:
    """A single scope's diff (as :meth:`Transformed.scope_diff` or a single-scope directory gives it) with a
    ``scope_path`` on every row: the form every stage after the transform takes.  A row that already
    names another scope keeps it (validation then fails it: SPEC §1)."""
    out = {}
    for name, td in diff.tables.items():
        frames = {k: (f if not f.height or "scope_path" in f.columns
                      else f.with_columns(pl.lit(scope_path).alias("scope_path"))) for k, f in td.frames().items()}
        out[name] = TableDiff(**frames)
    return Diff(out)


__all__ = ["Transformed", "transform", "write_diff", "as_shard_diff", "with_scope", "OVERLAP_ROWS"]
