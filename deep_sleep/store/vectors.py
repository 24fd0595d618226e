"""The node embeddings the recall-quality gate replays queries against (:mod:`deep_sleep.run.gate`).

Snapshots leave embeddings in Postgres (a million nodes' vectors would be most of the bytes moved
by every extract, and no phase reads them); the gate, which needs them, reads them here in one
statement, ADBC → Arrow, pgvector's binary form decoded as the extract decodes vectors.  Only
nodes with an embedding are returned.  The read is its own transaction, after the extract: a node
inserted since is not in the snapshot and so is never replayed; an embedding rewritten since by a
live turn is read as it is now (the same text re-embedded, in practice).
"""

from __future__ import annotations

from collections.abc import Iterable

import polars as pl
import pyarrow as pa

from deep_sleep.core.scope import Scope
from deep_sleep.core.tables import EMBEDDING_DIM
from deep_sleep.store.db import Store
from deep_sleep.store.extract import decode_vectors, pg_array

__all__ = ["NODE_EMBEDDINGS_SQL", "node_embeddings"]

NODE_EMBEDDINGS_SQL = (
    "SELECT n.id::text AS id, n.embedding FROM memory_nodes n JOIN unnest($1::text[]) AS _s(_path)"
    " ON n.scope_path = _s._path WHERE n.embedding IS NOT NULL"
)


def node_embeddings(store: Store, scopes: Iterable[Scope | str]) -> pl.DataFrame:
    """(id, embedding fixed-size float32 list) of every node with an embedding in exactly these scopes."""
    paths = sorted({Scope.coerce(s).path for s in scopes}, key=str.encode)
    with store.adbc() as con:
        cur = con.cursor()
        try:
            cur.execute(NODE_EMBEDDINGS_SQL, parameters=(pg_array(paths),))
            arrow = cur.fetch_arrow_table()
        finally:
            con.rollback()
            cur.close()
    table = pa.table({"id": arrow.column("id"), "embedding": decode_vectors(arrow.column("embedding"), EMBEDDING_DIM)})
    return pl.from_arrow(table, rechunk=True)
