"""Extract one scope into a :class:`Snapshot`: one ``REPEATABLE READ, READ ONLY`` transaction, ADBC → Arrow.

Rows are read by exact ``scope_path = $1`` (SPEC §1: consolidation is partitioned by exact
scope).  The append-only access log is read from ``log_since`` on (the earliest window start
any phase can ask for), and never from before the scope's latest applied quick nap (which
counted the events up to its ``as_of``); every other table is read whole.
"""

from __future__ import annotations

from datetime import datetime

import numpy as np
import polars as pl
import pyarrow as pa

from deep_sleep.core import tables
from deep_sleep.core.scope import Scope
from deep_sleep.core.snapshot import Snapshot, utc
from deep_sleep.store.db import Store
from deep_sleep.store.errors import StoreError

NAP_FLOOR_SQL = (
    "SELECT max(as_of) AS as_of FROM consolidation_runs WHERE scope_path = $1 AND status = 'applied' AND mode = 'quick_nap'"
)
PREVIOUS_RUN_SQL = (
    "SELECT max(as_of) AS as_of FROM consolidation_runs WHERE scope_path = $1 AND status = 'applied' AND mode = 'nightly'"
)


def select_sql(table: str, bounded: bool) -> str:
    """The extract query of one table (pure; parameters: $1 scope_path[, $2 log_since])."""
    cols = ", ".join(c.select_sql for c in tables.TABLES[table])
    where = "scope_path = $1"
    if bounded and table == "memory_access_log":
        where += " AND accessed_at > $2"
    return f"SELECT {cols} FROM {table} WHERE {where}"


def decode_vectors(column: pa.ChunkedArray | pa.Array, dim: int = tables.EMBEDDING_DIM) -> pa.Array:
    """pgvector's binary send format (int16 dim, int16 unused, big-endian float32s) → fixed_size_list<float32>."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if isinstance(arr, pa.ExtensionArray):
        arr = arr.storage
    n = len(arr)
    out_type = pa.list_(pa.float32(), dim)
    if n == 0:
        return pa.array([], type=out_type)
    valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset : arr.offset + n + 1]
    raw = np.frombuffer(arr.buffers()[2], dtype=np.uint8) if arr.buffers()[2] is not None else np.empty(0, np.uint8)
    values = np.zeros((n, dim), dtype=np.float32)
    if valid.any():
        lengths = offsets[1:] - offsets[:-1]
        if np.any(lengths[valid] != 4 + 4 * dim):
            bad = int(np.flatnonzero(valid & (lengths != 4 + 4 * dim))[0])
            raise StoreError(f"memory vectors: row {bad}: vector has {(lengths[bad] - 4) // 4} dimensions, expected {dim}")
        idx = offsets[:-1][valid][:, None] + 4 + np.arange(4 * dim)
        values[valid] = raw[idx].view(">f4").reshape(-1, dim).astype(np.float32)
    flat = pa.array(values.reshape(-1), type=pa.float32())
    return pa.FixedSizeListArray.from_arrays(flat, dim, mask=pa.array(~valid))


def _to_polars(table: str, arrow: pa.Table) -> pl.DataFrame:
    cols = {}
    for col in tables.TABLES[table]:
        data = arrow.column(col.name)
        if col.kind == "vector":
            data = decode_vectors(data)
        cols[col.name] = data
    frame = pl.from_arrow(pa.table(cols), rechunk=True)
    return tables.conform(table, frame)


def extract(store: Store, scope: Scope | str, log_since: datetime | None = None) -> Snapshot:
    """Read one scope consistently.  ``taken_at`` is the store's transaction start time."""
    scope = Scope.coerce(scope)
    with store.adbc() as con:
        cur = con.cursor()
        try:
            cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
            cur.execute("SELECT now() AS taken_at")
            taken_at = cur.fetch_arrow_table().column(0)[0].as_py()
            cur.execute(PREVIOUS_RUN_SQL, parameters=(scope.path,))
            previous = cur.fetch_arrow_table().column(0)[0].as_py()
            # Access events a quick nap already counted are not counted again by the nightly.
            cur.execute(NAP_FLOOR_SQL, parameters=(scope.path,))
            nap = cur.fetch_arrow_table().column(0)[0].as_py()
            floors = [utc(t) for t in (log_since, nap) if t is not None]
            since = max(floors) if floors else None
            frames = {}
            for table in tables.TABLES:
                bounded = since is not None
                params = (scope.path, since) if bounded and table == "memory_access_log" else (scope.path,)
                cur.execute(select_sql(table, bounded), parameters=params)
                frames[table] = _to_polars(table, cur.fetch_arrow_table())
        finally:
            con.rollback()
            cur.close()
    return Snapshot(
        scope_path=scope.path,
        taken_at=utc(taken_at),
        previous_run_as_of=utc(previous) if previous else None,
        frames=frames,
    )
