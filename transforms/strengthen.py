"""Phase 1 — strengthen: nodes used repeatedly in the window gain importance (SPEC §3)."""

from __future__ import annotations

from datetime import datetime

import polars as pl
from deep_sleep.transforms._common import (
    PhaseResult,
    in_own_window,
    scope_paths,
    scoped_result,
)
from pydantic import Field

from deep_sleep.core.config import PhaseConfig
from deep_sleep.core.diff import Diff
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot


class StrengthenConfig(PhaseConfig):
    min_accesses: int = Field(2, ge=1)
    increment: float = Field(0.5, gt=0)
    cap: float = Field(10.0, le=10.0)


#: The counters this phase reports (SPEC §3).
COUNTERS: tuple[str, ...] = ("nodes_strengthened",)


def strengthen(snapshot: Snapshot | Shard, config: StrengthenConfig, as_of: datetime, lookback_hours: float) -> PhaseResult:
    """Semantic nodes with ≥ ``min_accesses`` access-log events in (window start, as_of]:
    importance += ``increment``, capped at ``cap``.  A node already at the cap is neither changed nor counted.

    Per scope (a :class:`~deep_sleep.core.shard.Shard` or a single-scope snapshot): each scope's window
    starts at its own previous run, and an access counts only for a node of the access's own scope.
    """
    multi = len(scope_paths(snapshot)) > 1
    scoped = ["scope_path"] if multi else []  # one scope: every row is of it
    hits = (
        snapshot.table("memory_access_log")
        .lazy()
        .select(*scoped, "node_id", "accessed_at")
        .filter(in_own_window(snapshot, "accessed_at", as_of, lookback_hours))
        .group_by(*scoped, "node_id")
        .len("accesses")
        .filter(pl.col("accesses") >= config.min_accesses)
        .select(*scoped, pl.col("node_id").alias("id"))
        .collect()
    )
    nodes = (
        snapshot.table("memory_nodes")
        .lazy()  # reads only these columns, however earlier folds left the frame's chunks
        .select(*scoped, "id", "version", "layer", "importance")
        .filter(
            (pl.col("layer") == "semantic")
            & (pl.col("importance") < config.cap)
            & pl.col("id").is_in(hits.get_column("id").implode())
        )
        .select(*scoped, "id", "version",
                pl.min_horizontal(pl.col("importance") + config.increment, pl.lit(config.cap)).alias("importance"))
        .collect()
    )
    if multi:  # an access counts for a node of its own scope only
        nodes = nodes.join(hits, on=["scope_path", "id"], how="semi", maintain_order="left")
        counts = nodes.group_by("scope_path").len("nodes_strengthened")
    else:
        counts = pl.DataFrame({"scope_path": list(scope_paths(snapshot)), "nodes_strengthened": [nodes.height]})
    # The shard's diff names its rows' scope as well (Diff.by_scope); a scope's, by id alone.
    diff = Diff.of("memory_nodes", "strengthen", updates=nodes) if nodes.height else Diff.empty()
    return scoped_result(diff, counts, COUNTERS)
