"""Hand-built shards for the per-phase shard tests (``test_<phase>_shard.py``): two string-prefix
sibling scopes ``org/ac`` and ``org/acme`` (and more), each a single-scope :class:`Snapshot`, and a
check that one pass over their shard gives every scope the plan of that scope alone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl

from deep_sleep.core import tables
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run.plan import ShardPlan, plan, plan_shard
from deep_sleep.transforms.config import ConsolidationConfig

AS_OF = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
AC, ACME = "org\x1fac", "org\x1facme"  # AC is a string prefix of ACME
SAME = ("counters", "counters_by_phase", "phases_run", "phases_skipped", "rows_changed", "notes", "diff_hash",
        "quarantined", "scope_path", "as_of")
DEFAULTS = {"properties": "{}", "metadata": "{}", "importance": 5.0, "layer": "semantic", "version": 1, "weight": 1.0,
            "access_count": 0, "kind": "read", "created_at": AS_OF - timedelta(days=10),
            "updated_at": AS_OF - timedelta(days=10)}


def uid(n: int) -> str:
    return f"00000000-0000-0000-0000-{n:012d}"


def ago(**delta: float) -> datetime:
    return AS_OF - timedelta(**delta)


def frame(table: str, scope: str, rows: list[dict]) -> pl.DataFrame:
    """Rows of one scope's ``table``; columns not given take :data:`DEFAULTS` (or null)."""
    cols = tables.columns(table)
    tenant = scope.split("\x1f")[1]
    base = {**DEFAULTS, "scope_path": scope, "tenant_id": tenant}
    filled = [{c: row.get(c, base.get(c)) for c in cols} for row in rows]
    if table == "memory_nodes":  # a node needs a label: its id's last digits unless given
        for row in filled:
            row["label"] = row["label"] or f"n{row['id'][-4:]}"
    return tables.conform(table, pl.DataFrame(filled, schema={c: cols[c].dtype for c in cols}))


def snapshot(scope: str, previous_run_as_of: datetime | None = None, **rows: list[dict]) -> Snapshot:
    return Snapshot(scope, AS_OF, previous_run_as_of, {t: frame(t, scope, r) for t, r in rows.items()})


def shard_plan(snaps: list[Snapshot], phase: str, config: ConsolidationConfig | None = None,
               check_rows: bool = True) -> ShardPlan:
    """The shard's plan of ``phase``, after checking that every scope's report and diff are that
    scope's plan alone."""
    config = config or ConsolidationConfig()
    got = plan_shard(Shard.from_snapshots(snaps), config, AS_OF, phases=(phase,), check_rows=check_rows)
    diffs = got.scope_diffs()
    for snap in snaps:
        alone = plan(snap, config, AS_OF, phases=(phase,), check_rows=check_rows)
        mine = got.reports[snap.scope_path]
        for field in SAME:
            assert getattr(mine, field) == getattr(alone.report, field), (snap.scope_path, field)
        assert diffs[snap.scope_path].content_hash() == alone.diff.content_hash()
    return got


def rows(got: ShardPlan, scope: str, table: str, kind: str) -> pl.DataFrame:
    """One scope's ``kind`` rows of ``table`` in the shard's diff, by id."""
    frame = got.scope_diffs()[scope].table(table).frames()[kind]
    return frame.sort("id") if frame.height else frame
