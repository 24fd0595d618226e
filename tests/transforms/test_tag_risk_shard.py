"""tag_risk on a shard: "recent" is each scope's own window (from its previous run) and each scope's
note lists only its own untaggable nodes (string-prefix siblings ``org/ac`` and ``org/acme``)."""

from __future__ import annotations

from tests.transforms.shard_cases import AC, ACME, ago, each_scope_alone, nid, rows, scope_snapshot


def test_windows_and_notes_are_per_scope():
    ac = scope_snapshot(
        AC, previous_run_as_of=ago(hours=1),
        memory_nodes=[
            {"id": nid(1), "label": "risk of fire", "updated_at": ago(hours=3)},  # before AC's previous run
            {"id": nid(2), "label": "a warning", "updated_at": ago(minutes=30)},
            {"id": nid(3), "label": "critical path", "properties": "[1]", "updated_at": ago(minutes=10)},  # untaggable
            {"id": nid(4), "label": "error budget", "properties": "[2]", "updated_at": ago(minutes=10)},  # untaggable
        ],
    )
    acme = scope_snapshot(
        ACME,
        memory_nodes=[
            {"id": nid(11), "label": "risk of flood", "updated_at": ago(hours=3)},  # in ACME's window
            {"id": nid(12), "label": "calm", "properties": '{"note": "a threat"}', "updated_at": ago(hours=5)},
            {"id": nid(13), "label": "calm too", "updated_at": ago(hours=5)},
        ],
    )
    got = each_scope_alone([ac, acme], "tag_risk", check_rows=False)
    assert rows(got, AC, "memory_nodes", "updates").get_column("id").to_list() == [nid(2)]
    assert rows(got, ACME, "memory_nodes", "updates").get_column("id").to_list() == [nid(11), nid(12)]
    assert got.reports[AC].notes["tag_risk"] == [
        f"2 risk node(s) not tagged: properties are not a JSON object ({nid(3)}, {nid(4)})"]
    assert "tag_risk" not in got.reports[ACME].notes
    assert got.reports[AC].counters["risk_nodes_tagged"] == 1
    assert got.reports[ACME].counters["risk_nodes_tagged"] == 2


def test_a_long_note_is_cut_per_scope():
    """Eleven untaggable nodes in one scope, one in the other: only the first gets " …"."""
    ac = scope_snapshot(AC, memory_nodes=[{"id": nid(i), "label": "risk", "properties": "[]", "updated_at": ago(hours=1)}
                                    for i in range(1, 12)])
    acme = scope_snapshot(ACME, memory_nodes=[{"id": nid(20), "label": "risk", "properties": "[]", "updated_at": ago(hours=1)}])
    got = each_scope_alone([ac, acme], "tag_risk", check_rows=False)
    shown = ", ".join(nid(i) for i in range(1, 11))
    assert got.reports[AC].notes["tag_risk"] == [f"11 risk node(s) not tagged: properties are not a JSON object ({shown} …)"]
    assert got.reports[ACME].notes["tag_risk"] == [f"1 risk node(s) not tagged: properties are not a JSON object ({nid(20)})"]
