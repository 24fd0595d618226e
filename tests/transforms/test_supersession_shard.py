"""supersession on a shard: groups are (scope_path, source_id, relation), so an edge supersedes
only edges of its own scope — even when two scopes' rows name the same source and relation."""

from __future__ import annotations

from datetime import timedelta

import polars as pl

from tests.transforms.shard_cases import AC, ACME, OLD, each_scope_alone, edges, new_id, snapshot_of


def _facts(scope: str, source: str, targets: list[str], start) -> pl.DataFrame:
    return edges(scope, [{"source_id": source, "target_id": t, "relation": "lives_in",
                          "created_at": start + timedelta(hours=i)} for i, t in enumerate(targets)])


def test_each_scope_supersedes_only_its_own_facts():
    # The same source id and relation in both scopes (rows built by hand: no quarantine here), the
    # acme facts interleaved in time with ac's.  Grouped across scopes, the four edges would form one
    # chain of three closings, ac's newest closed by an acme edge.
    source = new_id()
    ac = _facts(AC, source, [new_id(), new_id()], OLD)
    acme = _facts(ACME, source, [new_id(), new_id()], OLD + timedelta(minutes=30))
    got = each_scope_alone([snapshot_of(AC, memory_edges=ac), snapshot_of(ACME, memory_edges=acme)], "supersession", check_rows=False)
    assert got.reports[AC].counters["facts_superseded"] == 1
    assert got.reports[ACME].counters["facts_superseded"] == 1
    updates = got.diff.table("memory_edges").updates.sort("scope_path")
    by_scope = {AC: ac, ACME: acme}
    for row in updates.iter_rows(named=True):
        mine = by_scope[row["scope_path"]].sort("created_at")
        assert row["id"] == mine.item(0, "id")
        assert row["valid_to"] == mine.item(1, "created_at")
        assert mine.item(1, "id") in row["properties"]


def test_a_scope_without_functional_edges_counts_zero_beside_one_with():
    source = new_id()
    ac = _facts(AC, source, [new_id(), new_id(), new_id()], OLD)
    acme = edges(ACME, [{"source_id": source, "target_id": new_id()}, {"source_id": source, "target_id": new_id()}])
    got = each_scope_alone([snapshot_of(AC, memory_edges=ac), snapshot_of(ACME, memory_edges=acme)], "supersession", check_rows=False)
    assert got.reports[AC].counters["facts_superseded"] == 2
    assert got.reports[ACME].counters["facts_superseded"] == 0
    assert got.reports[ACME].phases_run == ["supersession"]
