"""working_ttl on a shard: each scope's expired working nodes (and their edges) and its own counter."""

from __future__ import annotations

import json
from datetime import timedelta


from deep_sleep.transforms.config import ConsolidationConfig
from deep_sleep.transforms.working_ttl import working_ttl
from tests.transforms.shard_cases import AC, ACME, AS_OF, NESTED, assert_each_scope_alone, shard_of, uid


def _working(scope: str, s: int, n: int, ttl_hours: float, age_hours: float) -> dict:
    return {"id": uid(s, n), "scope_path": scope, "layer": "working", "label": f"w{n}",
            "properties": json.dumps({"ttl_hours": ttl_hours}), "updated_at": AS_OF - timedelta(hours=age_hours)}


def test_each_scope_prunes_its_own_expired_working_nodes():
    nodes = [
        _working(ACME, 2, 1, 1, 10), _working(AC, 1, 1, 1, 2), _working(ACME, 2, 2, 5, 5),  # expired (ACME's at as_of exactly)
        _working(AC, 1, 2, 48, 2), _working(ACME, 2, 3, 48, 2),  # not yet
        {"id": uid(1, 3), "scope_path": AC, "label": "kept"},
        {"id": uid(3, 1), "scope_path": NESTED, "label": "kept"},
    ]
    edges = [{"id": uid(1, 9), "scope_path": AC, "source_id": uid(1, 3), "target_id": uid(1, 1), "relation": "R"},
             {"id": uid(2, 9), "scope_path": ACME, "source_id": uid(2, 3), "target_id": uid(2, 2), "relation": "R"}]
    shard, snaps = shard_of({"memory_nodes": nodes, "memory_edges": edges}, (AC, ACME, NESTED))

    result = working_ttl(shard, ConsolidationConfig().phase("working_ttl"), AS_OF)
    by_scope = dict(result.by_scope.select("scope_path", "working_ttl_pruned").iter_rows())
    assert by_scope == {AC: 1, ACME: 2} and result.counters == {"working_ttl_pruned": 3}
    deletes = result.diff.tables["memory_nodes"].deletes
    assert sorted(deletes["id"]) == sorted([uid(1, 1), uid(2, 1), uid(2, 2)])
    assert sorted(result.diff.tables["memory_edges"].deletes["id"]) == [uid(1, 9), uid(2, 9)]

    reports = assert_each_scope_alone(shard, snaps, "working_ttl")
    assert {s: r.counters["working_ttl_pruned"] for s, r in reports.items()} == {AC: 1, ACME: 2, NESTED: 0}
    assert all(r.phases_run == ["working_ttl"] for r in reports.values())


def test_a_shard_without_working_nodes_counts_zero_everywhere():
    shard, snaps = shard_of({"memory_nodes": [{"id": uid(1, 1), "scope_path": AC, "label": "x"}]}, (AC, ACME))
    result = working_ttl(shard, ConsolidationConfig().phase("working_ttl"), AS_OF)
    assert not result.diff.has_changes and result.counters == {"working_ttl_pruned": 0} and not result.skipped_scopes
    assert_each_scope_alone(shard, snaps, "working_ttl")
