"""The scope backfill (SPEC §1, §6): give every legacy row (``scope_path IS NULL``) its path.

A legacy row reads as the one-level path ``tenant␟<tenant_id>`` (:meth:`Scope.legacy`); the
backfill writes exactly that path, table by table, in small transactions that live traffic
barely notices::

    plan = backfill(dsn, dry_run=True)             # legacy rows per table and tenant, predicted conflicts
    result = backfill(dsn, batch_size=5_000, lock_timeout_ms=200, job="scope-backfill")
    result.rows_backfilled, result.validation.ok   # e.g. (1000000, True); rerun: (0, True)

How, and why:

* **Which tables.** Every table of the current schema with a nullable ``scope_path``, a
  ``tenant_id`` and a one-column primary key, read from the catalog (so a table a later
  migration adds is covered without editing a list).  Migration 005 gives each a partial index
  ``(pk) INCLUDE (tenant_id) WHERE scope_path IS NULL``.
* **Batches.** Keyset pagination over that index (``pk > last_key ORDER BY pk LIMIT n``, never
  OFFSET).  One batch is one transaction: ``SET LOCAL lock_timeout``, then a single statement
  that locks the batch's rows ``FOR UPDATE SKIP LOCKED`` (a row a live writer holds is passed
  over, not waited for), writes the path, records conflicts and advances the checkpoint.  A
  batch that cannot get a lock in time (a table lock, a unique-index wait) is rolled back and
  retried after a jittered backoff -- never failed, up to ``max_retries`` in a row.
* **Batch size adapts.** ``batch_size`` is the ceiling.  Our row locks are held for one batch,
  so a live writer that needs one of those rows waits at most one batch: a batch slower than
  ``lock_timeout_ms`` halves the size, a fast one doubles it back -- no live writer waits on
  the backfill longer than the backfill would wait on it.
* **Passes.** Rows skipped because a live writer held them (or inserted behind the cursor) are
  caught by another pass from the start, run while rows other than recorded conflicts remain
  (cheap: the partial index holds only rows still without a path); at most ``max_passes``.
  Rerunning a finished job starts a new pass, which finds nothing and reports 0.
* **Checkpoint.** ``scope_backfill_checkpoints`` (job, table): pass, last key, rows done,
  batches, timestamps -- updated by the batch's own statement, so a SIGKILL at any moment
  loses no work and counts no row twice; the next run resumes after the last committed key.
  One process per (job, table) at a time (a session advisory lock).
* **Never lose a row.** If the target path would collide with a row already there under a
  unique key that includes ``scope_path`` (memory_edges, soul_profiles, reranker_models,
  procedural_skills' pattern key -- derived from the catalog), or the tenant_id is not a valid
  scope id, the row is left as it is and recorded in ``scope_backfill_conflicts``.  Two legacy
  rows that would collide with each other: the smaller key is backfilled, the other recorded.
* **Dry run.** Counts legacy rows per table and tenant and predicts the conflicts in one
  read-only transaction, by the same SQL the batches use; writes nothing.
* **Validation** (set-based, whole tables): no row left without a path; no row whose path's
  root id differs from its tenant_id; the conflicts by id.  Failing validation is reported,
  not raised.
* The version trigger bumps ``version`` of each backfilled row (the path changed), so a
  consolidation run that snapshotted a legacy row before the backfill skips it as a conflict
  and retries it next night; ``updated_at`` is untouched (no content changed).
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg
from psycopg import errors as pg_errors

from deep_sleep.core.scope import MAX_PART, Scope
from deep_sleep.jobs.errors import BackfillError

LEGACY_KIND = Scope.legacy("t").levels[0][0]  # "tenant"
DEFAULT_JOB = "scope-backfill"
DEFAULT_BATCH_SIZE = 5_000
DEFAULT_LOCK_TIMEOUT_MS = 200
MIN_BATCH_SIZE = 100
LIST_LIMIT = 1_000  # ids listed per table and check; counts are always exact
_RETRYABLE = (pg_errors.LockNotAvailable, pg_errors.UniqueViolation, pg_errors.DeadlockDetected,
              pg_errors.SerializationFailure)
# What Scope accepts as an id (scope._check_part), as SQL: a row failing it is left alone.
VALID_TENANT_SQL = (f"coalesce(tenant_id <> '' AND char_length(tenant_id) <= {MAX_PART} "
                    r"AND tenant_id !~ '[\x01-\x1f\x7f-\x9f]', false)")



# ------------------------------------------------------------------------------------------------
# value objects


@dataclass(frozen=True)
class BackfillOptions:
    """How to backfill.  job: checkpoint name (a new name starts over); batch_size: rows per
    transaction at most; lock_timeout_ms: ``SET LOCAL lock_timeout`` of each batch and the batch
    duration the size adapts to; pause_ms: sleep between batches; max_retries: consecutive lock
    failures of one batch before giving up; max_passes: passes per table per run; dry_run: count only."""

    job: str = DEFAULT_JOB
    batch_size: int = DEFAULT_BATCH_SIZE
    lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS
    pause_ms: int = 0
    max_retries: int = 50
    max_passes: int = 5
    dry_run: bool = False

    def __post_init__(self) -> None:
        for name in ("batch_size", "lock_timeout_ms", "max_retries", "max_passes"):
            if getattr(self, name) < 1:
                raise ValueError(f"BackfillOptions.{name} must be >= 1, got {getattr(self, name)}")
        if self.pause_ms < 0:
            raise ValueError(f"BackfillOptions.pause_ms must be >= 0, got {self.pause_ms}")
        if not self.job:
            raise ValueError("BackfillOptions.job must be a non-empty name")


@dataclass(frozen=True)
class UniqueKey:
    """A unique index whose key involves scope_path: key expressions as SQL over the table's columns."""

    name: str
    keys: tuple[str, ...]
    nullable: tuple[bool, ...]
    predicate: str | None
    nulls_not_distinct: bool


@dataclass(frozen=True)
class TableInfo:
    """A table that can hold legacy rows, as the catalog describes it."""

    name: str
    pk: str
    pk_type: str
    columns: tuple[str, ...]
    unique_keys: tuple[UniqueKey, ...]


@dataclass(frozen=True)
class Conflict:
    """A legacy row left without a path on purpose.  reason: "collision" (existing_id already holds
    the key at target_path under index_name) or "invalid_tenant_id" (not a valid scope id)."""

    table: str
    row_id: str
    reason: str
    existing_id: str | None = None
    target_path: str | None = None
    index_name: str | None = None


@dataclass(frozen=True)
class Mismatch:
    """A row whose scope_path's root id is not its tenant_id (moved to another tenant)."""

    table: str
    row_id: str
    scope_path: str
    tenant_id: str


@dataclass(frozen=True)
class Progress:
    """Reported after every batch and at the end of each table."""

    table: str
    pass_no: int
    rows_done: int  # backfilled by this run in this table
    rows_total: int  # legacy rows in the table when this run started on it
    batches: int
    retries: int
    conflicts: int
    batch_size: int
    finished: bool = False


@dataclass(frozen=True)
class TableResult:
    """One table.  legacy_rows: rows without a path when the run started on the table (dry run:
    the count); by_tenant: those per tenant (dry run only); rows_backfilled: by this run;
    rows_backfilled_job: by this job over all its runs (the checkpoint); left_without_path: rows
    still without a path when the run finished the table (conflicts included); conflicts: rows of
    the table left without a path on purpose (dry run: predicted)."""

    table: str
    legacy_rows: int
    rows_backfilled: int = 0
    rows_backfilled_job: int = 0
    batches: int = 0
    retries: int = 0
    passes: int = 0
    left_without_path: int = 0
    conflicts: int = 0
    seconds: float = 0.0
    by_tenant: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class ValidationOutcome:
    """The end-of-backfill check, set-based over whole tables.

    ok: no row without a path and no row moved to another tenant.
    without_path: table → rows still without a path (conflicts included).
    without_path_ids: table → ids of those rows that are not recorded conflicts (up to LIST_LIMIT).
    conflicts: rows left without a path on purpose, by id (collisions with the colliding id).
    mismatches: table → rows whose scope_path root id differs from tenant_id.
    mismatch_rows: those rows by id (up to LIST_LIMIT per table).
    """

    ok: bool
    without_path: dict[str, int]
    without_path_ids: dict[str, tuple[str, ...]]
    conflicts: tuple[Conflict, ...]
    mismatches: dict[str, int]
    mismatch_rows: tuple[Mismatch, ...]

    def messages(self) -> list[str]:
        out = [f"{t}: {n} row(s) without a scope_path" for t, n in self.without_path.items() if n]
        out += [f"{c.table} {c.row_id}: {c.reason}" + (f" with {c.existing_id} at {c.target_path!r} ({c.index_name})"
                                                       if c.reason == "collision" else "") for c in self.conflicts]
        out += [f"{t}: {n} row(s) whose scope_path root id is not their tenant_id" for t, n in self.mismatches.items() if n]
        return out


@dataclass(frozen=True)
class BackfillResult:
    """What a backfill (or dry run) did: per table, conflicts by id, validation (None for a dry run)."""

    job: str
    dry_run: bool
    tables: tuple[TableResult, ...]
    conflicts: tuple[Conflict, ...]
    validation: ValidationOutcome | None
    seconds: float

    @property
    def rows_backfilled(self) -> int:
        return sum(t.rows_backfilled for t in self.tables)

    @property
    def legacy_rows(self) -> int:
        return sum(t.legacy_rows for t in self.tables)

    @property
    def batches(self) -> int:
        return sum(t.batches for t in self.tables)

    @property
    def retries(self) -> int:
        return sum(t.retries for t in self.tables)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "rows_backfilled": self.rows_backfilled, "legacy_rows": self.legacy_rows,
                "batches": self.batches, "retries": self.retries}


ProgressCallback = Callable[[Progress], None]


# ------------------------------------------------------------------------------------------------
# the catalog


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


_TABLES_SQL = """
SELECT c.oid, c.relname, a.attname, format_type(a.atttypid, a.atttypmod)
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = current_schema()
LEFT JOIN pg_index x ON x.indrelid = c.oid AND x.indisprimary
LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND x.indnkeyatts = 1 AND a.attnum = x.indkey[0]
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND EXISTS (SELECT 1 FROM pg_attribute s WHERE s.attrelid = c.oid AND s.attname = 'scope_path'
              AND NOT s.attnotnull AND NOT s.attisdropped)
  AND EXISTS (SELECT 1 FROM pg_attribute s WHERE s.attrelid = c.oid AND s.attname = 'tenant_id' AND NOT s.attisdropped)
ORDER BY c.relname
"""

_UNIQUE_SQL = r"""
SELECT i.relname, x.indnullsnotdistinct, pg_get_expr(x.indpred, x.indrelid, true),
       array(SELECT pg_get_indexdef(x.indexrelid, k, true) FROM generate_series(1, x.indnkeyatts) k ORDER BY k),
       x.indkey::int2[]
FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
WHERE x.indrelid = %s AND x.indisunique AND NOT x.indisprimary AND x.indisvalid
  AND pg_get_indexdef(x.indexrelid) ~ '\mscope_path\M'
ORDER BY i.relname
"""


def discover_tables(con: psycopg.Connection, only: Sequence[str] | None = None) -> tuple[TableInfo, ...]:
    """The tables that can hold legacy rows (all of them, or ``only`` those named), from the catalog."""
    found = {name: (oid, pk, pk_type) for oid, name, pk, pk_type in con.execute(_TABLES_SQL)}
    names = list(only) if only else list(found)
    unknown = [n for n in names if n not in found]
    if unknown:
        raise BackfillError(f"cannot backfill {', '.join(unknown)}: not a table with a nullable scope_path and a "
                            f"tenant_id; the tables that have legacy rows are {', '.join(found) or 'none'}")
    out = []
    for name in names:
        oid, pk, pk_type = found[name]
        if pk is None:
            raise BackfillError(f"table {name} has no one-column primary key, which the backfill pages by; "
                                f"add one, or leave the table out (tables=[…])")
        cols = con.execute("SELECT attname, attnotnull FROM pg_attribute WHERE attrelid = %s AND attnum > 0 "
                           "AND NOT attisdropped ORDER BY attnum", (oid,)).fetchall()
        notnull = {c: nn for c, nn in cols}
        by_num = dict(con.execute("SELECT attnum, attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0",
                                  (oid,)).fetchall())
        keys = []
        for iname, nnd, pred, exprs, indkey in con.execute(_UNIQUE_SQL, (oid,)):
            # a plain column may be NOT NULL; an expression may always be NULL.  scope_path is
            # compared against a computed, never-NULL target.
            nullable = tuple(e != "scope_path" and (num == 0 or not notnull[by_num[num]])
                             for e, num in zip(exprs, indkey, strict=False))
            keys.append(UniqueKey(iname, tuple(exprs), nullable, pred, bool(nnd)))
        out.append(TableInfo(name, pk, pk_type, tuple(c for c, _ in cols), tuple(keys)))
    return tuple(out)


# ------------------------------------------------------------------------------------------------
# SQL: pure functions of a TableInfo (``%`` from the catalog is escaped for psycopg)


def _esc(fragment: str) -> str:
    return fragment.replace("%", "%%")


def _proposed_cols(info: TableInfo) -> list[str]:
    """Columns a proposed row needs: the key and tenant, and every column when unique keys are checked."""
    if info.unique_keys:
        return [c for c in info.columns if c != "scope_path"]
    return list(dict.fromkeys([info.pk, "tenant_id"]))


def _target(alias: str = "") -> str:
    return f"%(kind)s || chr(31) || {alias}tenant_id"


def clash_sql(info: TableInfo) -> str:
    """Rows of the CTE ``proposed`` (legacy rows with their target scope_path) that would break a
    unique key: against a row already in the table, or against a proposed row with a smaller
    key.  Columns: id, existing_id, index_name, target; at most one row per id."""
    pk, t = _q(info.pk), _q(info.name)
    parts = []
    for u in info.unique_keys:
        pred = _esc(u.predicate) if u.predicate else "true"
        keys = [_esc(k) for k in u.keys]
        sel = ", ".join(f"{k} AS k{i}" for i, k in enumerate(keys))
        conds = []
        for i, (k, nullable) in enumerate(zip(keys, u.nullable, strict=True)):
            eq = f"{k} = p.k{i}"
            conds.append(f"({eq} OR ({k} IS NULL AND p.k{i} IS NULL))" if nullable and u.nulls_not_distinct else eq)
        name = _esc(u.name).replace("'", "''")
        parts.append(f"""
    SELECT p.id, o.id AS existing_id, '{name}'::text AS index_name, p.scope_path AS target
    FROM (SELECT {pk} AS id, scope_path, {sel} FROM proposed WHERE {pred}) p
    JOIN LATERAL (SELECT {pk} AS id FROM {t} WHERE ({pred}) AND {' AND '.join(conds)} LIMIT 1) o ON true""")
        distinct_nulls = "" if u.nulls_not_distinct else "".join(
            f" AND {k} IS NOT NULL" for k, n in zip(keys, u.nullable, strict=True) if n)
        groups = ", ".join(f"k{i}" for i in range(len(keys)))
        parts.append(f"""
    SELECT id, existing_id, '{name}'::text, target FROM (
        SELECT id, scope_path AS target, first_value(id) OVER (PARTITION BY {groups} ORDER BY id) AS existing_id
        FROM (SELECT {pk} AS id, scope_path, {sel} FROM proposed WHERE ({pred}){distinct_nulls}) q) w
    WHERE id <> existing_id""")
    if not parts:
        return f"SELECT NULL::{info.pk_type} AS id, NULL::{info.pk_type} AS existing_id, NULL::text AS index_name, " \
               f"NULL::text AS target WHERE false"
    return "SELECT DISTINCT ON (id) * FROM (" + "\n    UNION ALL".join(parts) + "\n) u ORDER BY id, index_name"


def batch_sql(info: TableInfo, *, first: bool) -> str:
    """One batch as one statement: lock the next free legacy rows in key order, write the paths of
    those that neither collide nor have an invalid tenant, record those that do, advance the
    checkpoint.  Parameters: kind, job, table, limit, and after (unless ``first``).  Returns one
    row: locked, done, clashes (json), invalid (json), last_key, finished, rows_done of the job.

    Every access is by key for at most ``limit`` rows: the partial index in key order, the primary
    key, the unique indexes.  The rows were locked while still without a path, so the UPDATE
    needs no second look at scope_path.  (:data:`BATCH_SETTINGS` keep the planner on that path.)
    """
    pk, t = _q(info.pk), _q(info.name)
    cols = _proposed_cols(info)
    after = "" if first else f" AND x.{pk} > %(after)s::{info.pk_type}"
    lock_cols = ", ".join(f"x.{_q(c)}" for c in cols)
    prop_cols = ", ".join(_q(c) for c in cols)
    return f"""
WITH locked AS (
    SELECT {lock_cols} FROM {t} x
    WHERE x.scope_path IS NULL{after}
    ORDER BY x.{pk} LIMIT %(limit)s
    FOR UPDATE OF x SKIP LOCKED
), proposed AS (
    SELECT {prop_cols}, {_target()} AS scope_path FROM locked WHERE {VALID_TENANT_SQL}
), clash AS (
    {clash_sql(info)}
), invalid AS (
    SELECT {pk} AS id FROM locked WHERE NOT {VALID_TENANT_SQL}
), done AS (
    UPDATE {t} x SET scope_path = {_target("x.")}
    WHERE x.{pk} = ANY(ARRAY(SELECT {pk} FROM proposed p WHERE NOT EXISTS (SELECT 1 FROM clash c WHERE c.id = p.{pk})))
    RETURNING 1
), noted AS (
    INSERT INTO scope_backfill_conflicts (job, table_name, row_id, reason, existing_id, target_path, index_name)
    SELECT %(job)s, %(table)s, id::text, 'collision', existing_id::text, target, index_name FROM clash
    UNION ALL
    SELECT %(job)s, %(table)s, id::text, 'invalid_tenant_id', NULL, NULL, NULL FROM invalid
    ON CONFLICT DO NOTHING
), cp AS (
    UPDATE scope_backfill_checkpoints SET
        last_key = coalesce((SELECT l.{pk} FROM locked l ORDER BY l.{pk} DESC LIMIT 1)::text, last_key),
        rows_done = rows_done + (SELECT count(*) FROM done),
        batches = batches + 1,
        updated_at = now(),
        finished_at = CASE WHEN (SELECT count(*) FROM locked) < %(limit)s THEN now() END
    WHERE job = %(job)s AND table_name = %(table)s
    RETURNING last_key, finished_at IS NOT NULL AS finished, rows_done
)
SELECT (SELECT count(*) FROM locked), (SELECT count(*) FROM done),
       (SELECT coalesce(json_agg(json_build_array(id::text, existing_id::text, target, index_name)), '[]') FROM clash),
       (SELECT coalesce(json_agg(id::text), '[]') FROM invalid),
       cp.last_key, cp.finished, cp.rows_done
FROM cp
"""


def legacy_conflicts_sql(info: TableInfo) -> str:
    """Every row still without a path that the backfill cannot give one (set-based; read only).
    Columns: row_id, reason, existing_id, target_path, index_name."""
    pk, t = _q(info.pk), _q(info.name)
    prop_cols = ", ".join(_q(c) for c in _proposed_cols(info))
    return f"""
WITH proposed AS (
    SELECT {prop_cols}, {_target()} AS scope_path FROM {t} WHERE scope_path IS NULL AND {VALID_TENANT_SQL}
), clash AS (
    {clash_sql(info)}
)
SELECT id::text, 'collision', existing_id::text, target, index_name FROM clash
UNION ALL
SELECT {pk}::text, 'invalid_tenant_id', NULL, NULL, NULL FROM {t} WHERE scope_path IS NULL AND NOT {VALID_TENANT_SQL}
ORDER BY 1
"""


# ------------------------------------------------------------------------------------------------
# running


def _conflicts(table: str, rows: Sequence[tuple]) -> list[Conflict]:
    return [Conflict(table, r[0], r[1], r[2], r[3], r[4]) for r in rows]


def dry_run_table(con: psycopg.Connection, info: TableInfo) -> tuple[TableResult, list[Conflict]]:
    """Count the table's legacy rows per tenant and predict its conflicts; reads only."""
    t0 = time.perf_counter()
    t = _q(info.name)
    by_tenant = dict(con.execute(f"SELECT tenant_id, count(*) FROM {t} WHERE scope_path IS NULL "
                                 f"GROUP BY tenant_id ORDER BY tenant_id").fetchall())
    conflicts = _conflicts(info.name, con.execute(legacy_conflicts_sql(info), {"kind": LEGACY_KIND}).fetchall())
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


# Run in every batch transaction.  lock_timeout: a batch that cannot get a lock in time gives up
# and is retried.  No sequential or bitmap scans: the planner's statistics of legacy rows are stale
# while the backfill runs (by design), and a bitmap scan of "scope_path IS NULL" plus a sort -- or
# a hash join over a whole-table scan -- would cost O(rows left) per batch, O(n²) in all.
BATCH_SETTINGS = "SET LOCAL lock_timeout = {ms}; SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off"


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
    count_sql = f"SELECT count(*) FROM {_q(name)} WHERE scope_path IS NULL"
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
                    con.execute(f"ANALYZE {_q(name)}")
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
          AND EXISTS (SELECT 1 FROM {_q(info.name)} x WHERE x.{_q(info.pk)} = c.row_id::{info.pk_type} AND x.scope_path IS NULL)
        ORDER BY c.row_id""", (job, info.name)).fetchall()
    return _conflicts(info.name, rows)


def validate_backfill(dsn: str, *, tables: Sequence[str] | None = None, limit: int = LIST_LIMIT) -> ValidationOutcome:
    """Check the whole store, set-based: rows without a path, rows whose path's tenant differs, conflicts."""
    without: dict[str, int] = {}
    without_ids: dict[str, tuple[str, ...]] = {}
    mismatches: dict[str, int] = {}
    mismatch_rows: list[Mismatch] = []
    conflicts: list[Conflict] = []
    with psycopg.connect(dsn) as con:
        con.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        for info in discover_tables(con, tables):
            t, pk = _q(info.name), _q(info.pk)
            moved = "scope_path IS NOT NULL AND split_part(scope_path, chr(31), 2) IS DISTINCT FROM tenant_id"
            n_null, n_moved = con.execute(f"SELECT count(*) FILTER (WHERE scope_path IS NULL), count(*) FILTER "
                                          f"(WHERE {moved}) FROM {t}").fetchone()
            without[info.name], mismatches[info.name] = n_null, n_moved
            found: list[Conflict] = []
            if n_null:
                found = _conflicts(info.name, con.execute(legacy_conflicts_sql(info), {"kind": LEGACY_KIND}).fetchall())
                explained = [c.row_id for c in found]
                without_ids[info.name] = tuple(r[0] for r in con.execute(
                    f"SELECT {pk}::text FROM {t} WHERE scope_path IS NULL AND NOT ({pk}::text = ANY(%s)) "
                    f"ORDER BY {pk} LIMIT %s", (explained, limit)))
            conflicts += found
            if n_moved:
                mismatch_rows += [Mismatch(info.name, *r) for r in con.execute(
                    f"SELECT {pk}::text, scope_path, tenant_id FROM {t} WHERE {moved} ORDER BY {pk} LIMIT %s", (limit,))]
        con.rollback()
    ok = not any(without.values()) and not any(mismatches.values())
    return ValidationOutcome(ok, without, without_ids, tuple(conflicts), mismatches, tuple(mismatch_rows))


def backfill(dsn: str, *, batch_size: int = DEFAULT_BATCH_SIZE, lock_timeout_ms: int = DEFAULT_LOCK_TIMEOUT_MS,
             dry_run: bool = False, job: str = DEFAULT_JOB, progress: ProgressCallback | None = None,
             tables: Sequence[str] | None = None, pause_ms: int = 0, max_retries: int = 50,
             max_passes: int = 5) -> BackfillResult:
    """Backfill (or, with ``dry_run``, count) the legacy rows of every table, then validate.

    Resumes the job's checkpoint; a finished job reruns as a cheap pass that finds nothing.
    Conflicts are listed (and recorded), never overwritten or dropped; a failed validation is
    in ``result.validation``, not raised.  See the module docstring for the semantics.
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


# ------------------------------------------------------------------------------------------------
# showing it


def result_rows(result: BackfillResult) -> tuple[list[str], list[list[str]]]:
    """One row per table (for a terminal table or Markdown)."""
    header = ["table", "legacy rows", "backfilled", "job total", "batches", "retries", "conflicts", "seconds"]
    rows = [[t.table, f"{t.legacy_rows:,}", f"{t.rows_backfilled:,}", f"{t.rows_backfilled_job:,}", str(t.batches),
             str(t.retries), str(t.conflicts), f"{t.seconds:.2f}"] for t in result.tables]
    return header, rows


@contextlib.contextmanager
def rich_progress() -> Iterator[ProgressCallback]:
    """A progress callback drawing one rich progress bar per table (for the CLI)."""
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
    from rich.progress import Progress as Bar

    with Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
             TextColumn("{task.fields[note]}")) as bar:
        ids: dict[str, Any] = {}

        def update(p: Progress) -> None:
            if p.table not in ids:
                ids[p.table] = bar.add_task(p.table, total=p.rows_total or 1, note="")
            note = f"pass {p.pass_no} · {p.batches} batches · batch {p.batch_size}"
            note += f" · {p.retries} retries" if p.retries else ""
            note += f" · {p.conflicts} conflicts" if p.conflicts else ""
            bar.update(ids[p.table], completed=(p.rows_total or 1) if p.finished else p.rows_done, note=note)

        yield update


def dumps(result: BackfillResult) -> str:
    return json.dumps(result.to_dict(), indent=2, sort_keys=True, default=str) + "\n"
