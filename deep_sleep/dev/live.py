"""What the live path would have written into a synthetic store: vectors and the recall log.

:func:`deep_sleep.online.turn.record_turn` gives every node, event and skill it writes the configured
embedder's vector and records the model (``embedding_model``); :func:`deep_sleep.online.recall.recall`
logs one ``recall_events`` row per hit (default k = 5), and :func:`~deep_sleep.online.recall.feedback`
labels a hit used (1.0) or ignored (0.0) with ``label_source = 'explicit'``.  A seeded store without
them is not a store (issue 38): the recall-quality gate could not measure, and the cost of vectors —
the HNSW index, the bytes moved — was never paid.  Two functions add them to generated frames:

* :func:`with_vectors` — ``embedding`` and ``embedding_model`` on ``memory_nodes`` (the vector of
  :func:`~deep_sleep.core.embedding.node_text`, as record_turn and the night embed a node),
  ``episodic_events`` (its ``content``) and ``procedural_skills`` (``name description``).  In bulk:
  each distinct text embedded once, in chunks of :data:`EMBED_CHUNK` (the hashing embedder's
  bincount holds ``texts × 256`` float64 at a time), vectorised; an all-zero vector (nothing to
  embed) is stored as NULL with no model, as record_turn stores it.
* :func:`recall_log` — per scope ``max(20, nodes // 5)`` recalls (at most :data:`MAX_QUERIES`),
  each asking ``"what about <two words of a node's label>"`` about an ordinary semantic node of the
  scope (its *target*; a scope's targets distinct while it has enough), within the 48 h before
  ``now``; its :data:`RECALL_K` hits are the scope's nodes nearest to the query's vector (cosine;
  a scope of more than :data:`MAX_CANDIDATES` nodes is searched in a fixed sample of that many plus
  the targets), similarity the cosine, twelve features and a score as the reranker stores them.
  Feedback on :data:`FEEDBACK_SHARE` of each scope's recalls (at least one): the hit the agent used
  (the target when it was found, else the first hit) labelled 1.0 and the other hits 0.0 — so about
  a tenth of the rows carry an explicit label, every scope has a used memory the gate can replay,
  and the used memories are found before the diff (its ranking seeds from the same cosine).

Both are pure functions of their inputs (the recall log draws from a generator seeded by ``seed``).
"""

from __future__ import annotations

import json

import numpy as np
import polars as pl

from deep_sleep.core.embedding import EmbeddingProvider, node_text
from deep_sleep.core.tables import EMBEDDING_DIM
from deep_sleep.dev.arrays import _HOUR, _US, _ids, _rng, _ts

__all__ = ["EMBED_CHUNK", "FEEDBACK_SHARE", "MAX_CANDIDATES", "MAX_QUERIES", "RECALL_K", "embed_texts",
           "queries_per_scope", "recall_log", "with_vectors"]

EMBED_CHUNK = 16_384
RECALL_K = 5  # the live recall's default k: hits logged per recall
FEEDBACK_SHARE = 0.1  # of a scope's recalls, labelled used/ignored by the agent (at least one per scope)
MAX_QUERIES = 10_000  # recalls per scope
MAX_CANDIDATES = 2_000  # nodes a recall's hits are searched among, in a bigger scope
_PROTECTED = ("SOUL:", "AGENT_IDENTITY:", "META:")
_VECTOR = pl.Array(pl.Float32, EMBEDDING_DIM)


def queries_per_scope(nodes: int) -> int:
    """Recalls a scope of ``nodes`` nodes has logged: ``max(20, nodes // 5)``, at most :data:`MAX_QUERIES`."""
    return min(MAX_QUERIES, max(20, nodes // 5))


def embed_texts(embedder: EmbeddingProvider, texts: pl.Series) -> np.ndarray:
    """``(len(texts), dim)`` float32: each distinct text embedded once (a null as the empty text),
    :data:`EMBED_CHUNK` at a time."""
    texts = texts.cast(pl.String).fill_null("").alias("_t")
    uniq = texts.unique(maintain_order=True)
    words = uniq.to_list()
    out = np.zeros((len(words), EMBEDDING_DIM), dtype=np.float32)
    for at in range(0, len(words), EMBED_CHUNK):
        out[at : at + EMBED_CHUNK] = embedder.embed(words[at : at + EMBED_CHUNK])
    slot = texts.to_frame().join(uniq.to_frame().with_row_index("_i"), on="_t", how="left", maintain_order="left")
    return out[slot.get_column("_i").to_numpy()]


def _vector_columns(vec: np.ndarray, model: str) -> list[pl.Series]:
    """``embedding`` and ``embedding_model`` columns: NULL both for an all-zero vector."""
    emb = pl.Series("embedding", vec, dtype=_VECTOR)
    zero = ~vec.any(axis=1)
    mdl = pl.Series("embedding_model", [model], dtype=pl.String).new_from_index(0, len(vec))
    if zero.any():
        mask = pl.Series(zero)
        emb = emb.set(mask, None)
        mdl = mdl.set(mask, None)
    return [emb, mdl]


def node_texts(nodes: pl.DataFrame) -> pl.Series:
    """What each node's vector embeds (:func:`~deep_sleep.core.embedding.node_text`), one Python call
    per distinct (label, properties)."""
    pairs = nodes.select("label", "properties").unique(maintain_order=True)
    text = [node_text(label, json.loads(props) if props else {}) for label, props in pairs.iter_rows()]
    keyed = pairs.with_columns(pl.Series("_text", text, dtype=pl.String))
    return nodes.select("label", "properties").join(keyed, on=["label", "properties"], how="left",
                                                    maintain_order="left", nulls_equal=True).get_column("_text")


def with_vectors(frames: dict[str, pl.DataFrame], embedder: EmbeddingProvider) -> dict[str, pl.DataFrame]:
    """``frames`` with the embedder's ``embedding`` and ``embedding_model`` on every node, event and
    skill (module docstring)."""
    out = dict(frames)
    texts = {"memory_nodes": node_texts,
             "episodic_events": lambda f: f.get_column("content"),
             "procedural_skills": lambda f: f.select(pl.concat_str("name", "description", separator=" ")).to_series()}
    for table, text_of in texts.items():
        frame = frames.get(table)
        if frame is None:
            continue
        vec = embed_texts(embedder, text_of(frame)) if frame.height else np.zeros((0, EMBEDDING_DIM), np.float32)
        out[table] = frame.drop("embedding", "embedding_model", strict=False).with_columns(
            _vector_columns(vec, embedder.name))
    return out


def _vectors(frame: pl.DataFrame) -> np.ndarray:
    emb = frame.get_column("embedding")
    mat = emb.fill_null(np.zeros(EMBEDDING_DIM, dtype=np.float32).tolist()) if emb.null_count() else emb
    return mat.to_numpy().reshape(frame.height, EMBEDDING_DIM).astype(np.float32, copy=False)


def recall_log(nodes: pl.DataFrame, embedder: EmbeddingProvider, *, seed: int, now_us: int) -> pl.DataFrame:
    """The ``recall_events`` rows of every scope of ``nodes`` (which carry ``embedding``; legacy rows
    without a scope are left out), as the live recall and feedback write them (module docstring).
    ``now_us``: the store's clock in microseconds since the epoch."""
    rng = _rng(seed, "live-recalls")
    rows = nodes.with_row_index("_row").filter(pl.col("scope_path").is_not_null())
    sizes = rows.group_by("scope_path", maintain_order=True).agg(
        pl.col("tenant_id").first(), pl.len().alias("_n"), pl.col("_row").alias("_rows"))
    ordinary = ((pl.col("layer") == "semantic")
                & ~pl.any_horizontal([pl.col("label").str.starts_with(p) for p in _PROTECTED])
                & (pl.col("label").str.split(" ").list.len() >= 3))
    cand = rows.filter(ordinary).select("_row", "scope_path", "label")
    cand = (cand.with_columns(pl.Series("_key", rng.random(cand.height)))
            .sort("scope_path", "_key", maintain_order=True)
            .with_columns(pl.int_range(pl.len()).over("scope_path").alias("_r"), pl.len().over("scope_path").alias("_c")))
    per = cand.group_by("scope_path", maintain_order=True).agg(pl.col("_c").first())
    asked = (sizes.join(per, on="scope_path")
             .with_columns(pl.min_horizontal(pl.lit(MAX_QUERIES), pl.max_horizontal(pl.lit(20), pl.col("_n") // 5))
                           .cast(pl.Int64).alias("_q"))
             .with_columns(pl.int_ranges(0, pl.col("_q")).alias("_j")).explode("_j")
             .with_columns((pl.col("_j") % pl.col("_c")).alias("_r"))
             .join(cand.select("scope_path", "_r", "_row", "label"), on=["scope_path", "_r"], maintain_order="left")
             .select("scope_path", "tenant_id", "_q", "_j", pl.col("_row").alias("_target"),
                     (pl.lit("what about ") + pl.col("label").str.split(" ").list.slice(1, 2).list.join(" ")).alias("query")))
    if not asked.height:
        return _empty()
    n_q = asked.height
    asked = asked.with_columns(_ts(now_us - rng.integers(_US, 48 * _HOUR, n_q), "created_at"),
                               pl.Series("_fbkey", rng.random(n_q)))
    # feedback on FEEDBACK_SHARE of each scope's recalls (at least one): those of the smallest draws
    asked = asked.with_columns(
        (pl.col("_fbkey").rank("ordinal").over("scope_path")
         <= pl.max_horizontal((pl.col("_q") * FEEDBACK_SHARE).round(0).cast(pl.Int64), pl.lit(1))).alias("_fb"))

    vec = _vectors(nodes)
    qvec = embed_texts(embedder, asked.get_column("query"))
    targets = asked.get_column("_target").cast(pl.Int64).to_numpy()
    q_rows: list[np.ndarray] = []
    hit_rows: list[np.ndarray] = []
    sims: list[np.ndarray] = []
    starts = np.concatenate([[0], np.cumsum(asked.group_by("scope_path", maintain_order=True).len().get_column("len").to_numpy())])
    scope_rows = dict(zip(sizes.get_column("scope_path").to_list(), sizes.get_column("_rows").to_list()))
    for k, path in enumerate(asked.get_column("scope_path").unique(maintain_order=True).to_list()):
        lo, hi = int(starts[k]), int(starts[k + 1])
        mine = np.asarray(scope_rows[path], dtype=np.int64)
        if len(mine) > MAX_CANDIDATES:
            mine = np.union1d(rng.choice(mine, MAX_CANDIDATES, replace=False), targets[lo:hi])
        sim = qvec[lo:hi] @ vec[mine].T
        k_hits = min(RECALL_K, len(mine))
        top = np.argpartition(-sim, k_hits - 1, axis=1)[:, :k_hits] if len(mine) > k_hits else np.tile(
            np.arange(len(mine)), (hi - lo, 1))
        s = np.take_along_axis(sim, top, axis=1)
        order = np.argsort(-s, axis=1, kind="stable")
        top, s = np.take_along_axis(top, order, axis=1), np.take_along_axis(s, order, axis=1)
        q_rows.append(np.repeat(np.arange(lo, hi), k_hits))
        hit_rows.append(mine[top].reshape(-1))
        sims.append(s.reshape(-1))
    qi, node_row, sim = np.concatenate(q_rows), np.concatenate(hit_rows), np.concatenate(sims)
    m = len(qi)
    rank = _ranks(qi)
    found = np.zeros(n_q, dtype=bool)
    np.logical_or.at(found, qi, node_row == targets[qi])
    used = np.where(found[qi], node_row == targets[qi], rank == 0)
    fb = asked.get_column("_fb").to_numpy()[qi]
    sim = np.clip(sim.astype(np.float64), 0.0, 1.0).round(4)
    hits = asked.select("scope_path", "tenant_id", "query", "created_at").gather(qi)
    return pl.DataFrame([
        _ids(seed, "live-recalls", "recall_events", m),
        hits.get_column("scope_path"), hits.get_column("tenant_id"), hits.get_column("query"),
        nodes.get_column("id").gather(node_row).alias("node_id"),
        pl.Series("similarity", sim),
        pl.Series("features", np.round(rng.random((m, 12)), 4)).cast(pl.List(pl.Float64)),
        pl.Series("score", np.round(sim + rng.normal(0.0, 0.05, m), 4)),
        pl.Series("label", np.where(used, 1.0, 0.0)).set(pl.Series(~fb), None),
        pl.Series("label_source", ["explicit"], dtype=pl.String).new_from_index(0, m).set(pl.Series(~fb), None),
        pl.Series("trained_at", [None] * m, dtype=pl.Datetime("us", "UTC")),
        hits.get_column("created_at"),
        pl.Series("version", np.ones(m, dtype=np.int64)),
    ])


def _ranks(qi: np.ndarray) -> np.ndarray:
    """0, 1, … within each run of equal query indexes (hits are grouped by query, best first)."""
    start = np.flatnonzero(np.r_[True, qi[1:] != qi[:-1]])
    return np.arange(len(qi)) - np.repeat(start, np.diff(np.r_[start, len(qi)]))


def _empty() -> pl.DataFrame:
    from deep_sleep.core.tables import TABLES

    return pl.DataFrame(schema={c.name: c.dtype for c in TABLES["recall_events"]})
