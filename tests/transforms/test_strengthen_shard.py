"""strengthen on a shard: each scope's window starts at its own previous run, and an access counts
only for a node of the access's own scope (string-prefix siblings ``org/ac`` and ``org/acme``)."""

from __future__ import annotations

from tests.transforms.shard_cases import AC, ACME, ago, each_scope_alone, nid, rows, scope_snapshot


def _access(n: int, node: int, **when: float) -> dict:
    return {"id": n, "node_id": nid(node), "accessed_at": ago(**when)}


def test_windows_and_accesses_are_per_scope():
    ac = scope_snapshot(
        AC, previous_run_as_of=ago(hours=1),
        memory_nodes=[{"id": nid(1)}, {"id": nid(2)}],
        # node 1: accessed before this scope's previous run (in ACME's window, not in AC's)
        memory_access_log=[_access(1, 1, hours=3), _access(2, 1, hours=3), _access(3, 2, minutes=30),
                           _access(4, 2, minutes=20),
                           _access(5, 12, minutes=10)],  # names a node of ACME: not an access of it
    )
    acme = scope_snapshot(
        ACME,
        memory_nodes=[{"id": nid(11)}, {"id": nid(12)}],
        memory_access_log=[_access(11, 11, hours=3), _access(12, 11, hours=3), _access(13, 12, minutes=10)],
    )
    got = each_scope_alone([ac, acme], "strengthen", check_rows=False)
    assert rows(got, AC, "memory_nodes", "updates").get_column("id").to_list() == [nid(2)]
    assert rows(got, ACME, "memory_nodes", "updates").get_column("id").to_list() == [nid(11)]
    assert got.reports[AC].counters["nodes_strengthened"] == 1
    assert got.reports[ACME].counters["nodes_strengthened"] == 1
    # The shard's update rows carry their scope.
    updates = got.diff.table("memory_nodes").updates
    assert dict(zip(updates["id"], updates["scope_path"], strict=True)) == {nid(2): AC, nid(11): ACME}


def test_a_scope_with_nothing_to_strengthen_counts_zero():
    ac = scope_snapshot(AC, memory_nodes=[{"id": nid(1)}], memory_access_log=[_access(1, 1, hours=1)])
    acme = scope_snapshot(ACME, memory_nodes=[{"id": nid(11)}],
                    memory_access_log=[_access(11, 11, hours=1), _access(12, 11, hours=2)])
    got = each_scope_alone([ac, acme], "strengthen")
    assert got.reports[AC].counters_by_phase["strengthen"] == {}
    assert got.reports[ACME].counters_by_phase["strengthen"] == {"nodes_strengthened": 1}
