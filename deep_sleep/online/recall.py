"""Recall and feedback (SPEC §5): the nodes a query finds in a scope, logged for training, and
the conversation's verdict on them.

    >>> hits = recall(store, scope, "who is Ada?"); feedback(store, hits[0].recall_id, used=True)   # doctest: +SKIP
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

import psycopg

from deep_sleep.core.embedding import EmbeddingProvider, default_embedder, well_formed
from deep_sleep.core.scope import Scope
from deep_sleep.core.snapshot import utc
from deep_sleep.online import reranker
from deep_sleep.online.errors import OnlineArgumentError, OnlineArgumentTypeError
from deep_sleep.online.ops import MAX_TEXT_CHARS
from deep_sleep.online.pg import connection, pipelined_transaction, vector_text, visible
from deep_sleep.store.db import Store
from deep_sleep.transforms.label_recalls import query_words

__all__ = ["Hit", "candidates_sql", "feedback", "recall"]

SEED_MIN = 20
FAN_OUT = 8


@dataclass(frozen=True)
class Hit:
    """One recalled node: ``score = base + adjustment`` (see :func:`recall`); ``recall_id`` is the
    ``recall_events`` row to give :func:`feedback`; ``via`` the top hit it was reached from, if
    it came by spreading activation."""

    recall_id: str
    node_id: str
    scope_path: str | None
    layer: str
    label: str
    similarity: float
    score: float
    features: tuple[float, ...]
    via: str | None = None


# Recall's log is training telemetry: it may lose its last fraction of a second in a server crash
# rather than wait for a WAL flush on every query (synchronous_commit = off, this transaction only).
_SETTINGS_SQL = (
    "SELECT set_config('hnsw.ef_search', %s, true), set_config('hnsw.iterative_scan', 'relaxed_order', true),"
    " set_config('synchronous_commit', 'off', true)"
)
_MODEL_SQL = "SELECT weights, bias FROM reranker_models WHERE scope_path = %s AND tenant_id = %s"


@lru_cache(maxsize=2)
def candidates_sql(legacy: bool) -> str:
    """The candidate query: the nearest nodes, one hop of spreading activation from the top ones,
    each with its capped degree (``legacy``: the reader also sees its tenant's legacy rows)."""
    n, e = visible("n", legacy), visible("e", legacy)
    return f"""
WITH seed AS (
    SELECT n.id, n.scope_path, n.layer, n.label, n.importance, n.access_count, n.updated_at,
           n.embedding <=> %(q)s::vector AS dist
    FROM memory_nodes n
    WHERE {n} AND n.embedding IS NOT NULL
    ORDER BY n.embedding <=> %(q)s::vector
    LIMIT %(n_seed)s
),
top AS (SELECT id FROM seed ORDER BY dist, id LIMIT %(n_top)s),
hop AS (
    SELECT h.id, h.via, h.weight FROM top t CROSS JOIN LATERAL (
        (SELECT e.target_id AS id, t.id AS via, e.weight FROM memory_edges e
          WHERE e.source_id = t.id AND {e} AND e.valid_to IS NULL ORDER BY e.weight DESC, e.target_id LIMIT %(fan)s)
        UNION ALL
        (SELECT e.source_id, t.id, e.weight FROM memory_edges e
          WHERE e.target_id = t.id AND {e} AND e.valid_to IS NULL ORDER BY e.weight DESC, e.source_id LIMIT %(fan)s)
    ) h
),
nb AS (
    SELECT DISTINCT ON (h.id) h.id, h.via, h.weight FROM hop h
    WHERE h.id NOT IN (SELECT id FROM seed) ORDER BY h.id, h.weight DESC, h.via
),
cand AS (
    SELECT s.*, NULL::uuid AS via, NULL::float8 AS weight FROM seed s
    UNION ALL
    SELECT n.id, n.scope_path, n.layer, n.label, n.importance, n.access_count, n.updated_at,
           n.embedding <=> %(q)s::vector, nb.via, nb.weight
    FROM nb JOIN memory_nodes n ON n.id = nb.id WHERE {n}
)
SELECT c.id::text, c.scope_path, c.layer, c.label, c.importance, c.access_count, c.updated_at, c.dist, c.via::text, c.weight,
       (SELECT count(*) FROM (SELECT 1 FROM memory_edges e WHERE e.source_id = c.id AND {e} AND e.valid_to IS NULL LIMIT %(deg)s) a)
     + (SELECT count(*) FROM (SELECT 1 FROM memory_edges e WHERE e.target_id = c.id AND {e} AND e.valid_to IS NULL LIMIT %(deg)s) b)
FROM cand c"""


def recall(
    store_or_conn: Store | psycopg.Connection,
    scope: Scope | str,
    query: str,
    k: int = 5,
    *,
    now: datetime | None = None,
    embedder: EmbeddingProvider | None = None,
) -> list[Hit]:
    """The ``k`` best nodes for ``query`` visible from ``scope``, each logged to ``recall_events``.

    Candidates: the ``max(4k, 20)`` nearest nodes by cosine distance among rows whose
    ``scope_path = ANY(scope.ancestor_paths())`` (HNSW index, ``ORDER BY embedding <=> q``,
    iterative scan so a small scope among many still fills its quota), plus one hop of
    spreading activation: up to 8 current edges each way (highest weight first) of each of the
    ``k`` nearest, to neighbours in the same visible paths.

    Score: ``base + clip(w · x + b, −0.25, +0.25)`` where ``base`` is the similarity (for a
    neighbour, the larger of its own similarity and its spread) and ``w, b`` are the scope's
    ``reranker_models`` row (none yet: no adjustment).  ``x`` are the 12
    :data:`~deep_sleep.online.reranker.FEATURES`.  Ties go to the higher similarity, then the
    smaller id.

    One statement logs the returned hits: a ``recall_events`` row each (query, node, similarity,
    features, score; unlabelled) and a ``memory_access_log`` ``read`` row each, under the node's
    own scope path — a recalled node was read, and phase 1 counts reads.  Node rows are not
    touched (no version bump: a recall never makes a consolidation run conflict).
    The query is logged as given, less NUL characters, cut at :data:`MAX_TEXT_CHARS`, with any lone
    surrogate replaced by U+FFFD (PostgreSQL cannot store one).
    """
    scope = Scope.coerce(scope)
    if not isinstance(query, str):
        raise OnlineArgumentTypeError(f"recall: query must be a string, got {type(query).__name__}")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise OnlineArgumentError(f"recall: k must be a positive integer, got {k!r}")
    query = well_formed(query.replace("\x00", "")[:MAX_TEXT_CHARS])
    now = utc(now or datetime.now(UTC))
    embedder = embedder or default_embedder()
    qvec = vector_text(embedder.embed([query])[0])
    if qvec is None:
        return []
    legacy = scope.levels[0][0] == "tenant"
    n_seed = max(4 * k, SEED_MIN)
    words = set(query_words(query))
    # Pipeline mode: BEGIN, settings, model and candidates in one round trip; the log and COMMIT in one more.
    with connection(store_or_conn) as conn, pipelined_transaction(conn):
        cur, model_cur = conn.cursor(), conn.cursor()
        cur.execute(_SETTINGS_SQL, (str(max(40, n_seed)),))
        model_cur.execute(_MODEL_SQL, (scope.path, scope.tenant_id))
        cur.execute(candidates_sql(legacy), {
            "q": qvec, "paths": scope.ancestor_paths(), "tenant": scope.tenant_id,
            "n_seed": n_seed, "n_top": k, "fan": FAN_OUT, "deg": reranker.DEGREE_LIMIT,
        })
        rows = cur.fetchall()
        weights, bias = reranker.model(model_cur.fetchone())
        if not rows:
            return []
        seed_sim = {r[0]: 1.0 - r[7] for r in rows if r[8] is None}
        scored = [reranker.candidate(row, seed_sim, scope, now, words) for row in rows]
        hits = [Hit(str(uuid.uuid4()), nid, spath, layer, label, sim, score, tuple(float(v) for v in x), via)
                for score, sim, nid, spath, layer, label, x, via in reranker.rank(scored, weights, bias, k)]
        values = ", ".join(["(%s::uuid, %s, %s, %s, %s::uuid, %s, %s::float8[], %s, %s)"] * len(hits))
        reads = ", ".join(["(%s, %s, %s::uuid, %s, 'read')"] * len(hits))
        params: list[Any] = []
        for h in hits:
            params += [h.recall_id, scope.path, scope.tenant_id, query, h.node_id, h.similarity, list(h.features), h.score, now]
        for h in hits:
            params += [h.scope_path, scope.tenant_id, h.node_id, now]
        cur.execute(
            f"WITH logged AS (INSERT INTO recall_events (id, scope_path, tenant_id, query, node_id, similarity, features, score,"
            f" created_at) VALUES {values} RETURNING 1)"
            f" INSERT INTO memory_access_log (scope_path, tenant_id, node_id, accessed_at, kind) VALUES {reads}",
            params,
        )
    return hits


def feedback(store_or_conn: Store | psycopg.Connection, recall_id: str, used: bool) -> bool:
    """Label a recall explicitly: 1.0 if the conversation used the hit, 0.0 if it ignored it
    (``label_source = "explicit"``; phase D2 never overwrites it, phase D3 weighs it double).
    Clears ``trained_at`` so the next training step learns from the new label.  Returns whether
    the recall exists."""
    if not isinstance(used, bool):
        raise OnlineArgumentTypeError(f"feedback: used must be True or False, got {used!r}")
    try:
        rid = str(uuid.UUID(str(recall_id)))
    except ValueError:
        raise OnlineArgumentError(f"feedback: recall_id must be a UUID, got {str(recall_id)[:40]!r}") from None
    with connection(store_or_conn) as conn, conn.transaction():
        row = conn.execute(
            "UPDATE recall_events SET label = %s, label_source = 'explicit', trained_at = NULL WHERE id = %s::uuid RETURNING 1",
            (1.0 if used else 0.0, rid),
        ).fetchone()
    return row is not None
