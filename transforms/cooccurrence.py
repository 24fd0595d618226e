"""Phase 1.5 — cooccurrence: nodes touched close together in time get linked (SPEC §3)."""

from __future__ import annotations

import math
from datetime import datetime

import numpy as np
import polars as pl
import pyarrow as pa

from deep_sleep import tables
from deep_sleep.config import CooccurrenceConfig
from deep_sleep.diff import Diff
from deep_sleep.scope import Scope
from deep_sleep.snapshot import Snapshot
from transforms._common import PhaseResult, created_ids, in_window, window_start

RELATION = "CO_OCCURRED"


def cooccurrence(
    snapshot: Snapshot, config: CooccurrenceConfig, as_of: datetime, lookback_hours: float, scope_path: str
) -> PhaseResult:
    """Pairs of distinct recent nodes with |Δ``updated_at``| ≤ ``window_seconds`` (boundary included, µs
    precision).  A pair that already has a ``CO_OCCURRED`` edge in either direction is reinforced: every
    such edge gets weight + 1, so if edges exist both ways each gets one update (and the counter counts
    edges).  Any other pair is a candidate; a node's free slots are ``max_neighbours`` minus its distinct
    ``CO_OCCURRED`` neighbours (any node, self-loops not counted; never below 0).  (a, b) becomes an
    edge (source = smaller id, weight 1, id from ``source|target``) iff each is among the other's
    free-slot nearest candidates, nearest by |Δ``updated_at``| then by the partner's id (text order);
    a full node still takes a slot in its candidates' rankings, it just never accepts.  Any existing
    ``CO_OCCURRED`` edge counts, including one closed by ``valid_to`` (the store's unique key ignores
    validity), and is reinforced like the others.  Only each node's few nearest partners matter: a
    node with free slots has fewer than ``max_neighbours`` existing neighbours, so its choices lie
    within ``max_neighbours`` positions on each side of it in time order (and the first
    ``max_neighbours`` + 1 of its equal-time group) — O(N·max_neighbours) pairs after an O(N log N) sort.
    """
    zero = {"edges_created": 0, "edges_reinforced": 0}
    start = window_start(snapshot, as_of, lookback_hours)
    width = math.floor(config.window_seconds * 1_000_000 + 1e-6)  # µs; the boundary itself is in
    k = config.max_neighbours

    # Recent nodes, numbered in id order: comparing numbers is comparing ids.  Lazy: the frames
    # arrive in misaligned chunks after earlier phases' folds, and an eager select would copy
    # every column to realign them.  Put in id order by :func:`_text_order` (no string sort).
    recent = (
        snapshot.table("memory_nodes")
        .lazy()
        .select("id", "layer", "updated_at")
        .filter((pl.col("layer") == "semantic") & in_window("updated_at", start, as_of))
        .select("id", pl.col("updated_at").dt.epoch("us").alias("t"))
        .collect()
    )
    # The gather leaves one chunk: gathers and joins on a chunked string column are several times slower.
    recent = recent.select(pl.all().gather(_text_order(recent.get_column("id"))))
    recent = recent.with_row_index("i").with_columns(pl.col("i").cast(pl.Int64))
    n = recent.height
    if n < 2:
        return PhaseResult(counters=zero)

    edges = (
        snapshot.table("memory_edges")
        .lazy()
        .select("id", "version", "weight", "source_id", "target_id", "relation")
        .filter(pl.col("relation") == RELATION)
        .collect()
        .rechunk()  # the joins below are faster on one chunk
        .filter(pl.col("source_id") != pl.col("target_id"))  # compares ids of CO_OCCURRED edges only
    )
    # Each CO_OCCURRED edge with its ends' numbers where they are recent (one join per end): edges
    # with both ends recent are the existing pairs; every edge gives its recent ends a neighbour.
    ends = (
        edges.join(recent.rename({"id": "source_id", "i": "si", "t": "st"}), on="source_id", how="left")
        .join(recent.rename({"id": "target_id", "i": "ti", "t": "tt"}), on="target_id", how="left")
        .filter(pl.col("si").is_not_null() | pl.col("ti").is_not_null())
    )
    linked = ends.filter(pl.col("si").is_not_null() & pl.col("ti").is_not_null())
    neighbours = pl.concat(
        [
            ends.filter(pl.col("si").is_not_null()).select(pl.col("si").alias("i"), pl.col("target_id").alias("nbr")),
            ends.filter(pl.col("ti").is_not_null()).select(pl.col("ti").alias("i"), pl.col("source_id").alias("nbr")),
        ]
    )
    degree = neighbours.unique().group_by("i").len("deg")  # distinct neighbours, either direction
    deg = np.zeros(n, dtype=np.int64)  # by node number: recent's rows are numbers 0..n-1 in order
    deg[degree.get_column("i").to_numpy()] = degree.get_column("deg").to_numpy()
    nodes = recent.select("i", "t").with_columns(pl.Series("free", np.maximum(k - deg, 0)))

    reinforced = linked.filter((pl.col("st") - pl.col("tt")).abs() <= width)
    new_pairs = _mutual_nearest(nodes, linked, n, k, width) if k > 0 else pl.DataFrame(schema={"a": pl.Int64, "b": pl.Int64})

    updates = inserts = None
    if reinforced.height:
        updates = reinforced.select("id", "version", (pl.col("weight") + 1.0).alias("weight")).sort("id")
    if new_pairs.height:
        id_of = recent.get_column("id")
        pairs = pl.DataFrame({"source_id": id_of.gather(new_pairs["a"]), "target_id": id_of.gather(new_pairs["b"])})
        keys = pairs.select(pl.concat_str("source_id", "target_id", separator="|")).to_series()
        inserts = pairs.select(  # in (source, target) order: deterministic without sorting the ids
            created_ids(scope_path, "cooccurrence", keys).alias("id"),
            pl.lit(scope_path).alias("scope_path"),
            pl.lit(Scope.parse(scope_path).tenant_id).alias("tenant_id"),
            "source_id",
            "target_id",
            pl.lit(RELATION).alias("relation"),
            pl.lit(1.0).alias("weight"),
            pl.lit("{}").alias("properties"),
            *(pl.lit(as_of).dt.cast_time_unit("us").alias(c) for c in ("created_at", "updated_at", "valid_from")),
            # Present (null) so that a later phase's update of the new edge (supersession) merges into it.
            pl.lit(None, dtype=tables.TS).alias("valid_to"),
        )
    return PhaseResult(
        diff=Diff.of("memory_edges", "cooccurrence", inserts=inserts, updates=updates),
        counters={"edges_created": new_pairs.height, "edges_reinforced": reinforced.height},
    )


def _mutual_nearest(nodes: pl.DataFrame, linked: pl.DataFrame, n: int, k: int, width: int) -> pl.DataFrame:
    """Pairs (a < b) of node numbers that pick each other among their ``free`` nearest candidates.

    ``nodes``: i (id order; row r is node r), t (µs), free.  ``linked``: existing edges as si/ti (not
    candidates).  Rows follow the time order (t, id).  A row's candidates at other times are the ``k``
    nearest strictly later and strictly earlier nodes (see :func:`cooccurrence`); each is packed into
    one integer ``gap·n + partner``, so that integer order is the ranking order, in an ``n × 2k`` matrix
    whose rows are sorted on their own (tiny sorts instead of one big sort).  Same-time partners (gap 0,
    so ranked first) are merged in only for the rows that have any.  Everything is dense column
    arithmetic on length-n vectors (no compaction, no hashing); linked pairs are found by their packed
    value, the picks checked for mutuality by gathers from the node-numbered pick table.
    """
    none = np.iinfo(np.int64).max
    t_by_i = nodes.get_column("t").to_numpy()
    i_of = _time_order(t_by_i)  # row p of the matrix is node i_of[p]
    t = t_by_i[i_of]
    free = nodes.get_column("free").to_numpy()[i_of]
    pos = np.arange(n, dtype=np.int64)
    row_of = np.empty(n, dtype=np.int64)
    row_of[i_of] = pos  # node number → matrix row
    # Each row's equal-time group: its first (gs) and last (ge) row.
    new = np.ones(n, dtype=bool)
    new[1:] = t[1:] != t[:-1]
    gs = np.maximum.accumulate(np.where(new, pos, 0))
    last = np.ones(n, dtype=bool)
    last[:-1] = new[1:]
    ge = np.minimum.accumulate(np.where(last, pos, n)[::-1])[::-1]
    # Arrays padded by k, so that a neighbour beyond either end reads a dummy row (position n, masked).
    # Reversing each equal-time group gives order (t, id desc): walking left from a group's start in
    # it gives earlier times nearest first and, within one earlier time, the smallest id first.
    pad = np.zeros(k, dtype=np.int64)
    t_pad, i_pad = np.concatenate([t, pad]), np.concatenate([i_of, pad])
    desc_pad = np.concatenate([np.full(k, n), gs + ge - pos])  # position in (t, id desc) → in (t, id)

    def sides():  # (partner row, gap) of each row's j-th strictly later and strictly earlier node
        for j in range(1, k + 1):
            at = ge + j
            yield at, t_pad[at] - t
            at = desc_pad[gs - j + k]
            yield at, t - t_pad[at]

    # The gap is packed as itself, or, when gap·n could overflow (only for absurdly wide windows), as
    # 1 + its rank among the candidates' gaps (≥ 1: gap 0 stays the same-time partners' alone).
    keyset = None
    if (width + 1) * n >= 2**62:
        keyset = np.unique(np.concatenate([gap[(at < n) & (gap <= width)] for at, gap in sides()]))

    def packed(gap: np.ndarray, partner: np.ndarray) -> np.ndarray:
        if keyset is not None:
            gap = np.searchsorted(keyset, gap) + 1
        return gap * n + partner  # wraps around only where masked as no candidate

    rank = np.empty((2 * k, n), dtype=np.int64)  # filled slot by slot (contiguous), transposed below
    for slot, (at, gap) in enumerate(sides()):
        value = packed(gap, i_pad[at])
        value[(at >= n) | (gap > width)] = none
        rank[slot] = value
    rank = rank.T.copy()
    # Pairs that already have a CO_OCCURRED edge are not candidates: a row holds each partner at most
    # once, and its packed value is known.
    si, ti = linked.get_column("si").to_numpy(), linked.get_column("ti").to_numpy()
    gap = np.abs(t_by_i[si] - t_by_i[ti])
    near = gap <= width
    si, ti, gap = si[near], ti[near], gap[near]
    ends = ((row_of[si], ti), (row_of[ti], si))
    for rows, others in ends:
        _drop(rank, rows, packed(gap, others))
    rank.sort(axis=1)  # one tiny sort per row instead of one big sort of every candidate
    # Rows in equal-time groups: their first k + 1 group members but themselves (gap 0, packed as the
    # partner's number) come before every other candidate.
    multi = np.flatnonzero(ge > gs)
    if multi.size:
        at = gs[multi, None] + np.arange(k + 1)
        ok = (at <= ge[multi, None]) & (at != multi[:, None])
        same = np.where(ok, i_of[np.where(ok, at, 0)], none)
        sub = np.full(n, -1)
        sub[multi] = np.arange(multi.size)  # matrix row → row of `same`
        for rows, others in ends:
            rows = sub[rows]
            has = rows >= 0
            _drop(same, rows[has], others[has])
        same = np.concatenate([same, rank[multi]], axis=1)
        same.sort(axis=1)
        rank[multi, :k] = same[:, :k]
    # A row picks its first `free` (≤ k) ranked candidates: they sit in the first k columns.
    rank = rank[:, :k]
    chosen = (rank != none) & (np.arange(k) < free[:, None])
    picks = np.take(np.where(chosen, rank % n, -1), row_of, axis=0)  # by node number, -1 for none
    at = np.flatnonzero(picks > pos[:, None])  # a picked b > a
    a, b = at // k, picks.ravel()[at]
    by_slot = picks.T.copy()
    mutual = by_slot[0][b] == a  # b picked a too
    for c in range(1, k):
        mutual |= by_slot[c][b] == a
    key = np.sort(a[mutual] * n + b[mutual])
    return pl.DataFrame({"a": key // n, "b": key % n})


def _drop(rank: np.ndarray, rows: np.ndarray, values: np.ndarray) -> None:
    """Mark the candidate packed as ``values[m]`` of matrix row ``rows[m]`` (where present) as none."""
    m, c = np.nonzero(np.take(rank, rows, axis=0) == values[:, None])
    rank[rows[m], c] = np.iinfo(np.int64).max


def _time_order(t: np.ndarray) -> np.ndarray:
    """Stable argsort of ``t`` (order (t, row)): one sort of ``(t − min)·n + row`` when that cannot
    overflow (several times faster than numpy's stable argsort)."""
    n = len(t)
    lo, hi = int(t.min()), int(t.max())
    if (hi - lo + 1) * n >= 2**63:
        return np.argsort(t, kind="stable")
    key = (t - lo) * n + np.arange(n)
    key.sort()
    return key % n


def _text_order(ids: pl.Series) -> np.ndarray:
    """``ids.arg_sort()`` for distinct non-null ids: the permutation that puts them in text order.

    Sorting 142k 36-character strings costs Polars ~50 ms.  When all ids have one length (UUIDs),
    their bytes form an ``(n, L)`` matrix, and its columns read as big-endian 64-bit words order the
    rows as the text does (byte order, as Polars compares strings): one integer sort of the first
    word (~10 ms), then the few rows whose first words tie are ordered by all their words.
    """
    arr = ids.to_arrow()
    n = len(arr)
    if ids.null_count() or n < 2 or not isinstance(arr, pa.LargeStringArray):
        return ids.arg_sort().to_numpy()
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64, count=n + 1, offset=arr.offset * 8)
    width = int(offsets[1] - offsets[0])
    if width == 0 or not (np.diff(offsets) == width).all():
        return ids.arg_sort().to_numpy()
    text = np.zeros((n, -(-width // 8) * 8), dtype=np.uint8)  # zero-padded to whole words
    text[:, :width] = np.frombuffer(arr.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[0] + width * n].reshape(n, width)
    words = text.view(">u8").astype(np.uint64)  # (n, words), native byte order for the sorts
    order = np.argsort(words[:, 0])
    first = words[order, 0]
    tie = np.zeros(n, dtype=bool)
    same = first[1:] == first[:-1]
    tie[1:] |= same
    tie[:-1] |= same
    if tie.any():  # tied runs keep their places; within them, all words decide
        sub = order[tie]
        order[tie] = sub[np.lexsort(words[sub].T[::-1])]
    return order
