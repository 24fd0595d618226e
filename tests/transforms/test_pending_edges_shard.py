"""pending_edges on a shard: labels resolve over the row's own scope's nodes, duplicates, existing
edges and the CO_OCCURRED neighbour cap are the scope's own, each scope's rows are consumed by its
own run id, and a scope without pending rows is skipped (string-prefix siblings ``org/ac`` and
``org/acme``, and a scope nested under ``org/acme``)."""

from __future__ import annotations

from deep_sleep.transforms._common import created_id
from deep_sleep.transforms.config import load_config

from deep_sleep.core.snapshot import iso
from tests.transforms.shard_cases import AC, ACME, AS_OF, ago, each_scope_alone, nid, rows, scope_snapshot

NESTED = ACME + "\x1fagent\x1fa1"


def _pending(n: int, source: str, target: str, relation: str = "CO_OCCURRED", **when: float) -> dict:
    return {"id": nid(n), "source_label": source, "target_label": target, "relation": relation, "weight": 1.0,
            "created_at": ago(**when)}


def test_labels_duplicates_caps_and_skips_are_per_scope():
    ac = scope_snapshot(
        AC,
        memory_nodes=[{"id": nid(1), "label": "x"}, {"id": nid(2), "label": "y"}],
        pending_connections=[_pending(101, "x", "y", hours=2), _pending(102, "x", "y", "RELATED_TO", hours=2)],
    )
    acme = scope_snapshot(
        ACME,
        memory_nodes=[{"id": nid(11), "label": "x", "importance": 9.0}, {"id": nid(12), "label": "y"},
                      {"id": nid(13), "label": "w"}, {"id": nid(14), "label": "x", "importance": 2.0}],
        memory_edges=[{"id": nid(51), "source_id": nid(11), "target_id": nid(13), "relation": "CO_OCCURRED"}],
        # the same proposals as AC's (not duplicates of them), and one that names a label only AC has
        pending_connections=[_pending(111, "x", "y", hours=1), _pending(112, "x", "y", "RELATED_TO", hours=1),
                             _pending(113, "y", "v", "RELATED_TO", hours=1)],
    )
    nested = scope_snapshot(NESTED, memory_nodes=[{"id": nid(21), "label": "x"}])
    config = load_config(overrides={"cooccurrence": {"max_neighbours": 1}})
    got = each_scope_alone([ac, acme, nested], "pending_edges", config)

    def outcomes(scope):
        consumed = rows(got, scope, "pending_connections", "updates")
        return dict(zip(consumed["id"], consumed["outcome"], strict=True)), set(consumed["consumed_by_run"])

    assert outcomes(AC) == ({nid(101): "created", nid(102): "created"}, {created_id(AC, "run", iso(AS_OF))})
    # ACME's x is its own nid(11) (importance 9), which already has its one CO_OCCURRED neighbour.
    assert outcomes(ACME) == ({nid(111): "neighbour_cap", nid(112): "created", nid(113): "unresolved_target"},
                              {created_id(ACME, "run", iso(AS_OF))})
    ac_edges = rows(got, AC, "memory_edges", "inserts")
    acme_edges = rows(got, ACME, "memory_edges", "inserts")
    assert set(zip(ac_edges["source_id"], ac_edges["target_id"], ac_edges["relation"], strict=True)) == {
        (nid(1), nid(2), "CO_OCCURRED"), (nid(1), nid(2), "RELATED_TO")}
    assert set(zip(acme_edges["source_id"], acme_edges["target_id"], acme_edges["relation"], strict=True)) == {
        (nid(11), nid(12), "RELATED_TO")}
    assert set(ac_edges["scope_path"]) == {AC} and set(ac_edges["tenant_id"]) == {"ac"}
    assert set(acme_edges["scope_path"]) == {ACME} and set(acme_edges["tenant_id"]) == {"acme"}
    assert got.reports[NESTED].phases_skipped == {"pending_edges": "missing input: no pending connections"}
    assert got.reports[NESTED].phases_run == []
    assert [got.reports[s].counters["edges_created"] for s in (AC, ACME)] == [2, 1]


def test_a_shard_without_pending_rows_skips_every_scope():
    got = each_scope_alone([scope_snapshot(AC, memory_nodes=[{"id": nid(1)}]), scope_snapshot(ACME, memory_nodes=[{"id": nid(11)}])],
                     "pending_edges")
    assert {s: r.phases_skipped for s, r in got.reports.items()} == {
        s: {"pending_edges": "missing input: no pending connections"} for s in (AC, ACME)}
