"""meta_nodes on a shard: groups, caps, label resolution, taken ids, CLUSTERS edges and the
summarizer's requests are per scope — for the string-prefix siblings org/ac and org/acme."""

from __future__ import annotations

import polars as pl
from deep_sleep.transforms._common import created_id
from deep_sleep.transforms.config import ConsolidationConfig

from deep_sleep.core.shard import Shard
from deep_sleep.core.summary import Summary
from deep_sleep.run.transform import transform
from tests.transforms.shard_cases import AC, ACME, AS_OF, each_scope_alone, edges, nodes, snapshot_of


def _labels(prefix: str, n: int, importance: float = 5.0) -> list[dict]:
    return [{"label": f"{prefix}: item {i:02d}", "importance": importance} for i in range(n)]


def _snaps():
    ac = nodes(AC, [
        *_labels("project", 2),  # 2 + acme's 2: a group only if counted across scopes
        *_labels("task", 3, importance=9.0),  # across scopes these three would crowd acme's top 10
        *_labels("topic", 3),
        {"label": "META:topic", "importance": 1.0},  # ac's META node: acme's topic group is not its
        *_labels("note", 3),
        {"id": created_id(AC, "meta_nodes", "note"), "label": "not a meta node"},  # takes ac's META:note id
    ])
    acme = nodes(ACME, [*_labels("project", 2), *_labels("task", 12), *_labels("topic", 3), *_labels("note", 3)])
    meta_topic = ac.filter(pl.col("label") == "META:topic").item(0, "id")
    # a stale CLUSTERS edge of ac's META:topic to a node of acme: not acme's, and stale for ac
    stale = edges(AC, [{"source_id": meta_topic, "target_id": acme.item(0, "id"), "relation": "CLUSTERS"}])
    return [snapshot_of(AC, memory_nodes=ac, memory_edges=stale), snapshot_of(ACME, memory_nodes=acme)], ac, acme


def test_groups_caps_and_labels_are_per_scope():
    snaps, ac, acme = _snaps()
    got = each_scope_alone(snaps, "meta_nodes", check_rows=False)  # the stale edge is not quarantined
    ins = got.diff.table("memory_nodes").inserts
    by = {s: sorted(ins.filter(pl.col("scope_path") == s).get_column("label").to_list()) for s in (AC, ACME)}
    assert by[AC] == ["META:task"]  # topic updates ac's own META node; note's id is taken
    assert by[ACME] == ["META:note", "META:task", "META:topic"]  # no project group (2 < 3) anywhere
    assert ins.filter(pl.col("scope_path") == ACME).get_column("tenant_id").unique().to_list() == ["acme"]
    assert ins.filter(pl.col("scope_path") == AC).get_column("tenant_id").unique().to_list() == ["ac"]
    assert got.reports[AC].counters["meta_nodes_updated"] == 1 and got.reports[ACME].counters["meta_nodes_updated"] == 0
    assert got.reports[AC].notes["meta_nodes"] == [
        f"META group 'note' skipped: its id {created_id(AC, 'meta_nodes', 'note')} belongs to node 'not a meta node'"]
    assert "meta_nodes" not in got.reports[ACME].notes
    # acme's META:task clusters exactly its own top 10 (ac's important tasks are not members)
    task = ins.filter((pl.col("scope_path") == ACME) & (pl.col("label") == "META:task")).item(0, "id")
    clusters = got.diff.table("memory_edges").inserts.filter(pl.col("source_id") == task)
    assert clusters.height == 10
    assert set(clusters.get_column("target_id")) <= set(acme.get_column("id"))
    assert clusters.get_column("scope_path").unique().to_list() == [ACME]
    # the stale edge goes, as ac's
    assert got.diff.table("memory_edges").deletes.select("scope_path").rows() == [(AC,)]


class _Recording:
    """Answers every other request with a text naming its scope; records what it was asked."""

    def __init__(self):
        self.asked: list[tuple[str, str]] = []

    def summarize(self, requests):
        self.asked.extend((r.scope_path, r.key) for r in requests)
        return [Summary(f"{r.scope_path}|{r.key}", "m") if r.key != "task" else None for r in requests]


def test_the_summarizer_is_asked_with_each_groups_own_scope():
    snaps, _, _ = _snaps()
    got = each_scope_alone(snaps, "meta_nodes", summarizer=_Recording())  # model summaries: still each scope's own diff
    model, alone = _Recording(), _Recording()
    transform(Shard.from_snapshots(snaps), ConsolidationConfig(), AS_OF, phases=("meta_nodes",), check_rows=False,
         summarizer=model)
    for snap in snaps:
        transform(Shard.of(snap), ConsolidationConfig(), AS_OF, phases=("meta_nodes",), check_rows=False, summarizer=alone)
    assert sorted(model.asked) == sorted(alone.asked)
    assert set(model.asked) == {(s, k) for s in (AC, ACME) for k in ("note", "task", "topic")}
    ins = got.diff.table("memory_nodes").inserts.filter(pl.col("label") == "META:topic")
    assert ins.get_column("properties").str.json_path_match("$.summary").to_list() == [f"{ACME}|topic"]
    assert ins.get_column("properties").str.json_path_match("$.summary_model").to_list() == ["m"]
