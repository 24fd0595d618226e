"""A night's bookkeeping that needs no orchestrator, and the night in which no scope is due.

The nightly flow (:mod:`deep_sleep.flows.nightly`) gates the fleet, consolidates the due scopes in
shards, then runs the data-quality suite, the run-health alerts and retention, and summarises.  All
of it but the shards and the suite is plain Python over the store and lives here — the night's
parameters, which scopes it considers, its summary rows and dict, health, retention — so that the
flow and :func:`quiet_night` build the very same summary.

**A night with no due scope** (an hourly schedule has one due night a day per scope and 23 in which
every scope is gated) changes nothing in the store.  What it owes the operator is the report (every
scope skipped, with its reason), the run-health alerts (they can fire on a night that consolidated
nothing, e.g. ``gated_too_long``) and retention.  :func:`quiet_night` does exactly that in the
calling process, without Prefect; ``deep-sleep nightly`` takes it when no scope is due and no
standing Prefect server is configured (:mod:`deep_sleep.cli.night`).  Without a standing server
the flow would first start Prefect's temporary one — most of such a night's time — only to record a
flow run in a local SQLite database that no server shows; with a standing server
(``PREFECT_API_URL``) the flow still runs, so every night is on its UI.  Importing nothing of
Prefect, the pipeline or great-expectations, such a night takes well under a second (measured in
benchmarks/README.md, "a night's floor").
"""

from __future__ import annotations

import time
import uuid
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field

from deep_sleep.core.config import GatingConfig
from deep_sleep.core.errors import InputError
from deep_sleep.core.scope import Scope
from deep_sleep.core.snapshot import utc
from deep_sleep.jobs.gating import Gate, due_scopes
from deep_sleep.jobs.health import health
from deep_sleep.run.console import gate_line  # noqa: F401  (its home was here)
from deep_sleep.store.db import Store, connect_store


class NightlyParameters(BaseModel):
    """Parameters of one night over the whole fleet (or the listed scopes)."""

    as_of: datetime | None = Field(None, description="logical time of the night (UTC); default: now")
    config_file: str | None = None
    config: dict[str, Any] = Field(default_factory=dict, description="knob overrides")
    dsn: str | None = None
    runs_dir: str | None = None
    scopes: list[str] | None = Field(None, description="consider only these scopes (default: every scope of the store)")
    max_workers: int = Field(2, ge=1, description="shards consolidated at once")
    shard_rows: int = Field(500_000, ge=1, description="at most this many rows (nodes + edges + events) per shard")
    shard_scopes: int = Field(5_000, ge=1, description="at most this many scopes per shard")
    plan: bool = Field(False, description="plan only: extract, transform and validate every due scope, apply nothing")
    plan_scopes: int = Field(20, ge=0, description="with plan: the scopes (most records first) whose records the "
                             "night's plan shows; every record is in each diff directory's preview.parquet")
    plan_per_phase: int = Field(5, ge=1, description="with plan: records shown per phase of each scope shown")
    apply_concurrency: int = Field(2, ge=1, description="applies at once (apply slots held in the store)")
    prefect_apply_limit: bool = Field(False, description="also cap shard tasks with the Prefect tag concurrency limit "
                                      "'deep-sleep-apply' (visible in the UI; a killed run keeps its Prefect slot "
                                      "until Prefect reaps the lease — use with a standing server)")
    data_quality: bool = Field(True, description="run the great-expectations suite over the store after a night "
                               "that applied at least one scope")
    task_runner: Literal["auto", "threads", "processes", "dask"] = Field(
        "auto", description="auto (processes for a night of at least AUTO_PROCESSES_ROWS due rows in two or more "
        "shards with max_workers >= 2, else threads), threads (one process), processes (max_workers worker "
        "processes: no shared GIL, for large nights) or dask")
    dask_address: str | None = Field(None, description="scheduler address; default: a local cluster")
    dask_workers: int = Field(2, ge=1, description="workers of the local Dask cluster")
    progress: bool = Field(False, description="print progress (scopes done / due, rows changed, elapsed) to stderr")


def considered_scopes(store: Store, as_of: datetime, config: GatingConfig, scopes: list[str] | None = None) -> list[Gate]:
    """The night's gate verdicts (:func:`~deep_sleep.jobs.gating.due_scopes`): every scope of the
    store, or of those of ``scopes`` that hold rows."""
    gates = due_scopes(store, as_of, config)
    if scopes is not None:
        wanted = {Scope.coerce(s).path for s in scopes}
        gates = [g for g in gates if g.scope_path in wanted]
    return gates


def night_rows(gates: list[Gate], results: dict[str, dict], failed_shard: dict[str, str],
               plan: bool = False) -> list[dict[str, Any]]:
    """One summary row per considered scope, in gate order: skipped (with the gate's reason), failed
    (its shard's error, or the scope's own errors), or applied / planned with its counts."""
    rows: list[dict[str, Any]] = []
    for g in gates:
        if not g.due:
            rows.append({"scope": Scope.parse(g.scope_path).display(), "status": "skipped", "reason": g.reason})
            continue
        if g.scope_path in failed_shard:
            rows.append({"scope": Scope.parse(g.scope_path).display(), "status": "failed",
                         "reason": failed_shard[g.scope_path][:500]})
            continue
        r = results[g.scope_path]
        ok = r["status"] in ("applied", "planned")
        rows.append({
            "scope": Scope.parse(g.scope_path).display(),
            "status": r["status"] if ok else "failed",
            "reason": g.reason if ok else "; ".join(r["errors"])[:500],
            "changes": r["changes"],
            "conflicts": r["conflicts"],
            "counters": ", ".join(f"{k}={v}" for k, v in r["counters"].items()),
            "quarantined": r["quarantined"],
            "run_id": r["run_id"],
            "worker_pid": r["worker_pid"],
            "diff_hash": r["diff_hash"],
            "diff_uri": r["diff_uri"],
            "held": r.get("held", 0),
            "shard": r.get("shard"),
            "seconds": r.get("seconds"),
            **({"records": r.get("records", 0)} if plan else {}),
        })
    return rows


def status_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How many rows are applied, failed and skipped."""
    return {s: sum(r["status"] == s for r in rows) for s in ("applied", "failed", "skipped")}


def gate_distribution(results: list[dict]) -> dict[str, Any] | None:
    """The night's recall-quality gate across the fleet: how many scopes it ran for by status
    (``measured``, or why not: ``no_used_query``, ``no_vectors``, ``zero_before``, ``disabled``, …),
    how many it measured and failed, and over the measured ones the distribution (min, median, p90,
    max) of recall@k before and after and of the drop (pp).  A gate that could not measure never
    counts as measured (SPEC §9 as amended)."""
    import statistics
    from collections import Counter

    gates = [r["gate"] for r in results if r.get("gate")]
    if not gates:
        return None
    by_status = Counter(str(g.get("status") or "unknown") for g in gates)
    measured = [g for g in gates if g.get("status") == "measured"]

    def spread(key: str) -> dict[str, float]:
        values = sorted(float(g[key]) for g in measured if g.get(key) is not None)
        if not values:
            return {}
        p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
        return {"min": round(values[0], 4), "median": round(statistics.median(values), 4), "p90": round(p90, 4),
                "max": round(values[-1], 4)}

    return {"gated": len(gates), "by_status": dict(sorted(by_status.items())), "scopes": len(measured),
            "failed": sum(bool(g.get("failed")) for g in measured),
            "recall_before": spread("recall_before"), "recall_after": spread("recall_after"), "drop_pp": spread("drop_pp")}


def health_alerts(dsn: str, as_of: datetime, config, scopes: list[str]) -> list[dict[str, str]]:
    """The run-health alerts of ``scopes`` after the night (set-based, once per night); ``config``: the
    whole :class:`~deep_sleep.transforms.config.ConsolidationConfig`."""
    wanted = set(scopes)
    alerts = health(connect_store(dsn), as_of, config.health, config.gating.min_interval_hours)
    return [{"scope_path": a.scope_path, "check": a.check, "message": a.message} for a in alerts if a.scope_path in wanted]


def retention(dsn: str, runs_dir: str | None, config) -> dict[str, int]:
    """Old run directories and archive rows removed (``retention.keep_days``; see :mod:`deep_sleep.jobs.gc`)."""
    from deep_sleep.jobs.gc import gc
    from deep_sleep.run.layout import runs_location

    result = gc(connect_store(dsn), runs_location(runs_dir), config.retention.keep_days, force=config.retention.force)
    return {"directories": len(result.removed), "bytes": result.bytes_freed, "archive_rows": result.archive_rows_removed,
            "marked_not_undoable": len(result.runs_marked_not_undoable)}


def night_summary(*, night_id: str, as_of: datetime, gates: list[Gate], shards: int, task_runner: str,
                  rows: list[dict[str, Any]], results: dict[str, dict], quality: dict | None,
                  alerts: list[dict[str, str]], removed: dict[str, int] | None,
                  seconds: dict[str, float] | None = None) -> dict[str, Any]:
    """The night's summary (what ``deep-sleep nightly`` prints and the flow returns); ``seconds``: the
    night's time in its steps (``shards``: from the first shard's submission to the last's end,
    ``data_quality``, ``health``, ``retention``)."""
    due = sum(g.due for g in gates)
    by_reason: dict[str, int] = {}
    for r in results.values():
        for reason, n in (r.get("held_reasons") or {}).items():
            by_reason[reason] = by_reason.get(reason, 0) + int(n)
    return {"night_id": night_id, "as_of": as_of.isoformat(), "scopes": len(gates), "due": due,
            "shards": shards, "task_runner": task_runner, **status_counts(rows),
            "gate": gate_distribution(list(results.values())),
            "held_rows": sum(r.get("held") or 0 for r in results.values()),
            "held_by_reason": dict(sorted(by_reason.items())),
            "data_quality": quality, "health": alerts, "retention": removed,
            "seconds": {k: round(v, 3) for k, v in (seconds or {}).items()}, "rows": rows}


def night_dir(runs_dir: str | None, as_of: datetime, night_id: str) -> str:
    """The night's own directory, beside its shards' runs: ``<runs>/_nightly/<as_of>_<night id>/``
    (``scopes.csv``, the data-quality suite's ``data_quality/``); a path or an object-store URL."""
    from deep_sleep.core import files
    from deep_sleep.run.layout import runs_location

    return files.join(runs_location(runs_dir), "_nightly", f"{utc(as_of).strftime('%Y%m%dT%H%M%SZ')}_{night_id}")


def write_scope_table(summary: dict[str, Any], runs_dir: str | None) -> str:
    """Write the night's per-scope table (:data:`~deep_sleep.run.console.SCOPE_TABLE`) as
    ``scopes.csv`` in :func:`night_dir`, set ``summary["table"]`` to its location and return it."""
    import csv
    import io
    import tempfile
    from pathlib import Path

    from deep_sleep.core import files
    from deep_sleep.run.console import scope_table

    header, rows = scope_table(summary["rows"])
    text = io.StringIO()
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    where = files.join(night_dir(runs_dir, datetime.fromisoformat(summary["as_of"]), summary["night_id"]), "scopes.csv")
    if files.is_remote(where):
        with tempfile.TemporaryDirectory() as tmp:
            local = files.write_atomic(Path(tmp) / "scopes.csv", text.getvalue())
            files.publish_file(local, where)
    else:
        files.write_atomic(where, text.getvalue())
    summary["table"] = where
    return where


def quiet_night(params: NightlyParameters, config, store: Store, gates: list[Gate]) -> dict[str, Any]:
    """The night of ``gates`` in which no scope is due, in this process and without Prefect (see the
    module docstring): every scope skipped with its reason, the run-health alerts and retention exactly
    as the flow evaluates them, and the flow's summary (``shards`` 0; no data-quality suite: nothing
    was applied).  ``params.as_of`` must be set (the time the gates were taken at); ``config``: the
    night's :class:`~deep_sleep.transforms.config.ConsolidationConfig`."""
    if params.as_of is None:
        raise InputError("quiet_night needs params.as_of: the time the gates were taken at")
    due = [g.scope_path for g in gates if g.due]
    if due:
        raise InputError(f"quiet_night is for a night with no due scope; {len(due)} are due")
    as_of = utc(params.as_of)
    clock = time.perf_counter()
    alerts = health_alerts(store.dsn, as_of, config, [g.scope_path for g in gates]) if config.health.enabled else []
    seconds = {"health": time.perf_counter() - clock}
    clock = time.perf_counter()
    removed = retention(store.dsn, params.runs_dir, config) if config.retention.keep_days is not None else None
    seconds["retention"] = time.perf_counter() - clock
    summary = night_summary(night_id=str(uuid.uuid4()), as_of=as_of, gates=gates, shards=0,
                            task_runner="threads" if params.task_runner == "auto" else params.task_runner,
                            rows=night_rows(gates, {}, {}), results={}, quality=None, alerts=alerts, removed=removed,
                            seconds=seconds)
    write_scope_table(summary, params.runs_dir)
    return summary


__all__ = ["NightlyParameters", "considered_scopes", "gate_distribution", "health_alerts", "night_dir", "night_rows",
           "night_summary", "quiet_night", "retention", "status_counts", "write_scope_table"]
