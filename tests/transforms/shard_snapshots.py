"""Small shards for the phases' shard tests: the string-prefix siblings ``org/ac`` and ``org/acme``
in one shard, rows built by hand, and a check that a shard run gives each scope its own run."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import polars as pl

from deep_sleep.core import tables
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run.plan import ShardPlan, plan, plan_shard
from deep_sleep.transforms import roster
from deep_sleep.transforms.config import ConsolidationConfig

AC, ACME = "org\x1fac", "org\x1facme"
AS_OF = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
OLD = AS_OF - timedelta(days=30)
FIELDS = ("counters", "counters_by_phase", "phases_run", "phases_skipped", "rows_changed", "notes", "diff_hash")


def uid() -> str:
    return str(uuid.uuid4())


def nodes(scope: str, rows: list[dict]) -> pl.DataFrame:
    """Semantic nodes of ``scope``: each row needs ``label``; the rest defaults (old, importance 5)."""
    base = {"scope_path": scope, "tenant_id": scope.split("\x1f")[1], "layer": "semantic", "properties": "{}",
            "importance": 5.0, "access_count": 0, "created_at": OLD, "updated_at": OLD, "version": 1}
    return tables.conform("memory_nodes", pl.DataFrame([{"id": uid(), **base, **r} for r in rows]))


def edges(scope: str, rows: list[dict]) -> pl.DataFrame:
    """Edges of ``scope``: each row needs ``source_id`` and ``target_id``."""
    base = {"scope_path": scope, "tenant_id": scope.split("\x1f")[1], "relation": "RELATED_TO", "weight": 1.0,
            "properties": "{}", "created_at": OLD, "updated_at": OLD, "valid_from": OLD, "version": 1}
    return tables.conform("memory_edges", pl.DataFrame([{"id": uid(), **base, **r} for r in rows]))


def snapshot(scope: str, previous_run_as_of: datetime | None = None, **frames: pl.DataFrame) -> Snapshot:
    return Snapshot(scope, AS_OF, previous_run_as_of, {name: tables.conform(name, f) for name, f in frames.items()})


def each_scope_alone(snaps: list[Snapshot], phase: str, config: ConsolidationConfig | None = None,
                     check_rows: bool = False, **kwargs) -> ShardPlan:
    """Run ``phase`` on the shard of ``snaps`` and on each snapshot alone; assert every scope got
    exactly its own report fields and diff hash, and that the phase really ran once on the shard."""
    config = config or ConsolidationConfig()
    (entry,) = roster((phase,))
    assert getattr(entry.fn, "shard_native", False), f"{phase} is not shard_native"
    got = plan_shard(Shard.from_snapshots(snaps), config, AS_OF, phases=(phase,), check_rows=check_rows, **kwargs)
    diffs = got.scope_diffs()
    for snap in snaps:
        alone = plan(snap, config, AS_OF, phases=(phase,), check_rows=check_rows, **kwargs)
        mine = got.reports[snap.scope_path]
        for field in FIELDS:
            assert getattr(mine, field) == getattr(alone.report, field), (snap.scope_path, field)
        assert diffs[snap.scope_path].content_hash() == alone.diff.content_hash()
    return got
