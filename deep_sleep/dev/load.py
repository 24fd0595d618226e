"""The bulk loader: :func:`load` inserts generated frames into a store in one transaction.

Each frame goes through ADBC (Arrow COPY into a temporary staging table), then one set-based
``INSERT … SELECT`` per table with the casts of :mod:`deep_sleep.core.tables`; a large load into
an empty table drops and rebuilds that table's indexes inside the transaction (``REBUILD_MIN_ROWS``).
"""

from __future__ import annotations

import logging
import time

import polars as pl

from deep_sleep.core.tables import TABLES, columns
from deep_sleep.dev.errors import SeedError

log = logging.getLogger(__name__)

__all__ = ["REBUILD_MIN_ROWS", "BulkLoad", "load"]


# Below this many rows (or into a table that already has rows) the loader inserts through the
# live indexes; above it, into an empty table, it drops the table's indexes and unique/primary
# constraints inside the load transaction and rebuilds them from their own definitions after
# the insert -- 3-5x faster at a million rows (index builds sort once instead of inserting
# randomly ordered uuids into four b-trees).  Nobody sees the table without its indexes: the
# DDL holds an ACCESS EXCLUSIVE lock until commit, and a rollback restores everything.
REBUILD_MIN_ROWS = 100_000


def _fetch(cur, sql: str) -> list[tuple]:
    cur.execute(sql)
    return list(cur.fetchall())


def _detach_indexes(cur, table: str) -> list[str] | None:
    """Drop ``table``'s indexes and primary/unique constraints; return the DDL that restores them.

    None (nothing dropped) when the table has rows or is referenced by a foreign key.  Takes the
    ACCESS EXCLUSIVE lock first, so two concurrent bulk loads queue instead of deadlocking on a
    lock upgrade.
    """
    cur.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
    if _fetch(cur, f"SELECT 1 FROM {table} LIMIT 1"):
        return None
    if _fetch(cur, f"SELECT 1 FROM pg_constraint WHERE confrelid = '{table}'::regclass"):
        return None
    cons = _fetch(cur, f"""
        SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint
        WHERE conrelid = '{table}'::regclass AND contype IN ('p', 'u') ORDER BY conname""")
    idx = _fetch(cur, f"""
        SELECT c.relname, pg_get_indexdef(x.indexrelid) FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid
        WHERE x.indrelid = '{table}'::regclass
          AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = x.indexrelid)
        ORDER BY c.relname""")
    for name, _ in idx:
        cur.execute(f'DROP INDEX "{name}"')
    for name, _ in cons:
        cur.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
    return [f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {ddl}' for name, ddl in cons] + [ddl for _, ddl in idx]


class BulkLoad:
    """Bulk inserts into one open transaction (``cur``), fed one frame or chunk at a time.

    :meth:`add` stages a frame through ADBC into a temporary table and moves it with one
    ``INSERT … SELECT`` that applies :meth:`Column.cast_sql` (uuid/json as text, embeddings as
    ``list<float32>``).  On a table's first rows, when the table is empty and ``expected_rows``
    (default: the frame's height) reaches ``REBUILD_MIN_ROWS``, its indexes and constraints are
    dropped; :meth:`finish` rebuilds them from their own definitions, once, after the last chunk.
    So a fleet loaded in chunks of scopes (bounded memory) costs one index build per table, as one
    load of the whole table would.  Nobody sees a table without its indexes: the DDL holds an
    ACCESS EXCLUSIVE lock until the transaction ends, and a rollback restores everything.
    """

    def __init__(self, cur):
        self.cur = cur
        self.counts: dict[str, int] = {}
        self._restore: dict[str, list[str]] = {}  # table → DDL that rebuilds what was dropped
        cur.execute("DISCARD TEMP")  # staging tables an earlier load, apply or undo left on this pooled connection
        # The HNSW index over the node vectors is built in memory when its graph fits (a seeded fleet's
        # 300k vectors need ~0.6 GB; past maintenance_work_mem pgvector's build slows several-fold).
        cur.execute("SET LOCAL maintenance_work_mem = '1GB'")

    def add(self, table: str, df: pl.DataFrame, expected_rows: int | None = None) -> int:
        """Insert ``df`` into ``table``; rows inserted."""
        if table not in TABLES:
            raise SeedError(f"load: unknown table {table!r}; Deep Sleep knows {', '.join(TABLES)}")
        self.counts.setdefault(table, 0)
        if df.height == 0:
            return 0
        first = self.counts[table] == 0  # its first rows: whether to detach is decided now
        cur, known = self.cur, columns(table)
        stage_cols, selects = [], []
        for name in df.columns:
            col = known.get(name)
            if name == "embedding" or (col is not None and col.kind == "vector"):
                stage_cols.append(pl.col(name).cast(pl.List(pl.Float32)))
                selects.append(f'"{name}"::real[]::vector')
            else:
                stage_cols.append(pl.col(name))
                selects.append(col.cast_sql(f'"{name}"') if col is not None else f'"{name}"')
        t0 = time.perf_counter()
        stage = f"_ds_seed_{table}"
        data = df.select(stage_cols).to_arrow(compat_level=pl.CompatLevel.oldest())
        cur.adbc_ingest(stage, data, mode="create", temporary=True)
        del data
        t1 = time.perf_counter()
        if first and (expected_rows if expected_rows is not None else df.height) >= REBUILD_MIN_ROWS:
            restore = _detach_indexes(cur, table)
            if restore:
                self._restore[table] = restore
        cols_sql = ", ".join(f'"{c}"' for c in df.columns)
        cur.execute(f'INSERT INTO {table} ({cols_sql}) SELECT {", ".join(selects)} FROM "{stage}"')
        n = cur.rowcount if cur.rowcount is not None and cur.rowcount >= 0 else df.height
        self.counts[table] += n
        cur.execute(f'DROP TABLE "{stage}"')
        log.debug("seed load %s: %d rows, stage %.2fs, insert %.2fs", table, df.height, t1 - t0,
                  time.perf_counter() - t1)
        return n

    def finish(self) -> dict[str, int]:
        """Rebuild every dropped index and constraint; rows inserted per table (every table added)."""
        for table, ddls in self._restore.items():
            t = time.perf_counter()
            for ddl in ddls:
                self.cur.execute(ddl)
            log.debug("seed load %s: index rebuild %.2fs", table, time.perf_counter() - t)
        self._restore.clear()
        return dict(self.counts)


def load(store, frames: dict[str, pl.DataFrame]) -> dict[str, int]:
    """Bulk-insert ``frames`` (as from :func:`generate`) into ``store`` in one transaction
    (:class:`BulkLoad`).  Columns are taken from the frame, so a frame may leave out columns that
    have defaults.  Large loads into empty tables rebuild the indexes afterwards (see
    ``REBUILD_MIN_ROWS``).  Returns rows inserted per table (every table of the input).
    """
    with store.transaction() as cur:
        bulk = BulkLoad(cur)
        for table, df in frames.items():
            bulk.add(table, df)
        return bulk.finish()
