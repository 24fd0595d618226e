"""cooccurrence on a shard: candidates, rankings, free slots, existing links and windows are each
scope's own (string-prefix siblings ``org/ac`` and ``org/acme``), also when the scopes' nodes share
times, and when the window is so wide that the scopes cannot share one time axis."""

from __future__ import annotations

import random
from datetime import timedelta

import numpy as np
from deep_sleep.transforms._common import created_id
from deep_sleep.transforms.config import load_config
from deep_sleep.transforms.cooccurrence import _apart
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.transforms.shard_cases import AC, ACME, AS_OF, ago, each_scope_alone, nid, rows, scope_snapshot


def _pairs(got, scope):
    new = rows(got, scope, "memory_edges", "inserts")
    return set(zip(new["source_id"], new["target_id"], strict=True))


def test_nodes_at_the_same_times_pair_within_their_scope():
    """With one slot each, AC's x pairs with AC's y although ACME's nodes are nearer in time (the same
    instant); an existing link is reinforced in its own scope only."""
    t0, t1 = ago(hours=2), ago(hours=2) + timedelta(seconds=60)
    ac = scope_snapshot(AC, memory_nodes=[{"id": nid(1), "updated_at": t0}, {"id": nid(2), "updated_at": t1}])
    acme = scope_snapshot(
        ACME,
        memory_nodes=[{"id": nid(11), "updated_at": t0}, {"id": nid(12), "updated_at": t1},
                      {"id": nid(13), "updated_at": t1 + timedelta(minutes=10)},
                      {"id": nid(14), "updated_at": t1 + timedelta(minutes=10, seconds=1)}],
        memory_edges=[{"id": nid(51), "source_id": nid(11), "target_id": nid(12), "relation": "CO_OCCURRED", "weight": 2.0}],
    )
    config = load_config(overrides={"cooccurrence": {"max_neighbours": 1}})
    got = each_scope_alone([ac, acme], "cooccurrence", config)
    assert _pairs(got, AC) == {(nid(1), nid(2))}
    assert _pairs(got, ACME) == {(nid(13), nid(14))}  # 11 and 12 are full (their one link)
    reinforced = rows(got, ACME, "memory_edges", "updates")
    assert reinforced["id"].to_list() == [nid(51)] and reinforced["weight"].to_list() == [3.0]
    assert rows(got, AC, "memory_edges", "updates").height == 0
    new = rows(got, AC, "memory_edges", "inserts")
    assert new["id"].to_list() == [created_id(AC, "cooccurrence", f"{nid(1)}|{nid(2)}")]
    assert set(new["scope_path"]) == {AC} and set(new["tenant_id"]) == {"ac"}
    assert got.reports[AC].counters_by_phase["cooccurrence"] == {"edges_created": 1}
    assert got.reports[ACME].counters_by_phase["cooccurrence"] == {"edges_created": 1, "edges_reinforced": 1}


def test_windows_are_per_scope_and_an_edge_links_only_its_own_scope():
    """AC's previous run leaves its older node out; an edge row of ACME between AC's nodes (which the
    row checks would quarantine as dangling) is no link of AC's."""
    ac = scope_snapshot(AC, previous_run_as_of=ago(hours=1),
                  memory_nodes=[{"id": nid(1), "updated_at": ago(minutes=30)}, {"id": nid(2), "updated_at": ago(minutes=31)},
                                {"id": nid(3), "updated_at": ago(minutes=90)}])
    acme = scope_snapshot(ACME,
                    memory_nodes=[{"id": nid(11), "updated_at": ago(minutes=90)}, {"id": nid(12), "updated_at": ago(minutes=91)}],
                    memory_edges=[{"id": nid(51), "source_id": nid(1), "target_id": nid(2), "relation": "CO_OCCURRED"}])
    got = each_scope_alone([ac, acme], "cooccurrence", check_rows=False)
    assert _pairs(got, AC) == {(nid(1), nid(2))}
    assert _pairs(got, ACME) == {(nid(11), nid(12))}
    assert got.diff.table("memory_edges").updates.height == 0


def test_a_window_of_centuries_runs_scope_by_scope():
    """Nodes spread over 50 years in a window of 300 years: the scopes laid end to end would not fit in
    63 bits, so the phase ranks each scope on its own — with the same result."""
    rng = random.Random(5)
    span = int(timedelta(days=365 * 50).total_seconds())

    def nodes(first):
        return [{"id": nid(first + i), "updated_at": AS_OF - timedelta(seconds=rng.randrange(span))} for i in range(1900)]

    ac, acme = scope_snapshot(AC, memory_nodes=nodes(1)), scope_snapshot(ACME, memory_nodes=nodes(5001))
    t = np.concatenate([s.table("memory_nodes")["updated_at"].dt.epoch("us").to_numpy() for s in (ac, acme)])
    assert _apart(t, np.repeat([0, 1], 1900), 365 * 86400 * 300 * 10**6) is None  # no room on one axis
    config = load_config(overrides={"lookback_hours": 24 * 365 * 300.0,
                                    "cooccurrence": {"window_seconds": 365 * 86400 * 300.0}})
    got = each_scope_alone([ac, acme], "cooccurrence", config, check_rows=False)
    assert got.reports[AC].counters["edges_created"] > 0 and got.reports[ACME].counters["edges_created"] > 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40)), min_size=2, max_size=30), st.integers(0, 50))
def test_apart_keeps_each_scopes_window_and_order(nodes, width):
    """Within a scope: the time order, which pairs are within the window, and every gap within it are
    kept; nodes of different scopes are never within the window of each other."""
    sc = np.array([s for s, _ in nodes], dtype=np.int64)
    t = np.array([x for _, x in nodes], dtype=np.int64) * 7 + 10**15
    got = _apart(t, sc, width)
    assert got is not None
    u, wide = got
    for i in range(len(t)):
        for j in range(len(t)):
            if sc[i] != sc[j]:
                assert abs(u[i] - u[j]) > wide
                continue
            assert (t[i] < t[j]) == (u[i] < u[j]) and (t[i] == t[j]) == (u[i] == u[j])
            near = abs(t[i] - t[j]) <= width
            assert near == (abs(u[i] - u[j]) <= wide)
            if near:
                assert abs(u[i] - u[j]) == abs(t[i] - t[j])
