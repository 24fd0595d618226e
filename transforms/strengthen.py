"""Phase 1 — strengthen: nodes used repeatedly in the window gain importance (SPEC §3)."""

from __future__ import annotations

from datetime import datetime

import polars as pl
from deep_sleep.transforms._common import PhaseResult, in_window, window_start
from pydantic import Field

from deep_sleep.core.config import PhaseConfig
from deep_sleep.core.diff import Diff
from deep_sleep.core.snapshot import Snapshot


class StrengthenConfig(PhaseConfig):
    min_accesses: int = Field(2, ge=1)
    increment: float = Field(0.5, gt=0)
    cap: float = Field(10.0, le=10.0)


#: The counters this phase reports (SPEC §3).
COUNTERS: tuple[str, ...] = ("nodes_strengthened",)


def strengthen(snapshot: Snapshot, config: StrengthenConfig, as_of: datetime, lookback_hours: float) -> PhaseResult:
    """Semantic nodes with ≥ ``min_accesses`` access-log events in (window start, as_of]:
    importance += ``increment``, capped at ``cap``.  A node already at the cap is neither changed nor counted.
    """
    start = window_start(snapshot, as_of, lookback_hours)
    hits = (
        snapshot.table("memory_access_log")
        .filter(in_window("accessed_at", start, as_of))
        .group_by("node_id")
        .len("accesses")
        .filter(pl.col("accesses") >= config.min_accesses)
    )
    nodes = (
        snapshot.table("memory_nodes")
        .lazy()  # reads only these columns, however earlier folds left the frame's chunks
        .select("id", "version", "layer", "importance")
        .filter(
            (pl.col("layer") == "semantic")
            & (pl.col("importance") < config.cap)
            & pl.col("id").is_in(hits.get_column("node_id").implode())
        )
        .select("id", "version", pl.min_horizontal(pl.col("importance") + config.increment, pl.lit(config.cap)).alias("importance"))
        .collect()
    )
    if not nodes.height:
        return PhaseResult(counters={"nodes_strengthened": 0})
    return PhaseResult(
        diff=Diff.of("memory_nodes", "strengthen", updates=nodes),
        counters={"nodes_strengthened": nodes.height},
    )
