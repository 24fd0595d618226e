"""The pipeline: stages as values, run by one runner (SQLMesh's ``plan/stages.py`` is the model).

A run is a :class:`Context` (what it is given, normalised once at its boundary: ``as_of`` in UTC,
scope paths, configuration, store, where its files go) and a list of stages.  Each stage is a frozen
value with a ``run(ctx, state) -> state``; :func:`run` hands each the :class:`State` the previous one
returned.  Every path builds the list it needs from the same stage values — no flag is threaded
through a stage, and no stage returns two shapes:

    NIGHT   = Extract, Transform, Gate, Hold, Validate, Publish, Apply, Publish   the nightly's shard task,
                                                                               deep-sleep run, the flows
    PLAN    = Extract, Transform, Gate, Hold, Validate                         deep-sleep plan, nightly --plan
    REPLAY  = Transform, Gate, Hold, Validate                                  replay of a stored snapshot
    NAP     = Transform, Validate, Apply                                       the quick nap (a targeted shard of one)

A single scope is a shard of one and runs the same stages.  :func:`explain` walks the same list to
say what each stage would do.  Whether the gate ran, or why not, is in every report (``gate``).

The holds split comes before the final validation, so validation judges what will be applied
tonight — the snapshot with only that part folded in — every SPEC §4 check (SPEC §9 as amended).
"""

from __future__ import annotations

import shutil
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import ClassVar

import polars as pl

from deep_sleep.core import files
from deep_sleep.core.diff import Diff
from deep_sleep.core.errors import InputError
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.scope import Scope
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import utc
from deep_sleep.core.summary import Summarizer
from deep_sleep.run import holds as held_rows
from deep_sleep.run.apply import ScopeApplied, apply
from deep_sleep.run.gate import not_run, recall_gate
from deep_sleep.run.holds import HoldSplit, split_holds
from deep_sleep.run.layout import QUARANTINE_FILE, VALIDATION_FILE, publish, write_config, write_reports
from deep_sleep.run.transform import Transformed, transform
from deep_sleep.store.db import Store
from deep_sleep.transforms.config import ConsolidationConfig
from deep_sleep.validation import failed_scopes, validate_diff


# -- values --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Context:
    """What a run is given.  Build it with :meth:`of`, which normalises at the boundary.

    as_of: the run's logical time, UTC.  config: the whole configuration.  store: None for a run that
    touches no database (replay).  scopes: the scopes to extract (scope paths, byte order).
    mode: the ledger's ``mode`` (``nightly``, ``quick_nap``).  started_at: when the run started.
    snapshot_dir, diff_dir: where the snapshot and the diff directory go (None: not written);
    :meth:`of` sets both from a run directory ``base`` (``base/snapshot``, ``base/diff``).
    location: where they are published (an object-store URL: ``location/snapshot``, ``/diff``), if anywhere.  phases: only these
    phases (None: the roster).  summarizer: for phases 4 and 10 (SPEC §7; None: the deterministic
    text).  holds: apply the configuration's holds policy (the quick nap does not: it keeps no files).
    run_ids: scope → its run id (the rest get a new UUID).
    """

    as_of: datetime
    config: ConsolidationConfig
    store: Store | None = None
    scopes: tuple[str, ...] = ()
    mode: str = "nightly"
    started_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    snapshot_dir: Path | None = None
    diff_dir: Path | None = None
    location: str | None = None
    phases: tuple[str, ...] | None = None
    summarizer: Summarizer | None = None
    holds: bool = True
    run_ids: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, as_of: datetime | str | None = None, config: ConsolidationConfig | None = None, *,
           scopes: list[Scope | str] | tuple[Scope | str, ...] | Scope | str = (), **fields) -> Context:
        """A context with ``as_of`` in UTC (default: now), scope paths sorted, the default configuration;
        ``base``: a run directory for ``snapshot/`` and ``diff/``."""
        started = fields.pop("started_at", None) or datetime.now(UTC)
        many = [scopes] if isinstance(scopes, (Scope, str)) else list(scopes)
        paths = tuple(sorted({Scope.coerce(s).path for s in many}, key=str.encode))
        base = fields.pop("base", None)
        if base is not None:
            fields.setdefault("snapshot_dir", Path(base) / "snapshot")
            fields.setdefault("diff_dir", Path(base) / "diff")
        return cls(as_of=utc(as_of or started), config=config or ConsolidationConfig(), scopes=paths,
                   started_at=started, **fields)

    def with_base(self, base: Path | str) -> Context:
        """This context with its files in the run directory ``base``."""
        return replace(self, snapshot_dir=Path(base) / "snapshot", diff_dir=Path(base) / "diff")


@dataclass(frozen=True)
class State:
    """What the stages so far computed.

    shard: the snapshot (extracted, or given: replay, the nap).  transformed: the transform stage's
    (:class:`~deep_sleep.run.transform.Transformed`: the clean shard, the diff, the quarantined rows).
    reports: scope → its report, as far as the run got.  split: the holds split (what applies tonight,
    what waits); None before the Hold stage or without one.  failures: the validation's failing checks.
    applied: scope → what the apply did.  ran: the names of the stages that ran, in order; seconds: each one's.
    preview: after a plan's Preview stage, every record and what would be held.
    """

    shard: Shard | None = None
    transformed: Transformed | None = None
    reports: Mapping[str, ConsolidationReport] = field(default_factory=dict)
    split: HoldSplit | None = None
    failures: pl.DataFrame | None = None
    applied: Mapping[str, ScopeApplied] = field(default_factory=dict)
    ran: tuple[str, ...] = ()
    seconds: Mapping[str, float] = field(default_factory=dict)
    preview: object | None = None  # a plan's records (:class:`deep_sleep.run.preview.PlanPreview`), after its Preview stage

    @property
    def tonight(self) -> Diff:
        """The part of the diff that applies tonight: the holds split's, else the whole diff."""
        if self.split is not None:
            return self.split.apply
        return self.transformed.diff if self.transformed is not None else Diff.empty()

    @property
    def ok(self) -> list[str]:
        """The scopes not marked failed."""
        return [s for s, r in self.reports.items() if r.status != "failed"]

    def report(self, scope_path: str | None = None) -> ConsolidationReport:
        """One scope's report (a shard of one: the only one)."""
        if scope_path is None:
            if len(self.reports) != 1:
                raise InputError(f"this run has {len(self.reports)} scopes; name one")
            return next(iter(self.reports.values()))
        return self.reports[scope_path]


def _with_reports(state: State, changes: Mapping[str, dict]) -> State:
    return replace(state, reports={s: (r.with_(**changes[s]) if s in changes else r) for s, r in state.reports.items()})


# -- stages --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Extract:
    """Read ``ctx.scopes`` consistently (one ``REPEATABLE READ`` transaction, each table once) and
    write the shard snapshot to ``ctx.snapshot_dir``."""

    name: ClassVar[str] = "extract"

    def run(self, ctx: Context, state: State) -> State:
        from deep_sleep.store.extract import extract_shard

        if ctx.store is None or not ctx.scopes:
            raise InputError("the extract stage needs a store and at least one scope")
        shard = extract_shard(ctx.store, list(ctx.scopes), log_since=ctx.as_of - timedelta(hours=ctx.config.lookback_hours))
        if ctx.snapshot_dir is not None:
            shard.write(ctx.snapshot_dir)
            shard = replace(shard, source=ctx.snapshot_dir)
        return replace(state, shard=shard)

    def describe(self, ctx: Context) -> str:
        return f"extract {len(ctx.scopes)} scope(s) in one REPEATABLE READ transaction" + (
            f"; snapshot to {ctx.snapshot_dir}" if ctx.snapshot_dir else "")


@dataclass(frozen=True)
class Transform:
    """Run the phases over the shard (:func:`~deep_sleep.run.transform.transform`), give each scope its run id,
    and write the diff's frames to ``ctx.diff_dir``."""

    name: ClassVar[str] = "transform"

    def run(self, ctx: Context, state: State) -> State:
        if state.shard is None:
            raise InputError("the transform stage needs a shard: extract first, or give one (replay, the nap)")
        if ctx.diff_dir is not None:
            ctx.diff_dir.mkdir(parents=True, exist_ok=True)
        p = transform(state.shard, ctx.config, ctx.as_of, ctx.phases, summarizer=ctx.summarizer, write_to=ctx.diff_dir)
        snap_uri = str(state.shard.source.resolve()) if state.shard.source is not None else None
        diff_uri = str(ctx.diff_dir.resolve()) if ctx.diff_dir is not None else None
        if ctx.location is not None:
            snap_uri, diff_uri = files.join(ctx.location, "snapshot"), files.join(ctx.location, "diff")
        reports = {s: r.with_(run_id=ctx.run_ids.get(s) or str(uuid.uuid4()), snapshot_uri=snap_uri, diff_uri=diff_uri)
                   for s, r in p.reports.items()}
        if ctx.diff_dir is not None and p.quarantined.height:
            (p.quarantined.drop("scope_path") if len(reports) == 1 else p.quarantined).write_parquet(
                ctx.diff_dir / QUARANTINE_FILE)
        return replace(state, transformed=p, reports=reports)

    def describe(self, ctx: Context) -> str:
        return f"transform: quarantine, then {'the roster' if ctx.phases is None else ', '.join(ctx.phases)} over the shard"


@dataclass(frozen=True)
class Gate:
    """The recall-quality gate (SPEC §9, :mod:`deep_sleep.run.gate`) of every scope, for the whole
    shard at once; its verdict (``status``: measured or why not, and the figures) goes into each
    report, and the Hold stage holds the destructive rows of a scope whose gate failed.  Node
    embeddings (which snapshots do not carry) are read from the store in one query; without a store
    (replay) the gate does not run, and the reports say so."""

    name: ClassVar[str] = "gate"

    def run(self, ctx: Context, state: State) -> State:
        if ctx.store is None:
            return _with_reports(state, {s: {"gate": not_run("no store: the nodes' embeddings are in the store")}
                                         for s in state.reports})
        from deep_sleep.core.embedding import embedder_for
        from deep_sleep.store.vectors import foreign_models, node_embeddings

        embedder = embedder_for(ctx.config)
        # Vectors of another model than the configured one cannot be compared (SPEC §5 as amended): such a
        # scope's night fails, naming both models and the fix; it changes nothing.
        if ctx.config.gate.enabled:
            embeddings = node_embeddings(ctx.store, list(state.reports))
            foreign = (embeddings.filter(pl.col("embedding_model").is_not_null()
                                         & (pl.col("embedding_model") != embedder.name))
                       .group_by("scope_path").agg(pl.col("embedding_model").unique().sort()))
            wrong = {s: models for s, models in foreign.iter_rows()}
            if wrong:
                embeddings = embeddings.filter(~pl.col("scope_path").is_in(pl.Series(sorted(wrong), dtype=pl.String).implode()))
        else:
            embeddings, wrong = None, foreign_models(ctx.store, list(state.reports), embedder.name)
        results = recall_gate(state.transformed.shard, state.transformed.diff, ctx.config, embeddings, now=ctx.as_of,
                              embedder=embedder)
        changes = {s: {"gate": results[s].to_report()} for s in state.reports}
        for s, models in wrong.items():
            changes[s] = {"status": "failed", "gate": {"status": "model_mismatch", "failed": False, "detail": (
                f"the store holds vectors of {', '.join(models)}; this night embeds with {embedder.name}")},
                "errors": [*state.reports[s].errors, f"embedding model: {Scope.parse(s)} holds vectors of model "
                           f"{', '.join(models)}; this night embeds with {embedder.name} (embedding.model) and vectors of "
                           "two models cannot be compared: run `deep-sleep reembed`, or set embedding.model to the "
                           "store's model; nothing of this scope was changed"]}
        return _with_reports(state, changes)

    def describe(self, ctx: Context) -> str:
        return "gate: replay each scope's used recall queries before and after the diff"


@dataclass(frozen=True)
class Hold:
    """Split the diff into what applies tonight and what waits for approval
    (:func:`~deep_sleep.run.holds.split_holds`: the configuration's holds policy and each scope's gate
    verdict), closed under the graph; the held rows go to ``<diff>/held/`` and each holding scope's
    report says what and why (``held``, ``status: pending``).  The run's whole configuration goes to
    ``<diff>/config.json``: approve and undo decide with it.  A context without holds (the quick nap)
    splits nothing."""

    name: ClassVar[str] = "hold"

    def run(self, ctx: Context, state: State) -> State:
        if ctx.diff_dir is not None:  # what an approval or an undo of this run decides with (layout.CONFIG_FILE)
            write_config(ctx.diff_dir, ctx.config)
        out = ctx.diff_dir / held_rows.HELD_DIR if ctx.diff_dir is not None else None
        if out is not None and out.exists():
            shutil.rmtree(out)  # a re-run on the same files
        if not ctx.holds:
            return state
        gate_failed = {s: bool(r.gate.get("failed")) for s, r in state.reports.items()}
        split = split_holds(state.transformed.diff, state.transformed.shard, ctx.config.holds, gate_failed, scopes=state.ok)
        if not split.held.has_changes:
            return replace(state, split=split)
        if out is None:
            raise InputError("holds keep the held rows beside the diff: run with a run directory, or without holds")
        split.write(out)
        summaries = split.summaries()
        return _with_reports(replace(state, split=split), {s: {"held": {**summaries[s], "status": "pending"}}
                                                           for s in summaries})

    def describe(self, ctx: Context) -> str:
        return "hold: split what applies tonight from what waits for approval" if ctx.holds else "hold: off"


@dataclass(frozen=True)
class Validate:
    """Check what applies tonight (SPEC §4, :func:`~deep_sleep.validation.validate_diff`) against the
    snapshot: the whole diff, or after the Hold stage its applied part — every check on the snapshot
    with only that part folded in.  A failing check fails only the scopes whose rows fail it: their
    reports are marked failed with the checks named, and they apply (and hold) nothing."""

    name: ClassVar[str] = "validate"
    writes_reports: ClassVar[bool] = True

    def run(self, ctx: Context, state: State) -> State:
        shard = state.transformed.shard
        failures = validate_diff(state.tonight, shard, ctx.config)
        failing = failed_scopes(failures, shard)
        if ctx.diff_dir is not None and failures.height:
            (failures.drop("scope_path") if len(shard.scope_paths) == 1 else failures).write_parquet(
                ctx.diff_dir / VALIDATION_FILE)
        by_scope = ({k: v for (k,), v in failures.partition_by("scope_path", as_dict=True).items()}
                    if failures.height else {})
        changes = {}
        for s in failing:
            mine = by_scope.get(s, failures)  # a failure no scope owns fails them all (failed_scopes)
            r = state.reports[s]
            changes[s] = {"status": "failed", "errors": r.errors + failure_messages(mine), "held": {},
                          "validation": mine.drop("scope_path").head(200).to_dicts()}
        return _with_reports(replace(state, failures=failures), changes)

    def describe(self, ctx: Context) -> str:
        return "validate: every SPEC §4 check of what applies tonight"


@dataclass(frozen=True)
class Publish:
    """Copy the run directory to ``ctx.location`` (an object-store URL; a no-op without one): before
    the apply, because the ledger rows name these files, and after it, for the reports it rewrote."""

    name: ClassVar[str] = "publish"

    def run(self, ctx: Context, state: State) -> State:
        if ctx.location is not None:
            if ctx.diff_dir is not None:
                write_reports(ctx.diff_dir, dict(state.reports))
            publish(ctx.snapshot_dir, ctx.diff_dir, ctx.location)
        return state

    def describe(self, ctx: Context) -> str:
        return f"publish the run directory to {ctx.location}" if ctx.location else "publish: nothing (local files)"


@dataclass(frozen=True)
class Apply:
    """Apply what applies tonight (:func:`~deep_sleep.run.apply.apply`: atomic per scope, version
    guarded, a scope that fails leaves the others applying) and record every scope's run in the
    ledger — with what it held, in the same transaction."""

    name: ClassVar[str] = "apply"
    writes_reports: ClassVar[bool] = True

    def run(self, ctx: Context, state: State) -> State:
        if ctx.store is None:
            raise InputError("the apply stage needs a store")
        steps: dict[str, float] = {}
        ok = state.ok  # a failed scope's rows are not applied (nor, when validation failed them all, a stray row's)
        q = _only(state.transformed.quarantined, ok)
        results = apply(ctx.store, _only_scopes(state.tonight, ok), dict(state.reports), mode=ctx.mode,
                        started_at=ctx.started_at, quarantined=q if q.height else None, step_seconds=steps,
                        cluster_cap=ctx.config.meta_nodes.max_members)
        timings = {f"apply.{k}": round(v, 6) for k, v in steps.items()}
        changes = {}
        for s, r in state.reports.items():
            got = results[s]
            if r.status == "failed":
                continue
            if got.status == "failed":
                changes[s] = {"status": "failed", "errors": r.errors + [f"apply failed: {got.error}"], "held": {}}
            else:
                changes[s] = {"status": "applied", "rows_changed": got.applied, "conflicts": got.conflicts,
                              "timings": {**r.timings, **timings}}
        return _with_reports(replace(state, applied=results), changes)

    def describe(self, ctx: Context) -> str:
        return f"apply in batches of scopes, one transaction each (mode {ctx.mode})"


def _only(frame: pl.DataFrame, scopes: list[str]) -> pl.DataFrame:
    return frame.filter(pl.col("scope_path").is_in(pl.Series(scopes, dtype=pl.String).implode())) if frame.height else frame


def _only_scopes(diff: Diff, scopes: list[str]) -> Diff:
    """The rows of ``diff`` (a shard diff) of ``scopes``."""
    from deep_sleep.core.diff import TableDiff

    return Diff({t: TableDiff(**{k: _only(f, scopes) for k, f in td.frames().items()}) for t, td in diff.tables.items()})


NIGHT = (Extract(), Transform(), Gate(), Hold(), Validate(), Publish(), Apply(), Publish())
PLAN = tuple(s for s in NIGHT if not isinstance(s, (Publish, Apply)))
REPLAY = tuple(s for s in PLAN if not isinstance(s, Extract))
NAP = (Transform(), Validate(), Apply())


# -- the runner ----------------------------------------------------------------------------------
def step(stage, ctx: Context, state: State) -> State:
    """Run one stage: its seconds go into every report's ``timings`` under its name, and a stage that
    writes reports (validate, apply) leaves the reports file in ``ctx.diff_dir`` as it left them."""
    t0 = time.perf_counter()
    state = stage.run(ctx, state)
    seconds = {**state.seconds, stage.name: round(time.perf_counter() - t0, 6)}
    state = replace(state, ran=(*state.ran, stage.name), seconds=seconds,  # reports made later get the earlier stages' too
                    reports={s: r.with_(timings={**r.timings, **seconds}) for s, r in state.reports.items()})
    if getattr(stage, "writes_reports", False) and ctx.diff_dir is not None:
        write_reports(ctx.diff_dir, dict(state.reports))
    return state


def finish(ctx: Context, state: State) -> State:
    """The end of a run: a report whose run had no gate stage says so (``gate``), and the reports
    file is written to ``ctx.diff_dir``."""
    if "gate" not in state.ran:
        missing = {s: {"gate": not_run(f"not a stage of this run ({', '.join(state.ran)})")}
                   for s, r in state.reports.items() if not r.gate}
        state = _with_reports(state, missing)
    if ctx.diff_dir is not None and state.reports:
        write_reports(ctx.diff_dir, dict(state.reports))
    return state


def run(stages: tuple, ctx: Context, state: State | None = None) -> State:
    """Run ``stages`` in order from ``state`` (default: nothing yet): :func:`step` each, then :func:`finish`."""
    state = state or State()
    for stage in stages:
        state = step(stage, ctx, state)
    return finish(ctx, state)


def explain(stages: tuple, ctx: Context) -> str:
    """What each stage of ``stages`` would do, one line each (the same values :func:`run` runs)."""
    return "\n".join(f"{i}. {s.describe(ctx)}" for i, s in enumerate(stages, 1))


def new_run_id() -> str:
    """A new run id (a UUID4 text)."""
    return str(uuid.uuid4())


def consolidate(store: Store, scopes: list[Scope | str] | Scope | str, as_of: datetime | str | None = None,
                config: ConsolidationConfig | None = None, *, runs_dir: str | Path | None = None, stages: tuple = NIGHT,
                mode: str = "nightly", phases: tuple[str, ...] | None = None, summarizer: Summarizer | None = None,
                run_id: str | None = None, started_at: datetime | None = None, embedder: str | None = None,
                force: bool = False) -> State:
    """Run a night for one scope or a shard of scopes (``stages``: :data:`NIGHT`; :data:`PLAN` stops
    before the apply) with its files in a run directory of its own under ``runs_dir``
    (:func:`~deep_sleep.run.layout.run_location`; default ``$DEEP_SLEEP_RUNS_DIR`` or
    ``.deep_sleep/runs``, or an object-store URL: staged in a local temporary directory and published
    there).  Returns the final :class:`State`; ``state.reports`` has every scope's report.

        >>> state = consolidate(store, "org/acme", as_of="2026-11-20T03:00:00Z")   # doctest: +SKIP
        >>> state.report().status                                                  # doctest: +SKIP
        'applied'

    ``run_id``: the run directory's id, and for a single scope its run id (default: a new UUID).
    ``summarizer``: for phases 4 and 10 (default: the configuration's, :func:`deep_sleep.run.llm.summarizer_for`
    — None, the deterministic text, unless ``llm.enabled``).  ``embedder``: the one embedder's name
    (``hashing``, ``wordllama``, ``package.module:attribute``), in place of ``config.embedding.model``;
    it must be the model of the store's vectors and of the live path's (the Gate stage refuses a scope
    holding another model's vectors).  Also ``from deep_sleep import consolidate``.

    Refused before anything is read or written (:class:`~deep_sleep.core.errors.InputError`), as the
    CLI refuses them, unless ``force``: an ``as_of`` more than ``DEEP_SLEEP_AS_OF_MARGIN_HOURS`` (1 h)
    past the wall clock (a run there decays and prunes as if that time had come, and the scope is then
    never due) — when ``stages`` apply — and a scope that holds no row of any table (nothing to
    consolidate: a run would only leave a ledger row that makes the scope look consolidated).  The
    nightly passes ``force``: its gating chose the scopes and its caller checked the ``as_of``.  An
    ``as_of`` outside years 1–9999 in UTC is a :class:`~deep_sleep.core.errors.TimeRangeError`.
    """
    import tempfile

    from deep_sleep.run.layout import run_location
    from deep_sleep.run.llm import summarizer_for

    if embedder is not None:
        from deep_sleep.core.config import EmbeddingConfig
        from deep_sleep.transforms.config import load_config

        config = (config or load_config()).model_copy(update={"embedding": EmbeddingConfig(model=embedder)})
    ctx = Context.of(as_of, config, scopes=scopes, store=store, mode=mode, phases=phases, started_at=started_at)
    if not force:
        if any(isinstance(s, Apply) for s in stages):
            check_not_ahead(ctx.as_of, "consolidate: as_of", "pass force=True if you mean it")
        _check_scopes_hold_rows(store, ctx.scopes)
    ctx = replace(ctx, summarizer=summarizer if summarizer is not None else summarizer_for(ctx.config, store))
    run_id = run_id or str(uuid.uuid4())
    location = run_location(runs_dir, ctx.scopes, ctx.as_of, run_id)
    remote = files.is_remote(location)  # workers share no disk: stage locally, publish to the object store
    base = Path(tempfile.mkdtemp(prefix="deep-sleep-run-")) if remote else files.local_path(location)
    ctx = replace(ctx.with_base(base), location=location if remote else None,
                  run_ids={ctx.scopes[0]: run_id} if len(ctx.scopes) == 1 else {})
    try:
        return run(stages, ctx)
    finally:
        if remote:
            shutil.rmtree(base, ignore_errors=True)


def as_of_margin_hours() -> float:
    """How far past the wall clock an ``as_of`` may be (``DEEP_SLEEP_AS_OF_MARGIN_HOURS``, default 1 h)."""
    import os

    from deep_sleep.core.errors import ConfigError

    text = os.environ.get("DEEP_SLEEP_AS_OF_MARGIN_HOURS", "1")
    try:
        margin = float(text)
    except ValueError:
        margin = float("nan")
    if not 0 <= margin < 1e6:  # nan compares false
        raise ConfigError(f"DEEP_SLEEP_AS_OF_MARGIN_HOURS={text!r}: expected a number of hours such as 1")
    return margin


def check_not_ahead(as_of: datetime, what: str, fix: str, *, margin_hours: float | None = None,
                    now: datetime | None = None) -> None:
    """Refuse an ``as_of`` more than ``margin_hours`` (:func:`as_of_margin_hours`) past the wall clock, naming ``what`` and ``fix``."""
    margin = as_of_margin_hours() if margin_hours is None else margin_hours
    now = now or datetime.now(UTC)
    if as_of > now + timedelta(hours=margin):
        raise InputError(f"{what} {as_of.isoformat()} is {(as_of - now).total_seconds() / 3600:.1f} h after the wall clock "
                         f"(the margin is {margin:g} h, DEEP_SLEEP_AS_OF_MARGIN_HOURS); a run there would decay and prune "
                         f"as if that time had come, and the scope would not be due again until then. {fix}")


#: The tables a scope's rows live in: a scope with a row in none of them has nothing to consolidate.
SCOPED_TABLES = ("memory_nodes", "episodic_events", "memory_edges", "recall_events", "procedural_skills", "soul_profiles",
                 "pending_connections", "prospective_triggers", "memory_access_log")


def _check_scopes_hold_rows(store: Store, paths: tuple[str, ...]) -> None:
    """Refuse the scopes of ``paths`` that hold no row at all (one query, an index probe per table and scope)."""
    if not paths:
        return
    probes = " OR ".join(f"EXISTS (SELECT 1 FROM {t} WHERE scope_path = p)" for t in SCOPED_TABLES)
    legacy = ("EXISTS (SELECT 1 FROM memory_nodes WHERE scope_path IS NULL AND tenant_id = split_part(p, chr(31), 2)"
              " AND p = 'tenant' || chr(31) || split_part(p, chr(31), 2))")  # tenant/<id> reads the legacy rows
    with store.pg() as con:
        empty = [r[0] for r in con.execute(f"SELECT p FROM unnest(%s::text[]) p WHERE NOT ({probes} OR {legacy})",
                                           (list(paths),))]
    if empty:
        shown = ", ".join(str(Scope.parse(p)) for p in empty[:5]) + (f" and {len(empty) - 5} more" if len(empty) > 5 else "")
        raise InputError(f"consolidate: scope(s) {shown} hold no rows in this store; nothing to consolidate (no run "
                         "and no ledger row is written for them). Check the scope's spelling (`deep-sleep report` "
                         "lists the scopes that ran), or pass force=True to record an empty run")


def failure_messages(failures: pl.DataFrame) -> list[str]:
    """One line per (check, table, kind, phase) of a scope's failing checks, with example ids."""
    summary = (failures.group_by("check", "table", "kind", "phase")
               .agg(pl.len().alias("rows"), pl.col("id").head(5).alias("example_ids")).sort("table", "kind", "check"))
    return [f"validation failed: {r['check']} — {r['table']}.{r['kind']} from phase {r['phase']}: {r['rows']} row(s), "
            f"e.g. {', '.join(x for x in r['example_ids'] if x)}" for r in summary.iter_rows(named=True)]


__all__ = ["Context", "State", "Extract", "Transform", "Gate", "Hold", "Validate", "Publish", "Apply", "NIGHT", "PLAN",
           "REPLAY", "NAP", "run", "step", "finish", "explain", "consolidate", "new_run_id", "failure_messages",
           "as_of_margin_hours", "check_not_ahead", "SCOPED_TABLES"]
