"""Phase 9 — decay_importance: memories nobody touches slowly lose importance (SPEC §3)."""

from __future__ import annotations

from datetime import datetime, timedelta

import polars as pl
from deep_sleep.transforms._common import PhaseResult, is_protected, scope_paths, scoped_result
from pydantic import Field

from deep_sleep.core.config import PhaseConfig
from deep_sleep.core.diff import Diff
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot


class DecayImportanceConfig(PhaseConfig):
    stale_days: float = Field(30, ge=0)
    step: float = Field(0.5, gt=0)
    floor: float = Field(1.0, ge=1.0)
    min_interval_hours: float = Field(24, ge=0)
    exempt_importance: float = Field(8.0, le=10.0)


#: The counters this phase reports (SPEC §3).
COUNTERS: tuple[str, ...] = ("nodes_decayed",)


def decay_importance(snapshot: Snapshot | Shard, config: DecayImportanceConfig, as_of: datetime) -> PhaseResult:
    """Semantic nodes whose ``updated_at`` is strictly older than ``stale_days`` before as_of lose
    ``step`` importance, floored at ``floor``, and get ``last_decayed_at = as_of``.  Exempt:
    importance ≥ ``exempt_importance`` and protected labels.  A node at (or, for legacy rows, below)
    the floor is neither changed nor counted.  Rate limit: a node decays only if ``last_decayed_at``
    is null or ≤ as_of − ``min_interval_hours`` (so exactly one interval later it decays again) and
    strictly before as_of — the second condition keeps a rerun at the same as_of a no-op even when
    ``min_interval_hours`` is 0.  The rule is row-wise, so a shard (many scopes) is handled in one
    pass; the counter is per scope.
    """
    stale_before = as_of - timedelta(days=config.stale_days)
    interval_start = min(as_of - timedelta(hours=config.min_interval_hours), as_of - timedelta(microseconds=1))
    lda = pl.col("last_decayed_at")
    paths = scope_paths(snapshot)
    owner = ["scope_path"] if len(paths) > 1 else []  # one scope: its count is the frame's height
    decayed = (
        snapshot.table("memory_nodes")
        .lazy()
        # Cheap numeric and timestamp tests first: at 1M nodes this phase sees about half of them.
        .filter(
            (pl.col("updated_at") < stale_before)
            & (pl.col("importance") > config.floor)
            & (pl.col("importance") < config.exempt_importance)
            & (lda.is_null() | (lda <= interval_start))
            & (pl.col("layer") == "semantic")
        )
        .filter(~is_protected())
        .select(
            "id",
            "version",
            *owner,
            pl.max_horizontal(pl.col("importance") - config.step, pl.lit(config.floor)).alias("importance"),
            pl.lit(as_of, dtype=pl.Datetime("us", "UTC")).alias("last_decayed_at"),
        )
        .collect()
    )
    if not decayed.height:
        return scoped_result(Diff.empty(), None, COUNTERS)
    counts = (decayed.group_by("scope_path").agg(pl.len().alias("nodes_decayed")) if owner
              else pl.DataFrame({"scope_path": list(paths), "nodes_decayed": [decayed.height]}))
    return scoped_result(Diff.of("memory_nodes", "decay_importance", updates=decayed.drop(owner)), counts, COUNTERS)
