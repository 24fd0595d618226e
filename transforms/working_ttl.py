"""Phase 8 — working_ttl: working memory expires (SPEC §3)."""

from __future__ import annotations

from datetime import datetime

import polars as pl
from deep_sleep.transforms._common import PhaseResult, delete_nodes, json_number, scope_paths, scoped_result

from deep_sleep.core.config import PhaseConfig
from deep_sleep.core.diff import Diff
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot


class WorkingTtlConfig(PhaseConfig):
    """No knobs but ``enabled``."""


#: The counters this phase reports (SPEC §3).
COUNTERS: tuple[str, ...] = ("working_ttl_pruned",)


def working_ttl(snapshot: Snapshot | Shard, config: WorkingTtlConfig, as_of: datetime) -> PhaseResult:
    """Delete working-layer nodes whose ``updated_at + properties.ttl_hours ≤ as_of`` (and their edges).

    A node without a numeric ``ttl_hours`` is exempt.  Expiry exactly at ``as_of`` counts as expired.
    The rule is row-wise, so a shard (many scopes) is handled in one pass; the counter is per scope.
    """
    paths = scope_paths(snapshot)
    owner = ["scope_path"] if len(paths) > 1 else []  # one scope: its count is the frame's height
    expired = (
        snapshot.table("memory_nodes")
        .lazy()
        .filter(pl.col("layer") == "working")
        .select("id", "version", *owner, "properties", "updated_at")
        .with_columns(json_number("properties", "ttl_hours").alias("ttl_hours"))
        .filter(pl.col("ttl_hours").is_not_null() & pl.col("ttl_hours").is_finite())
        .filter(pl.col("updated_at") + pl.duration(microseconds=(pl.col("ttl_hours") * 3_600_000_000).cast(pl.Int64)) <= as_of)
        .select("id", "version", *owner)
        .collect()
    )
    if not expired.height:
        return scoped_result(Diff.empty(), None, COUNTERS)
    counts = (expired.group_by("scope_path").agg(pl.len().alias("working_ttl_pruned")) if owner
              else pl.DataFrame({"scope_path": list(paths), "working_ttl_pruned": [expired.height]}))
    diff = delete_nodes(snapshot, expired.select("id", "version"), "working_ttl", "working memory ttl expired")
    return scoped_result(diff, counts, COUNTERS)
