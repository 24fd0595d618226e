"""One in-memory DuckDB connection per thread, for the few transforms written in SQL.

Opening a DuckDB connection costs ~10 ms; a nightly run over hundreds of small scopes would pay
it per table and phase.  Connections are not shared across threads (DuckDB connections are not
thread-safe), and every caller registers its frames under unique names and unregisters them.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Iterator

import duckdb

_local = threading.local()
_names = itertools.count()


def connection() -> duckdb.DuckDBPyConnection:
    con = getattr(_local, "con", None)
    if con is None:
        con = _local.con = duckdb.connect()
    return con


@contextlib.contextmanager
def registered(frame) -> Iterator[tuple[duckdb.DuckDBPyConnection, str]]:
    """``(connection, view name)`` of ``frame`` (Arrow or Polars) for the duration of the block."""
    con = connection()
    name = f"_ds_frame_{next(_names)}"
    con.register(name, frame)
    try:
        yield con, name
    finally:
        con.unregister(name)
