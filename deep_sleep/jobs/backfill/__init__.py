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

The package, one module per job: :mod:`~.values` (options, results, constants),
:mod:`~.catalog` (which tables, from the catalog), :mod:`~.sql` (the statements, pure functions
of a table), :mod:`~.runner` (batches, retries, passes, checkpoints), :mod:`~.validate` (the
end-of-backfill check), :mod:`~.render` (tables, progress bars, JSON).  Everything public is
importable from ``deep_sleep.jobs.backfill``.
"""

from __future__ import annotations

from deep_sleep.jobs.backfill.catalog import discover_tables
from deep_sleep.jobs.backfill.render import dumps, result_rows, rich_progress
from deep_sleep.jobs.backfill.runner import (
    backfill,
    backfill_table,
    dry_run_table,
    recorded_conflicts,
    run_backfill,
)
from deep_sleep.jobs.backfill.sql import (
    BATCH_SETTINGS,
    VALID_TENANT_SQL,
    batch_sql,
    clash_sql,
    legacy_conflicts_sql,
)
from deep_sleep.jobs.backfill.validate import validate_backfill
from deep_sleep.jobs.backfill.values import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_JOB,
    DEFAULT_LOCK_TIMEOUT_MS,
    LEGACY_KIND,
    LIST_LIMIT,
    MIN_BATCH_SIZE,
    BackfillOptions,
    BackfillResult,
    Conflict,
    Mismatch,
    Progress,
    ProgressCallback,
    TableInfo,
    TableResult,
    UniqueKey,
    ValidationOutcome,
)
from deep_sleep.jobs.errors import BackfillError

__all__ = [
    "BATCH_SETTINGS", "DEFAULT_BATCH_SIZE", "DEFAULT_JOB", "DEFAULT_LOCK_TIMEOUT_MS", "LEGACY_KIND", "LIST_LIMIT",
    "MIN_BATCH_SIZE", "VALID_TENANT_SQL", "BackfillError", "BackfillOptions", "BackfillResult", "Conflict", "Mismatch",
    "Progress", "ProgressCallback", "TableInfo", "TableResult", "UniqueKey", "ValidationOutcome", "backfill",
    "backfill_table", "batch_sql", "clash_sql", "discover_tables", "dry_run_table", "dumps", "legacy_conflicts_sql",
    "recorded_conflicts", "result_rows", "rich_progress", "run_backfill", "validate_backfill",
]
