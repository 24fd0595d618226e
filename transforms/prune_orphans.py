"""Phase 3 — prune_orphans: weak, stale, unconnected memories and expired ones go (SPEC §3)."""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import polars as pl
from deep_sleep.transforms._common import PhaseResult, is_protected, json_number, scope_paths, scoped_result
from pydantic import Field

from deep_sleep.core.config import PhaseConfig
from deep_sleep.core.diff import Diff, TableDiff
from deep_sleep.core.errors import SnapshotError
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot


class PruneOrphansConfig(PhaseConfig):
    importance_factor: float = Field(0.4, ge=0, le=1)  # prune below factor × 10
    min_age_days: float = Field(7, ge=0)
    max_degree: int = Field(1, ge=0)
    # Labels never pruned as orphans.  A summary carries its folded turns (SPEC §3 phase 10 as amended
    # 2026-12-06: they stay findable through it, in episodic_folded): pruning it would lose them, so
    # "META:episodic_summary" is kept by default.
    keep_labels: tuple[str, ...] = ("META:episodic_summary",)


#: The counters this phase reports (SPEC §3).
COUNTERS: tuple[str, ...] = ("nodes_pruned",)


PHASE = "prune_orphans"
TTL_REASON = "semantic ttl expired"
ORPHAN_REASON = "orphan: weak, stale and at most max_degree neighbours"


def prune_orphans(snapshot: Snapshot | Shard, config: PruneOrphansConfig, as_of: datetime) -> PhaseResult:
    """Delete unprotected semantic nodes (with their incident edges) that either
    (a) have a numeric ``properties.ttl_hours`` with ``updated_at + ttl_hours ≤ as_of`` — whatever their
    importance or degree — or (b) are orphans: importance < ``importance_factor`` × 10, ``updated_at``
    strictly older than ``min_age_days`` before as_of (a node exactly that old stays), and at most
    ``max_degree`` distinct neighbours — except a node labelled one of ``keep_labels`` (none by
    default; ``META:episodic_summary`` keeps summaries, whose events phase 10 deleted, from being
    forgotten by a store nobody recalls them from).  Neighbours are the other ends of every edge in the snapshot
    (any relation, either direction, superseded edges included, edges created earlier in the run
    included; self-loops do not count).  Degree is measured on the graph that survives this run: a
    neighbour deleted here does not count, so a chain of weak nodes hanging off the graph goes in one
    run and a rerun finds nothing new (peeling to a fixpoint).  A node matching both rules is deleted
    with the ttl reason, as is any edge touching an expired node.  A node that a quarantined row
    still touches (``snapshot.held_nodes``, e.g. an edge of NaN weight) is never pruned: its degree
    here ignores that row, and the quarantined row would be left pointing at a deleted node.

    Shard-native: on a :class:`Shard` a node is known by (scope_path, id) and an edge's ends by
    (its scope_path, source_id / target_id), so only a scope's own edges count towards its nodes'
    degrees; ``nodes_pruned`` is counted per scope.
    """
    nodes = snapshot.table("memory_nodes")
    paths = scope_paths(snapshot)
    many = len(paths) > 1  # one scope: no scope_path to carry or hash
    scope = ("scope_path",) if many else ()
    # Lazy scans, each collected right after its cheap first filter: an eager select or filter would
    # copy every column of a frame whose chunks earlier folds misaligned, and polars' optimizer would
    # fuse the later filters into the first and parse every node's JSON.  So only the few nodes whose
    # properties mention ttl_hours are parsed.
    semantic = pl.col("layer") == "semantic"
    ttl = json_number("properties", "ttl_hours")
    age_us = (pl.lit(as_of, dtype=pl.Datetime("us", "UTC")) - pl.col("updated_at")).dt.total_microseconds()
    expired = (
        nodes.lazy()
        .select("id", "version", "layer", "label", "properties", "updated_at", *scope)
        .filter(semantic & pl.col("properties").str.contains("ttl_hours", literal=True))
        .collect()
        # Whole microseconds as in working_ttl, compared as floats: no overflow for absurd ttl values.
        .filter(ttl.is_finite() & (age_us.cast(pl.Float64) >= (ttl * 3_600_000_000).floor()))
        .filter(~is_protected())
        .select("id", "version", *scope)
    )
    weak = (
        nodes.lazy()
        .select("id", "version", "layer", "label", "importance", "updated_at", *scope)
        .filter(
            semantic
            & (pl.col("importance") < config.importance_factor * 10)
            & (pl.col("updated_at") < as_of - timedelta(days=config.min_age_days))
        )
        .collect()
        .filter(~is_protected() & ~pl.col("label").is_in(list(config.keep_labels)))
        .select("id", "version", *scope)
    )
    if snapshot.held_nodes:
        held = pl.Series(sorted(snapshot.held_nodes), dtype=pl.String).implode()
        expired = expired.filter(~pl.col("id").is_in(held))
        weak = weak.filter(~pl.col("id").is_in(held))
    if not (expired.height or weak.height):
        return scoped_result(Diff.empty(), None, COUNTERS)
    seed = _seed(nodes, many)
    expired = expired.with_columns(_key("id", seed, many).alias("h"))
    weak = weak.with_columns(_key("id", seed, many).alias("h"))
    weak = weak.filter(~pl.col("h").is_in(expired.get_column("h").implode()))
    # The only edges that matter touch a weak or an expired node: both steps below read just those.
    touching = pl.concat([weak.get_column("h"), expired.get_column("h")]).implode()
    edges = (
        snapshot.table("memory_edges")
        .lazy()
        .select("id", "version", _key("source_id", seed, many).alias("s"), _key("target_id", seed, many).alias("t"), *scope)
        .filter(pl.col("s").is_in(touching) | pl.col("t").is_in(touching))
        .collect()
    )
    orphans = weak.filter(_peel(edges, weak.get_column("h"), expired.get_column("h"), config.max_degree))
    doomed = pl.concat(
        [
            expired.select("id", "version", "h", pl.lit(TTL_REASON).alias("reason"), *scope),
            orphans.select("id", "version", "h", pl.lit(ORPHAN_REASON).alias("reason"), *scope),
        ]
    )
    if not doomed.height:
        return scoped_result(Diff.empty(), None, COUNTERS)
    if many:
        counts = doomed.group_by("scope_path").agg(pl.len().alias("nodes_pruned"))
    else:
        counts = pl.DataFrame({"scope_path": [paths[0]], "nodes_pruned": [doomed.height]})
    return scoped_result(_delete(edges, doomed, expired.get_column("h"), many), counts, COUNTERS)


def _key(column: str, seed: int, many: bool) -> pl.Expr:
    """A node's 64-bit key: the hash of its id — with ``many`` scopes, combined with the hash of the
    row's ``scope_path``, so an edge's end names a node of the edge's own scope only."""
    key = pl.col(column).hash(seed)
    return key ^ pl.col("scope_path").hash(seed + 8) if many else key


def _seed(nodes: pl.DataFrame, many: bool = False) -> int:
    """A hash seed under which the nodes' keys (:func:`_key`) are distinct 64-bit values, so the
    graph work below runs on integers instead of 36-character strings (a collision is ~1e-8 at 1M
    nodes; the next seed then resolves it).  Edges point at nodes of the snapshot: the extract
    quarantines dangling ones."""
    for seed in range(8):
        # Sorted, equal hashes sit side by side: numpy's sort of a million integers beats polars' n_unique.
        keys = nodes.lazy().select(_key("id", seed, many)).collect().to_series()
        hashes = np.sort(keys.to_numpy())
        if not (hashes[1:] == hashes[:-1]).any():
            return seed
    raise SnapshotError("memory_nodes: duplicate ids in the snapshot")


def _peel(edges: pl.DataFrame, weak: pl.Series, expired: pl.Series, max_degree: int) -> np.ndarray:
    """Which weak nodes end with ≤ ``max_degree`` surviving distinct neighbours once expired nodes and
    peeled weak nodes are gone (a boolean mask over ``weak``, given as id hashes).  Round k removes the
    weak nodes whose count dropped to ``max_degree`` in round k − 1; only the neighbours of a round's
    removals are looked at again, so the work stays linear in the weak nodes' edges."""
    n_weak = weak.len()
    if not n_weak:
        return np.zeros(0, dtype=bool)
    pos = pl.DataFrame({"h": weak, "p": np.arange(n_weak, dtype=np.int64)})
    ends = edges.lazy().select("s", "t").filter(pl.col("s") != pl.col("t"))
    # Distinct (weak node, live neighbour) pairs, both directions; b_pos: the neighbour's own weak position.
    pairs = (
        pl.concat([ends.select(a="s", b="t"), ends.select(a="t", b="s")])
        .join(pos.lazy().rename({"h": "a", "p": "a_pos"}), on="a")  # keeps the weak ends
        .filter(~pl.col("b").is_in(expired.implode()))
        .select("a_pos", "b")
        .unique()
        .join(pos.lazy().rename({"h": "b", "p": "b_pos"}), on="b", how="left")
        .select("a_pos", "b_pos")
        .collect()
    )
    degree = np.bincount(pairs.get_column("a_pos").to_numpy(), minlength=n_weak)
    # Weak-weak pairs grouped by the neighbour: when b goes, each holder a loses one.
    ww = pairs.drop_nulls().sort("b_pos")
    holder = ww.get_column("a_pos").to_numpy()
    starts = np.concatenate([[0], np.cumsum(np.bincount(ww.get_column("b_pos").to_numpy(), minlength=n_weak))])

    removed = np.zeros(n_weak, dtype=bool)
    frontier = np.flatnonzero(degree <= max_degree)
    while frontier.size:
        removed[frontier] = True
        lo, lengths = starts[frontier], starts[frontier + 1] - starts[frontier]
        total = int(lengths.sum())
        if not total:
            break
        offsets = np.repeat(lo - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
        hit = holder[offsets + np.arange(total)]
        np.subtract.at(degree, hit, 1)
        hit = np.unique(hit)
        frontier = hit[~removed[hit] & (degree[hit] <= max_degree)]
    return removed


def _delete(edges: pl.DataFrame, doomed: pl.DataFrame, expired: pl.Series, many: bool = False) -> Diff:
    """Node deletes with their reasons, and every incident edge (the ttl reason wins when an edge
    touches an expired node; ``expired``: the expired nodes' id hashes).  With ``many`` scopes the
    deletes keep the rows' ``scope_path`` (the runner would otherwise look each id up)."""
    hashes = doomed.get_column("h").implode()
    ttl = expired.implode()
    incident = (
        edges.lazy()
        .filter(pl.col("s").is_in(hashes) | pl.col("t").is_in(hashes))
        .select(
            "id",
            "version",
            pl.when(pl.col("s").is_in(ttl) | pl.col("t").is_in(ttl))
            .then(pl.lit(f"{TTL_REASON} (incident edge)"))
            .otherwise(pl.lit(f"{ORPHAN_REASON} (incident edge)"))
            .alias("reason"),
            *(("scope_path",) if many else ()),
        )
        .collect()
        .sort("id", multithreaded=False)
    )
    # Single-threaded: polars' parallel sort of a string column is ~2× slower at these sizes.
    doomed = doomed.drop("h").sort("id", multithreaded=False)
    nodes = Diff.of("memory_nodes", PHASE, deletes=doomed)
    edges = Diff.of("memory_edges", PHASE, deletes=incident)
    if many:  # Diff.of keeps the rows' order: their scope_path goes back on as it was
        nodes, edges = (Diff({name: TableDiff(deletes=td.deletes.with_columns(rows.get_column("scope_path")))
                              for name, td in d.tables.items()}) for d, rows in ((nodes, doomed), (edges, incident)))
    return Diff({**nodes.tables, **edges.tables})  # two tables, nothing to normalise
