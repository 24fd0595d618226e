"""Phase 1.5 — cooccurrence: nodes touched close together in time get linked (SPEC §3)."""

from __future__ import annotations

import math
from datetime import datetime

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

    # Recent nodes, numbered in id order: comparing numbers is comparing ids.
    recent = (
        snapshot.table("memory_nodes")
        .select("id", "layer", "updated_at")
        .filter((pl.col("layer") == "semantic") & in_window("updated_at", start, as_of))
        .select("id", pl.col("updated_at").dt.epoch("us").alias("t"))
        .sort("id")
        .with_row_index("i")
        .with_columns(pl.col("i").cast(pl.Int64))
    )
    n = recent.height
    if n < 2:
        return PhaseResult(counters=zero)

    edges = (
        snapshot.table("memory_edges")
        .select("id", "version", "weight", "source_id", "target_id", "relation")
        .filter((pl.col("relation") == RELATION) & (pl.col("source_id") != pl.col("target_id")))
    )
    # Existing CO_OCCURRED edges with both ends recent (numbered), and each recent node's degree.
    linked = (
        edges.join(recent.rename({"id": "source_id", "i": "si", "t": "st"}), on="source_id")
        .join(recent.rename({"id": "target_id", "i": "ti", "t": "tt"}), on="target_id")
    )
    ends, numbered = edges.select("source_id", "target_id"), recent.select("id", "i")
    neighbours = pl.concat(
        [
            ends.join(numbered, left_on="source_id", right_on="id").select("i", pl.col("target_id").alias("nbr")),
            ends.join(numbered, left_on="target_id", right_on="id").select("i", pl.col("source_id").alias("nbr")),
        ]
    )
    degree = neighbours.unique().group_by("i").len("deg")  # distinct neighbours, either direction
    nodes = recent.join(degree, on="i", how="left").select(
        "i", "t", (pl.lit(k, pl.Int64) - pl.col("deg").fill_null(0).cast(pl.Int64)).clip(lower_bound=0).alias("free")
    )

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
    """
    # Order A = (t, id): the later side in preference order, and each equal-time group by id.
    # Order B = (t, id desc): walking left from a group's start gives earlier times nearest first,
    # and within one earlier time the smallest id first.
    a_ord = _with_groups(nodes.sort(["t", "i"]))
    b_ord = _with_groups(nodes.sort(["t", "i"], descending=[False, True]))
    parts = []
    for j in range(1, k + 1):
        parts.append(_partners(a_ord, pl.col("_ge") + j, n))  # strictly later
        parts.append(_partners(b_ord, pl.col("_gs") - j, n))  # strictly earlier
    for j in range(k + 1):
        parts.append(_partners(a_ord, pl.col("_gs") + j, n, same_group=True))  # same time
    existing = pl.concat(
        [linked.select(pl.col("si").alias("a"), pl.col("ti").alias("b")), linked.select(pl.col("ti").alias("a"), pl.col("si").alias("b"))]
    ).with_columns(_key("a", "b", n))
    cand = (
        pl.concat(parts)
        .filter(pl.col("dt") <= width)
        .with_columns(_key("a", "b", n))
        .join(existing.select("key"), on="key", how="anti")
        .sort(["a", "dt", "b"])
    )
    first = pl.when(pl.col("a") != pl.col("a").shift(1, fill_value=-1)).then(pl.int_range(pl.len())).forward_fill()
    chosen = cand.filter((pl.int_range(pl.len()) - first) < pl.col("free"))
    back = chosen.select(_key("b", "a", n)).to_series()
    return chosen.filter((pl.col("a") < pl.col("b")) & pl.col("key").is_in(back.implode())).select("a", "b").sort("a", "b")


def _with_groups(ordered: pl.DataFrame) -> pl.DataFrame:
    """Add each row's equal-time group bounds (first and last position) in this order."""
    pos = pl.int_range(pl.len(), dtype=pl.Int64)
    new = pl.col("t") != pl.col("t").shift(1)
    last = pl.col("t") != pl.col("t").shift(-1)
    return ordered.with_columns(
        pl.when(new.fill_null(True)).then(pos).forward_fill().alias("_gs"),
        pl.when(last.fill_null(True)).then(pos).backward_fill().alias("_ge"),
    )


def _partners(ordered: pl.DataFrame, at: pl.Expr, n: int, same_group: bool = False) -> pl.DataFrame:
    """(a, b, dt, free of a) for the partner at position ``at`` of ``ordered`` (dropped when out of range)."""
    ok = (at >= 0) & (at < n)
    if same_group:
        ok = ok & (at <= pl.col("_ge")) & (at != pl.int_range(pl.len(), dtype=pl.Int64))
    idx = at.clip(0, n - 1)
    return ordered.select(
        pl.col("i").alias("a"),
        pl.col("i").gather(idx).alias("b"),
        (pl.col("t").gather(idx) - pl.col("t")).abs().alias("dt"),
        "free",
        ok.alias("_ok"),
    ).filter(pl.col("_ok") & (pl.col("free") > 0)).drop("_ok")


def _key(a: str, b: str, n: int) -> pl.Expr:
    return (pl.col(a) * n + pl.col(b)).alias("key")
