"""Phase 2.5 — pending_edges: edges proposed by live turns are created (SPEC §3)."""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING

import polars as pl
from deep_sleep.transforms._common import (
    PhaseResult,
    scope_paths,
    scoped_created_ids,
    scoped_result,
    scopes_without,
    semantic,
    skip,
    tenant_of,
)

from deep_sleep.core import tables
from deep_sleep.core.config import PhaseConfig
from deep_sleep.core.diff import Diff
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot, iso

if TYPE_CHECKING:  # assembled from the roster, which imports this module
    from deep_sleep.transforms.config import ConsolidationConfig


class PendingEdgesConfig(PhaseConfig):
    """No knobs but ``enabled``."""


#: The counters this phase reports (SPEC §3).
COUNTERS: tuple[str, ...] = ("edges_created",)


OUTCOMES = ("created", "duplicate", "exists", "self_loop", "unresolved_source", "unresolved_target", "neighbour_cap")
CO_OCCURRED = "CO_OCCURRED"


def pending_edges(snapshot: Snapshot | Shard, config: PendingEdgesConfig, as_of: datetime,
                  settings: ConsolidationConfig) -> PhaseResult:
    """Unconsumed ``pending_connections`` (``consumed_by_run`` null): both labels are resolved over the
    scope's current semantic nodes (highest importance, then latest ``updated_at``, then smallest id);
    the edge (source, target, relation) is created with the row's weight unless a label does not
    resolve, it would be a self-loop, or an edge with that natural key already exists (including one
    created earlier in this run, and one closed by ``valid_to``: the store's unique key ignores validity).
    Several rows proposing the same edge create it once: the oldest row (``created_at``, then id) gets
    ``created``, the others ``duplicate``.  A ``CO_OCCURRED`` proposal must keep phase 1.5's cap (no node
    over ``max_neighbours`` distinct CO_OCCURRED neighbours, counting this run's new edges): one that
    joins two nodes not yet neighbours is created only if it is among the first free-slot such
    proposals at both ends, else ``neighbour_cap``.  Every examined row is marked consumed with its
    outcome — the first that applies of ``unresolved_source``, ``unresolved_target``, ``self_loop``,
    ``exists``, ``duplicate``, ``neighbour_cap``, else ``created``.  Pure phases do not know the run's
    ledger id, so ``consumed_by_run`` is the run's *logical id*: UUIDv5 of (scope_path, "run", ISO
    ``as_of``) — the same for every attempt at that ``as_of``, joinable to the ledger through
    (scope_path, as_of).

    Per scope (a :class:`~deep_sleep.core.shard.Shard` or a single-scope snapshot): labels resolve
    over the row's own scope's nodes, existing edges, duplicates and the neighbour cap are the
    scope's own, and a scope without unconsumed rows is skipped ("missing input").
    """
    pending = snapshot.table("pending_connections").filter(pl.col("consumed_by_run").is_null())
    reason = "missing input: no pending connections"
    if not pending.height:
        return skip(reason)
    skipped = scopes_without(snapshot, "pending_connections", reason, rows=pending)
    single = len(scope_paths(snapshot)) == 1
    # Resolve only the labels the pending rows name, and look only for the edges they propose.
    wanted = pl.concat([pending.get_column("source_label"), pending.get_column("target_label")]).unique().implode()
    named = snapshot.table("memory_nodes").lazy().filter(pl.col("label").is_in(wanted))
    labels = _resolve_labels(named.select("scope_path", "id", "layer", "label", "importance", "updated_at").collect())
    key = ["source_id", "target_id", "relation"]
    rows = (
        pending.sort(["created_at", "id"], nulls_last=True)
        .join(labels.rename({"label": "source_label", "id": "source_id"}), on=["scope_path", "source_label"], how="left",
              maintain_order="left")
        .join(labels.rename({"label": "target_label", "id": "target_id"}), on=["scope_path", "target_label"], how="left",
              maintain_order="left")
    )
    skey = ["scope_path", *key]
    proposed = rows.select(skey).drop_nulls().unique()
    existing = (
        snapshot.table("memory_edges")
        .lazy()
        .select(skey)
        .filter(pl.col("source_id").is_in(proposed.get_column("source_id").implode()))
        .join(proposed.lazy(), on=skey, how="semi")
        .unique()
        .with_columns(pl.lit(True).alias("_exists"))
        .collect()
    )
    rows = rows.join(existing, on=skey, how="left", maintain_order="left").with_columns(
        pl.when(pl.col("source_id").is_null()).then(pl.lit("unresolved_source"))
        .when(pl.col("target_id").is_null()).then(pl.lit("unresolved_target"))
        .when(pl.col("source_id") == pl.col("target_id")).then(pl.lit("self_loop"))
        .when(pl.col("_exists").fill_null(False)).then(pl.lit("exists"))
        .when(~pl.struct(skey).is_first_distinct()).then(pl.lit("duplicate"))
        .otherwise(pl.lit("created"))
        .alias("outcome")
    )
    cap = settings.cooccurrence.max_neighbours  # the same invariant phase 1.5 keeps
    rows = _neighbour_cap(rows, snapshot.table("memory_edges"), cap)
    # The run's logical id of each scope with pending rows, one hash per scope.
    runs = rows.select(pl.col("scope_path").unique())
    runs = runs.with_columns(scoped_created_ids(runs.get_column("scope_path"), "run",
                                                pl.Series([iso(as_of) or ""] * runs.height, dtype=pl.String))
                             .alias("consumed_by_run"))
    consumed = (
        rows.select("scope_path", "id", "version", "outcome")
        .join(runs, on="scope_path", how="left", maintain_order="left")
        .select(*(["scope_path"] if not single else []), "id", "version", "consumed_by_run", "outcome")
        .sort("id")
    )
    created = rows.filter(pl.col("outcome") == "created")
    counts = rows.group_by("scope_path").agg((pl.col("outcome") == "created").sum().alias("edges_created"))
    diffs = [Diff.of("pending_connections", "pending_edges", updates=consumed)]
    if created.height:
        keys = created.select(pl.concat_str("source_id", "target_id", "relation", separator="|")).to_series()
        inserts = created.select(
            scoped_created_ids(created.get_column("scope_path"), "pending_edges", keys).alias("id"),
            "scope_path",
            tenant_of("scope_path").alias("tenant_id"),
            "source_id",
            "target_id",
            "relation",
            "weight",
            pl.lit("{}").alias("properties"),
            *(pl.lit(as_of).dt.cast_time_unit("us").alias(c) for c in ("created_at", "updated_at", "valid_from")),
            # Present (null) so that a later phase's update of the new edge (supersession) merges into it.
            pl.lit(None, dtype=tables.TS).alias("valid_to"),
        ).sort("id")
        diffs.append(Diff.of("memory_edges", "pending_edges", inserts=inserts))
    # Two tables, nothing to normalise.
    diff = Diff({name: td for d in diffs for name, td in d.tables.items()})
    return scoped_result(diff, counts, COUNTERS, skipped_scopes=skipped)


def _resolve_labels(nodes: pl.DataFrame) -> pl.DataFrame:
    """(scope_path, label) → id of the node it resolves to within that scope: among the scope's
    semantic nodes with that exact label, the highest importance, then the latest ``updated_at``, then
    the smallest id (SPEC §3, phase 2.5; :func:`~deep_sleep.transforms._common.resolve_labels` per scope)."""
    return (
        semantic(nodes)
        .sort(["scope_path", "label", "importance", "updated_at", "id"], descending=[False, False, True, True, False],
              nulls_last=True)
        .group_by("scope_path", "label", maintain_order=True)
        .agg(pl.col("id").first())
    )


def _neighbour_cap(rows: pl.DataFrame, edges: pl.DataFrame, cap: int) -> pl.DataFrame:
    """Turn ``created`` into ``neighbour_cap`` for CO_OCCURRED proposals that would give a node more than
    ``cap`` distinct CO_OCCURRED neighbours.  A proposal joining two nodes not yet neighbours (either
    direction) takes a slot at both ends; it is kept iff it is among the first ``free`` such
    proposals (``created_at``, then id; both directions of one pair count once) at each end.
    Neighbours, pairs and ranks are per ``scope_path`` (only a scope's own edges count)."""
    wanted = (pl.col("outcome") == "created") & (pl.col("relation") == CO_OCCURRED)
    proposed = rows.filter(wanted)
    if not proposed.height:
        return rows
    touched = pl.concat([proposed.get_column("source_id"), proposed.get_column("target_id")]).unique().implode()
    # The cheap relation test alone over all edges (collected, so that the plan cannot fuse it with the
    # membership tests), then those tests over the CO_OCCURRED edges only.
    co = (
        edges.lazy()
        .filter(pl.col("relation") == CO_OCCURRED)
        .select("scope_path", "source_id", "target_id")
        .collect()
        .lazy()
        .filter(pl.col("source_id").is_in(touched) | pl.col("target_id").is_in(touched))
        .filter(pl.col("source_id") != pl.col("target_id"))
        .collect()
    )
    linked = pl.concat(
        [co.select("scope_path", a="source_id", b="target_id"), co.select("scope_path", a="target_id", b="source_id")]
    ).unique()
    free = linked.group_by("scope_path", "a").len("deg").select(
        "scope_path", node="a", free=(cap - pl.col("deg").cast(pl.Int64)).clip(lower_bound=0))
    pair = [pl.min_horizontal("source_id", "target_id").alias("lo"), pl.max_horizontal("source_id", "target_id").alias("hi")]
    new_pairs = (
        rows.with_row_index("_order")
        .filter(wanted)
        .join(linked, left_on=["scope_path", "source_id", "target_id"], right_on=["scope_path", "a", "b"], how="anti",
              maintain_order="left")
        .select("_order", "scope_path", *pair)
        .unique(subset=["scope_path", "lo", "hi"], keep="first", maintain_order=True)
    )
    ends = pl.concat([new_pairs.select("_order", "scope_path", "lo", "hi", node="lo"),
                      new_pairs.select("_order", "scope_path", "lo", "hi", node="hi")])
    refused = (
        ends.join(free, on=["scope_path", "node"], how="left")
        .with_columns(pl.col("_order").rank("ordinal").over("scope_path", "node").alias("_rank"))
        .filter(pl.col("_rank") > pl.col("free").fill_null(cap))
        .select("scope_path", "lo", "hi")
        .unique()
        .with_columns(pl.lit(True).alias("_refused"))
    )
    return (
        rows.with_columns(*pair)
        .join(refused, on=["scope_path", "lo", "hi"], how="left", maintain_order="left")
        .with_columns(
            pl.when(wanted & pl.col("_refused").fill_null(False)).then(pl.lit("neighbour_cap")).otherwise("outcome").alias("outcome")
        )
        .drop("lo", "hi", "_refused")
    )
