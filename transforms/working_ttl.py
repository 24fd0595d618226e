"""Phase 8 — working_ttl: working memory expires (SPEC §3)."""

from __future__ import annotations

from datetime import datetime

import polars as pl
from deep_sleep.transforms._common import PhaseResult, delete_nodes, json_number

from deep_sleep.core.config import PhaseConfig
from deep_sleep.core.snapshot import Snapshot


class WorkingTtlConfig(PhaseConfig):
    """No knobs but ``enabled``."""


#: The counters this phase reports (SPEC §3).
COUNTERS: tuple[str, ...] = ("working_ttl_pruned",)


def working_ttl(snapshot: Snapshot, config: WorkingTtlConfig, as_of: datetime) -> PhaseResult:
    """Delete working-layer nodes whose ``updated_at + properties.ttl_hours ≤ as_of`` (and their edges).

    A node without a numeric ``ttl_hours`` is exempt.  Expiry exactly at ``as_of`` counts as expired.
    """
    expired = (
        snapshot.table("memory_nodes")
        .lazy()
        .filter(pl.col("layer") == "working")
        .select("id", "version", "properties", "updated_at")
        .with_columns(json_number("properties", "ttl_hours").alias("ttl_hours"))
        .filter(pl.col("ttl_hours").is_not_null() & pl.col("ttl_hours").is_finite())
        .filter(pl.col("updated_at") + pl.duration(microseconds=(pl.col("ttl_hours") * 3_600_000_000).cast(pl.Int64)) <= as_of)
        .select("id", "version")
        .collect()
    )
    if not expired.height:
        return PhaseResult(counters={"working_ttl_pruned": 0})
    return PhaseResult(
        diff=delete_nodes(snapshot, expired, "working_ttl", "working memory ttl expired"),
        counters={"working_ttl_pruned": expired.height},
    )
