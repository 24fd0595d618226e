"""Phase 1.5 — cooccurrence: nodes touched close together in time get linked (SPEC §3)."""

from __future__ import annotations

import math
from datetime import datetime

import numpy as np
import polars as pl
from deep_sleep.transforms._common import (
    PhaseResult,
    in_own_window,
    scope_paths,
    scoped_created_ids,
    scoped_result,
    tenant_of,
)
from pydantic import Field

from deep_sleep.core import tables
from deep_sleep.core.config import PhaseConfig
from deep_sleep.core.diff import Diff
from deep_sleep.core.lookup import text_order
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot


class CooccurrenceConfig(PhaseConfig):
    window_seconds: float = Field(900.0, ge=0)
    max_neighbours: int = Field(5, ge=0)


#: The counters this phase reports (SPEC §3).
COUNTERS: tuple[str, ...] = ("edges_created", "edges_reinforced")


RELATION = "CO_OCCURRED"


def cooccurrence(snapshot: Snapshot | Shard, config: CooccurrenceConfig, as_of: datetime, lookback_hours: float) -> PhaseResult:
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

    Per scope (a :class:`~deep_sleep.core.shard.Shard` or a single-scope snapshot): "recent" is each
    scope's own window, pairs, neighbours and edges are the scope's own (an edge counts for a node only
    if it is of the node's scope).  The scopes are laid end to end on one time axis, farther apart than
    ``window_seconds`` (see :func:`_apart`), so one pass ranks every scope's candidates on its own.
    """
    width = math.floor(config.window_seconds * 1_000_000 + 1e-6)  # µs; the boundary itself is in
    k = config.max_neighbours
    paths = scope_paths(snapshot)
    multi = len(paths) > 1
    # A scope is named by its number (its position in the shard's sorted scope list) on a shard.
    code = [pl.col("scope_path").cast(pl.Enum(paths)).to_physical().cast(pl.Int64).alias("sc")] if multi else []

    # Recent nodes, numbered in id order: comparing numbers is comparing ids.  Lazy: the frames
    # arrive in misaligned chunks after earlier phases' folds, and an eager select would copy
    # every column to realign them.  Put in id order by :func:`deep_sleep.core.lookup.text_order` (no string sort).
    recent = (
        snapshot.table("memory_nodes")
        .lazy()
        .select(*(["scope_path"] if multi else []), "id", "layer", "updated_at")
        .filter((pl.col("layer") == "semantic") & in_own_window(snapshot, "updated_at", as_of, lookback_hours))
        .select(*code, "id", pl.col("updated_at").dt.epoch("us").alias("t"))
        .collect()
        .rechunk()  # the sort and the gather below are several times slower on a chunked string column
    )
    recent = recent.select(pl.all().gather(text_order(recent.get_column("id"))))
    if recent.height < 2:
        return scoped_result(Diff.empty(), None, COUNTERS)

    # CO_OCCURRED edges, narrow: their row number (the other columns are fetched for the reinforced
    # ones only) and their ends, with the ends' id hashes for the joins below.
    edges = (
        snapshot.table("memory_edges")
        .lazy()
        .select("relation", "source_id", "target_id", *(["scope_path"] if multi else []))
        .with_row_index("_row")
        .filter(pl.col("relation") == RELATION)
        .select("_row", "source_id", "target_id", *code)
        .collect()
        .rechunk()  # the hashes and joins below are faster on one chunk
        .filter(pl.col("source_id") != pl.col("target_id"))  # compares ids of CO_OCCURRED edges only
        .with_columns(pl.col("source_id").hash().alias("sh"), pl.col("target_id").hash().alias("th"))
    )
    if not multi:
        reinforced, pairs = _link(recent, edges, k, width)
    else:
        apart = _apart(recent.get_column("t").to_numpy(), recent.get_column("sc").to_numpy(), width)
        if apart is not None:
            t, wide = apart
            reinforced, pairs = _link(recent.with_columns(pl.Series("t", t)), edges, k, wide)
        else:  # only for windows of years over thousands of nodes: the axis would overflow; scope by scope
            parts = [_link(recent.filter(pl.col("sc") == c), edges.filter(pl.col("sc") == c), k, width)
                     for c in recent.get_column("sc").unique().sort().to_list()]
            reinforced = pl.concat([r for r, _ in parts])
            pairs = pl.concat([p for _, p in parts])

    updates = inserts = None
    if reinforced.height:
        updates = (  # a filter on the row number: unlike a gather, fast on a frame in many chunks
            snapshot.table("memory_edges")
            .lazy()
            .select("id", "version", "weight", *(["scope_path"] if multi else []))
            .with_row_index("_row")
            .filter(pl.col("_row").is_in(reinforced.get_column("_row").implode()))
            .select(*(["scope_path"] if multi else []), "id", "version", (pl.col("weight") + 1.0).alias("weight"))
            .collect()
            .sort("id", multithreaded=False)  # polars' parallel sort of strings is slower at these sizes
        )
    if pairs.height:
        scope = (pl.Series("scope_path", paths, dtype=pl.String).gather(pairs.get_column("sc")) if multi
                 else pl.repeat(paths[0], pairs.height, dtype=pl.String, eager=True).alias("scope_path"))
        pairs = pairs.with_columns(scope)
        keys = pairs.select(pl.concat_str("source_id", "target_id", separator="|")).to_series()
        inserts = pairs.select(  # in (source, target) order: deterministic without sorting the ids
            scoped_created_ids(pairs.get_column("scope_path"), "cooccurrence", keys).alias("id"),
            "scope_path",
            tenant_of("scope_path").alias("tenant_id"),
            "source_id",
            "target_id",
            pl.lit(RELATION).alias("relation"),
            pl.lit(1.0).alias("weight"),
            pl.lit("{}").alias("properties"),
            *(pl.lit(as_of).dt.cast_time_unit("us").alias(c) for c in ("created_at", "updated_at", "valid_from")),
            # Present (null) so that a later phase's update of the new edge (supersession) merges into it.
            pl.lit(None, dtype=tables.TS).alias("valid_to"),
        )
    if multi:
        name = pl.Series("scope_path", paths, dtype=pl.String)
        counts = pl.concat(
            [pairs.group_by("sc").len("edges_created").with_columns(pl.lit(0, pl.UInt32).alias("edges_reinforced")),
             reinforced.group_by("sc").len("edges_reinforced").with_columns(pl.lit(0, pl.UInt32).alias("edges_created"))
             .select("sc", "edges_created", "edges_reinforced")]
        ).group_by("sc").sum()
        counts = counts.select(name.gather(counts.get_column("sc")), "edges_created", "edges_reinforced")
    else:
        counts = pl.DataFrame({"scope_path": [paths[0]], "edges_created": [pairs.height],
                               "edges_reinforced": [reinforced.height]})
    return scoped_result(Diff.of("memory_edges", "cooccurrence", inserts=inserts, updates=updates), counts, COUNTERS)


def _link(recent: pl.DataFrame, edges: pl.DataFrame, k: int, width: int) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The reinforced edges (``_row``, and ``sc`` on a shard) and the new pairs (``source_id``,
    ``target_id``, and ``sc``) of the recent nodes ``recent`` (``id`` in id order, ``t`` µs, and on a
    shard ``sc``, the node's scope number) given the CO_OCCURRED ``edges`` (see :func:`cooccurrence`)."""
    n = recent.height
    multi = "sc" in recent.columns
    none = (pl.DataFrame(schema={"_row": pl.UInt32, **({"sc": pl.Int64} if multi else {})}),
            pl.DataFrame(schema={"source_id": pl.String, "target_id": pl.String, **({"sc": pl.Int64} if multi else {})}))
    if n < 2:
        return none
    id_of, t_by_i = recent.get_column("id"), recent.get_column("t").to_numpy()
    # Each edge with a recent end, with its ends' numbers (si, ti) where they are recent: edges with
    # both ends recent are the existing pairs; every edge gives its recent ends a neighbour.
    ends = _number_ends(edges, id_of)
    if multi:  # an edge is a neighbour only of the nodes of its own scope
        sc = recent.get_column("sc")
        ends = ends.with_columns(
            pl.when(sc.gather(ends.get_column(i).fill_null(0)) == ends.get_column("sc")).then(ends.get_column(i)).alias(i)
            for i in ("si", "ti")
        ).filter(pl.col("si").is_not_null() | pl.col("ti").is_not_null())
    linked = ends.filter(pl.col("si").is_not_null() & pl.col("ti").is_not_null())
    deg = _distinct_neighbours(ends, n)  # by node number: recent's rows are numbers 0..n-1 in order
    nodes = recent.select(pl.int_range(n, dtype=pl.Int64).alias("i"), "t").with_columns(
        pl.Series("free", np.maximum(k - deg, 0))
    )

    si, ti = linked.get_column("si").to_numpy(), linked.get_column("ti").to_numpy()
    reinforced = linked.filter(pl.Series(np.abs(t_by_i[si] - t_by_i[ti]) <= width)).select("_row", *(["sc"] if multi else []))
    new_pairs = _mutual_nearest(nodes, linked, n, k, width) if k > 0 else pl.DataFrame(schema={"a": pl.Int64, "b": pl.Int64})
    pairs = pl.DataFrame({"source_id": id_of.gather(new_pairs["a"]), "target_id": id_of.gather(new_pairs["b"])})
    if multi:
        pairs = pairs.with_columns(recent.get_column("sc").gather(new_pairs["a"]))
    return reinforced, pairs


def _apart(t: np.ndarray, sc: np.ndarray, width: int) -> tuple[np.ndarray, int] | None:
    """Times ``t`` (µs) of nodes of several scopes (``sc``) on one axis where no two scopes' nodes are
    within the window of each other, and the window on it: ``(t', width')``, or None when the axis
    would not fit in 63 bits.

    In (scope, time) order every gap between consecutive nodes becomes ``min(gap, c)`` and the gap
    between the last node of a scope and the first of the next becomes ``c``, where ``c = width' + 1``
    and ``width' = min(width, the widest scope's time span)``.  Within a scope this keeps the time
    order, the equal-time groups, every gap ≤ ``width'`` (all its consecutive gaps are) and every
    gap > ``width`` above ``width'`` — so which pairs are within the window, and how a node's
    candidates rank, are the scope's own; nodes of different scopes are always farther apart than
    ``width'``.  (When ``width`` exceeds every scope's span, no pair within a scope is outside it,
    which a window of ``width'`` keeps.)"""
    n = len(t)
    order = np.lexsort((t, sc))
    ts, cs = t[order], sc[order]
    first = np.ones(n, dtype=bool)
    first[1:] = cs[1:] != cs[:-1]
    starts = np.flatnonzero(first)
    stops = np.append(starts[1:], n) - 1
    wide = int(min(width, int((ts[stops] - ts[starts]).max())))
    c = wide + 1
    if c * n >= 2**62:
        return None
    gap = np.empty(n, dtype=np.int64)
    gap[0] = 0
    gap[1:] = np.minimum(ts[1:] - ts[:-1], c)
    gap[first] = c
    gap[0] = 0
    out = np.empty(n, dtype=np.int64)
    out[order] = np.cumsum(gap)
    return out, wide


def _number_ends(edges: pl.DataFrame, ids: pl.Series) -> pl.DataFrame:
    """The edges (``_row``, ``source_id``, ``target_id`` and their hashes ``sh``, ``th``) with a
    recent end, with ``si`` / ``ti``: the number (position in ``ids``) of the source / target, null
    where not recent.

    Joined on the 64-bit id hashes (narrow integer joins, several times cheaper than on the
    36-character ids), then every match is confirmed on the ids themselves.  When two recent ids
    share a hash, joined on the ids.
    """
    number = pl.DataFrame({"h": ids.hash(), "i": pl.int_range(ids.len(), dtype=pl.Int64, eager=True)})
    if number.get_column("h").n_unique() < ids.len():
        return _number_ends_by_id(edges, ids)
    found = (
        edges.select("sh", "th")
        .with_row_index("_e")
        .join(number.rename({"h": "sh", "i": "si"}), on="sh", how="left")
        .join(number.rename({"h": "th", "i": "ti"}), on="th", how="left")
        .filter(pl.col("si").is_not_null() | pl.col("ti").is_not_null())
    )
    ends = edges.select(pl.all().gather(found.get_column("_e"))).with_columns(found.get_column("si"), found.get_column("ti"))
    same = [  # null (not recent) stays null; a mere hash match becomes null
        pl.when(ids.gather(ends.get_column(i).fill_null(0)) == ends.get_column(end)).then(ends.get_column(i)).alias(i)
        for i, end in (("si", "source_id"), ("ti", "target_id"))
    ]
    return ends.with_columns(*same).filter(pl.col("si").is_not_null() | pl.col("ti").is_not_null())


def _number_ends_by_id(edges: pl.DataFrame, ids: pl.Series) -> pl.DataFrame:
    """:func:`_number_ends` by joins on the ids themselves (when two recent ids share a hash)."""
    number = pl.DataFrame({"id": ids, "i": pl.int_range(ids.len(), dtype=pl.Int64, eager=True)})
    return (
        edges.join(number.rename({"id": "source_id", "i": "si"}), on="source_id", how="left", maintain_order="left")
        .join(number.rename({"id": "target_id", "i": "ti"}), on="target_id", how="left", maintain_order="left")
        .filter(pl.col("si").is_not_null() | pl.col("ti").is_not_null())
    )


def _distinct_neighbours(ends: pl.DataFrame, n: int) -> np.ndarray:
    """For each node number below ``n``: its distinct neighbours over ``ends`` (either direction).

    Counted on (node, neighbour's id hash) keys: rows whose key occurs once are distinct neighbours;
    only the rows of repeated keys (the same pair linked both ways, or a hash collision) are told
    apart by the ids themselves."""
    src, tgt = ends.get_column("si").is_not_null(), ends.get_column("ti").is_not_null()
    pairs = pl.DataFrame(
        {
            "i": pl.concat([ends.get_column("si").filter(src), ends.get_column("ti").filter(tgt)]),
            "h": pl.concat([ends.get_column("th").filter(src), ends.get_column("sh").filter(tgt)]),
        }
    )
    # A collision of the mixed keys only costs an id comparison.
    repeated = pairs.select((pl.col("h") ^ pl.col("i").hash()).is_duplicated()).to_series()
    i = pairs.get_column("i").to_numpy()
    deg = np.bincount(i[~repeated.to_numpy()], minlength=n)
    if repeated.any():
        nbr = pl.concat([ends.get_column("target_id").filter(src), ends.get_column("source_id").filter(tgt)])
        rest = pl.DataFrame({"i": pairs.get_column("i"), "nbr": nbr}).filter(repeated).unique()
        deg += np.bincount(rest.get_column("i").to_numpy(), minlength=n)
    return deg


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

