"""``deep_sleep_nightly``: every due scope of the fleet, with bounded concurrency and isolated failures.

0. The store's night lock (:func:`deep_sleep.run.slots.night_lock`), held to the end: a second night
   on the store refuses at once, naming this one (a plan takes none).
1. Gate (one set-based query): which scopes are due (SPEC §3); the rest are reported as skipped
   with the reason.
2. The due scopes are grouped into *shards* (at most ``shard_rows`` rows and ``shard_scopes``
   scopes each, in scope order) and each shard is ONE task, ``consolidate-shard``: extract (one
   ``REPEATABLE READ`` transaction for the shard) → transform (every phase once over all its scopes)
   → validate → apply (atomic per scope; it holds one of the night's ``apply_concurrency`` apply
   slots, and the task carries the ``deep-sleep-apply`` tag), passing the stage values in memory
   (:mod:`deep_sleep.run.pipeline`) and writing the shard's snapshot and diff directories.  A
   100k-scope night is tens to a few hundred task runs.  Only small per-scope rows cross the task
   boundary.  Transient database errors before the apply retry the shard; a scope that fails
   validation or its apply fails alone.  With ``plan``, the shards stop before the apply: each
   writes every record of its diff (and which rows its apply would hold) to ``<diff>/preview.parquet``,
   and the night's plan — the fleet's counts, then the records of the scopes with the most changes,
   by the renderer of ``deep-sleep plan`` — is the result and a Markdown artifact.
3. The data-quality suite over the whole store, once for the night — after a night that applied at
   least one scope.  A night that applied nothing (no scope due, every due scope failed, or a plan)
   changed no memory row, and SPEC §4 checks the store *after apply*, keeping the results with the
   night's runs; so the suite does not run then.  Live writes keep changing the store between
   nights, but the suite checks whole tables: what a live write broke is found by the next night that
   applies (and each scope's extract quarantines such rows before they reach a diff).  Those nights
   do not pay great-expectations (its import alone takes seconds; benchmarks/README.md).
4. Run health and retention, the summary (:mod:`deep_sleep.jobs.night` builds it, the same as for a
   night with no due scope that ``deep-sleep nightly`` runs without Prefect), and a summary table
   artifact.

Concurrency comes from the shards' task runner, which the flow run builds from its parameters
(:func:`shard_runner`; so a deployment's run honours them as ``deep-sleep nightly`` does): threads
(``max_workers`` bounded), ``max_workers`` worker processes (``task_runner="processes"``: Prefect's
``ProcessPoolTaskRunner``; shards do not share a GIL, for large nights), or a Dask cluster
(``task_runner="dask"``, ``dask_address`` or a local cluster).  The default, ``"auto"``, takes
processes for a night of :data:`AUTO_PROCESSES_ROWS` due rows or more in two or more shards, else
threads (:func:`runner_kind`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from deep_sleep.transforms.config import ConsolidationConfig, load_config
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import as_completed
from prefect.states import Failed
from prefect.task_runners import ProcessPoolTaskRunner, TaskRunner, ThreadPoolTaskRunner

from deep_sleep.core import files
from deep_sleep.core.errors import DeepSleepError
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.scope import Scope
from deep_sleep.core.snapshot import utc
from deep_sleep.jobs.gating import shards_of
from deep_sleep.jobs.health import Alert, health_markdown
from deep_sleep.jobs.night import (  # noqa: F401 - NightlyParameters and gate_distribution: re-exported
    NightlyParameters,
    considered_scopes,
    gate_distribution,
    health_alerts,
    night_rows,
    night_dir,
    night_summary,
    write_scope_table,
    retention,
    status_counts,
)
from deep_sleep.run import pipeline
from deep_sleep.run.slots import APPLY_SLOT_CLASS, ApplyInSlot, apply_slot, in_slots, night_lock, night_name, slot_holders  # noqa: F401 - re-exported
from deep_sleep.run.preview import Preview, PreviewDigest, night_plan_markdown
from deep_sleep.store.db import Store, connect_store
from deep_sleep.store.errors import is_transient

APPLY_TAG = "deep-sleep-apply"


def _retry_transient(task, task_run, state) -> bool:
    """Prefect's retry condition: retry a task only when its error is transient, by
    :func:`deep_sleep.store.errors.is_transient` (psycopg error class / SQLSTATE, never message text)."""
    try:
        state.result()
    except BaseException as exc:  # noqa: BLE001 - we are classifying it
        return is_transient(exc)
    return False


def _row(report: ConsolidationReport, worker_pid: int) -> dict:
    """The summary row of one scope's run (small: this is what crosses the task boundary)."""
    return {
        "scope_path": report.scope_path, "status": report.status, "errors": report.errors[:5],
        "counters": {k: v for k, v in report.counters.items() if v},
        "changes": sum(sum(k.values()) for k in report.rows_changed.values()),
        "conflicts": report.conflicts,
        "quarantined": sum(n for reasons in report.quarantined.values() for n in reasons.values()),
        "run_id": report.run_id, "worker_pid": worker_pid, "diff_uri": report.diff_uri, "diff_hash": report.diff_hash,
        "gate": report.gate or None,
        "held": sum(sum(k.values()) for k in (report.held or {}).get("rows", {}).values()) if report.held else 0,
        "held_reasons": dict((report.held or {}).get("reasons", {})),
        # the shard's stages (every scope of a shard shares them): the console's slowest shards
        "seconds": round(sum(report.timings.get(s, 0.0) for s in _STAGES), 3),
    }


_STAGES = ("extract", "transform", "gate", "hold", "validate", "publish", "apply")


def night_stages(apply_concurrency: int) -> tuple:
    """The nightly's stages: :data:`~deep_sleep.run.pipeline.NIGHT` with the apply in a slot."""
    return in_slots(pipeline.NIGHT, apply_concurrency)


def _run_shard(dsn: str, scopes: list[str], as_of: datetime, config: ConsolidationConfig, runs_dir: str | None,
               started_at: datetime, stages: tuple) -> pipeline.State:
    # force: the gating chose these scopes (each holds rows) and the night's as_of was checked where it started
    return pipeline.consolidate(Store(dsn), scopes, as_of, config, runs_dir=runs_dir, stages=stages, started_at=started_at,
                                force=True)


@task(name="consolidate-shard", retries=2, retry_delay_seconds=2,
      retry_condition_fn=_retry_transient, cache_policy=NO_CACHE)
def shard_task(dsn: str, scopes: list[str], as_of: datetime, config: ConsolidationConfig, runs_dir: str | None,
               started_at: datetime, apply_concurrency: int) -> list[dict]:
    """One shard's night (:func:`night_stages`); one summary row per scope.  The apply holds one of the
    night's ``apply_concurrency`` apply slots.  An error before the apply (nothing written yet) fails
    the task, and a transient one retries it; per-scope failures after that are in the rows."""
    state = _run_shard(dsn, scopes, as_of, config, runs_dir, started_at, night_stages(apply_concurrency))
    return [_row(r, os.getpid()) for r in state.reports.values()]


@task(name="plan-shard", retries=2, retry_delay_seconds=2, retry_condition_fn=_retry_transient, cache_policy=NO_CACHE)
def plan_shard_task(dsn: str, scopes: list[str], as_of: datetime, config: ConsolidationConfig, runs_dir: str | None,
                    started_at: datetime, plan_scopes: int = 20, plan_per_phase: int = 5) -> dict:
    """One shard's plan (``nightly --plan``: :data:`~deep_sleep.run.pipeline.PLAN`, the night without its
    apply): every record of the shard's diff, and the rows the apply would hold, go to
    ``<diff>/preview.parquet`` (:func:`deep_sleep.run.preview.plan_preview`), and the result is
    ``{"rows": …, "digest": …}`` — the rows with each scope's ``records`` and ``held`` counts, and the
    bounded :class:`~deep_sleep.run.preview.PreviewDigest` (``plan_scopes`` scopes, ``plan_per_phase``
    records per phase) that the night's plan renders."""
    state = _run_shard(dsn, scopes, as_of, config, runs_dir, started_at, (*pipeline.PLAN, Preview(), pipeline.Publish()))
    found = state.preview
    counts = found.per_scope()
    rows = [{**_row(r.with_(status="planned" if r.status != "failed" else "failed"), os.getpid()),
             "records": counts.get(s, (0, 0))[0], "held": counts.get(s, (0, 0))[1]}
            for s, r in state.reports.items()]
    return {"rows": rows, "digest": found.digest(set(state.ok), plan_scopes, plan_per_phase)}


def _prewarm_data_quality() -> None:
    """Import great-expectations (~5 s here, more under load) in a daemon thread while the shards run,
    so the suite after them starts at once: the main process only waits on the shards then.  A
    failure is left for the suite itself to raise."""
    import threading

    def load() -> None:
        try:
            from deep_sleep.validation.store_suite import _import_gx

            _import_gx()
        except Exception:  # noqa: BLE001 - the data-quality task imports it again and reports the error
            pass

    threading.Thread(target=load, name="deep-sleep-prewarm-gx", daemon=True).start()


@task(name="data-quality", cache_policy=NO_CACHE)
def data_quality_task(dsn: str, out_dir: str, night_id: str) -> dict:
    """The data-quality suite over the store, its results under ``out_dir`` (a local path, or an
    object-store URL: written to a local temp dir, published there, and the paths kept are the URLs)."""
    from deep_sleep.validation.store_suite import run_store_suite

    remote = files.is_remote(out_dir)
    local = Path(tempfile.mkdtemp(prefix="deep-sleep-quality-")) if remote else Path(out_dir)
    try:
        result = run_store_suite(dsn, local, run_id=night_id)
        json_path, docs_path = result.json_path, result.data_docs_path
        if remote:
            files.publish_dir(local, out_dir)
            json_path, docs_path = (files.published_name(p, local, out_dir) for p in (json_path, docs_path))
    finally:
        if remote:
            shutil.rmtree(local, ignore_errors=True)
    with Store(dsn).pg() as con:
        con.execute(
            "INSERT INTO data_quality_runs (id, nightly_run_id, success, failures, results_path, data_docs_path)"
            " VALUES (%s, %s, %s, %s::jsonb, %s, %s)",
            (str(uuid.uuid4()), night_id, result.success,
             json.dumps([r for r in result.results if not r["success"]], default=str), json_path, docs_path),
        )
    return {"success": result.success, "results_path": json_path, "data_docs_path": docs_path,
            "failed_checks": sorted({r["expectation"] for r in result.results if not r["success"]})}




def ensure_apply_limit(limit: int) -> None:
    """Create (or resize) the Prefect tag concurrency limit ``deep-sleep-apply``."""
    from prefect.client.orchestration import get_client

    with get_client(sync_client=True) as client:
        client.create_concurrency_limit(tag=APPLY_TAG, concurrency_limit=limit)


def _progress_line(shards_done: int, shards: int, scopes_done: int, due: int, results: dict, clock: float) -> None:
    """One stderr line per finished shard: shards and scopes done, rows changed so far, elapsed."""
    import sys

    rows = sum(r["changes"] for r in results.values())
    # Written, not printed: the flow's log_prints would turn a print into a log record.
    sys.stderr.write(f"deep-sleep nightly: {shards_done}/{shards} shards, {scopes_done}/{due} scopes done, "
                     f"{rows:,} rows changed, {time.perf_counter() - clock:.1f} s\n")
    sys.stderr.flush()


ARTIFACT_ROWS = 1_000  # the summary table artifact lists failures first, then up to this many rows


def _artifact_rows(rows: list[dict]) -> list[dict]:
    keys = ("scope", "status", "reason", "changes", "conflicts", "counters")
    ordered = sorted(rows, key=lambda r: r["status"] != "failed")[:ARTIFACT_ROWS]
    return [{k: r.get(k, "") for k in keys} for r in ordered]


def _night_plan(as_of: datetime, night_id: str, gates: list, due: list, rows: list[dict], results: dict[str, dict],
                failed_shard: dict[str, str], digests: list[PreviewDigest], params: NightlyParameters) -> dict:
    """``nightly --plan``: what the night would change — the fleet's summary, then the records of the
    scopes with the most changes (:func:`deep_sleep.run.preview.night_plan_markdown`, the renderer of
    ``deep-sleep plan``) — as a ``deep-sleep-night-plan`` Markdown artifact and in the summary
    (``markdown``, which the CLI prints)."""
    scopes = []
    for g in due:
        r = results.get(g.scope_path)
        if r is None:
            scopes.append({"scope_path": g.scope_path, "status": "failed", "records": 0, "held": 0, "diff_uri": None,
                           "reason": failed_shard.get(g.scope_path, "")})
            continue
        scopes.append({"scope_path": g.scope_path, "status": r["status"], "records": r.get("records", 0),
                       "held": r.get("held", 0), "diff_uri": r["diff_uri"], "reason": "; ".join(r["errors"])})
    markdown = night_plan_markdown(f"Deep Sleep night plan {as_of.isoformat()}", scopes, PreviewDigest.merge(digests),
                                   considered=len(gates), skipped=len(gates) - len(due), max_scopes=params.plan_scopes,
                                   per_phase=params.plan_per_phase)
    create_markdown_artifact(key="deep-sleep-night-plan", markdown=markdown,
                             description=f"Deep Sleep night plan {as_of.isoformat()}: {len(due)} due scopes, nothing applied")
    planned = sum(r["status"] == "planned" for r in rows)
    failed = sum(r["status"] == "failed" for r in rows)
    return {"night_id": night_id, "as_of": as_of.isoformat(), "scopes": len(gates), "due": len(due), "planned": planned,
            "failed": failed, "skipped": len(gates) - len(due),
            "records": sum(s["records"] for s in scopes if s["status"] == "planned"),
            "held_rows": sum(s["held"] for s in scopes if s["status"] == "planned"), "markdown": markdown, "rows": rows}


#: ``task_runner="auto"`` runs the shards in worker processes from this many due rows (nodes + edges +
#: events) on: four full default shards.  Workers cost seconds to start (each imports the pipeline) and
#: pay off only once two shards would otherwise share a GIL for long: two shards came out even, four
#: and more clearly faster in processes (benchmarks/README.md).  Tests and the demo stay in one process.
AUTO_PROCESSES_ROWS = 2_000_000


def runner_kind(params: NightlyParameters, shards: int, rows: int) -> str:
    """The shards' runner for a night of ``shards`` shards and ``rows`` due rows: ``params.task_runner``,
    or for ``"auto"`` ``"processes"`` when at least two shards can run at once (``max_workers`` >= 2,
    two or more shards) and the night has :data:`AUTO_PROCESSES_ROWS` rows or more, else ``"threads"``."""
    if params.task_runner != "auto":
        return params.task_runner
    parallel = params.max_workers >= 2 and shards >= 2
    return "processes" if parallel and rows >= AUTO_PROCESSES_ROWS else "threads"


def shard_runner(params: NightlyParameters, kind: str) -> TaskRunner:
    """The task runner the night's shards run on, built from ``params`` (``task_runner``, ``max_workers``,
    ``dask_*``) inside the flow run — not the flow's own runner, so a deployment's flow run (which runs
    :func:`deep_sleep_nightly` with its decorator's runner) honours them exactly as ``deep-sleep nightly`` does.
    ``kind``: the runner :func:`runner_kind` chose for the night."""
    if kind == "dask":
        from prefect_dask import DaskTaskRunner

        if params.dask_address:
            return DaskTaskRunner(address=params.dask_address)
        return DaskTaskRunner(cluster_kwargs={"n_workers": params.dask_workers, "threads_per_worker": 1,
                                              "processes": True, "dashboard_address": None})
    if kind == "processes":
        return ProcessPoolTaskRunner(max_workers=params.max_workers, initializer=_import_worker)
    return ThreadPoolTaskRunner(max_workers=params.max_workers)


def _error_of(future) -> str:
    try:
        future.result()
    except BaseException as exc:  # noqa: BLE001 - reported, not raised: one scope never stops the night
        return f"{type(exc).__name__}: {exc}"
    return ""


# The flow's own runner runs nothing: the shards go to shard_runner(params, kind), built inside the run.
@flow(name="deep_sleep_nightly", log_prints=True, task_runner=ThreadPoolTaskRunner(max_workers=1))
def deep_sleep_nightly(params: NightlyParameters) -> dict[str, Any]:
    """Consolidate every due scope; returns the night's summary (counts and one row per scope).

    The night holds the store's night lock from its gate to its summary (:func:`~deep_sleep.run.slots.night_lock`):
    a second night on the store refuses at once, naming this one (a plan applies nothing and takes no lock)."""
    store = connect_store(params.dsn)
    night_id = str(uuid.uuid4())
    with contextlib.nullcontext() if params.plan else night_lock(store.dsn, night_name(night_id)):
        return _night(params, store, night_id)


def _night(params: NightlyParameters, store: Store, night_id: str) -> dict[str, Any]:
    logger = get_run_logger()
    started = datetime.now(UTC)
    as_of = utc(params.as_of or started)
    config = load_config(params.config_file, params.config)
    if params.prefect_apply_limit:
        ensure_apply_limit(params.apply_concurrency)

    gates = considered_scopes(store, as_of, config.gating, params.scopes)
    due = [g for g in gates if g.due]
    logger.info("%d scopes, %d due, %d skipped", len(gates), len(due), len(gates) - len(due))

    shards = shards_of([(g.scope_path, g.rows) for g in due], params.shard_rows, params.shard_scopes)
    kind = runner_kind(params, len(shards), sum(g.rows for g in due))
    logger.info("%d due scopes in %d shard(s), on %s%s", len(due), len(shards), kind,
                " (auto)" if params.task_runner == "auto" else "")
    results: dict[str, dict] = {}
    failed_shard: dict[str, str] = {}
    digests: list[PreviewDigest] = []  # with plan: each shard's bounded preview
    clock = time.perf_counter()
    with shard_runner(params, kind) if shards else contextlib.nullcontext() as runner:
        common = {"dsn": store.dsn, "as_of": as_of, "config": config, "runs_dir": params.runs_dir, "started_at": started}
        if params.plan:
            futures = [runner.submit(plan_shard_task, parameters={**common, "scopes": scopes, "plan_scopes": params.plan_scopes,
                                                                  "plan_per_phase": params.plan_per_phase}) for scopes in shards]
        else:
            shard = shard_task.with_options(tags=[APPLY_TAG]) if params.prefect_apply_limit else shard_task
            futures = [runner.submit(shard, parameters={**common, "scopes": scopes,
                                                             "apply_concurrency": params.apply_concurrency})
                       for scopes in shards]
        index = {fut.task_run_id: i for i, fut in enumerate(futures)}
        if futures and params.data_quality and not params.plan:
            _prewarm_data_quality()
        for done, fut in enumerate(as_completed(futures), 1):
            scopes = shards[index[fut.task_run_id]]
            error = _error_of(fut)
            if error:
                failed_shard.update(dict.fromkeys(scopes, error))
            else:
                out = fut.result()
                if params.plan:  # the rows and the shard's preview digest
                    digests.append(out["digest"])
                    out = out["rows"]
                results.update({r["scope_path"]: {**r, "shard": index[fut.task_run_id]} for r in out})
            if params.progress:
                _progress_line(done, len(shards), len(results) + len(failed_shard), len(due), results, clock)

    rows = night_rows(gates, results, failed_shard, params.plan)
    if params.plan:
        return _night_plan(as_of, night_id, gates, due, rows, results, failed_shard, digests, params)

    counts = status_counts(rows)
    seconds = {"shards": time.perf_counter() - clock}
    quality = None
    if params.data_quality and counts["applied"]:  # not after a night that applied nothing: see the docstring
        out = files.join(night_dir(params.runs_dir, as_of, night_id), "data_quality")
        clock = time.perf_counter()
        quality = data_quality_task(store.dsn, out, night_id)
        seconds["data_quality"] = time.perf_counter() - clock

    # Alerts about the scopes this night considered (all of the store's, or the listed ones).
    clock = time.perf_counter()
    alerts = health_task(store.dsn, as_of, config, [g.scope_path for g in gates]) if config.health.enabled else []
    seconds["health"] = time.perf_counter() - clock
    clock = time.perf_counter()
    removed = retention_task(store.dsn, params.runs_dir, config) if config.retention.keep_days is not None else None
    seconds["retention"] = time.perf_counter() - clock

    summary = night_summary(night_id=night_id, as_of=as_of, gates=gates, shards=len(shards), task_runner=kind,
                            rows=rows, results=results, quality=quality, alerts=alerts, removed=removed,
                            seconds=seconds)
    write_scope_table(summary, params.runs_dir)
    create_table_artifact(
        key="deep-sleep-nightly",
        table=_artifact_rows(rows),
        description=(f"Deep Sleep night {as_of.isoformat()}: {len(due)} due, {counts['applied']} applied, "
                     f"{counts['failed']} failed, {counts['skipped']} skipped"
                     + (f"; data quality {'passed' if quality['success'] else 'FAILED'}: {quality['data_docs_path']}" if quality else "")),
    )
    if alerts:
        create_markdown_artifact(key="deep-sleep-health", markdown=health_markdown([Alert(**a) for a in alerts]),
                                 description=f"Deep Sleep run health {as_of.isoformat()}: {len(alerts)} alert(s)")
    for r in rows:
        if r["status"] == "failed":
            logger.warning("scope %s failed: %s", r["scope"], r["reason"])
    for a in alerts:
        logger.warning("health alert %s for %s: %s", a["check"], Scope.parse(a["scope_path"]).display(), a["message"])
    if alerts and config.health.fail_nightly:  # the flow run ends Failed; the summary stays its result
        message = f"{len(alerts)} run-health alert(s); see the deep-sleep-health artifact"
        return Failed(message=message, data=NightFailedHealth(message, summary))
    return summary


@task(name="run-health", cache_policy=NO_CACHE)
def health_task(dsn: str, as_of: datetime, config: ConsolidationConfig, scopes: list[str]) -> list[dict[str, str]]:
    """The run-health alerts of ``scopes`` after the night (set-based, once per night;
    :func:`deep_sleep.jobs.night.health_alerts`)."""
    return health_alerts(dsn, as_of, config, scopes)


class NightFailedHealth(DeepSleepError):
    """The night ran, and run-health alerts fired (``health.fail_nightly``): the flow run ends Failed
    with this as its result; ``summary`` is the night's summary, alerts included."""

    def __init__(self, message: str, summary: dict[str, Any]):
        super().__init__(message)
        self.summary = summary


@task(name="retention", cache_policy=NO_CACHE)
def retention_task(dsn: str, runs_dir: str | None, config: ConsolidationConfig) -> dict[str, int]:
    """Old run directories and archive rows removed (``retention.keep_days``; :func:`deep_sleep.jobs.night.retention`)."""
    return retention(dsn, runs_dir, config)


def _import_worker() -> None:
    """A worker process of ``task_runner="processes"``: import the pipeline once, when it starts."""
    import deep_sleep.run.pipeline  # noqa: F401


def run_nightly(params: NightlyParameters) -> dict[str, Any]:
    """Run the nightly flow in this process; the night's summary.

    A night whose run-health alerts fail it (``health.fail_nightly``) ends in a Failed flow run and
    still returns its summary (``summary["health"]`` lists the alerts); any other failure raises."""
    state = deep_sleep_nightly(params, return_state=True)
    result = state.result(raise_on_failure=False)
    if isinstance(result, NightFailedHealth):
        return result.summary
    if isinstance(result, BaseException):
        raise result
    return result
