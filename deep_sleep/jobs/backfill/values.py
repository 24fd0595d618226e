"""The backfill's values: its options, what the catalog says about a table, and what a run reports."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from deep_sleep.core.errors import InputError
from deep_sleep.core.scope import Scope

LEGACY_KIND = Scope.legacy("t").levels[0][0]  # "tenant"
DEFAULT_JOB = "scope-backfill"
DEFAULT_BATCH_SIZE = 5_000
DEFAULT_LOCK_TIMEOUT_MS = 200
MIN_BATCH_SIZE = 100
LIST_LIMIT = 1_000  # ids listed per table and check; counts are always exact
MAX_OPTION = 100_000_000  # no option is larger (PostgreSQL's LIMIT and lock_timeout take 32-bit values past here)


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
        for name in ("batch_size", "lock_timeout_ms", "max_retries", "max_passes", "pause_ms"):
            value, low = getattr(self, name), 0 if name == "pause_ms" else 1
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= MAX_OPTION:
                raise InputError(f"BackfillOptions.{name} must be an integer from {low} to {MAX_OPTION:,}, got {value!r}")
        if not self.job:
            raise InputError("BackfillOptions.job must be a non-empty name")


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


def conflicts_of(table: str, rows: Sequence[tuple]) -> list[Conflict]:
    """Conflicts from rows of (row_id, reason, existing_id, target_path, index_name)."""
    return [Conflict(table, r[0], r[1], r[2], r[3], r[4]) for r in rows]
