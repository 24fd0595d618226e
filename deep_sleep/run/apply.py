"""Apply a validated diff to the store in one transaction (SPEC §2 step 4): run the statement list.

:func:`deep_sleep.run.statements.statements` builds every statement — the SQL, its parameters
and how each table's rows are fed (inline JSON, a JSON temporary table, ADBC COPY) — as values;
:func:`apply_diff` only executes them in order in one transaction and counts what landed: a
write's one-count result is its rows applied, the rest of its rows are ``conflicts`` (a live
writer changed them after the snapshot; the next run sees them again).  On any error the
transaction rolls back: the store is as before.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import polars as pl
import pyarrow as pa

from deep_sleep.core.diff import Diff
from deep_sleep.core.errors import InputError
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.run.statements import (  # noqa: F401 - re-exported: callers and tests name them here
    BIG_DIFF_ROWS,
    KEY_COLUMNS,
    LEDGER_SQL,
    QUARANTINE_SQL,
    SMALL_STAGE_ROWS,
    Rows,
    Statement,
    check_work_mem,
    delete_sql,
    insert_sql,
    json_source,
    stage_name,
    stage_sql,
    stage_statement,
    statements,
    update_sql,
)
from deep_sleep.store.db import Store


def apply_work_mem() -> str:
    """``work_mem`` for the apply transaction: ``DEEP_SLEEP_APPLY_WORK_MEM`` or 256MB."""
    return check_work_mem(os.environ.get("DEEP_SLEEP_APPLY_WORK_MEM"))


@dataclass(frozen=True)
class ApplyResult:
    """What landed: rows per table and kind, and the rows skipped because a live writer got there first."""

    applied: dict[str, dict[str, int]]
    conflicts: int
    seconds: dict[str, float] | None = None  # "stage" (ingest into temp tables), "<table>.<kind>", "ledger"


_TAIL = ("quarantine", "ledger")  # timed together with the commit


def _arrow(frame: pl.DataFrame) -> pa.Table:
    return frame.to_arrow()


def _bind(params: tuple) -> tuple:
    """Parameters as sent: staged rows as one JSON text each."""
    return tuple(p.frame.write_json() if isinstance(p, Rows) else p for p in params)


def stage(cur, name: str, body: pl.DataFrame) -> None:
    """Stage ``body`` as the temporary table ``name`` (see :func:`~deep_sleep.run.statements.stage_statement`)."""
    _run(cur, stage_statement(name, body, SMALL_STAGE_ROWS))


def _run(cur, s: Statement) -> None:
    """Execute one statement whose result is not read."""
    if s.sql is None:
        cur.adbc_ingest(s.staged, _arrow(s.params[0].frame), mode="create", temporary=True)
    elif s.params:
        cur.execute(s.sql, parameters=_bind(s.params))
    else:
        cur.execute(s.sql)


def _scalar(cur, sql: str, params: tuple) -> int:
    cur.execute(sql, parameters=params)
    return int(cur.fetch_arrow_table().column(0)[0].as_py())


def ledger_params(report: ConsolidationReport, mode: str, started_at: datetime, status: str) -> tuple:
    j = lambda v: json.dumps(v, sort_keys=True, default=str)  # noqa: E731
    return (
        report.run_id, report.scope_path, mode, datetime.fromisoformat(report.as_of.replace("Z", "+00:00")),
        started_at, status, j(report.counters), j(report.phases_run), j(report.phases_skipped), j(report.timings),
        j(report.rows_changed), report.conflicts, report.diff_hash, report.snapshot_uri, report.diff_uri, j(report.errors),
        j(report.quarantined), report.gate.get("recall_before"), report.gate.get("recall_after"),
    )


def record_run(store: Store, report: ConsolidationReport, mode: str, started_at: datetime, status: str) -> None:
    """Write a ledger row on its own (failed runs; applied runs are recorded inside :func:`apply_diff`)."""
    with store.transaction() as cur:
        cur.execute(LEDGER_SQL, parameters=ledger_params(report, mode, started_at, status))


def planned_statements(diff: Diff, scope_path: str, run_id: str,
                       quarantined: pl.DataFrame | None = None) -> tuple[Statement, ...]:
    """The statements :func:`apply_diff` runs for ``diff`` (``replay --explain`` prints them)."""
    # The thresholds are read at call time (tests set SMALL_STAGE_ROWS on this module to force the
    # staged path); the environment is read here, not by the pure builder.
    return statements(diff, scope_path, run_id, quarantined=quarantined, small_rows=SMALL_STAGE_ROWS,
                      big_rows=BIG_DIFF_ROWS, work_mem=os.environ.get("DEEP_SLEEP_APPLY_WORK_MEM"))


def apply_diff(
    store: Store,
    diff: Diff,
    report: ConsolidationReport,
    *,
    mode: str = "nightly",
    started_at: datetime | None = None,
    quarantined: pl.DataFrame | None = None,
) -> ApplyResult:
    """Apply ``diff`` for ``report.scope_path`` in one transaction and record the run as applied,
    with the rows it ``quarantined`` (table, id, reason, row JSON) if any.

    ``report.run_id`` must be set.  On any error the transaction rolls back: the store is as before.
    ``seconds``: ``stage`` (building the statements, session settings, the lock, staging), each
    write's ``<table>.<kind>``, then ``quarantine_and_ledger_and_commit``.
    """
    if not report.run_id:
        raise InputError("apply_diff needs report.run_id (a UUID) to archive and record the run")
    try:
        uuid.UUID(report.run_id)
    except ValueError:
        raise InputError(f"apply_diff: report.run_id {report.run_id!r} is not a UUID") from None
    started_at = started_at or datetime.now(UTC)
    applied: dict[str, dict[str, int]] = {}
    conflicts = 0
    seconds: dict[str, float] = {}
    clock = time.perf_counter()
    todo = planned_statements(diff, report.scope_path, report.run_id, quarantined)
    tail: float | None = None
    with store.transaction() as cur:
        for s in todo:
            if "stage" not in seconds and (s.is_write or s.step in _TAIL):
                seconds["stage"] = round(time.perf_counter() - clock, 6)
            if s.is_write:
                clock = time.perf_counter()
                n = _scalar(cur, s.sql, _bind(s.params))
                applied.setdefault(s.table, {})[s.kind] = n
                conflicts += s.rows - n
                seconds[f"{s.table}.{s.kind}"] = round(time.perf_counter() - clock, 6)
                continue
            if s.step in _TAIL and tail is None:
                tail = time.perf_counter()
            if s.step == "lock":
                cur.execute(s.sql, parameters=_bind(s.params))
                cur.fetch_arrow_table()
            elif s.step == "quarantine" and s.sql is not None:
                _scalar(cur, s.sql, _bind(s.params))
            elif s.step == "ledger":
                final = report.with_(rows_changed=applied, conflicts=conflicts, status="applied")
                cur.execute(s.sql, parameters=ledger_params(final, mode, started_at, "applied"))
            else:
                _run(cur, s)
    seconds["quarantine_and_ledger_and_commit"] = round(time.perf_counter() - (tail or clock), 6)
    return ApplyResult(applied=applied, conflicts=conflicts, seconds=seconds)
