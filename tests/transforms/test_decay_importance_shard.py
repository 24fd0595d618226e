"""decay_importance on a shard: each scope's stale nodes decay, and each scope counts its own."""

from __future__ import annotations

from datetime import timedelta

from deep_sleep.transforms.config import ConsolidationConfig
from deep_sleep.transforms.decay_importance import decay_importance
from tests.transforms.shard_cases import AC, ACME, AS_OF, NESTED, assert_each_scope_alone, shard_of, uid

OLD = AS_OF - timedelta(days=40)


def test_each_scope_decays_and_counts_its_own_nodes():
    nodes = [
        {"id": uid(2, 1), "scope_path": ACME, "label": "a", "importance": 5.0, "updated_at": OLD},
        {"id": uid(1, 1), "scope_path": AC, "label": "a", "importance": 3.0, "updated_at": OLD},
        {"id": uid(2, 2), "scope_path": ACME, "label": "b", "importance": 1.2, "updated_at": OLD},  # floored at 1.0
        {"id": uid(2, 3), "scope_path": ACME, "label": "c", "importance": 1.0, "updated_at": OLD},  # at the floor
        {"id": uid(1, 2), "scope_path": AC, "label": "SOUL:name", "importance": 5.0, "updated_at": OLD},  # protected
        {"id": uid(1, 3), "scope_path": AC, "label": "fresh", "importance": 5.0},
        {"id": uid(3, 1), "scope_path": NESTED, "label": "a", "importance": 5.0, "updated_at": OLD,
         "last_decayed_at": AS_OF - timedelta(hours=2)},  # decayed 2 h ago: rate-limited
    ]
    shard, snaps = shard_of({"memory_nodes": nodes}, (AC, ACME, NESTED))

    result = decay_importance(shard, ConsolidationConfig().phase("decay_importance"), AS_OF)
    assert dict(result.by_scope.select("scope_path", "nodes_decayed").iter_rows()) == {AC: 1, ACME: 2}
    updates = result.diff.tables["memory_nodes"].updates.sort("id")
    assert updates.select("id", "importance").rows() == [(uid(1, 1), 2.5), (uid(2, 1), 4.5), (uid(2, 2), 1.0)]
    assert "scope_path" not in updates.columns  # the same update rows as one scope's run

    reports = assert_each_scope_alone(shard, snaps, "decay_importance")
    assert {s: r.counters["nodes_decayed"] for s, r in reports.items()} == {AC: 1, ACME: 2, NESTED: 0}
