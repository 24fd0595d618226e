"""The recall-quality gate (SPEC §9, issue 16 item 3): before apply, replay a scope's used recall
queries against the scope as extracted and as the diff would leave it, and compare recall@k of the
memories the agent used.

    >>> result = recall_gate(shard, diff, config, embeddings=node_vectors)[scope_path]   # doctest: +SKIP
    >>> result.status, result.recall_before, result.recall_after, result.failed         # doctest: +SKIP
    ('measured', 0.9, 0.6, True)

**Which queries.**  A recall row (``recalls_events``) is *used* when it has explicit feedback
``used`` (``label_source = "explicit"``, ``label = 1``): the agent said it relied on the memory.
With ``gate.implicit`` (off by default) an implicit label of at least ``label_recalls.min_label``
counts too (labels as the diff leaves them, so this run's count) — off because phase D2's implicit
label says only that a word of the *query* came back, which nearly every conversation does (on the
LoCoMo dev split 89–95 % of implicit labels reach 0.5), so "used" meant "asked", the gate compared
the top k of nearly every query, and its verdicts moved with row ids (identical replays held 0 and
884 rows).  Queries are grouped by their text
within the scope; a query is replayed if it has a used row whose node is a node of the snapshot.
They are taken in this order, up to ``gate.max_queries``: those with explicit ``used`` feedback
first, then by their highest used label, then the most recent, then the text.  The *used memories*
of a query are the distinct snapshot nodes of its used rows (nodes of an ancestor scope are not in
the snapshot and are left out: this scope's diff cannot touch them).

**How they are ranked** — exactly as :func:`deep_sleep.online.recall.recall` scores with ``k =
gate.k``, with :mod:`deep_sleep.core.rank`'s features and order and phase D3's capped adjustment:
the query is embedded with the configured embedder (``embedding.model``, the live one); the seeds are the
``max(k, 10)`` (:func:`~deep_sleep.core.rank.n_seeds`) nodes of smallest cosine distance among the scope's nodes with an embedding (exact,
where the live path uses the HNSW index; ties by id); the ``k`` nearest of them spread one hop
along up to 8 current edges each way (highest weight first, then id) to nodes that are not seeds
(each neighbour keeping its heaviest edge, then the smallest ``via``); each candidate gets its 12
features (its degree from the current edges, up to 100 each way; recency against ``now``, the
snapshot's ``taken_at`` unless given) and the score ``base + clip(w · x + b, ±0.25)`` with the
scope's ``reranker_models`` row.  Ties go to the higher similarity, then the smaller id.

**Before and after.**  *Before* is the snapshot as extracted (less what quarantine set aside, as
the plan saw it); *after* is ``diff.fold(snapshot)``: deleted nodes and edges gone, new importance,
weights and edges in the features, the reranker row as the run leaves it, inserted nodes present
(without an embedding — the apply writes none — so only reachable by spreading).  The same
queries, used memories and ``now`` serve both.

**recall@k** of a query is the share of its used memories among its ``k`` best hits
(``|used ∩ top k| / |used|``); a scope's recall@k is the mean over its replayed queries (each
query weighs the same).  ``drop_pp = 100 × (before − after)``; the gate fails when ``drop_pp >
gate.max_drop_pp``.  It is exact for the queries it replays (no sampling, every node of the
scope compared), up to the last bits of the float32 cosine: pgvector sums in single precision in
its own order, so two candidates whose similarities agree to ~1e-7 may change places (tested
against the live recall on the store: the same hits, the same scores to 1e-6).

**Embeddings.**  Snapshots do not carry node embeddings (they stay in Postgres), so the caller
passes them (``embeddings``: ``id``, ``embedding``; :func:`deep_sleep.store.vectors.node_embeddings`
reads them from the store), or the ``memory_nodes`` frame carries an ``embedding`` column.  A node
without an embedding is never a seed — the live query filters ``embedding IS NOT NULL`` — and is
reached only by spreading, with similarity 0 (a zero vector likewise has similarity 0 and sorts
last).  When no embeddings are given at all the gate measures nothing: ``status = no_vectors``.  A query whose text embeds to the zero vector finds nothing
online and here (its recall@k is 0 before and after).

**Cost.**  Everything is one pass over all the shard's scopes in Polars; what is not vectorized is
the dense query × node product and the seed partition (one numpy call per scope with queries, no
Python per row) and the live path's tokenizer, once per distinct query and candidate label.  The
reranker adjustment is computed per model, not as a mask per scope (which was quadratic in the
scopes).  Measured costs are in benchmarks/README.md.

**When it cannot measure** (SPEC §9 as amended: a gate that could not measure says so, by reason,
and never reads as "passed"): ``status`` is ``no_used_query`` (no used query whose memory is a node
of the scope), ``no_vectors`` (none of the scope's nodes has an embedding), ``zero_before`` (recall@k
is 0 before the diff, so no drop could show: the figures are kept) or ``disabled``; never
``failed``.  The night's summary counts the scopes by status.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import numpy as np
import polars as pl
from deep_sleep.transforms.label_recalls import query_words
from deep_sleep.transforms.train_reranker import CAP, adjustment

from deep_sleep.core import rank
from deep_sleep.core.config import GateConfig
from deep_sleep.core.diff import Diff
from deep_sleep.core.embedding import EmbeddingProvider, default_embedder
from deep_sleep.core.errors import InputError
from deep_sleep.core.rank import FAN_OUT, n_seeds
from deep_sleep.core.scope import SEP
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot, utc
from deep_sleep.core.tables import EMBEDDING_DIM
from deep_sleep.run.probes import ProbeResult, probe_gate

__all__ = ["GateResult", "UNMEASURED", "not_run", "ranked_hits", "recall_gate"]

EXPLICIT = "explicit"
DEFAULT_MIN_LABEL = 0.5


#: Why a scope's gate did not measure (a key of the report's ``gate.status`` besides ``measured``).
UNMEASURED = {
    "nothing_removed": "the night removes, folds or demotes nothing findable, and no used recall query could be replayed",
    "no_used_query": "no used recall query whose memory is a node of the scope",
    "no_vectors": "no node embeddings to rank against",
    "zero_before": "recall@k of the used memories is 0 before the diff: a drop cannot be seen",
    "disabled": "the gate is switched off (gate.enabled = false)",
}


@dataclass(frozen=True)
class GateResult:
    """The gate's verdict on one scope (see the module docstring for the definitions).

    status: ``measured``, or why not: a key of :data:`UNMEASURED` (``no_used_query``, ``no_vectors``,
        ``zero_before``, ``disabled``).  Only a measured gate can pass or fail; one that could not
        measure never reads as passed (SPEC §9 as amended 2026-12-04).
    queries: used queries replayed (0: nothing to measure).
    recall_before, recall_after: mean recall@k of the used memories, 0–1 (None without queries).
    drop_pp: ``100 × (before − after)`` percentage points (None without queries).
    failed: measured, and the drop exceeds ``max_drop_pp`` — the run's destructive rows are to be held.
    detail: one line for the report and the terminal.
    """

    queries: int
    recall_before: float | None
    recall_after: float | None
    drop_pp: float | None
    failed: bool
    detail: str = ""
    status: str = "measured"
    probes: ProbeResult | None = None

    @property
    def measured(self) -> bool:
        return self.status == "measured"

    def to_report(self) -> dict[str, Any]:
        """The report's ``gate`` field: ``status`` and ``detail`` always; the figures when queries were
        replayed; the probes' (``probes``) when there were any."""
        out: dict[str, Any] = {"status": self.status, "detail": self.detail, "failed": self.failed}
        if self.queries:
            out.update(queries=self.queries, recall_before=self.recall_before, recall_after=self.recall_after,
                       drop_pp=self.drop_pp)
        if self.probes is not None and self.probes.probes:
            out["probes"] = self.probes.to_report()
        return out


def _with_probes(explicit: GateResult, probes: ProbeResult | None, limit: float) -> GateResult:
    """One verdict from the used queries' and the probes': measured when either measured, failed when
    either failed; could not measure — by the probes' reason when nothing was replayed — otherwise."""
    if probes is None:
        return explicit
    if probes.status != "measured":
        if explicit.measured:
            return replace(explicit, probes=probes)
        status = probes.status if explicit.status in ("no_used_query", "nothing_removed") else explicit.status
        return replace(explicit, status=status, detail=UNMEASURED.get(status, explicit.detail), probes=probes)
    line = (f"probes: {probes.found_before} → {probes.found_after} of {probes.probes} removed, folded or demoted rows "
            f"found within the recall budget; {probes.lost:.1f} of {probes.memory} rows estimated unfindable "
            f"({-probes.drop_pp:+.1f} pp; limit −{limit:g} pp)" + (": FAILED" if probes.failed else ""))
    detail = f"{explicit.detail}; {line}" if explicit.measured else line
    return replace(explicit, status="measured", failed=explicit.failed or probes.failed, detail=detail, probes=probes)


def not_run(reason: str) -> dict[str, Any]:
    """The report's ``gate`` field of a run whose stage list has no gate (``reason``: why not)."""
    return {"status": "not_run", "detail": reason, "failed": False}


def _settings(config: Any) -> tuple[GateConfig, float]:
    gate = config if isinstance(config, GateConfig) else getattr(config, "gate", None)
    if not isinstance(gate, GateConfig):
        raise InputError(f"recall_gate: config must be a GateConfig or carry a gate section, got {type(config).__name__}")
    labels = getattr(config, "label_recalls", None)
    return gate, float(getattr(labels, "min_label", DEFAULT_MIN_LABEL))


def _nothing(status: str, queries: int = 0, before: float | None = None, after: float | None = None) -> GateResult:
    return GateResult(queries, before, after, None if before is None else 100.0 * (before - (after or 0.0)), False,
                      UNMEASURED[status], status)


def recall_gate(shard: Shard | Snapshot, diff: Diff, config: Any, embeddings: pl.DataFrame | None = None, *,
                now: datetime | None = None, embedder: EmbeddingProvider | None = None) -> dict[str, GateResult]:
    """The recall-quality gate of every scope of ``shard``: recall@k of its used memories before
    ``diff`` (the shard's, a ``scope_path`` on every row) and after (module docstring) and, with a
    run's configuration, the probes of what the night removes, folds or demotes
    (:func:`deep_sleep.run.probes.probe_gate`), merged into one verdict.  One pass over all scopes'
    rows in Polars; only the query × node similarity is a dense product per scope.  A
    :class:`Snapshot` is a shard of one.  ``config``: a :class:`GateConfig` (the used queries alone) or
    a run's configuration (its ``gate``, ``recall`` and ``label_recalls.min_label``); ``embeddings``:
    the nodes' (``id``, ``embedding``)."""
    if isinstance(shard, Snapshot):
        from deep_sleep.run.transform import as_shard_diff

        shard, diff = Shard.of(shard), as_shard_diff(diff, shard.scope_path)
    explicit = _used_queries_gate(shard, diff, config, embeddings, now=now, embedder=embedder)
    gate, _ = _settings(config)
    if not gate.enabled or getattr(config, "recall", None) is None:
        return explicit
    probes = probe_gate(shard, diff, config)
    return {s: _with_probes(r, probes.get(s), gate.probe_max_drop_pp) for s, r in explicit.items()}


def _used_queries_gate(shard: Shard, diff: Diff, config: Any, embeddings: pl.DataFrame | None = None, *,
                       now: datetime | None = None, embedder: EmbeddingProvider | None = None) -> dict[str, GateResult]:
    """The used queries' part of :func:`recall_gate` (module docstring)."""
    gate, min_label = _settings(config)
    scopes = list(shard.scope_paths)
    if not gate.enabled:
        return {s: _nothing("disabled") for s in scopes}
    now = utc(now or shard.taken_at)
    nodes_before = shard.table("memory_nodes")
    vectors = _vectors(nodes_before, embeddings)
    before = shard.with_frames({"memory_nodes": nodes_before.drop("embedding", strict=False)})
    after = diff.fold(before)
    queries, used = _queries(after.table("recall_events"), before.table("memory_nodes"), gate.max_queries, min_label,
                             gate.implicit)
    out = {s: _nothing("no_used_query") for s in scopes}
    if not queries.height:
        return out
    if vectors is None:
        return {s: _nothing("no_vectors") if s in set(queries.get_column("scope_path").to_list()) else r
                for s, r in out.items()}
    qvec = (embedder or default_embedder()).embed(queries.get_column("query").to_list())
    words = _query_words(queries)
    space = _Space(before.table("memory_nodes"), vectors, queries, qvec)
    hits_before = _top_k(before, space, queries, words, gate.k, now)
    hits_after = _top_k(after, space, queries, words, gate.k, now)
    per_query = (
        used.group_by("q").agg(pl.len().alias("n_used"))
        .join(_found(used, hits_before, "found_before"), on="q", how="left")
        .join(_found(used, hits_after, "found_after"), on="q", how="left")
        .join(queries.select("q", "scope_path"), on="q")
        .with_columns((pl.col("found_before").fill_null(0) / pl.col("n_used")).alias("before"),
                      (pl.col("found_after").fill_null(0) / pl.col("n_used")).alias("after"))
        .group_by("scope_path").agg(pl.len().alias("queries"), pl.col("before").mean(), pl.col("after").mean())
    )
    with_vectors = set(space.scopes_with_vectors())
    for s, n, b, a in per_query.select("scope_path", "queries", "before", "after").iter_rows():
        if s not in with_vectors:
            out[s] = _nothing("no_vectors", int(n))
            continue
        if b <= 0.0:
            out[s] = _nothing("zero_before", int(n), float(b), float(a))
            continue
        drop = 100.0 * (b - a)
        failed = drop > gate.max_drop_pp
        detail = (f"recall@{gate.k} of the used memories of {n} quer{'y' if n == 1 else 'ies'}: "
                  f"{b:.1%} → {a:.1%} ({-drop:+.1f} pp; limit −{gate.max_drop_pp:g} pp){': FAILED' if failed else ''}")
        out[s] = GateResult(int(n), float(b), float(a), drop, failed, detail)
    return out


def ranked_hits(snapshot: Snapshot, config: Any, embeddings: pl.DataFrame | None = None, *,
                now: datetime | None = None, embedder: EmbeddingProvider | None = None,
                with_scores: bool = False) -> pl.DataFrame:
    """(query, rank, node_id[, score]): the ``k`` best hits, best first (rank 1), of each query the
    gate replays, over ``snapshot`` as it is — what :func:`deep_sleep.online.recall.recall` with
    ``k = gate.k`` returns for it (given the same ``now``; up to float32 cosine rounding, see the
    module docstring).  Empty without embeddings or queries."""
    gate, min_label = _settings(config)
    shard = Shard.of(snapshot)
    nodes = shard.table("memory_nodes")
    vectors = _vectors(nodes, embeddings)
    state = shard.with_frames({"memory_nodes": nodes.drop("embedding", strict=False)})
    queries, _ = _queries(state.table("recall_events"), state.table("memory_nodes"), gate.max_queries, min_label,
                          gate.implicit)
    cols = ["query", "rank", "node_id"] + (["score"] if with_scores else [])
    empty = pl.DataFrame(schema={"query": pl.String, "rank": pl.Int64, "node_id": pl.String, "score": pl.Float64}).select(cols)
    if vectors is None or not queries.height:
        return empty
    qvec = (embedder or default_embedder()).embed(queries.get_column("query").to_list())
    space = _Space(state.table("memory_nodes"), vectors, queries, qvec)
    hits = _top_k(state, space, queries, _query_words(queries), gate.k, utc(now or snapshot.taken_at))
    return (hits.with_columns((pl.int_range(pl.len()).over("q") + 1).cast(pl.Int64).alias("rank"))
            .join(queries.select("q", "query"), on="q").sort("q", "rank").select(cols))


# -- inputs ------------------------------------------------------------------------------------

def _vectors(nodes: pl.DataFrame, embeddings: pl.DataFrame | None) -> pl.DataFrame | None:
    """(id, embedding) of the nodes that have one (the first row of an id given twice), or None
    when no embeddings were given at all."""
    if embeddings is None:
        if "embedding" not in nodes.columns:
            return None
        embeddings = nodes.select("id", "embedding")
    if "id" not in embeddings.columns or "embedding" not in embeddings.columns:
        raise InputError("recall_gate: embeddings must have the columns id and embedding")
    emb = embeddings.select("id", "embedding")
    if emb.null_count().sum_horizontal().item():
        emb = emb.drop_nulls()  # a copy of every vector: only when there is a null to drop
    if emb.get_column("id").n_unique() < emb.height:
        emb = emb.filter(pl.col("id").is_first_distinct())
    return emb


def _matrix(emb: pl.DataFrame, rows: np.ndarray | None = None) -> np.ndarray:
    """The embeddings (of ``rows`` of ``emb``, in that order; None: all) as unit float32 rows (a zero
    row becomes NaN: its distance is NaN, as pgvector's).  One copy of the vectors: the gather (or
    the copy) of Polars' own buffer, normalised in place."""
    n = emb.height if rows is None else len(rows)
    if not n:
        return np.zeros((0, EMBEDDING_DIM), dtype=np.float32)
    col = emb.get_column("embedding")
    if not isinstance(col.dtype, pl.Array):
        col = col.cast(pl.List(pl.Float32)).list.to_array(len(col[0]))
    raw = col.cast(pl.Array(pl.Float32, col.dtype.size)).to_numpy().reshape(emb.height, -1)  # a view where it can be
    mat = np.array(raw, dtype=np.float32, copy=True) if rows is None else raw[rows].astype(np.float32, copy=False)
    norms = np.sqrt(np.einsum("ij,ij->i", mat, mat))
    with np.errstate(invalid="ignore", divide="ignore"):
        mat /= norms[:, None]
    return mat


def _queries(recalls: pl.DataFrame, nodes: pl.DataFrame, max_queries: int, min_label: float,
             implicit: bool = False) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(queries: q, scope_path, query; used: q, node_id) — the replayed queries in gate order, per
    scope, and the used memories of each.  Used: explicit "used" feedback; with ``implicit`` also an
    implicit label of at least ``min_label``."""
    label, source = pl.col("label"), pl.col("label_source")
    explicit = (source == EXPLICIT) & (label == 1.0)
    guessed = ((source.fill_null("") != EXPLICIT) & (label >= min_label)) if implicit else pl.lit(False)
    used_rows = (
        recalls.filter(label.is_not_null() & pl.col("query").is_not_null() & pl.col("node_id").is_not_null()
                       & (explicit | guessed))
        .with_columns(explicit.alias("_explicit"))
        .join(nodes.select("scope_path", pl.col("id").alias("node_id")), on=["scope_path", "node_id"], how="semi")
    )
    ranked = (
        used_rows.group_by("scope_path", "query")
        .agg(pl.col("_explicit").any().alias("_explicit"), pl.col("label").max().alias("_best"),
             pl.col("created_at").max().alias("_last"))
        .sort(["scope_path", "_explicit", "_best", "_last", "query"], descending=[False, True, True, True, False],
              nulls_last=True)
        .with_columns(pl.int_range(pl.len()).over("scope_path").alias("_n"))
        .filter(pl.col("_n") < max_queries)
        .with_row_index("q")
        .select(pl.col("q").cast(pl.Int64), "scope_path", "query")
    )
    used = (
        used_rows.join(ranked, on=["scope_path", "query"])
        .select("q", "node_id").unique().sort("q", "node_id")
    )
    return ranked, used


def _query_words(queries: pl.DataFrame) -> pl.DataFrame:
    """(q, word): the words of each query, as the live recall counts them (:func:`query_words`)."""
    q = queries.get_column("q").to_list()
    words = [query_words(t) for t in queries.get_column("query").to_list()]  # one call per query (≤ max_queries a scope)
    return pl.DataFrame({"q": q, "word": words}, schema={"q": pl.Int64, "word": pl.List(pl.String)}).explode("word").drop_nulls()


def _found(used: pl.DataFrame, hits: pl.DataFrame, name: str) -> pl.DataFrame:
    return used.join(hits, on=["q", "node_id"], how="semi").group_by("q").agg(pl.len().alias(name))


# -- ranking -----------------------------------------------------------------------------------

def _fan(edges: pl.DataFrame, tops: pl.DataFrame) -> pl.DataFrame:
    """(scope_path, node, nb, weight): for each node of ``tops`` (scope_path, node), its up to 8
    heaviest current out-edges and up to 8 heaviest current in-edges (ties by the other end's id;
    a null weight first, as PostgreSQL's ``DESC``), as the live query's LATERAL takes them."""
    ids = tops.get_column("node").implode()
    cur = (edges.lazy().filter(pl.col("valid_to").is_null() & (pl.col("source_id").is_in(ids) | pl.col("target_id").is_in(ids)))
           .select("scope_path", "source_id", "target_id", "weight").collect().lazy())
    top = tops.lazy()
    out = (cur.join(top, left_on=["scope_path", "source_id"], right_on=["scope_path", "node"], how="semi")
           .sort(["scope_path", "source_id", "weight", "target_id"], descending=[False, False, True, False], nulls_last=False)
           .group_by("scope_path", "source_id", maintain_order=True).head(FAN_OUT)
           .select("scope_path", pl.col("source_id").alias("node"), pl.col("target_id").alias("nb"), "weight"))
    inc = (cur.join(top, left_on=["scope_path", "target_id"], right_on=["scope_path", "node"], how="semi")
           .sort(["scope_path", "target_id", "weight", "source_id"], descending=[False, False, True, False], nulls_last=False)
           .group_by("scope_path", "target_id", maintain_order=True).head(FAN_OUT)
           .select("scope_path", pl.col("target_id").alias("node"), pl.col("source_id").alias("nb"), "weight"))
    return pl.concat([out, inc]).collect()


def _degree(edges: pl.DataFrame, nodes: pl.DataFrame) -> pl.DataFrame:
    """(node_id, degree) of the ids ``nodes.node_id``: current edges out plus in, each side counted
    up to DEGREE_LIMIT (node ids are uuids, unique across scopes, and an edge lies in its nodes' scope)."""
    ids = nodes.get_column("node_id").unique().implode()
    cur = edges.lazy().filter(pl.col("valid_to").is_null())
    lim = rank.DEGREE_LIMIT
    out = (cur.filter(pl.col("source_id").is_in(ids)).group_by(pl.col("source_id").alias("node_id"))
           .agg(pl.len().clip(upper_bound=lim).alias("_o")))
    inc = (cur.filter(pl.col("target_id").is_in(ids)).group_by(pl.col("target_id").alias("node_id"))
           .agg(pl.len().clip(upper_bound=lim).alias("_i")))
    return (out.join(inc, on="node_id", how="full", coalesce=True)
            .select("node_id", (pl.col("_o").fill_null(0) + pl.col("_i").fill_null(0)).alias("degree"))
            .collect())


class _Space:
    """Every replayed query's cosine distance to every embedded node of its scope, computed once
    (embeddings do not change with the diff): per scope one dense float32 product, all kept in one
    flat array so any (query, node) distance is one gather.

    rows: (scope_path, id, _e) — the embedded nodes of the snapshot, sorted by scope and id, ``_e``
    their row.  A node's zero vector gives NaN (as pgvector's ``<=>``), a zero query no distance
    (the live recall returns no hit for it)."""

    def __init__(self, nodes: pl.DataFrame, vectors: pl.DataFrame, queries: pl.DataFrame, qvec: np.ndarray) -> None:
        index = vectors.select("id").with_row_index("_v")
        emb = nodes.select("scope_path", "id").join(index, on="id").sort("scope_path", "id")
        self.rows = emb.select("scope_path", "id").with_row_index("_e").with_columns(pl.col("_e").cast(pl.Int64))
        self.ids = emb.get_column("id").to_numpy()
        mat = _matrix(vectors, emb.get_column("_v").to_numpy())
        qnorm = np.linalg.norm(qvec, axis=1)
        qmat = np.divide(qvec, qnorm[:, None], out=np.zeros_like(qvec), where=qnorm[:, None] > 0).astype(np.float32)
        paths = emb.get_column("scope_path")
        q_paths = queries.get_column("scope_path")
        n_q = queries.height
        self.lo = np.zeros(n_q, dtype=np.int64)    # first node row of the query's scope
        self.n = np.zeros(n_q, dtype=np.int64)     # embedded nodes of the query's scope
        self.off = np.full(n_q, -1, dtype=np.int64)  # where the query's distances start in flat (-1: none)
        keys = pl.Series(sorted(set(q_paths.to_list()), key=str.encode), dtype=pl.String)
        lo, hi = paths.search_sorted(keys, "left").to_numpy(), paths.search_sorted(keys, "right").to_numpy()
        qlo, qhi = q_paths.search_sorted(keys, "left").to_numpy(), q_paths.search_sorted(keys, "right").to_numpy()
        blocks, at = [], 0
        self.blocks: list[tuple[np.ndarray, int, int, np.ndarray]] = []  # (query rows, node lo, node hi, dist)
        for i in range(len(keys)):
            a, b = int(lo[i]), int(hi[i])
            qs = np.arange(int(qlo[i]), int(qhi[i]))
            qs = qs[qnorm[qs] > 0]
            if a == b or not len(qs):
                continue
            dist = 1.0 - (qmat[qs] @ mat[a:b].T).astype(np.float64)
            self.blocks.append((qs, a, b, dist))
            self.lo[qs], self.n[qs] = a, b - a
            self.off[qs] = at + np.arange(len(qs)) * (b - a)
            blocks.append(dist.reshape(-1))
            at += dist.size
        self.flat = np.concatenate(blocks) if blocks else np.zeros(0)

    def scopes_with_vectors(self) -> list[str]:
        """The scopes that have at least one embedded node."""
        return self.rows.get_column("scope_path").unique().to_list()

    def dist(self, q: np.ndarray, e: np.ndarray) -> np.ndarray:
        """The distance of queries ``q`` to node rows ``e`` (nodes of the query's scope; NaN for e < 0)."""
        ok = (e >= 0) & (self.off[q] >= 0)
        out = np.full(len(q), np.nan)
        out[ok] = self.flat[self.off[q[ok]] + e[ok] - self.lo[q[ok]]]
        return out

    def seeds(self, alive: np.ndarray, n_seed: int) -> pl.DataFrame:
        """(q, node_id, dist): each query's ``n_seed`` nearest live embedded nodes (ties by id)."""
        parts_q, parts_e, parts_d = [], [], []
        for qs, a, b, dist in self.blocks:
            live = np.flatnonzero(alive[a:b])
            if not len(live):
                continue
            d = dist if len(live) == b - a else dist[:, live]
            order_d = np.where(np.isnan(d), np.inf, d)  # pgvector's NaN sorts after every number
            take = min(n_seed, len(live))
            if take < len(live):  # everything at or below the take-th smallest distance; ties cut by id below
                kth = np.partition(order_d, take - 1, axis=1)[:, take - 1:take]
                r, c = np.nonzero(order_d <= kth)
            else:
                r, c = np.divmod(np.arange(len(qs) * len(live)), len(live))
            parts_q.append(qs[r])
            parts_e.append(live[c] + a)
            parts_d.append(d[r, c])
        if not parts_q:
            return pl.DataFrame(schema={"q": pl.Int64, "node_id": pl.String, "dist": pl.Float64})
        e = np.concatenate(parts_e)
        d = np.concatenate(parts_d)
        seeds = pl.DataFrame({"q": np.concatenate(parts_q).astype(np.int64), "node_id": self.ids[e], "dist": d,
                              "_o": np.where(np.isnan(d), np.inf, d)})
        return seeds.sort("q", "_o", "node_id").group_by("q", maintain_order=True).head(n_seed).drop("_o")


def _top_k(state: Shard, space: _Space, queries: pl.DataFrame, words: pl.DataFrame, k: int, now: datetime) -> pl.DataFrame:
    """(q, node_id, score): each query's ``k`` best hits over ``state``, ranked as the live recall ranks."""
    nodes = state.table("memory_nodes")
    edges = state.table("memory_edges")
    n_seed = n_seeds(k)
    # the embedded nodes still there (ids are unique across scopes: a uuid each)
    mask = space.rows.get_column("id").is_in(nodes.get_column("id").implode()).to_numpy()
    seeds = space.seeds(mask, n_seed)
    qscope = queries.select("q", "scope_path")
    top = (seeds.group_by("q", maintain_order=True).head(k).join(qscope, on="q")
           .select("q", "scope_path", pl.col("node_id").alias("via"), (1.0 - pl.col("dist")).alias("_via_sim")))
    hop = (
        top.join(_fan(edges, top.select("scope_path", pl.col("via").alias("node")).unique()),
                 left_on=["scope_path", "via"], right_on=["scope_path", "node"])
        .join(seeds.select("q", pl.col("node_id").alias("nb")), on=["q", "nb"], how="anti")
        .sort(["q", "nb", "weight", "via"], descending=[False, False, True, False], nulls_last=False)
        .group_by("q", "nb", maintain_order=True).first()
        .join(nodes.select("scope_path", pl.col("id").alias("nb")), on=["scope_path", "nb"], how="semi")
    )
    cand = pl.concat([
        seeds.join(qscope, on="q").select("q", "scope_path", "node_id", "dist", pl.lit(None, pl.String).alias("via"),
                                          pl.lit(None, pl.Float64).alias("weight"), pl.lit(None, pl.Float64).alias("_via_sim")),
        hop.select("q", "scope_path", pl.col("nb").alias("node_id"), pl.lit(None, pl.Float64).alias("dist"), "via",
                   pl.col("weight").cast(pl.Float64), "_via_sim"),
    ])
    hop_rows = cand.get_column("via").is_not_null().to_numpy()
    dist = cand.get_column("dist").fill_null(np.nan).to_numpy().copy()
    if hop_rows.any():  # a neighbour's own distance (NaN without an embedding)
        nb = (cand.filter(pl.col("via").is_not_null()).select("q", "scope_path", "node_id")
              .join(space.rows, left_on=["scope_path", "node_id"], right_on=["scope_path", "id"], how="left",
                    maintain_order="left"))
        dist[hop_rows] = space.dist(nb.get_column("q").to_numpy(), nb.get_column("_e").fill_null(-1).to_numpy())
    cand = (
        cand.with_columns(pl.Series("dist", dist))
        .join(nodes.select("scope_path", pl.col("id").alias("node_id"), "layer", "label", "importance",
                           "access_count", "updated_at", pl.col("scope_path").alias("_node_path")),
              on=["scope_path", "node_id"], how="left", maintain_order="left")
    )
    cand = (cand.join(_degree(edges, cand), on="node_id", how="left", maintain_order="left")
            .with_row_index("_r"))
    cand = cand.join(_overlap(cand, words), on="_r", how="left").sort("_r")
    xp = rank.ARRAY
    f64 = lambda name: cand.get_column(name).cast(pl.Float64).fill_null(np.nan).to_numpy()  # noqa: E731
    sim = rank.similarity(f64("dist"))
    via_sim = np.nan_to_num(f64("_via_sim"), nan=0.0)
    spread = np.where(hop_rows, rank.spread(via_sim, np.nan_to_num(f64("weight"), nan=0.0)), 0.0)
    base = rank.base_score(sim, spread, hop_rows)
    reader_depth = cand.select((pl.col("scope_path").str.count_matches(SEP, literal=True) + 1) // 2).to_series().to_numpy()
    node_depth = cand.select((pl.col("_node_path").str.count_matches(SEP, literal=True) + 1) // 2).to_series()
    up = np.where(node_depth.is_null().to_numpy(), reader_depth - 1, reader_depth - node_depth.fill_null(0).to_numpy())
    age = (pl.lit(now, dtype=pl.Datetime("us", "UTC")) - cand.get_column("updated_at")).dt.total_microseconds()
    x = np.column_stack(rank.features(
        sim, f64("importance"), pl.select(age).to_series().cast(pl.Float64).to_numpy() / 1e6,
        cand.get_column("access_count").fill_null(0).to_numpy(), cand.get_column("degree").fill_null(0).to_numpy(),
        hop_rows, spread, (cand.get_column("layer") == "working").fill_null(False).to_numpy(),
        cand.get_column("label").fill_null("").str.len_chars().to_numpy(), up.astype(np.float64),
        reader_depth.astype(np.float64), cand.get_column("_overlap").fill_null(0.0).to_numpy(),
        cand.get_column("label").fill_null("").str.starts_with("META:").to_numpy(), xp,
    ))
    score = base + _adjustments(state, cand.get_column("scope_path"), x)
    # ids by their rank in string order: the same order as the text, cheaper to sort than strings
    id_rank = cand.get_column("node_id").rank("dense").to_numpy()
    best = rank.order(score, sim, id_rank, group=cand.get_column("q").to_numpy())
    ranked = cand.select("q", "node_id", pl.Series("score", score))[best]
    return ranked.group_by("q", maintain_order=True).head(k)


def _overlap(cand: pl.DataFrame, words: pl.DataFrame) -> pl.DataFrame:
    """(_r, _overlap): the share of the query's words that are words of the candidate's label."""
    labels = cand.get_column("label").fill_null("").unique().to_list()
    flat_label, flat_word = [], []
    for text in labels:  # one call per distinct candidate label: the live recall's own tokenizer
        found = query_words(text)
        flat_label += [text] * len(found)
        flat_word += found
    label_words = pl.DataFrame({"label": flat_label, "word": flat_word}, schema={"label": pl.String, "word": pl.String})
    n_words = words.group_by("q").agg(pl.len().alias("_n"))
    hits = (cand.select("_r", "q", pl.col("label").fill_null(""))
            .join(label_words, on="label").join(words, on=["q", "word"], how="inner")
            .group_by("_r", "q").agg(pl.len().alias("_hit")))
    return (hits.join(n_words, on="q").select("_r", (pl.col("_hit") / pl.col("_n")).alias("_overlap")))


def _adjustments(state: Shard, paths: pl.Series, x: np.ndarray) -> np.ndarray:
    """Phase D3's capped adjustment ``clip(w · x + b, ±CAP)`` of each candidate with its scope's
    model (none: 0), for every scope at once: each row's weights gathered by its scope, the dot
    product summed feature by feature in a fixed order, so a row's value never depends on the other
    rows computed with it (a shard gives each scope exactly its own gate's figures; the live path's
    BLAS product may differ in the last bit, as the module docstring allows)."""
    models = state.table("reranker_models")
    out = np.zeros(len(x))
    if not models.height or not len(x):
        return out
    by_scope: Mapping[str, tuple] = {r[0]: (r[1], r[2]) for r in models.select("scope_path", "weights", "bias").iter_rows()}
    keys = list(by_scope)
    fitted = [rank.model(by_scope[k]) for k in keys]
    w = np.vstack([f[0] for f in fitted]) if fitted else np.zeros((0, x.shape[1]))
    b = np.array([f[1] for f in fitted], dtype=np.float64)
    index = pl.DataFrame({"scope_path": keys, "_m": np.arange(len(keys), dtype=np.int64)},
                         schema={"scope_path": pl.String, "_m": pl.Int64})
    m = (pl.DataFrame({"scope_path": paths}).join(index, on="scope_path", how="left", maintain_order="left")
         .get_column("_m").fill_null(-1).to_numpy())
    rows = np.flatnonzero(m >= 0)
    if not len(rows):
        return out
    mine, xr = m[rows], x[rows]
    wm = w[mine]
    acc = xr[:, 0] * wm[:, 0]
    for j in range(1, xr.shape[1]):  # feature by feature: the same sum for a row whatever rows come with it
        acc = acc + xr[:, j] * wm[:, j]
    out[rows] = np.clip(acc + b[mine], -CAP, CAP)
    return out


def _adjustments_by_scope(state: Shard, paths: pl.Series, x: np.ndarray) -> np.ndarray:
    """The plain version of :func:`_adjustments`: phase D3's own :func:`adjustment` (a BLAS
    product) scope by scope (one boolean mask over every candidate per scope: quadratic in the
    scopes of a shard).  Kept as the reference the fast one is tested
    against (equal to ~1e-15: the fixed-order sum against BLAS's)."""
    models = state.table("reranker_models")
    out = np.zeros(len(x))
    if not models.height or not len(x):
        return out
    by_scope: Mapping[str, tuple] = {r[0]: (r[1], r[2]) for r in models.select("scope_path", "weights", "bias").iter_rows()}
    p = paths.to_numpy()
    for scope in set(by_scope) & set(paths.unique().to_list()):
        weights, bias = rank.model(by_scope[scope])
        rows = p == scope
        out[rows] = adjustment(weights, bias, x[rows])
    return out
