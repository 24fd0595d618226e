"""The psycopg plumbing the online calls share: per-thread connections, one-round-trip
transactions, the scope-visibility predicate, pgvector's text form.

Every online call takes a :class:`~deep_sleep.store.db.Store` (a per-thread connection to its DSN
is opened once and reused) or an open ``psycopg.Connection`` (used as is; if it is already inside a
transaction, our work joins it as a savepoint and the caller commits).
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import psycopg

from deep_sleep.core.embedding import EmbeddingProvider, as_provider, embedder_for
from deep_sleep.core.errors import InputError
from deep_sleep.core.rank import SEED_PER_K
from deep_sleep.online.errors import OnlineArgumentError, OnlineArgumentTypeError
from deep_sleep.store.db import Store
from deep_sleep.store.vectors import STORE_MODEL_SQL, model_conflict

__all__ = ["MAX_K", "checked_embedder", "connection", "dumps", "pipelined_transaction", "store_model", "store_of",
           "vector_text", "visible"]

#: pgvector's ``hnsw.ef_search`` takes at most this many candidates.
HNSW_EF_SEARCH_MAX = 1000
#: The most hits a recall may ask for: each order takes ``n_seeds(k)`` candidates, at most what HNSW searches.
MAX_K = HNSW_EF_SEARCH_MAX // SEED_PER_K
#: A tenant's model, once seen equal to a call's, is not read again for this long (only ``deep-sleep reembed``
#: changes it; a recall that meets another model's vectors meanwhile still refuses them, row by row).
MODEL_CHECK_SECONDS = 30.0
_seen: dict[tuple[str, str, str], float] = {}

_local = threading.local()


def _pg(dsn: str) -> psycopg.Connection:
    """This thread's connection to ``dsn``, opened on first use and reopened if it broke."""
    cache = _local.__dict__.setdefault("pg", {})
    conn = cache.get(dsn)
    if conn is None or conn.closed or conn.broken:
        conn = cache[dsn] = psycopg.connect(dsn)
    elif conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
        conn.rollback()
    return conn


@contextlib.contextmanager
def connection(target: Store | psycopg.Connection) -> Iterator[psycopg.Connection]:
    """The connection to work on: ``target`` itself, or this thread's connection to the store."""
    if isinstance(target, psycopg.Connection):
        yield target
    elif isinstance(target, Store):
        yield _pg(target.dsn)
    else:
        raise OnlineArgumentTypeError(
            f"expected a deep_sleep.store.db.Store or a psycopg.Connection, got {type(target).__name__}")


@contextlib.contextmanager
def pipelined_transaction(conn: psycopg.Connection) -> Iterator[None]:
    """One transaction in pipeline mode, in as few round trips as the block's reads allow.

    ``with conn.pipeline(), conn.transaction():`` costs three round trips more than it needs:
    psycopg syncs right after ``BEGIN`` (to learn the transaction status), and it nests two more
    pipelines whose exits each sync, before and after ``COMMIT``.  On a connection that is idle
    and not already pipelined, this sends ``BEGIN`` and ``COMMIT`` itself as ordinary pipelined
    statements (the connection is switched to autocommit for the block, so psycopg adds no
    ``BEGIN`` of its own; it is switched back after), so ``BEGIN`` travels with the first reads
    and ``COMMIT`` with the writes.  The transaction is the same: one explicit ``BEGIN … COMMIT``
    block, committed durably unless the block asked otherwise (``SET LOCAL``).  Any error rolls
    it back and is raised, as ``conn.transaction()`` does.  Inside the caller's transaction (the
    work must be a savepoint) or in a caller's pipeline it is ``conn.pipeline()`` +
    ``conn.transaction()`` as before; so it is on a connection with its own isolation level,
    read-only or deferrable setting (psycopg's ``BEGIN`` carries them).
    """
    if (conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE
            or conn.pgconn.pipeline_status != psycopg.pq.PipelineStatus.OFF
            or (conn.isolation_level, conn.read_only, conn.deferrable) != (None, None, None)):  # psycopg's BEGIN says more
        with conn.pipeline(), conn.transaction():
            yield
        return
    autocommit = conn.autocommit
    conn.autocommit = True
    try:
        with conn.pipeline():
            conn.execute("BEGIN")
            yield
            conn.execute("COMMIT")
    except BaseException:
        if not conn.closed and conn.info.transaction_status != psycopg.pq.TransactionStatus.IDLE:
            conn.execute("ROLLBACK")
        raise
    finally:
        if not conn.closed and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE:
            conn.autocommit = autocommit


def store_of(target: Store | psycopg.Connection) -> Store:
    """The store behind ``target`` (the quick nap's apply talks ADBC; Store.adbc pools per thread)."""
    if isinstance(target, Store):
        return target
    info = target.info
    params = info.get_parameters()
    if info.password:
        params["password"] = info.password
    return Store(psycopg.conninfo.make_conninfo(**params))


def visible(alias: str, legacy: bool, paths: str = "%(paths)s", tenant: str = "%(tenant)s") -> str:
    """Prefix isolation: the row's path is one of the reader's ancestor paths (exact ``= ANY``).
    A ``tenant/<id>``-rooted reader also sees that tenant's legacy rows (``scope_path IS NULL``)."""
    clause = f"{alias}.scope_path = ANY({paths})"
    return f"({clause} OR ({alias}.scope_path IS NULL AND {alias}.tenant_id = {tenant}))" if legacy else clause


def dumps(value: Any) -> str:
    """Compact JSON for a ``jsonb`` parameter (values were checked finite by the op models)."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":"))


def vector_text(row: np.ndarray) -> str | None:
    """pgvector's text form, or None for an all-zero row (nothing to embed: cosine is undefined)."""
    if not row.any():
        return None
    return "[" + ",".join(map(repr, row.tolist())) + "]"


def store_model(target: Store | psycopg.Connection, tenant: str) -> str | None:
    """The embedding model the store records for ``tenant`` (``embedding_models``), None while it holds no
    vector.  A read of its own: on an idle connection the transaction it opens is ended; in the caller's
    transaction it joins it."""
    with connection(target) as conn:
        idle = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE and not conn.autocommit
        row = conn.execute(STORE_MODEL_SQL, (tenant,)).fetchone()
        if idle:
            conn.rollback()
    return row[0] if row else None


def checked_embedder(target: Store | psycopg.Connection, embedder: EmbeddingProvider | str | None, config,
                     call: str, tenant: str) -> EmbeddingProvider:
    """The embedder of an online call — ``embedder`` (a provider, or a name as ``embedding.model`` takes
    it) or the configuration's — once it is known to be the model the store records for ``tenant``:
    anything that is no embedder is an :class:`OnlineArgumentError` naming ``call``, another model
    than the tenant's an :class:`~deep_sleep.core.embedding.EmbeddingModelError`."""
    try:
        provider = embedder_for(config) if embedder is None else as_provider(embedder, "embedder")
    except InputError as exc:
        raise OnlineArgumentError(f"{call}: {exc}") from None
    key = (target.dsn, tenant, provider.name) if isinstance(target, Store) else None
    if key is not None and time.monotonic() - _seen.get(key, -MODEL_CHECK_SECONDS) < MODEL_CHECK_SECONDS:
        return provider
    stored = store_model(target, tenant)
    if stored is not None and stored != provider.name:
        raise model_conflict(stored, provider.name, call, tenant)
    if key is not None and stored is not None:
        _seen[key] = time.monotonic()
    return provider
