"""Phase 1.5 — cooccurrence: nodes touched close together in time get linked (SPEC §3)."""

from __future__ import annotations

import functools
import math
from datetime import datetime

import numpy as np
import polars as pl

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
    # every column to realign them.
    recent = (
        snapshot.table("memory_nodes")
        .lazy()
        .select("id", "layer", "updated_at")
        .filter((pl.col("layer") == "semantic") & in_window("updated_at", start, as_of))
        .select("id", pl.col("updated_at").dt.epoch("us").alias("t"))
        .sort("id")
        .with_row_index("i")
        .with_columns(pl.col("i").cast(pl.Int64))
        .collect()
        .rechunk()  # one chunk: gathers and joins on a chunked string column are several times slower
    )
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

    ``nodes``: i (id order), t (µs), free.  ``linked``: existing edges as si/ti (not candidates).
    A node's candidates lie within ``k`` places of it in time order (see :func:`cooccurrence`), so
    they fit in one row of a ``n × (3k + 1)`` matrix: each row is sorted on its own (tiny sorts
    instead of one big sort of every candidate).  Rows follow the time order and pairs are checked
    against each row's few slots, so there is no hashing and memory is mostly written in sequence.
    """
    order = _positions(nodes.sort(["t", "i"]))  # order (t, id): row p of the matrix is position p here
    i_of, t, gs, ge, pos = order["i"], order["t"], order["gs"], order["ge"], order["pos"]
    # Reversing each equal-time group gives order (t, id desc): walking left from a group's start in
    # it gives earlier times nearest first and, within one earlier time, the smallest id first.
    desc = gs + ge - pos  # position in (t, id desc) → position in (t, id), and back
    has_free = order["free"] > 0
    none = np.iinfo(np.int64).max
    slots = 3 * k + 1
    # Filled one slot at a time, so slot-major (each fill writes one contiguous row); transposed below.
    dt = np.full((slots, n), none, dtype=np.int64)
    partner = np.zeros((slots, n), dtype=np.int64)
    fill = functools.partial(_place, dt, partner, i_of, t, has_free, width)
    slot = 0
    for j in range(1, k + 1):
        fill(slot, ge + j)  # strictly later
        earlier = gs - j
        fill(slot + 1, np.where(earlier >= 0, desc[earlier.clip(0)], -1))  # strictly earlier
        slot += 2
    for j in range(k + 1):
        at = gs + j
        fill(slot, np.where((at <= ge) & (at != pos), at, -1))  # same time
        slot += 1
    row_of = np.empty(n, dtype=np.int64)
    row_of[i_of] = pos  # node number → matrix row
    valid = dt != none
    # Pairs that already have a CO_OCCURRED edge are not candidates (a node's row holds each partner once).
    si, ti = linked.get_column("si").to_numpy(), linked.get_column("ti").to_numpy()
    _drop(valid, partner, row_of[si], ti)
    _drop(valid, partner, row_of[ti], si)
    # Rank by (|Δt|, partner) packed in one integer; |Δt| is replaced by its dense rank when the
    # packed value could overflow (only for absurdly wide windows).
    gap = dt[valid]
    if gap.size and (int(gap.max()) + 1) * n >= 2**62:
        dt[valid] = np.unique(gap, return_inverse=True)[1].astype(np.int64)
    rank = dt  # in place: the matrices are large
    rank *= n  # products of non-candidates wrap around, and are overwritten next
    rank += partner
    rank[~valid] = none
    rank = rank.T.copy()
    rank.sort(axis=1)  # one tiny sort per node instead of one big sort of every candidate
    # A node picks its first `free` (≤ k) ranked candidates: they sit in the first k columns.
    rank = rank[:, :k]
    chosen = (rank != none) & (np.arange(k)[None, :] < order["free"][:, None])
    picks = np.where(chosen, rank % n, -1)  # each row's picked partners, -1 for none
    rows = np.broadcast_to(pos[:, None], picks.shape)[chosen]
    a, b = i_of[rows], picks[chosen]
    keep = a < b
    a, b = a[keep], b[keep]
    mutual = (picks[row_of[b]] == a[:, None]).any(axis=1)  # b picked a too
    key = np.sort(a[mutual] * n + b[mutual])
    return pl.DataFrame({"a": key // n, "b": key % n})


def _drop(valid: np.ndarray, partner: np.ndarray, rows: np.ndarray, others: np.ndarray) -> None:
    """Mark the candidate ``others[m]`` of matrix row ``rows[m]`` (where present) as not a candidate
    (the arrays are slot-major: ``[slot, row]``)."""
    c, m = np.nonzero((partner[:, rows] == others[None, :]) & valid[:, rows])
    valid[c, rows[m]] = False


def _positions(ordered: pl.DataFrame) -> dict[str, np.ndarray]:
    """Numpy columns of ``ordered`` plus each row's position and its equal-time group's first (gs)
    and last (ge) position in this order."""
    t = ordered.get_column("t").to_numpy()
    pos = np.arange(len(t), dtype=np.int64)
    new = np.ones(len(t), dtype=bool)
    new[1:] = t[1:] != t[:-1]
    gs = np.maximum.accumulate(np.where(new, pos, 0))
    last = np.ones(len(t), dtype=bool)
    last[:-1] = t[1:] != t[:-1]
    ge = np.minimum.accumulate(np.where(last, pos, len(t))[::-1])[::-1]
    return {"i": ordered.get_column("i").to_numpy(), "t": t, "free": ordered.get_column("free").to_numpy(),
            "pos": pos, "gs": gs, "ge": ge}


def _place(dt: np.ndarray, partner: np.ndarray, i_of: np.ndarray, t: np.ndarray, has_free: np.ndarray, width: int,
           slot: int, at: np.ndarray) -> None:
    """Write into slot ``slot`` of each matrix row the |Δt| and number of the partner at row ``at``
    (nothing where ``at`` is out of range, the partner is farther than ``width``, or the row's node
    has no free slot)."""
    n = len(t)
    rows = np.flatnonzero((at >= 0) & (at < n) & has_free)
    other = at[rows]
    gap = np.abs(t[other] - t[rows])
    near = gap <= width
    rows, other, gap = rows[near], other[near], gap[near]
    dt[slot, rows] = gap
    partner[slot, rows] = i_of[other]
