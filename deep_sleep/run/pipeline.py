"""One pipeline of stage values for every path: extract → plan → validate → apply (SPEC §2).

Each stage takes the previous stage's value and returns its own; values pass explicitly in one
process (nothing is re-read from disk, no cache in between), and each stage also writes its files
— for replay, for other processes and for re-running a stage by hand on the files of a failed
night (:mod:`deep_sleep.run.stages` reads them back).  The nightly runs it once per *shard* (many
scopes in one columnar pass); ``deep-sleep run``, the single-scope flow, the demo and the
benchmarks run it on a shard of one; ``deep-sleep plan`` stops before :func:`apply`; replay is
:func:`plan_only` on a stored snapshot.

    Extracted(shard, snapshot_dir)                         extract(store, scopes, as_of, config, out)
      → Planned(plan, reports with run ids, diff_dir)      transform(extracted, config, as_of, out)
      → Validated(failures, reports: failed scopes marked) validate(planned, config)
      → Applied(reports: applied / failed / conflicts)     apply(store, validated)

Files of a run directory (SPEC §8): ``snapshot/`` (a shard snapshot: one Parquet per table, rows
sorted by scope, a manifest listing every scope; a shard of one is also a valid single-scope
snapshot) and ``diff/``: for a shard of one the single-scope diff directory (``report.json``,
``<table>.<kind>.parquet``); for a shard of many, the same files holding every scope's rows (each
row with ``scope_path``) and ``reports.parquet`` (one row per scope: ``scope_path``, ``run_id``,
``status``, ``diff_hash``, ``report`` = the report's JSON).  :func:`read_scope_diff` and
:func:`read_scope_report` read one scope out of either.  ``quarantine.parquet`` and
``validation.parquet`` carry a ``scope_path`` column in a shard's directory.
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl

from deep_sleep.core import files, tables
from deep_sleep.core.diff import KINDS, Diff, TableDiff
from deep_sleep.core.errors import InputError, SnapshotError
from deep_sleep.core.holds_config import HoldsConfig
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.scope import Scope
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot, utc
from deep_sleep.core.summary import Summarizer
from deep_sleep.run import holds as held_rows
from deep_sleep.run.apply import apply_diff, apply_shard, record_run
from deep_sleep.run.plan import Plan, ShardPlan, _with_scope, plan, plan_shard
from deep_sleep.store.db import Store
from deep_sleep.store.extract import extract as extract_scope
from deep_sleep.store.extract import extract_shard
from deep_sleep.transforms.config import ConsolidationConfig
from deep_sleep.validation import failed_scopes, validate_diff, validate_shard_diff

REPORTS_FILE = "reports.parquet"
QUARANTINE_FILE = "quarantine.parquet"
VALIDATION_FILE = "validation.parquet"


# -- values ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Extracted:
    """The extract stage's value: the shard (a single-scope run: a shard of one) and where it was written."""

    shard: Shard
    snapshot_dir: Path | None = None
    seconds: float = 0.0


@dataclass(frozen=True)
class Planned:
    """The transform stage's value: the shard's plan and each scope's report (with its run id and
    the run's file locations)."""

    extracted: Extracted
    plan: ShardPlan
    reports: dict[str, ConsolidationReport]
    diff_dir: Path | None = None
    single: Plan | None = None  # a shard of one: the scope's plan as :func:`plan` gave it

    def scope_diff(self, scope_path: str) -> Diff:
        if self.single is not None:
            return self.single.diff
        return self._diffs().get(scope_path, Diff.empty())

    def scope_snapshot(self, scope_path: str) -> Snapshot:
        if self.single is not None:
            return self.single.snapshot
        return self.plan.shard.scope(scope_path)

    def scope_quarantined(self, scope_path: str) -> pl.DataFrame:
        if self.single is not None:
            return self.single.quarantined
        q = self.plan.quarantined
        return q.filter(pl.col("scope_path") == scope_path).drop("scope_path") if q.height else q.drop("scope_path")

    def _diffs(self) -> dict[str, Diff]:
        cached = self.__dict__.get("_scope_diffs")
        if cached is None:
            cached = self.plan.diff.by_scope()
            object.__setattr__(self, "_scope_diffs", cached)
        return cached


@dataclass(frozen=True)
class Validated:
    """The validate stage's value: the failing checks (with ``scope_path``) and the reports, the
    scopes that failed marked ``failed`` with the checks named in ``errors``."""

    planned: Planned
    failures: pl.DataFrame
    reports: dict[str, ConsolidationReport]


@dataclass(frozen=True)
class Applied:
    """The apply stage's value: every scope's final report (applied, failed, with conflicts)."""

    validated: Validated
    reports: dict[str, ConsolidationReport]


# -- stages ------------------------------------------------------------------------------------
def extract(store: Store, scopes: list[Scope | str] | Scope | str, as_of: datetime, config: ConsolidationConfig,
            out: Path | None = None) -> Extracted:
    """Read the scopes consistently (one ``REPEATABLE READ`` transaction, each table once) and write
    the shard snapshot to ``out`` (if given)."""
    t0 = time.perf_counter()
    log_since = utc(as_of) - timedelta(hours=config.lookback_hours)
    many = [scopes] if isinstance(scopes, (Scope, str)) else list(scopes)
    if not many:
        raise InputError("extract: no scopes given")
    if len(many) == 1:
        shard = Shard.of(extract_scope(store, many[0], log_since=log_since))
    else:
        shard = extract_shard(store, many, log_since=log_since)
    if out is not None:
        shard.write(out)
        shard = replace(shard, source=Path(out))
    return Extracted(shard, Path(out) if out is not None else None, round(time.perf_counter() - t0, 6))


def transform(extracted: Extracted, config: ConsolidationConfig, as_of: datetime, out: Path | None = None, *,
              run_ids: dict[str, str] | None = None, phases: tuple[str, ...] | None = None,
              summarizer: Summarizer | None = None, timings: dict[str, float] | None = None,
              location: str | None = None) -> Planned:
    """Run the phases over the shard (:func:`~deep_sleep.run.plan.plan_shard`; a shard of one:
    :func:`~deep_sleep.run.plan.plan`), give each scope a run id, and write the diff directory to
    ``out`` (if given).  ``location``: where the run's directories are published (an object-store
    URL, :func:`publish`); the reports and the ledger then name ``<location>/snapshot`` and ``/diff``."""
    t0 = time.perf_counter()
    shard = extracted.shard
    as_of = utc(as_of)
    ids = {s: (run_ids or {}).get(s) or str(uuid.uuid4()) for s in shard.scope_paths}
    single = None
    if len(shard.scope_paths) == 1:
        s = shard.scope_paths[0]
        snap = shard.scope(s)
        if shard.source is not None:
            snap = replace(snap, source=shard.source)
        if out is not None:
            Path(out).mkdir(parents=True, exist_ok=True)
        single = plan(snap, config, as_of, phases, write_to=out, summarizer=summarizer)  # writes while hashing
        one = Shard.of(single.snapshot)
        planned = ShardPlan(one, _with_scope(single.diff, one), {s: single.report},
                            single.quarantined.with_columns(pl.lit(s).alias("scope_path")))
    else:
        planned = plan_shard(shard, config, as_of, phases, summarizer=summarizer)
    seconds = round(time.perf_counter() - t0, 6)
    snap_uri = str(extracted.snapshot_dir.resolve()) if extracted.snapshot_dir else None
    diff_uri = str(Path(out).resolve()) if out is not None else None
    if location is not None:
        snap_uri, diff_uri = files.join(location, "snapshot"), files.join(location, "diff")
    reports = {
        s: r.with_(run_id=ids[s], snapshot_uri=snap_uri, diff_uri=diff_uri,
                   timings={**(timings or {}), "extract": extracted.seconds, **r.timings, "transform": seconds})
        for s, r in planned.reports.items()
    }
    result = Planned(extracted, planned, reports, Path(out) if out is not None else None, single)
    if out is not None:
        _write_diff_dir(result, Path(out))
    return result


def validate(planned: Planned, config: ConsolidationConfig | None = None) -> Validated:
    """Check every scope's diff (SPEC §4); a failing check fails only the scopes whose rows fail it."""
    t0 = time.perf_counter()
    config = config or ConsolidationConfig()
    shard = planned.plan.shard
    if planned.single is not None:  # a shard of one: the scope's own checks
        failures = validate_diff(planned.single.diff, planned.single.snapshot, config)
        failures = failures.with_columns(pl.lit(shard.scope_paths[0]).alias("scope_path"))
        failing = set(shard.scope_paths) if failures.height else set()
    else:  # one pandera pass over the shard's diff; a failing check fails only its rows' scopes
        failures = validate_shard_diff(planned.plan.diff, shard, config)
        failing = set(failed_scopes(failures, shard))
    seconds = round(time.perf_counter() - t0, 6)
    reports = {}
    by_scope = ({k: v.drop("scope_path") for (k,), v in failures.partition_by("scope_path", as_dict=True).items()}
                if failures.height else {})
    for s, r in planned.reports.items():
        timings = {**r.timings, "validate": seconds}
        if s in failing:
            mine = by_scope.get(s)
            if mine is None:  # a failure no scope of the shard owns fails them all (failed_scopes)
                mine = failures.drop("scope_path")
            r = r.with_(status="failed", errors=r.errors + failure_messages(mine), validation=mine.head(200).to_dicts(),
                        timings=timings)
        else:
            r = r.with_(timings=timings)
        reports[s] = r
    result = Validated(planned, failures, reports)
    if planned.diff_dir is not None:
        if failures.height:
            body = failures.drop("scope_path") if planned.single is not None else failures
            body.write_parquet(planned.diff_dir / VALIDATION_FILE)
        _write_reports(planned.diff_dir, reports, single=planned.single is not None)
    return result


def gate(store: Store, validated: Validated, config: ConsolidationConfig) -> Validated:
    """The recall-quality gate (SPEC §9, :mod:`deep_sleep.run.gate`) of every scope that passed
    validation, for the whole shard at once: its figures go into the reports (``gate``), and
    :func:`apply` holds the destructive rows of a scope whose gate failed.  Node embeddings (which
    snapshots do not carry) are read from the store in one query."""
    from deep_sleep.run.gate import recall_gate, recall_gate_shard
    from deep_sleep.store.vectors import node_embeddings

    if not config.gate.enabled:
        return validated
    ok = [s for s, r in validated.reports.items() if r.status != "failed"]
    if not ok:
        return validated
    t0 = time.perf_counter()
    planned = validated.planned
    as_of = utc(next(iter(validated.reports.values())).as_of)
    embeddings = node_embeddings(store, ok)
    if planned.single is not None:
        results = {ok[0]: recall_gate(planned.single.snapshot, planned.single.diff, config, embeddings, now=as_of)}
    else:
        results = recall_gate_shard(planned.plan.shard, planned.plan.diff, config, embeddings, now=as_of)
    seconds = round(time.perf_counter() - t0, 6)
    reports = {s: (r.with_(gate=results[s].to_report(), timings={**r.timings, "gate": seconds})
                   if s in ok and s in results else r) for s, r in validated.reports.items()}
    if planned.diff_dir is not None:
        _write_reports(planned.diff_dir, reports, single=planned.single is not None)
    return Validated(planned, validated.failures, reports)


def apply(store: Store, validated: Validated, mode: str = "nightly", started_at: datetime | None = None,
          holds: HoldsConfig | None = None, gate_failed: Mapping[str, bool] | None = None) -> Applied:
    """Apply every scope that passed validation (atomically per scope: a scope that fails leaves the
    store as it was for that scope and the others apply), record each scope's run in the ledger.

    ``holds`` (the configuration's section; None: no holds — e.g. the quick nap, which keeps no files)
    and ``gate_failed`` (scope → the recall-quality gate failed) hold rows for approval
    (:func:`deep_sleep.run.holds.hold`; a shard of many: :func:`deep_sleep.run.holds.split_holds_shard`
    once for the whole shard): written under the diff directory's ``held/`` (a shard's: one set of
    files, every row with ``scope_path``), in the report and the ledger; the rest applies."""
    started_at = started_at or datetime.now(UTC)
    planned = validated.planned
    if gate_failed is None:  # the gate stage's verdicts, kept in the reports
        gate_failed = {s: bool(r.gate.get("failed")) for s, r in validated.reports.items() if r.gate}
    reports = {}
    todo = dict(validated.reports)
    if planned.single is None and len(todo) > 1:
        # Many scopes: one split of the whole shard's diff (split_holds_shard: every scope's split as
        # split_holds of that scope alone), its held rows written once under held/; then every scope's
        # part to apply goes through one set-based apply per batch of scopes (apply_shard: atomic per
        # scope, a failed batch retried scope by scope).
        diff = planned.plan.diff
        if holds is not None:
            diff, todo = _hold_shard(planned, todo, holds, gate_failed or {})
        reports.update(_apply_many(store, planned, todo, mode, started_at, diff=diff))
        held_rows.record_holds_many(store, {r.run_id: r.held for r in reports.values()
                                            if r.held and r.status == "applied"})
        if planned.diff_dir is not None:
            _write_reports(planned.diff_dir, reports, single=False)
        return Applied(validated, reports)
    for s, report in todo.items():
        if report.status == "failed":
            record_run(store, report, mode, started_at, "failed")
            reports[s] = report
            continue
        t0 = time.perf_counter()
        diff = planned.scope_diff(s)
        gate = bool((gate_failed or {}).get(s))
        if holds is not None and (holds.enabled or gate) and diff.has_changes:
            if planned.diff_dir is None:
                raise InputError("holds keep the held rows beside the diff: run the pipeline with a diff directory, "
                                 "or without a holds policy")
            out = held_rows.held_dir(planned.diff_dir, s, shard=planned.single is None)
            diff, report = held_rows.hold(diff, planned.scope_snapshot(s), report, holds, out, gate)
        try:
            result = apply_diff(store, diff, report, mode=mode, started_at=started_at,
                                quarantined=planned.scope_quarantined(s))
            if report.held:
                held_rows.record_holds(store, report.run_id, report.held)
        except Exception as exc:
            if len(validated.reports) == 1:
                raise
            failed = report.with_(status="failed", errors=report.errors + [f"apply failed: {type(exc).__name__}: {exc}"])
            record_run(store, failed, mode, started_at, "failed")
            reports[s] = failed
            continue
        reports[s] = report.with_(
            status="applied", rows_changed=result.applied, conflicts=result.conflicts,
            timings={**report.timings, "apply": round(time.perf_counter() - t0, 6),
                     **{f"apply.{part}": v for part, v in (result.seconds or {}).items()}},
        )
    if planned.diff_dir is not None:
        _write_reports(planned.diff_dir, reports, single=planned.single is not None)
    return Applied(validated, reports)


def _hold_shard(planned: Planned, reports: dict[str, ConsolidationReport], policy: HoldsConfig,
                gate_failed: Mapping[str, bool]) -> tuple[Diff, dict[str, ConsolidationReport]]:
    """The shard's diff to apply and the reports, the scopes that hold rows with ``held`` set
    (``status: pending``): :func:`~deep_sleep.run.holds.split_holds_shard` of the scopes that passed
    validation (a failed scope holds nothing; its rows are not applied anyway), the held rows written
    to ``<diff_dir>/held/`` (a stale one — a re-run of the apply on the same files — is replaced)."""
    ok = [s for s, r in reports.items() if r.status != "failed"]
    splitting = policy.enabled or any(gate_failed.get(s) for s in ok)
    out = planned.diff_dir / held_rows.HELD_DIR if planned.diff_dir is not None else None
    if out is not None and out.exists():
        shutil.rmtree(out)
    if not splitting or not planned.plan.diff.has_changes:
        return planned.plan.diff, reports
    if out is None:
        raise InputError("holds keep the held rows beside the diff: run the pipeline with a diff directory, "
                         "or without a holds policy")
    t0 = time.perf_counter()
    split = held_rows.split_holds_shard(planned.plan.diff, planned.plan.shard, policy, gate_failed, scopes=ok)
    seconds = round(time.perf_counter() - t0, 6)
    if not split.held.has_changes:
        return planned.plan.diff, reports
    split.write(out)
    summaries = split.summaries()
    reports = {s: r.with_(held={**summaries[s], "status": "pending"}, timings={**r.timings, "holds": seconds})
               if s in summaries else r for s, r in reports.items()}
    return split.apply, reports


def _apply_many(store: Store, planned: Planned, reports: dict[str, ConsolidationReport], mode: str,
                started_at: datetime, diff: Diff | None = None) -> dict[str, ConsolidationReport]:
    """:func:`~deep_sleep.run.apply.apply_shard` of ``reports``' scopes of the shard's diff (or of
    ``diff``, a shard diff of the same scopes: e.g. what their holds left to apply)."""
    t0 = time.perf_counter()
    diff = planned.plan.diff if diff is None else diff
    if len(reports) < len(planned.plan.shard.scope_paths):
        wanted = pl.Series(sorted(reports), dtype=pl.String).implode()
        diff = Diff({name: TableDiff(**{k: f.filter(pl.col("scope_path").is_in(wanted)) if f.height else f
                                        for k, f in td.frames().items()})
                     for name, td in diff.tables.items()})
    q = planned.plan.quarantined
    q = q.filter(pl.col("scope_path").is_in(pl.Series(sorted(reports), dtype=pl.String).implode())) if q.height else None
    results = apply_shard(store, diff, reports, mode=mode, started_at=started_at, quarantined=q if q is not None and q.height else None)
    seconds = round(time.perf_counter() - t0, 6)
    out = {}
    for s, report in reports.items():
        r = results[s]
        if report.status == "failed":
            out[s] = report
        elif r.status == "failed":
            out[s] = report.with_(status="failed", errors=report.errors + [f"apply failed: {r.error}"])
        else:
            out[s] = report.with_(status="applied", rows_changed=r.applied, conflicts=r.conflicts,
                                  timings={**report.timings, "apply": seconds})
    return out


def run(store: Store, scopes: list[Scope | str] | Scope | str, config: ConsolidationConfig | None = None,
        as_of: datetime | None = None, base: Path | None = None, *, mode: str = "nightly",
        phases: tuple[str, ...] | None = None, summarizer: Summarizer | None = None,
        apply_changes: bool = True) -> Applied | Validated:
    """The whole pipeline over ``scopes`` (files under ``base`` when given); stops before the apply
    (returns the :class:`Validated`) with ``apply_changes=False`` — ``deep-sleep plan``."""
    config = config or ConsolidationConfig()
    started = datetime.now(UTC)
    as_of = utc(as_of or started)
    extracted = extract(store, scopes, as_of, config, None if base is None else base / "snapshot")
    planned = transform(extracted, config, as_of, None if base is None else base / "diff", phases=phases,
                        summarizer=summarizer)
    validated = gate(store, validate(planned, config), config)
    if not apply_changes:
        return validated
    return apply(store, validated, mode=mode, started_at=started, holds=config.holds if base is not None else None)


def publish(planned: Planned, location: str) -> None:
    """Copy the run's snapshot and diff directories to ``location`` (``s3://…``, ``gs://…``,
    ``file://…``): workers on other machines share no disk.  Called before the apply (the ledger
    names these files) and after it (the reports it rewrote)."""
    if planned.extracted.snapshot_dir is not None:
        files.publish_dir(planned.extracted.snapshot_dir, files.join(location, "snapshot"))
    if planned.diff_dir is not None:
        files.publish_dir(planned.diff_dir, files.join(location, "diff"))


def plan_only(shard: Shard, config: ConsolidationConfig, as_of: datetime, out: Path | None = None, *,
              phases: tuple[str, ...] | None = None) -> Validated:
    """Replay: transform and validate a stored shard or snapshot, without the apply executor."""
    extracted = Extracted(shard, shard.source)
    return validate(transform(extracted, config, as_of, out, phases=phases), config)


# -- files -------------------------------------------------------------------------------------
def _failure_schema() -> dict:
    from deep_sleep.validation.diff_checks import FAILURE_SCHEMA

    return dict(FAILURE_SCHEMA)


def failure_messages(failures: pl.DataFrame) -> list[str]:
    """One line per (check, table, kind, phase) of a scope's failing checks, with example ids."""
    summary = (failures.group_by("check", "table", "kind", "phase")
               .agg(pl.len().alias("rows"), pl.col("id").head(5).alias("example_ids")).sort("table", "kind", "check"))
    return [f"validation failed: {r['check']} — {r['table']}.{r['kind']} from phase {r['phase']}: {r['rows']} row(s), "
            f"e.g. {', '.join(x for x in r['example_ids'] if x)}" for r in summary.iter_rows(named=True)]


def _write_diff_dir(planned: Planned, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    if planned.single is not None:  # the single-scope directory: plan() wrote the diff
        if planned.single.quarantined.height:
            planned.single.quarantined.write_parquet(out / QUARANTINE_FILE)
        _write_reports(out, planned.reports, single=True)
        return
    for kind in KINDS:
        for stale in out.glob(f"*.{kind}.parquet"):
            stale.unlink()
    for name, td in planned.plan.diff.tables.items():
        for kind, frame in td.frames().items():
            if frame.height:
                frame.sort("scope_path", maintain_order=True).write_parquet(out / f"{name}.{kind}.parquet",
                                                                            **tables.PARQUET_OPTIONS)
    if planned.plan.quarantined.height:
        planned.plan.quarantined.write_parquet(out / QUARANTINE_FILE)
    _write_reports(out, planned.reports, single=False)


def _write_reports(out: Path, reports: dict[str, ConsolidationReport], single: bool) -> None:
    if single:
        (report,) = reports.values()
        report.write(out)
        return
    rows = [{"scope_path": s, "run_id": r.run_id, "status": r.status, "diff_hash": r.diff_hash,
             "report": json.dumps(r.to_dict(), sort_keys=True)} for s, r in sorted(reports.items())]
    frame = pl.DataFrame(rows, schema={"scope_path": pl.String, "run_id": pl.String, "status": pl.String,
                                       "diff_hash": pl.String, "report": pl.String})
    tmp = out / f".{REPORTS_FILE}.tmp"
    frame.write_parquet(tmp)
    tmp.replace(out / REPORTS_FILE)


def is_shard_diff(directory: str | Path) -> bool:
    return (files.fetch_dir(directory) / REPORTS_FILE).is_file()


def read_scope_report(directory: str | Path, scope_path: str | None = None) -> ConsolidationReport:
    """One scope's report out of a diff directory (a shard's: ``scope_path`` is required; a URL is
    fetched first, :func:`deep_sleep.core.files.fetch_dir`)."""
    src = files.fetch_dir(directory)
    if not is_shard_diff(src):
        return ConsolidationReport.read(src)
    if scope_path is None:
        raise InputError(f"{src} holds the diffs of many scopes; name one (--scope)")
    rows = pl.scan_parquet(src / REPORTS_FILE).filter(pl.col("scope_path") == scope_path).collect()
    if not rows.height:
        raise SnapshotError(f"{src}: no report of scope {Scope.parse(scope_path)} in {REPORTS_FILE}")
    return ConsolidationReport.from_dict(json.loads(rows.item(0, "report")))


def read_scope_diff(directory: str | Path, scope_path: str | None = None) -> Diff:
    """One scope's diff out of a diff directory (a shard's: its rows alone, as a run of that scope
    alone wrote them; a single-scope directory: the diff; a URL is fetched first)."""
    src = files.fetch_dir(directory)
    if not is_shard_diff(src):
        return Diff.read(src)
    if scope_path is None:
        raise InputError(f"{src} holds the diffs of many scopes; name one (--scope)")
    shard = Diff.read(src, where=pl.col("scope_path") == scope_path)
    return shard.by_scope((scope_path,)).get(scope_path, Diff.empty())


def read_scope_snapshot(directory: str | Path, scope_path: str | None = None) -> Snapshot:
    """One scope's snapshot out of a snapshot directory (a shard's or a single scope's; a URL is fetched first)."""
    directory = files.fetch_dir(directory)
    shard = Shard.read(directory)
    if scope_path is None:
        if len(shard.scope_paths) != 1:
            raise InputError(f"{directory} holds {len(shard.scope_paths)} scopes; name one (--scope)")
        scope_path = shard.scope_paths[0]
    return replace(shard.scope(scope_path), source=Path(directory))


__all__ = ["Extracted", "Planned", "Validated", "Applied", "extract", "transform", "validate", "apply", "run",
           "plan_only", "publish", "read_scope_diff", "read_scope_report", "read_scope_snapshot", "is_shard_diff",
           "failure_messages"]
