"""The ``scope_backfill`` Prefect flow: give legacy rows their scope_path (SPEC §6).

Thin tasks over :mod:`deep_sleep.jobs.backfill`: find the tables, backfill (or count) each one, then
validate the whole store.  A table's task retries by itself: the job's checkpoint makes a retry
resume where the failed attempt stopped.  The flow's parameters are its only configuration.
"""

from __future__ import annotations

import time
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, Field

from deep_sleep.jobs import backfill as bf
from deep_sleep.run.console import markdown_table
from deep_sleep.store.db import connect_store


class ScopeBackfillParameters(BaseModel):
    """Parameters of one backfill run."""

    dsn: str | None = Field(None, description="PostgreSQL DSN; default DEEP_SLEEP_DSN or the embedded server")
    job: str = Field(bf.DEFAULT_JOB, min_length=1, description="checkpoint name; the same name resumes, a new one starts over")
    batch_size: int = Field(bf.DEFAULT_BATCH_SIZE, ge=1, description="rows per transaction at most (adapts down under load)")
    lock_timeout_ms: int = Field(bf.DEFAULT_LOCK_TIMEOUT_MS, ge=1, description="SET LOCAL lock_timeout of each batch")
    pause_ms: int = Field(0, ge=0, description="sleep between batches, to leave room for live traffic")
    max_retries: int = Field(50, ge=1, description="consecutive lock failures of one batch before the task fails")
    dry_run: bool = Field(False, description="count legacy rows per table and tenant and predict conflicts; write nothing")
    tables: list[str] | None = Field(None, description="only these tables (default: every table with legacy rows)")

    def options(self) -> bf.BackfillOptions:
        return bf.BackfillOptions(job=self.job, batch_size=self.batch_size, lock_timeout_ms=self.lock_timeout_ms,
                                  pause_ms=self.pause_ms, max_retries=self.max_retries, dry_run=self.dry_run)


@task(name="discover-tables", cache_policy=NO_CACHE)
def discover_task(dsn: str, tables: list[str] | None) -> list[bf.TableInfo]:
    with connect_store(dsn).pg() as con:
        return list(bf.discover_tables(con, tables))


@task(name="dry-run", cache_policy=NO_CACHE)
def dry_run_task(dsn: str, options: bf.BackfillOptions, tables: list[str]) -> bf.BackfillResult:
    return bf.run_backfill(dsn, options, tables=tables)


@task(name="backfill-table", retries=2, retry_delay_seconds=10, cache_policy=NO_CACHE)
def backfill_table_task(dsn: str, info: bf.TableInfo, options: bf.BackfillOptions
                        ) -> tuple[bf.TableResult, list[bf.Conflict]]:
    return bf.backfill_table(dsn, info, options, progress=_log_progress)


@task(name="validate", cache_policy=NO_CACHE)
def validate_task(dsn: str, tables: list[str]) -> bf.ValidationOutcome:
    return bf.validate_backfill(dsn, tables=tables)


def _log_progress(p: bf.Progress) -> None:
    if p.finished or p.batches % 50 == 0:
        print(f"{p.table}: {p.rows_done:,}/{p.rows_total:,} rows, pass {p.pass_no}, {p.batches} batches, "
              f"{p.retries} retries, {p.conflicts} conflicts")


def result_markdown(result: bf.BackfillResult) -> str:
    kind = "dry run" if result.dry_run else "backfill"
    verdict = "" if result.validation is None else (" — valid" if result.validation.ok else " — NOT valid")
    parts = [f"# Scope {kind} `{result.job}`{verdict}", "", markdown_table(*bf.result_rows(result)), ""]
    if result.conflicts:
        parts += ["## Conflicts (left without a path, nothing overwritten)",
                  markdown_table(["table", "row", "reason", "existing row", "index"],
                                 [[c.table, c.row_id, c.reason, c.existing_id or "", c.index_name or ""]
                                  for c in result.conflicts[:200]]), ""]
    if result.validation is not None and not result.validation.ok:
        parts += ["## Validation", *[f"- {m}" for m in result.validation.messages()[:200]]]
    return "\n".join(parts)


@flow(name="scope_backfill", log_prints=True)
def scope_backfill(params: ScopeBackfillParameters) -> dict[str, Any]:
    """Backfill (or dry-run) every table's legacy rows, validate, and return the ``BackfillResult`` as a dict."""
    started = time.perf_counter()
    dsn = connect_store(params.dsn).dsn
    options = params.options()
    infos = discover_task(dsn, params.tables)
    names = [i.name for i in infos]
    if options.dry_run:
        result = dry_run_task(dsn, options, names)
    else:
        per_table = [backfill_table_task(dsn, info, options) for info in infos]  # one at a time: they share the I/O
        validation = validate_task(dsn, names)
        result = bf.BackfillResult(options.job, False, tuple(r for r, _ in per_table),
                                   tuple(c for _, found in per_table for c in found), validation,
                                   round(time.perf_counter() - started, 3))
    key = "scope-backfill-" + "".join(ch if ch.isalnum() else "-" for ch in options.job.lower())
    create_markdown_artifact(markdown=result_markdown(result), key=key[:100], description=f"scope backfill {options.job}")
    return result.to_dict()
