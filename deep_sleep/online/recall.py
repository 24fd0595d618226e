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
import math
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

import psycopg

from deep_sleep.core import rank as _rank
from deep_sleep.core.embedding import EmbeddingModelError, EmbeddingProvider, well_formed
from deep_sleep.core.rank import FAN_OUT, n_seeds
from deep_sleep.core.scope import Scope
from deep_sleep.core.snapshot import utc
from deep_sleep.online import reranker
from deep_sleep.online.errors import OnlineArgumentError, OnlineArgumentTypeError
from deep_sleep.online.ops import MAX_TEXT_CHARS
from deep_sleep.online.pg import MAX_K, checked_embedder, connection, pipelined_transaction, vector_text, visible
from deep_sleep.store.db import Store
from deep_sleep.transforms.label_recalls import WORD_RE, query_words

__all__ = ["Hit", "Line", "candidate_params", "candidates_sql", "cut_around", "feedback", "recall", "within_budget"]

#: An event candidate's text is cut here for the features and the hit (a turn's content is short; an
#: event may hold 16,000 characters).
EVENT_TEXT_CHARS = 2000
SUMMARY_LABEL = "META:episodic_summary"
#: Document frequencies (and the scope's document count) are counted up to here: a word in more
#: memories than this is common whatever the exact count, and the count stays bounded in a big scope.
DF_CAP = 5000
#: A summary's folded turns the candidate query returns, best first (a passage quotes those that fit).
LINES_PER_PASSAGE = 8
#: A scope of this many rows or more (nodes and events, counted up to DF_CAP each) is *big*: its word
#: match enumerates each of the first BIG_SCOPE_WORDS query words' rows apart, up to WORD_CAP a table
#: (a common word's rows are then a sample, and its document frequency is counted up to the cap), so
#: that the rows read follow the query, not the scope.  A smaller scope's rows are all read in one pass.
BIG_SCOPE = 4000
#: The events the vector order ranks: the scope's (each reader path's) latest this many.  Phase 10
#: keeps a scope's hot events near its threshold (100); an older event of a backlog is still found by
#: its words, and by its summary's turns once folded.
EVENT_WINDOW = 1000
BIG_SCOPE_WORDS = 8
WORD_CAP = 100
#: The members a cluster's passage quotes: its best match only.  Its members are nodes recall ranks on
#: their own; a cluster quoting every member that shares a word (~500 characters) spent a reader's
#: budget on facts ranked below it (benchmarks/README.md, 2026-12-06 11:10).
CLUSTER_LINES = 1
#: The words of a query that word matching uses (the first ones): a live turn's text may be long, and
#: each word costs a test per matching row.
MAX_WORDS = 24


@dataclass(frozen=True)
class Line:
    """One source line of a passage: the text it quotes and where it came from (a folded event's id for
    a summary, a member node's id for a cluster)."""

    source_id: str
    text: str


@dataclass(frozen=True)
class Hit:
    """One recalled memory: ``score = base + adjustment`` (see :func:`recall`); ``recall_id`` is the
    ``recall_events`` row to give :func:`feedback`.

    kind: ``node`` (a semantic or working-memory node), ``summary`` (a ``META:episodic_summary`` node:
        consolidated episodic events), ``cluster`` (another ``META:`` node) or ``event`` (an episodic
        event).
    node_id: the node's or the event's id.  label: a node's label, an event's content (cut at
        :data:`EVENT_TEXT_CHARS`).  text: the passage a reader gets (SPEC §5 as amended 2026-12-06) — a
        node's label or an event's content, cut around the query's words at ``recall.max_passage_chars``;
        for a summary or a cluster its gist (first line) and then, a line each, the source lines that
        best match the query (:attr:`lines`).  chars: ``len(text)``.
    lines: a summary's or a cluster's quoted source lines, in the order ``text`` gives them, each with
        the id it came from (a folded event's, a member node's): its provenance is what it quotes.
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
    lines: tuple[Line, ...] = ()

    @property
    def chars(self) -> int:
        """The characters the hit hands a reader: its passage, :attr:`text`."""
        return len(self.text)


# Recall's log is training telemetry: it may lose its last fraction of a second in a server crash
# rather than wait for a WAL flush on every query (synchronous_commit = off, this transaction only).
_SETTINGS_SQL = (
    "SELECT set_config('hnsw.ef_search', %s, true), set_config('hnsw.iterative_scan', 'relaxed_order', true),"
    " set_config('synchronous_commit', 'off', true)"
)
_MODEL_SQL = "SELECT weights, bias FROM reranker_models WHERE scope_path = %s AND tenant_id = %s"
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
    f, m = visible("f", legacy), visible("m", legacy)
    line_lex, line_from = "0::float8", ""
    if words:
        # a folded turn's words weigh what they weigh in an event: their inverse document frequency in the scope
        line_lex = "(" + " + ".join(f"CASE WHEN f.search @@ q.q{i} THEN i.i{i} ELSE 0 END" for i in range(words)) + ")::float8"
        line_from = ", q, idf i"
    lex_ctes = ""
    if words:
        ws = range(words)
        has = lambda a: ", ".join(f"{a}.search @@ q.q{i} AS h{i}" for i in ws)  # noqa: E731
        count_events = (f"""
         + (SELECT count(*) FROM (SELECT 1 FROM episodic_events v WHERE {v} LIMIT %(df_cap)s) b)""" if events else "")
        match_events = (f"""
    UNION ALL
    SELECT 'e', v.id, {has("v")} FROM episodic_events v, q
    WHERE NOT (SELECT is_big FROM big) AND v.search @@ (%(sq)s::tsquery && q.qany) AND {v}""" if events else "")
        # a node row is 'n', a summary 's' (its own word seats: lexn), an event 'e'
        kind = lambda a: f"CASE WHEN n.label = '{SUMMARY_LABEL}' THEN 's' ELSE 'n' END" if a == "n" else "'e'"  # noqa: E731
        tabs = [("n", "memory_nodes", n)] + ([("e", "episodic_events", v)] if events else [])
        capped = "\n    UNION ALL ".join(
            f"SELECT {i} AS w, x.t, x.id FROM (SELECT {kind(t_)} AS t, {t_}.id FROM {table} {t_}, q WHERE (SELECT is_big FROM big)"
            f" AND {t_}.search @@ q.q{i} AND {vis} LIMIT %(word_cap)s) x"
            for i in ws if i < BIG_SCOPE_WORDS for t, table, vis in tabs for t_ in ["n" if t == "n" else "v"])
        idf = lambda i: (f"ln(1 + (d.n - least(f.d{i}, d.n) + 0.5) / (least(f.d{i}, d.n) + 0.5)) AS i{i}")  # noqa: E731
        lex_ctes = f"""
q AS (
    SELECT {", ".join(f"plainto_tsquery('english', %(w{i})s) AS q{i}" for i in ws)},
           {" || ".join(f"plainto_tsquery('english', %(w{i})s)" for i in ws)} AS qany
),
docs AS MATERIALIZED (  -- counted once (inlined, each use of n in idf counted again), on the scope index
    SELECT greatest(1, (SELECT count(*) FROM (SELECT 1 FROM memory_nodes n WHERE {n} LIMIT %(df_cap)s) a){count_events}) AS n
),
big AS (SELECT n >= %(big_scope)s AS is_big FROM docs),
capped AS MATERIALIZED (  -- a big scope: each word's rows, up to word_cap a table (a common word's are a sample)
    {capped}
),
matched AS MATERIALIZED (
    SELECT {kind("n")} AS t, n.id, {has("n")} FROM memory_nodes n, q
    WHERE NOT (SELECT is_big FROM big) AND n.search @@ (%(sq)s::tsquery && q.qany) AND {n}{match_events}
    UNION ALL
    SELECT c.t, c.id, {", ".join(f"bool_or(c.w = {i}) AS h{i}" for i in ws)} FROM capped c GROUP BY c.t, c.id
),
freq AS (SELECT {", ".join(f"count(*) FILTER (WHERE h{i}) AS d{i}" for i in ws)} FROM matched),
idf AS (SELECT {", ".join(idf(i) for i in ws)} FROM freq f, docs d),
scored AS MATERIALIZED (
    SELECT m.t, m.id, ({" + ".join(f"CASE WHEN m.h{i} THEN i.i{i} ELSE 0 END" for i in ws)})::float8 AS lex
    FROM matched m, idf i
),"""
    lex_nodes = (f"""
lexn AS (  -- a summary's word key holds all its turns' words: summaries take their own n_seed, not the other nodes'
    (SELECT id, lex FROM scored WHERE t = 'n' ORDER BY lex DESC, id LIMIT %(n_seed)s)
    UNION ALL
    (SELECT id, lex FROM scored WHERE t = 's' ORDER BY lex DESC, id LIMIT %(n_seed)s)),""" if words
                 else "lexn AS (SELECT NULL::uuid AS id, 0::float8 AS lex WHERE false),")
    event_ctes = ""
    event_rows = ""
    legacy_recent = ("""
    UNION ALL
    SELECT * FROM (SELECT v.id, v.embedding FROM episodic_events v WHERE v.scope_path IS NULL AND v.tenant_id = %(tenant)s
                   AND v.embedding IS NOT NULL ORDER BY v.created_at DESC LIMIT %(event_window)s) l""" if legacy else "")
    if events:
        lex_events = ("""
lexe AS (SELECT id, lex FROM scored WHERE t = 'e' ORDER BY lex DESC, id LIMIT %(n_seed)s),""" if words
                      else "lexe AS (SELECT NULL::uuid AS id, 0::float8 AS lex WHERE false),")
        event_ctes = f"""{lex_events}
recent AS (  -- the scope's latest events, path by path on (scope_path, created_at): what the vector order ranks
    SELECT r.id, r.embedding FROM unnest(%(paths)s::text[]) p(path), LATERAL (
        SELECT v.id, v.embedding FROM episodic_events v WHERE v.scope_path = p.path AND v.embedding IS NOT NULL
        ORDER BY v.created_at DESC LIMIT %(event_window)s) r{legacy_recent}
),
nearv AS (
    SELECT id FROM recent WHERE %(q)s::vector IS NOT NULL ORDER BY embedding <=> %(q)s::vector, id LIMIT %(n_seed)s
),
evs AS (SELECT id FROM nearv UNION SELECT id FROM lexe),"""
        event_rows = f"""
UNION ALL
SELECT 'event', e.id::text, e.scope_path, 'episodic', left(e.content, {EVENT_TEXT_CHARS}), NULL::float8, 0::bigint, e.created_at,
       e.embedding <=> %(q)s::vector, coalesce(l.lex, 0)::float8, NULL::text, NULL::float8, 0::bigint, e.embedding_model, e.metadata::text,
       NULL::text
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
           n.embedding_model, (n.properties - 'summary' - 'keywords')::text AS properties,
           CASE WHEN n.label LIKE 'META:%%' THEN split_part(n.properties->>'summary', chr(10), 1) END AS gist
    FROM nodes c JOIN memory_nodes n ON n.id = c.id LEFT JOIN lexn l ON l.id = n.id WHERE {n}{event_rows}
),
summ AS (SELECT c.id::uuid AS id FROM cand c WHERE c.kind = 'node' AND c.text = '{SUMMARY_LABEL}'),
clus AS (SELECT c.id::uuid AS id FROM cand c WHERE c.kind = 'node' AND c.text LIKE 'META:%%' AND c.text <> '{SUMMARY_LABEL}'),
lines AS (
    SELECT f.id, f.summary_id, f.scope_path, f.content, f.created_at, f.embedding <=> %(q)s::vector AS dist,
           {line_lex} AS lex, f.embedding_model
    FROM episodic_folded f{line_from} WHERE f.summary_id IN (SELECT id FROM summ) AND {f}
),
best AS (SELECT *, row_number() OVER (PARTITION BY summary_id ORDER BY lex DESC, dist NULLS LAST, id) AS r,
                   row_number() OVER (PARTITION BY summary_id ORDER BY dist NULLS LAST, id) AS rv FROM lines)
SELECT * FROM cand
UNION ALL
SELECT 'line', b.id::text, b.scope_path, 'episodic', left(b.content, {EVENT_TEXT_CHARS}), NULL::float8, 0::bigint, b.created_at,
       b.dist, b.lex, b.summary_id::text, NULL::float8, 0::bigint, b.embedding_model, NULL::text, NULL::text
FROM best b WHERE b.r <= %(per_passage)s OR b.rv <= %(per_passage_vector)s
UNION ALL
SELECT 'member', m.id::text, m.scope_path, m.layer, m.label, NULL::float8, 0::bigint, m.updated_at, NULL::float8,
       0::float8, ce.source_id::text, ce.weight, 0::bigint, NULL::text, NULL::text, NULL::text
FROM clus JOIN memory_edges ce ON ce.source_id = clus.id AND ce.relation = 'CLUSTERS' AND ce.valid_to IS NULL
JOIN memory_nodes m ON m.id = ce.target_id AND m.scope_path = ce.scope_path WHERE {m}"""


def candidate_params(scope: Scope, words: Sequence[str], qvec: str | None, k: int) -> dict[str, Any]:
    """The parameters of :func:`candidates_sql` for ``scope``, the query's ``words``
    (:func:`_lexical_words`) and its vector (pgvector's text, None for none), ``k`` hits."""
    legacy = scope.levels[0][0] == "tenant"
    return {
        **{f"w{i}": w for i, w in enumerate(words)}, "df_cap": DF_CAP, "big_scope": BIG_SCOPE, "word_cap": WORD_CAP,
        "event_window": EVENT_WINDOW, "q": qvec, "paths": scope.ancestor_paths(), "tenant": scope.tenant_id,
        "sq": _scope_query(scope, legacy), "n_seed": n_seeds(k), "n_top": k, "fan": FAN_OUT, "deg": reranker.DEGREE_LIMIT,
        "per_passage": LINES_PER_PASSAGE, "per_passage_vector": LINES_PER_PASSAGE // 2,
    }


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
    budget_chars: int | None = None,
) -> list[Hit]:
    """The ``k`` best memories for ``query`` visible from ``scope`` as passages within ``budget_chars``
    characters, each logged to ``recall_events``.

    **The contract** (SPEC §5 as amended 2026-12-06): a hit's :attr:`Hit.text` is a passage a caller can
    hand to a model and :attr:`Hit.chars` its length — a node's label or an event's content, cut around
    the query's words at ``recall.max_passage_chars``; a summary's gist (the dates its turns span) and
    the folded turns that best match the query, one a line; a cluster's label and member count and its
    member that best matches the query (:data:`CLUSTER_LINES`) — each quoted line in :attr:`Hit.lines`
    with the id it came from.
    Hits come in rank order until their passages hold ``budget_chars`` characters (default
    ``recall.budget_chars``): the one that does not fit whole is cut to what is left (unless fewer than
    :data:`MIN_PASSAGE_CHARS` are), none after it is returned, and the budget is never exceeded.  A
    summary is ranked by its folded turns (:func:`_with_turns`): each competes like an event, and the
    summary takes the place of its best one.

    Visible: rows whose ``scope_path = ANY(scope.ancestor_paths())`` (never a string prefix).
    Candidates (:func:`candidates_sql`), ``n = max(k, 10)`` of each order
    (:func:`~deep_sleep.core.rank.n_seeds`): the ``n`` nearest nodes by cosine distance (HNSW, iterative
    scan so a small scope among many still fills its quota) and, with ``recall.events``, the ``n``
    nearest episodic events; with ``recall.lexical`` the ``n`` nodes, ``n`` summaries and ``n`` events
    whose words score best (the sum of the inverse document frequencies of the query words they hold: a
    summary's word key holds every folded turn's words, so summaries have their own ``n`` rather than
    crowding the facts out of the nodes'); and one hop of spreading activation from the ``k`` nearest
    nodes.

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
    budget = settings.budget_chars if budget_chars is None else budget_chars
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise OnlineArgumentError(f"recall: budget_chars must be a positive integer (characters), got {budget!r}")
    max_passage = min(settings.max_passage_chars, budget)
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
        # one cursor a statement: in pipeline mode a cursor that ran two statements may hand back the first's
        # rows (seen under load: the candidates' fetch returned the settings row)
        cur, model_cur, settings_cur = conn.cursor(), conn.cursor(), conn.cursor()
        settings_cur.execute(_SETTINGS_SQL, (str(max(40, n_seed)),))
        model_cur.execute(_MODEL_SQL, (scope.path, scope.tenant_id))
        cur.execute(candidates_sql(legacy, len(wq), settings.events), candidate_params(scope, wq, qvec, k))
        rows = cur.fetchall()
        weights, bias = reranker.model(model_cur.fetchone())
        if not rows:
            return []
        _check_models(rows, embedder, scope)
        cands = [r for r in rows if r[0] not in ("line", "member")]
        turns = [r for r in rows if r[0] == "line"]
        members: dict[str, list[tuple]] = {}
        for r in rows:
            if r[0] == "member":
                members.setdefault(r[10], []).append(r)
        if not cands:
            return []
        fused = bool(wq)
        # A summary is found through its folded turns: its own word key (all its turns' words) and vector
        # stand for the whole batch, not for any one turn, so it takes no place of its own in the fusion's
        # orders — its turns do, each like an event (a summary written before episodic_folded existed,
        # with no turn there, keeps its own place).
        carried = {r[10] for r in turns}
        own = reranker.own_bases([r for r in cands if r[1] not in carried] + [_as_own(r) for r in turns],
                                 settings.fusion_k if fused else None, settings.lexical_weight)
        for r in cands:
            own.setdefault(r[1], 0.0)
        scored = [reranker.candidate(row, own, scope, now, words, fused) for row in cands]
        everything = reranker.rank(scored, weights, bias, len(scored))
        ranked, quoted = _with_turns(everything, own, turns, k)
        quoted.update(members)
        info = {row[1]: row for row in cands}
        passage_words = _passage_words(query)
        hits = within_budget([_hit(s, info[s[2]], quoted.get(s[2], ()), passage_words, max_passage) for s in ranked],
                             budget, passage_words)
        if not hits:
            return []
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
    return hits


def _as_own(turn: tuple) -> tuple:
    """A folded turn's row as a candidate of its own (no ``via``) for the fusion's orders."""
    return turn[:10] + (None,) + turn[11:]


def _with_turns(everything: Sequence[reranker.Scored], own: dict[str, float], turns: Sequence[tuple],
                k: int) -> tuple[list[reranker.Scored], dict[str, list[tuple]]]:
    """The ``k`` best hits and the folded turns each summary hit quotes.

    Every candidate (``everything``: scored, best first) and every folded turn of a candidate summary
    (``turns``) is ranked in one order: a turn's score is its own fused base plus its summary's capped
    reranker adjustment; ties by similarity, then id.  A summary takes the place of its best turn and
    quotes its turns among the first ``k`` turns of that order (its best one when none is), best first;
    a candidate that is a summary with turns takes no place of its own."""
    by_id = {s[2]: s for s in everything}
    adjust = {s[2]: s[0] - own.get(s[2], 0.0) for s in everything}
    carried = {t[10] for t in turns if t[10] in by_id}
    items = [(s[0], s[1], s[2], None) for s in everything if s[2] not in carried]
    items += [(own.get(t[1], 0.0) + adjust[t[10]], _rank.similarity(math.nan if t[8] is None else t[8], _rank.SCALAR),
               t[1], t[10]) for t in turns if t[10] in carried]
    items.sort(key=lambda t: (-t[0], -t[1], t[2]))
    turn_of = {t[1]: t for t in turns}
    quoted: dict[str, list[tuple]] = {}
    places: dict[str, float] = {}
    n_turns = 0
    for score, _sim, iid, summary in items:
        key = summary or iid
        places.setdefault(key, score)
        if summary is not None:
            n_turns += 1
            if n_turns <= k or summary not in quoted:
                quoted.setdefault(summary, []).append(turn_of[iid])
        if len(places) >= k and n_turns >= k:
            break
    ranked = [(places[key],) + tuple(by_id[key][1:]) for key in list(places)[:k]]
    return ranked, quoted


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


def _passage_words(query: str) -> list[str]:
    """The query's words a passage is cut around and its lines are matched by (lower case)."""
    return list(dict.fromkeys(w for w in query_words(query) for w in _TOKEN.findall(w)))


def cut_around(text: str, words: list[str], limit: int) -> str:
    """``text`` in at most ``limit`` characters: whole when it fits; else a window around the first
    place one of ``words`` occurs (its start when none does), cut at spaces, an ellipsis (``…``) marking
    each cut side.

    >>> cut_around("a b c the answer is 42 and more words follow here", ["answer"], 20)
    '…the answer is 42…'
    """
    if len(text) <= limit:
        return text
    if limit < 2:
        return text[:max(limit, 0)]
    low = text.lower()
    found = [i for i in (low.find(w) for w in words) if i >= 0]
    at = min(found) if found else 0
    start = 0 if at <= limit // 3 else max(0, min(at - limit // 3, len(text) - limit + 1))
    if start:
        space = text.find(" ", start, at) if at > start else -1
        start = space + 1 if space >= 0 else start
    room = limit - (1 if start else 0)
    end = start + room
    if end < len(text):
        room -= 1
        end = start + room
        space = text.rfind(" ", start + room // 2, end + 1)
        end = space if space > start else end
    return ("…" if start else "") + text[start:end].strip() + ("…" if end < len(text) else "")


def _lines(kind: str, rows: Sequence[tuple], words: list[str], room: int) -> list[Line]:
    """The source lines a passage quotes in ``room`` characters: a summary's folded turns in the order
    given (:func:`_with_turns`: best first); a cluster's :data:`CLUSTER_LINES` members holding the most
    query words (then the heavier edge, then id).  Lines are taken
    while they fit; the first always, cut around the query's words when it alone does not fit."""
    if kind == "summary":
        chosen = list(rows)
    else:
        ws = set(words)
        overlap = {r[1]: len(ws & set(WORD_RE.findall(r[4].lower()))) for r in rows}
        ordered = sorted(rows, key=lambda r: (-overlap[r[1]], -(r[11] or 0.0), r[1]))
        chosen = ([r for r in ordered if overlap[r[1]]] or ordered)[:CLUSTER_LINES]
    out: list[Line] = []
    left = room
    for r in chosen:
        text = " ".join((r[4] or "").split())
        if len(text) > left:
            if out:
                break
            text = cut_around(text, words, max(left, 0))
        out.append(Line(r[1], text))
        left -= len(text) + 1
        if left <= 0:
            break
    return out


def _span(props: dict[str, Any]) -> str:
    """A summary's gist: the dates its turns span (``2023-05-08``, or ``2023-05-08 – 2023-06-09``)."""
    first, last = (str(props.get(k) or "")[:10] for k in ("first_at", "last_at"))
    return first if not last or last == first else f"{first} – {last}"


def _hit(scored: reranker.Scored, row: tuple, quoted: Sequence[tuple], words: list[str], max_passage: int) -> Hit:
    """The hit of a ranked candidate, with its passage (SPEC §5 as amended 2026-12-06): a node's label or
    an event's content, cut around the query's words at ``max_passage`` characters; a summary's or a
    cluster's gist — the dates a summary's turns span; a cluster's label and member count — and then,
    one a line, the source lines that best match the query, each with its source id, in ``max_passage``
    characters in all.  A summary with no folded turn (written before they were kept) reads its text's
    first line as its gist."""
    score, sim, nid, spath, layer, label, x, via = scored
    props = json.loads(row[14]) if row[14] else {}  # as text: only a hit's are parsed
    kind = _kind(row)
    sources = tuple(str(s) for s in props.get("source_ids", ()) or ()) if kind == "summary" else (
        (nid,) if kind == "event" else ())
    lines: tuple[Line, ...] = ()
    if kind in ("summary", "cluster"):
        if kind == "summary":
            gist = _span(props) if quoted else (row[15] or label)
        else:
            gist = f"{label} ({props.get('member_count', len(quoted))} members)"
        gist = cut_around(" ".join(gist.split()), words, max(max_passage // 3, 1))
        lines = tuple(_lines(kind, quoted, words, max_passage - len(gist) - 1))
        text = "\n".join([gist, *(ln.text for ln in lines)])
        if kind == "cluster":
            sources = tuple(r[1] for r in sorted(quoted, key=lambda r: (-(r[11] or 0.0), r[1])))
    else:
        text = cut_around(" ".join(label.split()) if kind == "event" else label, words, max_passage)
    return Hit(str(uuid.uuid4()), nid, spath, layer, label, sim, score, tuple(float(v) for v in x), via,
               kind=kind, text=text, properties=props, source_ids=sources, lines=lines)


#: A hit is not cut to fit the budget's last characters when fewer than this many are left.
MIN_PASSAGE_CHARS = 40


def within_budget(hits: Sequence[Hit], budget: int | None, words: list[str]) -> list[Hit]:
    """``hits`` in rank order until ``budget`` characters (the sum of their :attr:`Hit.chars`) are spent:
    the hit that does not fit whole is cut to the characters left — a passage keeps its gist and the
    lines that fit, a text is cut around the query's words — unless fewer than
    :data:`MIN_PASSAGE_CHARS` are left; the hits after it are not returned.  ``None``: no budget.
    The budget is never exceeded.

    >>> h = Hit("r", "n", None, "semantic", "x", 0.0, 0.0, (), text="abcdefghij " * 5)
    >>> [x.chars for x in within_budget([h, h], 80, [])]
    [55]
    """
    if budget is None:
        return list(hits)
    out: list[Hit] = []
    left = budget
    for h in hits:
        if h.chars <= left:
            out.append(h)
            left -= h.chars
            continue
        if left >= MIN_PASSAGE_CHARS:
            out.append(_shrink(h, left, words))
        break
    return out


def _shrink(hit: Hit, limit: int, words: list[str]) -> Hit:
    """``hit`` with its passage in at most ``limit`` characters."""
    if hit.lines:
        gist, *_ = hit.text.split("\n", 1)
        gist = cut_around(gist, words, max(limit // 3, 1))
        kept: list[Line] = []
        used = len(gist)
        for ln in hit.lines:
            if used + 1 + len(ln.text) > limit:
                if not kept and limit - used - 1 >= MIN_PASSAGE_CHARS // 2:
                    kept.append(Line(ln.source_id, cut_around(ln.text, words, limit - used - 1)))
                break
            kept.append(ln)
            used += 1 + len(ln.text)
        text = "\n".join([gist, *(ln.text for ln in kept)])
        return replace(hit, text=text[:limit], lines=tuple(kept))
    return replace(hit, text=cut_around(hit.text, words, limit))


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
