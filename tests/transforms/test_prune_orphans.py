"""Issue 13, item 3: a node that a quarantined row still touches is never pruned on a degree that
ignores that row (Snapshot.held_nodes), so no quarantined edge is left pointing at a deleted node."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import polars as pl

from deep_sleep.core import tables
from deep_sleep.transforms.config import load_config
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run.transform import transform

SCOPE = "org\x1facme\x1fbrand\x1fb1"
NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=30)


def _snapshot(bad_weight: float) -> tuple[Snapshot, str]:
    weak, hub, other = (str(uuid.uuid4()) for _ in range(3))
    nodes = tables.conform("memory_nodes", pl.DataFrame({
        "id": [weak, hub, other], "scope_path": SCOPE, "tenant_id": "acme", "layer": "semantic",
        "label": ["project: weak", "project: hub", "project: other"], "properties": "{}",
        "importance": [2.0, 9.0, 9.0], "created_at": OLD, "updated_at": OLD, "version": 1}))
    edges = tables.conform("memory_edges", pl.DataFrame({
        "id": [str(uuid.uuid4()), str(uuid.uuid4())], "scope_path": SCOPE, "tenant_id": "acme",
        "source_id": [weak, weak], "target_id": [hub, other], "relation": "RELATED_TO",
        "weight": [1.0, bad_weight], "properties": "{}", "created_at": OLD, "updated_at": OLD, "version": 1}))
    return Snapshot(SCOPE, NOW, frames={"memory_nodes": nodes, "memory_edges": edges}), weak


def test_weak_node_with_a_quarantined_edge_is_not_pruned():
    snap, weak = _snapshot(float("nan"))
    result = transform(snap, load_config(), NOW, phases=["prune_orphans"])
    assert result.report.quarantined == {"memory_edges": {"weight is negative or not finite": 1}}
    assert weak in result.shard.held_nodes
    assert weak in result.scope_snapshot().held_nodes
    assert result.report.counters["nodes_pruned"] == 0
    assert result.scope_diff().table("memory_nodes").deletes.height == 0
    assert result.scope_diff().table("memory_edges").deletes.height == 0


def test_the_same_node_with_a_good_second_edge_is_pruned_as_before():
    # control: the same weak node with only its good edge (nothing quarantined) is an orphan and goes
    snap, weak = _snapshot(1.0)
    edges = snap.table("memory_edges").head(1)
    result = transform(snap.with_frames({"memory_edges": edges}), load_config(), NOW, phases=["prune_orphans"])
    assert result.scope_diff().table("memory_nodes").deletes.get_column("id").to_list() == [weak]
    assert not result.scope_snapshot().held_nodes
