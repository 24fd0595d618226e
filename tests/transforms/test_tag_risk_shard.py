"""tag_risk on a shard: "recent" is each scope's own window (from its previous run) and each scope's
note lists only its own untaggable nodes (string-prefix siblings ``org/ac`` and ``org/acme``)."""

from __future__ import annotations

from tests.transforms.shard_builders import AC, ACME, ago, rows, shard_plan, snapshot, uid


def test_windows_and_notes_are_per_scope():
    ac = snapshot(
        AC, previous_run_as_of=ago(hours=1),
        memory_nodes=[
            {"id": uid(1), "label": "risk of fire", "updated_at": ago(hours=3)},  # before AC's previous run
            {"id": uid(2), "label": "a warning", "updated_at": ago(minutes=30)},
            {"id": uid(3), "label": "critical path", "properties": "[1]", "updated_at": ago(minutes=10)},  # untaggable
            {"id": uid(4), "label": "error budget", "properties": "[2]", "updated_at": ago(minutes=10)},  # untaggable
        ],
    )
    acme = snapshot(
        ACME,
        memory_nodes=[
            {"id": uid(11), "label": "risk of flood", "updated_at": ago(hours=3)},  # in ACME's window
            {"id": uid(12), "label": "calm", "properties": '{"note": "a threat"}', "updated_at": ago(hours=5)},
            {"id": uid(13), "label": "calm too", "updated_at": ago(hours=5)},
        ],
    )
    got = shard_plan([ac, acme], "tag_risk", check_rows=False)
    assert rows(got, AC, "memory_nodes", "updates").get_column("id").to_list() == [uid(2)]
    assert rows(got, ACME, "memory_nodes", "updates").get_column("id").to_list() == [uid(11), uid(12)]
    assert got.reports[AC].notes["tag_risk"] == [
        f"2 risk node(s) not tagged: properties are not a JSON object ({uid(3)}, {uid(4)})"]
    assert "tag_risk" not in got.reports[ACME].notes
    assert got.reports[AC].counters["risk_nodes_tagged"] == 1
    assert got.reports[ACME].counters["risk_nodes_tagged"] == 2


def test_a_long_note_is_cut_per_scope():
    """Eleven untaggable nodes in one scope, one in the other: only the first gets " …"."""
    ac = snapshot(AC, memory_nodes=[{"id": uid(i), "label": "risk", "properties": "[]", "updated_at": ago(hours=1)}
                                    for i in range(1, 12)])
    acme = snapshot(ACME, memory_nodes=[{"id": uid(20), "label": "risk", "properties": "[]", "updated_at": ago(hours=1)}])
    got = shard_plan([ac, acme], "tag_risk", check_rows=False)
    shown = ", ".join(uid(i) for i in range(1, 11))
    assert got.reports[AC].notes["tag_risk"] == [f"11 risk node(s) not tagged: properties are not a JSON object ({shown} …)"]
    assert got.reports[ACME].notes["tag_risk"] == [f"1 risk node(s) not tagged: properties are not a JSON object ({uid(20)})"]
