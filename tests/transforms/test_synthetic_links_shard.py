"""synthetic_links on a shard: markers resolve among their own scope's nodes, and the pair cap is per scope."""

from __future__ import annotations

from datetime import timedelta

from deep_sleep.transforms.config import ConsolidationConfig, load_config
from deep_sleep.transforms.synthetic_links import synthetic_links
from deep_sleep.core.snapshot import Snapshot
from tests.transforms.shard_cases import AC, ACME, AS_OF, NESTED, assert_each_scope_alone, frame, shard_of, uid

RECENT = AS_OF - timedelta(days=1)


def _node(scope: str, s: int, n: int, label: str, importance: float = 5.0) -> dict:
    return {"id": uid(s, n), "scope_path": scope, "label": label, "importance": importance}


def _event(scope: str, s: int, n: int, content: str) -> dict:
    return {"id": uid(s, 100 + n), "scope_path": scope, "session_id": "s", "content": content,
            "created_at": RECENT + timedelta(minutes=n)}


def _fixture():
    # Both scopes label nodes alpha, beta, gamma; ACME's alpha is the more important one, so a
    # resolution across the shard would send AC's [semantic:alpha] to ACME's node.
    nodes = [_node(ACME, 2, 1, "alpha", 9.0), _node(AC, 1, 1, "alpha"), _node(AC, 1, 2, "beta"), _node(ACME, 2, 2, "beta"),
             _node(AC, 1, 3, "gamma"), _node(ACME, 2, 3, "gamma"), _node(ACME, 2, 4, "SOUL:name"),
             _node(NESTED, 3, 1, "alpha", 10.0), _node(NESTED, 3, 2, "beta", 10.0)]
    events = []
    for n in range(4):  # AC: alpha–gamma in 4 events, alpha–beta in 3
        events.append(_event(AC, 1, n, "saw [semantic:alpha] and [semantic:gamma]"))
    for n in range(4, 7):
        events.append(_event(AC, 1, n, "[semantic:beta] with [semantic:alpha]"))
    for n in range(3):  # ACME: beta–gamma in 3 events (each also mentions its SOUL node once: 3 more pairs)
        events.append(_event(ACME, 2, n, "[semantic:gamma] [semantic:beta] [SOUL:name]"))
    events.append(_event(ACME, 2, 3, "[semantic:alpha] [semantic:beta]"))  # once: under the threshold
    events.sort(key=lambda e: e["created_at"])  # the scopes' events interleaved
    return shard_of({"memory_nodes": nodes, "episodic_events": events}, (AC, ACME, NESTED))


def _pairs(result, scope: str) -> set[tuple[str, str]]:
    ins = result.diff.tables["memory_edges"].inserts
    return set(ins.filter(ins["scope_path"] == scope).select("source_id", "target_id").iter_rows())


def test_markers_resolve_within_their_scope():
    shard, snaps = _fixture()
    result = synthetic_links(shard, ConsolidationConfig().phase("synthetic_links"), AS_OF)
    assert result.skipped_scopes == {NESTED: "missing input: no episodic events"}
    assert _pairs(result, AC) == {(uid(1, 1), uid(1, 3)), (uid(1, 1), uid(1, 2))}
    assert _pairs(result, ACME) == {(uid(2, 2), uid(2, 3)), (uid(2, 2), uid(2, 4)), (uid(2, 3), uid(2, 4))}
    ins = result.diff.tables["memory_edges"].inserts
    assert sorted(set(ins["tenant_id"])) == ["ac", "acme"]
    assert dict(result.by_scope.select("scope_path", "synthetic_edges_created").iter_rows()) == {AC: 2, ACME: 3}
    assert_each_scope_alone(shard, snaps, "synthetic_links")


def test_the_pair_cap_is_per_scope():
    config = load_config(overrides={"synthetic_links": {"max_pairs": 1}})
    shard, snaps = _fixture()
    result = synthetic_links(shard, config.phase("synthetic_links"), AS_OF)
    # AC's best pair has co-count 4; ACME's three pairs 3 each: the smallest (source, target) wins.
    assert _pairs(result, AC) == {(uid(1, 1), uid(1, 3))}
    assert _pairs(result, ACME) == {(uid(2, 2), uid(2, 3))}
    reports = assert_each_scope_alone(shard, snaps, "synthetic_links", config)
    assert {s: r.counters["synthetic_edges_created"] for s, r in reports.items()} == {AC: 1, ACME: 1, NESTED: 0}


def test_an_existing_link_in_one_scope_does_not_block_the_other():
    shard, snaps = _fixture()
    edges = [{"id": uid(2, 50), "scope_path": ACME, "source_id": uid(2, 3), "target_id": uid(2, 2), "relation": "SYNTHETIC_LINK"}]
    shard = shard.with_frames({"memory_edges": frame("memory_edges", edges)})
    snaps = [s if s.scope_path != ACME else Snapshot(s.scope_path, AS_OF, None, {**s.frames, "memory_edges": frame("memory_edges", edges)})
             for s in snaps]
    result = synthetic_links(shard, ConsolidationConfig().phase("synthetic_links"), AS_OF)
    assert (uid(2, 2), uid(2, 3)) not in _pairs(result, ACME)
    assert len(_pairs(result, AC)) == 2
    assert_each_scope_alone(shard, snaps, "synthetic_links")
