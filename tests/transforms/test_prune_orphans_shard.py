"""prune_orphans on a shard: a node's degree counts only its own scope's edges, and the chain
peeling, reasons and counters are per scope."""

from __future__ import annotations

import polars as pl

from tests.transforms.shard_cases import AC, ACME, each_scope_alone, edges, nodes, snapshot_of


def test_an_edge_of_another_scope_does_not_count_towards_a_degree():
    # ac: a weak node with one neighbour (an orphan: degree 1).  acme's rows (built by hand, no
    # quarantine) hold an edge naming that weak node's id: counted across scopes its degree would
    # be 2 and it would stay.
    ac = nodes(AC, [{"label": "project: weak", "importance": 1.0}, {"label": "project: hub", "importance": 9.0}])
    weak, hub = ac.get_column("id").to_list()
    acme = nodes(ACME, [{"label": "project: a", "importance": 9.0}])
    ac_edges = edges(AC, [{"source_id": weak, "target_id": hub}])
    acme_edges = edges(ACME, [{"source_id": acme.item(0, "id"), "target_id": weak}])
    got = each_scope_alone([snapshot_of(AC, memory_nodes=ac, memory_edges=ac_edges),
                            snapshot_of(ACME, memory_nodes=acme, memory_edges=acme_edges)], "prune_orphans")
    assert got.reports[AC].counters["nodes_pruned"] == 1
    assert got.reports[ACME].counters["nodes_pruned"] == 0
    deleted = got.diff.table("memory_nodes").deletes
    assert deleted.select("id", "scope_path").rows() == [(weak, AC)]
    # the incident edge that goes is ac's own; acme's row naming the node is not ac's to delete
    assert got.diff.table("memory_edges").deletes.select("id", "scope_path").rows() == [(ac_edges.item(0, "id"), AC)]


def test_chains_peel_and_ttl_expires_per_scope():
    # ac: a chain hub - w1 - w2 of weak nodes peels in one run; acme: a node whose ttl elapsed (any
    # importance), and one weak node with two strong neighbours that stays.
    ac = nodes(AC, [{"label": "x: hub", "importance": 9.0}, {"label": "x: w1", "importance": 1.0},
                    {"label": "x: w2", "importance": 1.0}])
    hub, w1, w2 = ac.get_column("id").to_list()
    acme = nodes(ACME, [{"label": "y: ttl", "importance": 9.0, "properties": '{"ttl_hours": 1}'},
                        {"label": "y: weak", "importance": 1.0}, {"label": "y: s1", "importance": 9.0},
                        {"label": "y: s2", "importance": 9.0}])
    ttl, weak, s1, s2 = acme.get_column("id").to_list()
    snaps = [snapshot_of(AC, memory_nodes=ac, memory_edges=edges(AC, [{"source_id": hub, "target_id": w1},
                                                                   {"source_id": w1, "target_id": w2}])),
             snapshot_of(ACME, memory_nodes=acme, memory_edges=edges(ACME, [{"source_id": weak, "target_id": s1},
                                                                         {"source_id": weak, "target_id": s2},
                                                                         {"source_id": ttl, "target_id": s1}]))]
    got = each_scope_alone(snaps, "prune_orphans")
    assert got.reports[AC].counters["nodes_pruned"] == 2
    assert got.reports[ACME].counters["nodes_pruned"] == 1
    deleted = got.diff.table("memory_nodes").deletes.sort("id")
    assert sorted(deleted.get_column("id").to_list()) == sorted([w1, w2, ttl])
    assert deleted.filter(pl.col("id") == ttl).item(0, "reason") == "semantic ttl expired"
