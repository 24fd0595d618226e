"""Recall and feedback (SPEC §5): what a query finds of everything a scope remembers — semantic
nodes (the summaries and clusters consolidation writes among them) and episodic events — logged
for training, and the conversation's verdict on it.

    >>> hits = recall(store, scope, "who is Ada?"); feedback(store, hits[0].recall_id, used=True)   # doctest: +SKIP
    >>> hits[0].kind, hits[0].source_ids                                                          # doctest: +SKIP
    ('summary', ('7c9e…', '0b1f…', …))
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

import psycopg

from deep_sleep.core.embedding import EmbeddingModelError, EmbeddingProvider, well_formed
from deep_sleep.core.rank import FAN_OUT, n_seeds
from deep_sleep.core.scope import Scope
from deep_sleep.core.snapshot import utc
from deep_sleep.online import reranker
from deep_sleep.online.errors import OnlineArgumentError, OnlineArgumentTypeError
from deep_sleep.online.ops import MAX_TEXT_CHARS
from deep_sleep.online.pg import MAX_K, checked_embedder, connection, pipelined_transaction, vector_text, visible
from deep_sleep.store.db import Store
from deep_sleep.transforms.label_recalls import query_words

__all__ = ["Hit", "candidates_sql", "feedback", "recall"]

#: An event candidate's text is cut here for the features and the hit (a turn's content is short; an
#: event may hold 16,000 characters).
EVENT_TEXT_CHARS = 2000
SUMMARY_LABEL = "META:episodic_summary"
#: Document frequencies (and the scope's document count) are counted up to here: a word in more
#: memories than this is common whatever the exact count, and the count stays bounded in a big scope.
DF_CAP = 5000
#: The words of a query that word matching uses (the first ones): a live turn's text may be long, and
#: each word costs a test per matching row.
MAX_WORDS = 24


@dataclass(frozen=True)
class Hit:
    """One recalled memory: ``score = base + adjustment`` (see :func:`recall`); ``recall_id`` is the
    ``recall_events`` row to give :func:`feedback`.

    kind: ``node`` (a semantic or working-memory node), ``summary`` (a ``META:episodic_summary`` node:
        consolidated episodic events), ``cluster`` (another ``META:`` node) or ``event`` (an episodic
        event).
    node_id: the node's or the event's id.  label: a node's label, an event's content (cut at
        :data:`EVENT_TEXT_CHARS`).  text: what the memory says — a node's label, a summary's or a
        cluster's ``properties.summary``, an event's content.
    properties: a node's properties or an event's metadata (a summary's without its text, which is
        ``text``).  source_ids: where it came from without SQL — a summary's source events, a cluster's
        members (the nodes its ``CLUSTERS`` edges reach, which its text names), an event's own id, none
        for a node.  via: the top hit a node was reached from by spreading activation.
    """

    recall_id: str
    node_id: str
    scope_path: str | None
    layer: str
    label: str
    similarity: float
    score: float
    features: tuple[float, ...]
    via: str | None = None
    kind: str = "node"
    text: str = ""
    properties: dict[str, Any] | None = None
    source_ids: tuple[str, ...] = ()


# Recall's log is training telemetry: it may lose its last fraction of a second in a server crash
# rather than wait for a WAL flush on every query (synchronous_commit = off, this transaction only).
_SETTINGS_SQL = (
    "SELECT set_config('hnsw.ef_search', %s, true), set_config('hnsw.iterative_scan', 'relaxed_order', true),"
    " set_config('synchronous_commit', 'off', true)"
)
_MODEL_SQL = "SELECT weights, bias FROM reranker_models WHERE scope_path = %s AND tenant_id = %s"
#: A META hit's text, and a cluster's members (its current ``CLUSTERS`` edges: the members its text names).
_TEXTS_SQL = (
    "SELECT n.id::text, n.properties->>'summary', CASE WHEN n.label <> %s THEN ARRAY(SELECT e.target_id::text"
    " FROM memory_edges e WHERE e.source_id = n.id AND e.scope_path = n.scope_path AND e.relation = 'CLUSTERS'"
    " AND e.valid_to IS NULL ORDER BY e.weight DESC, e.target_id) END FROM memory_nodes n WHERE n.id = ANY(%s::uuid[])"
)


@lru_cache(maxsize=2 * 2 * (MAX_WORDS + 1))
def candidates_sql(legacy: bool, words: int = 0, events: bool = True) -> str:
    """The candidate query (``legacy``: the reader also sees its tenant's legacy rows):

    - the nearest nodes by cosine distance (HNSW), and one hop of spreading activation from the
      ``n_top`` nearest (up to ``fan`` current edges each way, highest weight first);
    - with ``words`` query words (parameters ``w0`` … ``w<words-1>``), the nodes whose text (label, and
      a summary's or cluster's text) holds one of them (the stored ``search`` vector, whose scope
      lexeme keeps the match inside the reader's paths), scored by the sum of the inverse document
      frequencies of the words it holds — BM25's ``ln(1 + (N − df + ½) / (df + ½))``, ``N`` the rows the
      reader sees, ``df`` those holding the word (nodes and events together; both counted up to
      ``df_cap``) — so a rare word (a name, a place) outweighs a common one and a long text gains
      nothing from repeating a word;
    - with ``events``, the nearest episodic events (exact: a scope keeps few) and, with words, those
      whose content holds one.

    The word match is one pass over the matching rows: which of the words each holds, hence every
    word's document frequency and every row's score, with no subquery per row.

    One row per candidate: kind, id, scope_path, layer, text, importance, access_count, updated_at,
    dist, lex, via, weight, degree, embedding_model, properties (JSON text; a summary's without its text)."""
    n, e, v, x = visible("n", legacy), visible("e", legacy), visible("v", legacy), visible("x", legacy)
    lex_ctes = ""
    if words:
        ws = range(words)
        has = lambda a: ", ".join(f"{a}.search @@ q.q{i} AS h{i}" for i in ws)  # noqa: E731
        count_events = (f"""
         + (SELECT count(*) FROM (SELECT 1 FROM episodic_events v WHERE {v} LIMIT %(df_cap)s) b)""" if events else "")
        match_events = (f"""
    UNION ALL
    SELECT 'e', v.id, {has("v")} FROM episodic_events v, q WHERE v.search @@ (%(sq)s::tsquery && q.qany) AND {v}"""
                        if events else "")
        idf = lambda i: (f"ln(1 + (d.n - least(f.d{i}, d.n) + 0.5) / (least(f.d{i}, d.n) + 0.5)) AS i{i}")  # noqa: E731
        lex_ctes = f"""
q AS (
    SELECT {", ".join(f"plainto_tsquery('english', %(w{i})s) AS q{i}" for i in ws)},
           {" || ".join(f"plainto_tsquery('english', %(w{i})s)" for i in ws)} AS qany
),
docs AS MATERIALIZED (  -- counted once (inlined, each use of n in idf counted again), on the scope index
    SELECT greatest(1, (SELECT count(*) FROM (SELECT 1 FROM memory_nodes n WHERE {n} LIMIT %(df_cap)s) a){count_events}) AS n
),
matched AS MATERIALIZED (
    SELECT 'n' AS t, n.id, {has("n")} FROM memory_nodes n, q WHERE n.search @@ (%(sq)s::tsquery && q.qany) AND {n}{match_events}
),
freq AS (SELECT {", ".join(f"count(*) FILTER (WHERE h{i}) AS d{i}" for i in ws)} FROM matched),
idf AS (SELECT {", ".join(idf(i) for i in ws)} FROM freq f, docs d),
scored AS MATERIALIZED (
    SELECT m.t, m.id, ({" + ".join(f"CASE WHEN m.h{i} THEN i.i{i} ELSE 0 END" for i in ws)})::float8 AS lex
    FROM matched m, idf i
),"""
    lex_nodes = ("""
lexn AS (SELECT id, lex FROM scored WHERE t = 'n' ORDER BY lex DESC, id LIMIT %(n_seed)s),""" if words
                 else "lexn AS (SELECT NULL::uuid AS id, 0::float8 AS lex WHERE false),")
    event_ctes = ""
    event_rows = ""
    if events:
        lex_events = ("""
lexe AS (SELECT id, lex FROM scored WHERE t = 'e' ORDER BY lex DESC, id LIMIT %(n_seed)s),""" if words
                      else "lexe AS (SELECT NULL::uuid AS id, 0::float8 AS lex WHERE false),")
        event_ctes = f"""{lex_events}
nearv AS (
    SELECT v.id FROM episodic_events v WHERE {v} AND v.embedding IS NOT NULL AND %(q)s::vector IS NOT NULL
    ORDER BY v.embedding <=> %(q)s::vector, v.id LIMIT %(n_seed)s
),
evs AS (SELECT id FROM nearv UNION SELECT id FROM lexe),"""
        event_rows = f"""
UNION ALL
SELECT 'event', e.id::text, e.scope_path, 'episodic', left(e.content, {EVENT_TEXT_CHARS}), NULL::float8, 0::bigint, e.created_at,
       e.embedding <=> %(q)s::vector, coalesce(l.lex, 0)::float8, NULL::text, NULL::float8, 0::bigint, e.embedding_model, e.metadata::text
FROM evs JOIN episodic_events e ON e.id = evs.id LEFT JOIN lexe l ON l.id = e.id"""
    return f"""
WITH{lex_ctes} seed AS (
    SELECT n.id, n.embedding <=> %(q)s::vector AS dist
    FROM memory_nodes n
    WHERE {n} AND n.embedding IS NOT NULL AND %(q)s::vector IS NOT NULL
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
),{lex_nodes}
nb AS (
    SELECT DISTINCT ON (h.id) h.id, h.via, h.weight FROM hop h
    WHERE h.id NOT IN (SELECT id FROM seed) AND h.id NOT IN (SELECT id FROM lexn) ORDER BY h.id, h.weight DESC, h.via
),
nodes AS MATERIALIZED (
    SELECT id, NULL::uuid AS via, NULL::float8 AS weight FROM seed
    UNION SELECT id, NULL::uuid, NULL::float8 FROM lexn
    UNION ALL SELECT id, via, weight FROM nb
),{event_ctes}
cand AS (
    SELECT 'node' AS kind, n.id::text AS id, n.scope_path, n.layer, n.label AS text, n.importance, n.access_count,
           n.updated_at, n.embedding <=> %(q)s::vector AS dist, coalesce(l.lex, 0)::float8 AS lex, c.via::text AS via,
           c.weight, (SELECT count(*) FROM (SELECT 1 FROM memory_edges x WHERE x.source_id = n.id AND {x}
                        AND x.valid_to IS NULL LIMIT %(deg)s) a)
                   + (SELECT count(*) FROM (SELECT 1 FROM memory_edges x WHERE x.target_id = n.id AND {x}
                        AND x.valid_to IS NULL LIMIT %(deg)s) b) AS degree,
           n.embedding_model, (n.properties - 'summary')::text AS properties
    FROM nodes c JOIN memory_nodes n ON n.id = c.id LEFT JOIN lexn l ON l.id = n.id WHERE {n}{event_rows}
)
SELECT * FROM cand"""


_TOKEN = re.compile(r"[^\W_]+")


def _lexical_words(query: str) -> list[str]:
    """The query's words for word matching (:func:`query_words`: 3+ letters, no stop words), split at
    anything but letters and digits (a tsquery's syntax never reaches PostgreSQL), first occurrence
    order; PostgreSQL's ``english`` configuration stems them as it stemmed the stored text."""
    return list(dict.fromkeys(t for w in query_words(query) for t in _TOKEN.findall(w)))[:MAX_WORDS]


def _scope_query(scope: Scope, legacy: bool) -> str:
    """The tsquery of the reader's paths' scope lexemes (the ``search`` vectors' ``s<md5 of the path>``)."""
    paths = list(scope.ancestor_paths()) + ([f"tenant\x1f{scope.tenant_id}"] if legacy else [])
    return " | ".join("s" + hashlib.md5(p.encode()).hexdigest() for p in paths)


def recall(
    store_or_conn: Store | psycopg.Connection,
    scope: Scope | str,
    query: str,
    k: int = 5,
    *,
    now: datetime | None = None,
    embedder: EmbeddingProvider | None = None,
    config=None,
) -> list[Hit]:
    """The ``k`` best memories for ``query`` visible from ``scope``, each logged to ``recall_events``.

    Visible: rows whose ``scope_path = ANY(scope.ancestor_paths())`` (never a string prefix).
    Candidates (:func:`candidates_sql`), ``n = max(k, 10)`` of each order
    (:func:`~deep_sleep.core.rank.n_seeds`): the ``n`` nearest nodes by cosine distance (HNSW, iterative
    scan so a small scope among many still fills its quota) and, with ``recall.events``, the ``n``
    nearest episodic events; with ``recall.lexical`` the ``n`` nodes and ``n`` events whose words score
    best (the sum of the inverse document frequencies of the query words they hold); and one hop of
    spreading activation from the ``k`` nearest nodes.

    Base score: with ``recall.lexical``, reciprocal-rank fusion of the two orders, ``1 / (fusion_k +
    vector rank) + lexical_weight / (fusion_k + word rank)`` scaled so that first in both is 1 (dense
    retrieval misses the names and numbers a conversation turns on; word matching misses paraphrase);
    without it, the similarity.  A neighbour reached by spreading gets at least ``0.5 × its top hit's
    base × clip(edge weight, 0, 1)``.  Score: ``base + clip(w · x + b, −0.25, +0.25)``, ``w, b`` the
    scope's ``reranker_models`` row over the 12 :data:`~deep_sleep.online.reranker.FEATURES`.  Ties go
    to the higher similarity, then the smaller id.

    The embedder is the configuration's (``embedding.model``; ``config`` default: the online path's);
    a candidate stored by another model is an :class:`~deep_sleep.core.embedding.EmbeddingModelError`
    naming both models and the fix — never a silent score.

    One statement logs the returned hits: a ``recall_events`` row each (query, the hit's id and kind,
    similarity, features, score; unlabelled) and, for a node, a ``memory_access_log`` ``read`` row under
    the node's own scope path — a recalled node was read, and phase 1 counts reads.  Rows are not
    touched (no version bump: a recall never makes a consolidation run conflict).  The query is
    logged as given, less NUL characters, cut at :data:`MAX_TEXT_CHARS`, with any lone surrogate
    replaced by U+FFFD (PostgreSQL cannot store one).
    """
    from deep_sleep.online.nap import default_config

    scope = Scope.coerce(scope)
    if not isinstance(query, str):
        raise OnlineArgumentTypeError(f"recall: query must be a string, got {type(query).__name__}")
    if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
        raise OnlineArgumentError(f"recall: k must be an integer from 1 to {MAX_K}, got {k!r}")
    config = config or default_config()
    embedder = checked_embedder(store_or_conn, embedder, config, "recall", scope.tenant_id)
    settings = config.recall
    query = well_formed(query.replace("\x00", "")[:MAX_TEXT_CHARS])
    now = utc(now or datetime.now(UTC))
    qvec = vector_text(embedder.embed([query])[0])
    wq = _lexical_words(query) if settings.lexical else []
    if qvec is None and not wq:
        return []
    legacy = scope.levels[0][0] == "tenant"
    n_seed = n_seeds(k)
    words = set(query_words(query))
    # Pipeline mode: BEGIN, settings, model and candidates in one round trip; the log and COMMIT in one more.
    with connection(store_or_conn) as conn, pipelined_transaction(conn):
        cur, model_cur = conn.cursor(), conn.cursor()
        cur.execute(_SETTINGS_SQL, (str(max(40, n_seed)),))
        model_cur.execute(_MODEL_SQL, (scope.path, scope.tenant_id))
        cur.execute(candidates_sql(legacy, len(wq), settings.events), {
            **{f"w{i}": w for i, w in enumerate(wq)}, "df_cap": DF_CAP,
            "q": qvec, "paths": scope.ancestor_paths(), "tenant": scope.tenant_id,
            "sq": _scope_query(scope, legacy), "n_seed": n_seed, "n_top": k, "fan": FAN_OUT, "deg": reranker.DEGREE_LIMIT,
        })
        rows = cur.fetchall()
        weights, bias = reranker.model(model_cur.fetchone())
        if not rows:
            return []
        _check_models(rows, embedder, scope)
        fused = bool(wq)
        own = reranker.own_bases(rows, settings.fusion_k if fused else None, settings.lexical_weight)
        scored = [reranker.candidate(row, own, scope, now, words, fused) for row in rows]
        ranked = reranker.rank(scored, weights, bias, k)
        info = {row[1]: row for row in rows}
        texts: dict[str, str] = {}
        folded = [s[2] for s in ranked if info[s[2]][0] == "node" and info[s[2]][4].startswith("META:")]
        text_cur = conn.cursor()
        if folded:
            text_cur.execute(_TEXTS_SQL, (SUMMARY_LABEL, folded))
        hits = [_hit(s, info[s[2]]) for s in ranked]
        values = ", ".join(["(%s::uuid, %s, %s, %s, %s::uuid, %s, %s, %s::float8[], %s, %s)"] * len(hits))
        params: list[Any] = []
        for h in hits:
            params += [h.recall_id, scope.path, scope.tenant_id, query, h.node_id, "event" if h.kind == "event" else "node",
                       h.similarity, list(h.features), h.score, now]
        read = [h for h in hits if h.kind != "event"]
        reads = ", ".join(["(%s, %s, %s::uuid, %s, 'read')"] * len(read))
        for h in read:
            params += [h.scope_path, scope.tenant_id, h.node_id, now]
        log = (f"INSERT INTO recall_events (id, scope_path, tenant_id, query, node_id, item_kind, similarity, features, score,"
               f" created_at) VALUES {values}")
        if read:
            log = (f"WITH logged AS ({log} RETURNING 1) INSERT INTO memory_access_log (scope_path, tenant_id, node_id,"
                   f" accessed_at, kind) VALUES {reads}")
        cur.execute(log, params)
        if folded:
            texts = {nid: (text, members) for nid, text, members in text_cur.fetchall()}
    return [h if h.node_id not in texts else _with_text(h, *texts[h.node_id]) for h in hits]


def _check_models(rows: list[tuple], embedder: EmbeddingProvider, scope: Scope) -> None:
    """Refuse to rank vectors of another model than the query's (SPEC §5 as amended)."""
    other = sorted({r[13] for r in rows if r[13] is not None and r[13] != embedder.name})
    if other:
        raise EmbeddingModelError(
            f"recall: {scope} holds vectors of model {', '.join(other)}; this recall embeds with {embedder.name} "
            "(embedding.model), and vectors of two models cannot be compared. Re-embed the store with "
            f"`deep-sleep reembed` (it writes {embedder.name}'s vectors), or set embedding.model to the store's model")


def _kind(row: tuple) -> str:
    if row[0] == "event":
        return "event"
    if row[4] == SUMMARY_LABEL:
        return "summary"
    return "cluster" if row[4].startswith("META:") else "node"


def _hit(scored: reranker.Scored, row: tuple) -> Hit:
    score, sim, nid, spath, layer, label, x, via = scored
    props = json.loads(row[14]) if row[14] else {}  # as text: only a hit's are parsed
    kind = _kind(row)
    sources = tuple(str(s) for s in props.get("source_ids", ()) or ()) if kind == "summary" else (
        (nid,) if kind == "event" else ())
    return Hit(str(uuid.uuid4()), nid, spath, layer, label, sim, score, tuple(float(v) for v in x), via,
               kind=kind, text=label, properties=props, source_ids=sources)


def _with_text(hit: Hit, text: str | None, members: list[str] | None) -> Hit:
    from dataclasses import replace

    return replace(hit, text=text or hit.label, source_ids=tuple(members) if members is not None else hit.source_ids)


def feedback(store_or_conn: Store | psycopg.Connection, recall_id: str, used: bool) -> bool:
    """Label a recall explicitly: 1.0 if the conversation used the hit, 0.0 if it ignored it
    (``label_source = "explicit"``; phase D2 never overwrites it, phase D3 weighs it double).
    Clears ``trained_at`` so the next training step learns from the new label.  Returns whether
    the recall exists.

    A node that lives in an ancestor of the reader's scope (recalled from ``org/q/x``, stored in
    ``org/q``) is used by *its own* scope too: the label is also recorded there, in a row of its own
    (id derived from the recall's, so a second verdict replaces the first), so that scope's holds
    (``used_deletes``) and recall-quality gate see the use and its reranker learns from it.  Nothing
    crosses a tenant: a reader only ever recalls its own tenant's nodes."""
    if not isinstance(used, bool):
        raise OnlineArgumentTypeError(f"feedback: used must be True or False, got {used!r}")
    try:
        rid = str(uuid.UUID(str(recall_id)))
    except ValueError:
        raise OnlineArgumentError(f"feedback: recall_id must be a UUID, got {str(recall_id)[:40]!r}") from None
    label = 1.0 if used else 0.0
    with connection(store_or_conn) as conn, conn.transaction():
        row = conn.execute(_FEEDBACK_SQL, {"id": rid, "label": label, "mirror": str(uuid.uuid5(_MIRROR, rid))}).fetchone()
    return row is not None


_MIRROR = uuid.UUID("4f0d3c1e-9a51-4d7e-8a55-1b0f5e2c6d31")  # namespace of the node's-own-scope copies of a label
_FEEDBACK_SQL = (
    "WITH lab AS (UPDATE recall_events SET label = %(label)s, label_source = 'explicit', trained_at = NULL"
    " WHERE id = %(id)s::uuid RETURNING *),"
    " own AS (INSERT INTO recall_events (id, scope_path, tenant_id, query, node_id, item_kind, similarity, features, score,"
    " label, label_source, created_at)"
    " SELECT %(mirror)s::uuid, n.scope_path, n.tenant_id, lab.query, lab.node_id, lab.item_kind, lab.similarity,"
    " lab.features, lab.score, %(label)s, 'explicit', lab.created_at FROM lab JOIN memory_nodes n ON n.id = lab.node_id"
    " WHERE lab.item_kind = 'node' AND n.tenant_id = lab.tenant_id AND n.scope_path IS DISTINCT FROM lab.scope_path"
    " ON CONFLICT (id) DO UPDATE SET label = EXCLUDED.label, label_source = 'explicit', trained_at = NULL RETURNING 1)"
    " SELECT 1 FROM lab"
)
