"""The node embeddings the recall-quality gate replays queries against (:mod:`deep_sleep.run.gate`).

Snapshots leave embeddings in Postgres (a million nodes' vectors would be most of the bytes moved
by every extract, and no phase reads them); the gate, which needs them, reads them here in one
statement, ADBC → Arrow, pgvector's binary form decoded as the extract decodes vectors.  Only
nodes with an embedding are returned.  The read is its own transaction, after the extract: a node
inserted since is not in the snapshot and so is never replayed; an embedding rewritten since by a
live turn is read as it is now (the same text re-embedded, in practice).

The decode takes a fast path when it can (:func:`decode_contiguous`): pgvector's binary values of
one dimension lie back to back in the Arrow buffer, so they are one strided view, byte-swapped in
one pass, where :func:`deep_sleep.store.extract.decode_vectors` (the fallback, and the reference
the fast path is tested against) gathers through an index array of ``4 × dim`` offsets a row
(~8 KB a row: 780 MB of indexes for 95k vectors).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import polars as pl
import pyarrow as pa

from deep_sleep.core.embedding import EmbeddingModelError
from deep_sleep.core.scope import Scope
from deep_sleep.core.tables import EMBEDDING_DIM
from deep_sleep.store.db import Store
from deep_sleep.store.extract import decode_vectors, pg_array

__all__ = ["CLAIM_MODEL_SQL", "NODE_EMBEDDINGS_SQL", "SET_MODEL_SQL", "STORE_MODEL_SQL", "claim_models", "decode_contiguous",
           "foreign_models", "model_conflict", "node_embeddings"]

NODE_EMBEDDINGS_SQL = (
    "SELECT n.id::text AS id, n.embedding, n.scope_path, n.embedding_model FROM memory_nodes n"
    " JOIN unnest($1::text[]) AS _s(_path) ON n.scope_path = _s._path WHERE n.embedding IS NOT NULL"
)


def node_embeddings(store: Store, scopes: Iterable[Scope | str]) -> pl.DataFrame:
    """(id, embedding fixed-size float32 list, scope_path, embedding_model) of every node with an
    embedding in exactly these scopes."""
    paths = sorted({Scope.coerce(s).path for s in scopes}, key=str.encode)
    with store.adbc() as con:
        cur = con.cursor()
        try:
            cur.execute(NODE_EMBEDDINGS_SQL, parameters=(pg_array(paths),))
            arrow = cur.fetch_arrow_table()
        finally:
            con.rollback()
            cur.close()
    column = arrow.column("embedding")
    vectors = decode_contiguous(column, EMBEDDING_DIM)
    if vectors is None:
        vectors = decode_vectors(column, EMBEDDING_DIM)
    table = pa.table({"id": arrow.column("id"), "embedding": vectors, "scope_path": arrow.column("scope_path"),
                      "embedding_model": arrow.column("embedding_model")})
    return pl.from_arrow(table, rechunk=True)


def decode_contiguous(column: pa.ChunkedArray | pa.Array, dim: int = EMBEDDING_DIM) -> pa.Array | None:
    """pgvector's binary values (int16 dim, int16 unused, ``dim`` big-endian float32s) →
    fixed_size_list<float32>, when every value is non-null and exactly ``4 + 4 × dim`` bytes, back
    to back (what a query with ``embedding IS NOT NULL`` returns); None otherwise (the caller falls
    back to :func:`deep_sleep.store.extract.decode_vectors`, which also names a bad value)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if isinstance(arr, pa.ExtensionArray):
        arr = arr.storage
    n, width = len(arr), 4 + 4 * dim
    if n == 0 or arr.null_count or not pa.types.is_binary(arr.type) or arr.buffers()[2] is None:
        return None
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int32)[arr.offset : arr.offset + n + 1]
    if not np.array_equal(np.diff(offsets), np.full(n, width, dtype=np.int32)):
        return None
    raw = np.frombuffer(arr.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[0] + n * width].reshape(n, width)
    values = raw[:, 4:].view(">f4").astype(np.float32)  # one pass: the byte swap into a new contiguous array
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1), type=pa.float32()), dim)


def foreign_models(store: Store, scopes: Iterable[Scope | str], model: str) -> dict[str, list[str]]:
    """Scope path → the other models (sorted) whose vectors its nodes hold, for the scopes that hold any
    vector ``model`` did not make.  (The Gate stage reads them from :func:`node_embeddings` when the
    gate runs; this query is for a night without the gate.)"""
    paths = sorted({Scope.coerce(s).path for s in scopes}, key=str.encode)
    with store.pg() as con:
        rows = con.execute(
            "SELECT scope_path, array_agg(DISTINCT embedding_model ORDER BY embedding_model) FROM memory_nodes"
            " WHERE scope_path = ANY(%s) AND embedding IS NOT NULL AND embedding_model IS DISTINCT FROM %s"
            " AND embedding_model IS NOT NULL GROUP BY scope_path", (paths, model)).fetchall()
    return {path: list(models) for path, models in rows}


# -- each tenant's embedding model (embedding_models, migration 029) ------------------------------
#: The model of the vectors a tenant holds, as the store records it (psycopg parameters: tenant_id).
STORE_MODEL_SQL = "SELECT model FROM embedding_models WHERE tenant_id = %s"
#: Claim it for a tenant that has none yet (parameters: tenant_id, model); of two first writers one wins.
CLAIM_MODEL_SQL = "INSERT INTO embedding_models (tenant_id, model) VALUES (%s, %s) ON CONFLICT (tenant_id) DO NOTHING"
_CLAIM_MANY_SQL = ("INSERT INTO embedding_models (tenant_id, model) SELECT t, m FROM unnest($1::text[], $2::text[]) AS x(t, m)"
                   " ON CONFLICT (tenant_id) DO NOTHING")
_MODELS_SQL = "SELECT tenant_id, model FROM embedding_models WHERE tenant_id = ANY($1::text[])"
#: Set it (parameters: tenant_id, model): ``deep-sleep reembed``.
SET_MODEL_SQL = ("INSERT INTO embedding_models (tenant_id, model) VALUES (%s, %s)"
                 " ON CONFLICT (tenant_id) DO UPDATE SET model = EXCLUDED.model, updated_at = now()")


def model_conflict(stored: str, model: str, what: str, tenant: str) -> EmbeddingModelError:
    """The error of a writer or reader whose embedder is not the tenant's (``what`` names the call)."""
    return EmbeddingModelError(
        f"{what}: tenant {tenant!r} holds vectors of model {stored} (embedding_models) and {what} embeds with {model}; "
        f"vectors of two models cannot be compared, so nothing was stored. Use the tenant's model (embedding.model, "
        f"or the embedder passed), or switch the tenant to {model} with `deep-sleep reembed`, which re-embeds its vectors")


def claim_models(store: Store, wanted: dict[str, str]) -> dict[str, str]:
    """Tenant → its recorded model, for the tenants of ``wanted`` (tenant → the model a writer would
    write), each set to the wanted model if it had none.  One short ADBC transaction reads them; only
    when a tenant has none yet, two more claim it and read again (a claim another writer made first
    is read, not overwritten)."""
    tenants = sorted(wanted)
    with store.transaction() as cur:
        cur.execute(_MODELS_SQL, parameters=(tenants,))
        found = dict(cur.fetchall())
    if len(found) == len(tenants):
        return found
    with store.transaction() as cur:
        cur.execute(_CLAIM_MANY_SQL, parameters=(tenants, [wanted[t] for t in tenants]))
    with store.transaction() as cur:
        cur.execute(_MODELS_SQL, parameters=(tenants,))
        return dict(cur.fetchall())
