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
from deep_sleep.core.errors import InputError
from deep_sleep.core.scope import Scope
from deep_sleep.core.snapshot import Snapshot, iso, utc
from deep_sleep.store.db import Store
from deep_sleep.store.errors import StoreError

def select_sql(table: str, bounded: bool) -> str:
    """One scope's rows of one table (pure; parameters: $1 scope_path[, $2 log_since]): what the
    benchmarks' COPY baseline reads."""
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


def _begin_snapshot(cur) -> datetime:
    """Make this transaction one consistent, read-only snapshot (its first statement); its start time."""
    cur.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
    cur.execute("SELECT now() AS taken_at")
    return cur.fetch_arrow_table().column(0)[0].as_py()


def extract(store: Store, scope: Scope | str, log_since: datetime | None = None) -> Snapshot:
    """Read one scope consistently: :func:`extract_shard` of a shard of one, as that scope's
    :class:`Snapshot` (``deep-sleep snapshot``; the pipeline takes the shard)."""
    path = Scope.coerce(scope).path
    return extract_shard(store, [path], log_since=log_since).scope(path)


# -- shards: many scopes in one transaction ----------------------------------------------------

# The scope list is joined as a set (unnest), never filtered with ``= ANY($1)``: a bound array
# is not hashed in a generic plan, so ANY compares every row with every scope (hundreds of times
# slower at 2,000 scopes: benchmarks/README.md).
SHARD_LEDGER_SQL = (
    "SELECT scope_path, max(as_of) FILTER (WHERE mode = 'nightly') AS previous, "
    "max(as_of) FILTER (WHERE mode = 'quick_nap') AS nap "
    "FROM consolidation_runs JOIN unnest($1::text[]) AS _s(_path) ON scope_path = _s._path "
    "WHERE status = 'applied' GROUP BY scope_path"
)


def shard_select_sql(table: str) -> str:
    """The shard extract query of one table (pure; $1 the scopes as a text[] literal, and for the
    access log $2 each scope's lower bound as a timestamptz[] literal, null for none)."""
    cols = ", ".join(c.select_sql for c in tables.TABLES[table])
    if table == "memory_access_log":
        return (f"SELECT {cols} FROM {table} JOIN unnest($1::text[], $2::timestamptz[]) AS _s(_path, _since) "
                f"ON scope_path = _s._path WHERE _s._since IS NULL OR accessed_at > _s._since")
    return f"SELECT {cols} FROM {table} JOIN unnest($1::text[]) AS _s(_path) ON scope_path = _s._path"


def pg_array(values: list[str | None]) -> str:
    """A PostgreSQL array literal of text values (``NULL`` for None), for one bound parameter."""
    def one(v: str | None) -> str:
        return "NULL" if v is None else '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return "{" + ",".join(one(v) for v in values) + "}"


def extract_shard(store: Store, scopes: list[Scope | str], log_since: datetime | None = None):
    """Read many scopes consistently: one ``REPEATABLE READ`` transaction, each table read once.

    Per scope, the previous applied nightly run's ``as_of`` and the access-log floor (its latest
    applied quick nap, or ``log_since``) come from one ledger query, exactly as :func:`extract`
    takes them for one scope.  Returns a :class:`~deep_sleep.core.shard.Shard` (rows sorted by scope)."""
    from deep_sleep.core.shard import Shard

    paths = sorted({Scope.coerce(s).path for s in scopes}, key=str.encode)
    if not paths:
        raise InputError("extract_shard: no scopes given")
    literal = pg_array(paths)
    with store.adbc() as con:
        cur = con.cursor()
        try:
            taken_at = _begin_snapshot(cur)
            cur.execute(SHARD_LEDGER_SQL, parameters=(literal,))
            ledger = {r["scope_path"]: r for r in cur.fetch_arrow_table().to_pylist()}
            previous = {p: (utc(ledger[p]["previous"]) if p in ledger and ledger[p]["previous"] else None) for p in paths}
            since = []
            for p in paths:
                floors = [utc(t) for t in (log_since, ledger.get(p, {}).get("nap")) if t is not None]
                since.append(iso(max(floors)) if floors else None)
            frames = {}
            for table in tables.TABLES:
                params = (literal, pg_array(since)) if table == "memory_access_log" else (literal,)
                cur.execute(shard_select_sql(table), parameters=params)
                frames[table] = _to_polars(table, cur.fetch_arrow_table())
        finally:
            con.rollback()
            cur.close()
    return Shard.from_frames(previous, utc(taken_at), frames)
