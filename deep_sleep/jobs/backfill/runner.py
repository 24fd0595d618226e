"""Running the backfill: per table, batches in keyset order under a job lock and a checkpoint,
retried with a jittered backoff while they cannot get their locks, in passes until only
recorded conflicts are left; and the dry run that only counts."""

from __future__ import annotations

import contextlib
import random
import time
from collections.abc import Iterator, Sequence
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from deep_sleep.jobs.backfill.catalog import discover_tables
from deep_sleep.jobs.backfill.sql import (
    BATCH_SETTINGS,
    batch_sql,
    legacy_conflicts_sql,
    quote,
)
from deep_sleep.jobs.backfill.validate import validate_backfill
from deep_sleep.jobs.backfill.values import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_JOB,
    DEFAULT_LOCK_TIMEOUT_MS,
    LEGACY_KIND,
    MIN_BATCH_SIZE,
    BackfillOptions,
    BackfillResult,
    Conflict,
    Progress,
    ProgressCallback,
    TableInfo,
    TableResult,
    conflicts_of,
)
from deep_sleep.jobs.errors import BackfillError

_RETRYABLE = (pg_errors.LockNotAvailable, pg_errors.UniqueViolation, pg_errors.DeadlockDetected,
              pg_errors.SerializationFailure)


def dry_run_table(con: psycopg.Connection, info: TableInfo) -> tuple[TableResult, list[Conflict]]:
    """Count the table's legacy rows per tenant and predict its conflicts; reads only."""
    t0 = time.perf_counter()
    t = quote(info.name)
    by_tenant = dict(con.execute(f"SELECT tenant_id, count(*) FROM {t} WHERE scope_path IS NULL "
                                 f"GROUP BY tenant_id ORDER BY tenant_id").fetchall())
    conflicts = conflicts_of(info.name, con.execute(legacy_conflicts_sql(info), {"kind": LEGACY_KIND}).fetchall())
    result = TableResult(info.name, sum(by_tenant.values()), conflicts=len(conflicts),
                         seconds=round(time.perf_counter() - t0, 3), by_tenant=by_tenant)
    return result, conflicts


@contextlib.contextmanager
def _job_lock(con: psycopg.Connection, job: str, table: str, wait_s: float = 30.0) -> Iterator[None]:
    """One process per (job, table).  Waits a little: a killed predecessor's session may linger."""
    key = f"deep_sleep.scope_backfill:{job}:{table}"
    deadline = time.monotonic() + wait_s
    while not con.execute("SELECT pg_try_advisory_lock(hashtextextended(%s, 0))", (key,)).fetchone()[0]:
        if time.monotonic() > deadline:
            raise BackfillError(f"backfill job {job!r} is already running on table {table} in another session; "
                                f"wait for it, or stop it and rerun (the checkpoint keeps its progress)")
        time.sleep(0.1)
    try:
        yield
    finally:
        with contextlib.suppress(psycopg.Error):
            con.execute("SELECT pg_advisory_unlock(hashtextextended(%s, 0))", (key,))


def _start_pass(con: psycopg.Connection, job: str, table: str) -> tuple[int, str | None]:
    """Open the checkpoint: continue an unfinished pass, or start a new one after a finished pass."""
    con.execute("INSERT INTO scope_backfill_checkpoints (job, table_name) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                (job, table))
    con.execute("""UPDATE scope_backfill_checkpoints SET pass = pass + 1, last_key = NULL,
                   finished_at = NULL, updated_at = now() WHERE job = %s AND table_name = %s AND finished_at IS NOT NULL""",
                (job, table))
    return con.execute("SELECT pass, last_key FROM scope_backfill_checkpoints WHERE job = %s AND table_name = %s",
                       (job, table)).fetchone()


def _run_batch(con: psycopg.Connection, sql: str, params: dict[str, Any], options: BackfillOptions,
               rng: random.Random) -> tuple[tuple, int, float]:
    """One batch transaction, retried after a jittered backoff while it cannot get its locks.
    Returns the statement's row, the retries it took and the seconds the successful attempt held its locks.

    A unique violation is retried a few times only: it means a live writer committed a row on the
    target key after the batch looked (the retry sees it and reports the collision); one that
    persists means a unique index the collision check does not model, and retrying cannot help.
    """
    unique_violations = 0
    for attempt in range(options.max_retries + 1):
        started = time.perf_counter()
        try:
            with con.transaction():
                con.execute(BATCH_SETTINGS.format(ms=int(options.lock_timeout_ms)))
                row = con.execute(sql, params).fetchone()
            return row, attempt, time.perf_counter() - started
        except _RETRYABLE as exc:
            unique_violations += isinstance(exc, pg_errors.UniqueViolation)
            where = f"table {params['table']}, the batch after key {params.get('after')!r}"
            if unique_violations > 3:
                raise BackfillError(
                    f"{where}: {str(exc).strip()} -- the collision check missed this unique index; nothing of the "
                    f"batch was written. Report it with the index definition (\\d {params['table']})") from exc
            if attempt == options.max_retries:
                raise BackfillError(
                    f"{where}: failed {attempt + 1} times in a row ({type(exc).__name__}: {str(exc).strip()}); nothing "
                    f"of it was written. Rerun the same job ({options.job!r}) to resume once whatever holds the lock "
                    f"has finished") from exc
            time.sleep(min(2.0, 0.05 * 2 ** min(attempt, 6)) * (0.5 + rng.random()))
    raise AssertionError("unreachable")


def backfill_table(dsn: str, info: TableInfo, options: BackfillOptions, progress: ProgressCallback | None = None,
                   ) -> tuple[TableResult, list[Conflict]]:
    """Backfill one table from its checkpoint to the end, then sweep again from the start while rows
    other than recorded conflicts are still without a path (rows a live writer held, rows a legacy
    writer inserted behind the cursor), at most ``max_passes`` passes in all."""
    job, name = options.job, info.name
    t0 = time.perf_counter()
    sql = {True: batch_sql(info, first=True), False: batch_sql(info, first=False)}
    rows = batches = retries = passes = 0
    size = options.batch_size
    rng = random.Random()
    count_sql = f"SELECT count(*) FROM {quote(name)} WHERE scope_path IS NULL"
    with psycopg.connect(dsn, autocommit=True) as con, _job_lock(con, job, name):
        total = con.execute(count_sql).fetchone()[0]
        conflicts_seen = 0
        while True:
            pass_no, last_key = _start_pass(con, job, name)
            passes += 1
            finished = False
            while not finished:
                params = {"kind": LEGACY_KIND, "job": job, "table": name, "limit": size, "after": last_key}
                row, tries, held = _run_batch(con, sql[last_key is None], params, options, rng)
                _locked, done, clashes, invalid, last_key, finished, job_rows = row
                rows, batches, retries = rows + done, batches + 1, retries + tries
                conflicts_seen += len(clashes) + len(invalid)
                # our row locks are held for one batch: keep that near lock_timeout_ms
                if held * 1000 > options.lock_timeout_ms:
                    size = max(MIN_BATCH_SIZE, size // 2)
                elif held * 1000 < options.lock_timeout_ms / 4:
                    size = min(options.batch_size, size * 2)
                if progress:
                    progress(Progress(name, pass_no, rows, total, batches, retries, conflicts_seen, size))
                if options.pause_ms and not finished:
                    time.sleep(options.pause_ms / 1000)
            if rows:  # let the planner learn that the legacy rows are gone (ANALYZE does not block writers)
                with contextlib.suppress(psycopg.Error), con.transaction():
                    con.execute(f"SET LOCAL lock_timeout = {int(options.lock_timeout_ms)}")
                    con.execute(f"ANALYZE {quote(name)}")
            recorded = recorded_conflicts(con, info, job)
            left = con.execute(count_sql).fetchone()[0]
            if left <= len(recorded) or passes >= options.max_passes:
                break
            time.sleep(options.lock_timeout_ms / 1000)  # give whoever held the rows a moment
    result = TableResult(name, total, rows, job_rows, batches, retries, passes, left, len(recorded),
                         round(time.perf_counter() - t0, 3))
    if progress:
        progress(Progress(name, pass_no, rows, total, batches, retries, len(recorded), size, finished=True))
    return result, recorded


def recorded_conflicts(con: psycopg.Connection, info: TableInfo, job: str) -> list[Conflict]:
    """Conflicts the job recorded in the table whose rows are still without a path."""
    rows = con.execute(f"""
        SELECT c.row_id, c.reason, c.existing_id, c.target_path, c.index_name FROM scope_backfill_conflicts c
        WHERE c.job = %s AND c.table_name = %s
          AND EXISTS (SELECT 1 FROM {quote(info.name)} x WHERE x.{quote(info.pk)} = c.row_id::{info.pk_type} AND x.scope_path IS NULL)
        ORDER BY c.row_id""", (job, info.name)).fetchall()
    return conflicts_of(info.name, rows)


def backfill(dsn: str, *, batch_size: int = DEFAULT_BATCH_SIZE, lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
             dry_run: bool = False, job: str = DEFAULT_JOB, progress: ProgressCallback | None = None,
             tables: Sequence[str] | None = None, pause_ms: int = 0, max_retries: int = 50,
             max_passes: int = 5) -> BackfillResult:
    """Backfill (or, with ``dry_run``, count) the legacy rows of every table, then validate.

    Resumes the job's checkpoint; a finished job reruns as a cheap pass that finds nothing.
    Conflicts are listed (and recorded), never overwritten or dropped; a failed validation is
    in ``result.validation``, not raised.  See :mod:`deep_sleep.jobs.backfill` for the semantics.
    """
    options = BackfillOptions(job, batch_size, lock_timeout_ms, pause_ms, max_retries, max_passes, dry_run)
    return run_backfill(dsn, options, tables=tables, progress=progress)


def run_backfill(dsn: str, options: BackfillOptions, *, tables: Sequence[str] | None = None,
                 progress: ProgressCallback | None = None) -> BackfillResult:
    """:func:`backfill` with its options as one value (the Prefect flow passes them so)."""
    t0 = time.perf_counter()
    results: list[TableResult] = []
    conflicts: list[Conflict] = []
    with psycopg.connect(dsn, autocommit=True) as con:
        infos = discover_tables(con, tables)
        if options.dry_run:  # one consistent, read-only look at every table
            with con.transaction(force_rollback=True):
                con.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                for info in infos:
                    result, found = dry_run_table(con, info)
                    results.append(result)
                    conflicts += found
        elif con.execute("SELECT to_regclass('scope_backfill_checkpoints')").fetchone()[0] is None:
            raise BackfillError("the store has no scope_backfill_checkpoints table: migrate it first "
                                "(deep_sleep.store.db.migrate(dsn), or any deep-sleep command)")
    if not options.dry_run:
        for info in infos:
            result, found = backfill_table(dsn, info, options, progress)
            results.append(result)
            conflicts += found
    validation = None if options.dry_run else validate_backfill(dsn, tables=[i.name for i in infos])
    return BackfillResult(options.job, options.dry_run, tuple(results), tuple(conflicts),
                          validation, round(time.perf_counter() - t0, 3))
