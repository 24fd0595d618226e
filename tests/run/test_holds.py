"""split_holds (pure) — a golden case, each rule alone, the closure under the graph, the applied part
valid on its own (SPEC §9 as amended 2026-12-04; issue 29's reproduction in miniature)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl

from deep_sleep.core import tables
from deep_sleep.core.diff import Diff
from deep_sleep.core.holds_config import HoldsConfig
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run import holds
from deep_sleep.run.holds import only_phases, phases_of
from deep_sleep.run.transform import as_shard_diff, transform
from deep_sleep.transforms.config import load_config
from deep_sleep.validation import validate_diff

SCOPE = "org\x1facme\x1fbrand\x1fb1"
NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
OLD = NOW - timedelta(days=30)
N = [f"00000000-0000-4000-8000-{i:012d}" for i in range(10)]
W = "00000000-0000-4000-9000-000000000001"
E = [f"00000000-0000-4000-a000-{i:012d}" for i in range(3)]
SOUL = "00000000-0000-4000-b000-000000000001"


def snapshot() -> Snapshot:
    nodes = tables.conform("memory_nodes", pl.DataFrame({
        "id": [*N, W], "scope_path": SCOPE, "tenant_id": "acme", "layer": ["semantic"] * 10 + ["working"],
        "label": [f"fact {i}" for i in range(11)], "properties": "{}",
        "importance": [2.0] * 4 + [5.0] * 7, "created_at": OLD, "updated_at": OLD, "version": 3}))
    edges = tables.conform("memory_edges", pl.DataFrame({
        "id": E, "scope_path": SCOPE, "tenant_id": "acme", "source_id": [N[0], N[6], N[9]],
        "target_id": [N[5], N[7], N[8]], "relation": "RELATED_TO", "weight": 1.0, "properties": "{}",
        "created_at": OLD, "updated_at": OLD, "version": 2}))
    recalls = tables.conform("recall_events", pl.DataFrame({
        "id": ["00000000-0000-4000-c000-000000000001", "00000000-0000-4000-c000-000000000002"],
        "scope_path": SCOPE, "tenant_id": "acme", "query": "q", "node_id": [N[9], N[1]], "similarity": 0.9,
        "score": 0.5, "label": [1.0, 1.0], "label_source": ["explicit", "implicit"], "created_at": OLD, "version": 1}))
    soul = tables.conform("soul_profiles", pl.DataFrame({
        "id": [SOUL], "scope_path": SCOPE, "tenant_id": "acme", "key": ["tone"], "value": ["warm"],
        "updated_at": OLD, "version": 1}))
    return Snapshot(SCOPE, NOW, frames={"memory_nodes": nodes, "memory_edges": edges, "recall_events": recalls,
                                        "soul_profiles": soul})


def ids(*xs: str) -> pl.DataFrame:
    return pl.DataFrame({"id": list(xs), "version": [3] * len(xs)})


def diff() -> Diff:
    new_edge = pl.DataFrame({"id": ["00000000-0000-4000-a000-000000000099"], "scope_path": SCOPE, "tenant_id": "acme",
                             "source_id": [N[4]], "target_id": [N[5]], "relation": "RELATED_TO", "weight": 1.0})
    return Diff.combine([
        Diff.of("memory_nodes", "prune_orphans", deletes=ids(N[0], N[1], N[2], N[3]), reason="orphan"),
        Diff.of("memory_edges", "prune_orphans", deletes=pl.DataFrame({"id": [E[0]], "version": [2]}), reason="with node"),
        Diff.of("memory_nodes", "working_ttl", deletes=ids(W), reason="ttl"),
        Diff.of("memory_nodes", "supersession", deletes=ids(N[9]), reason="superseded"),
        Diff.of("memory_edges", "supersession", deletes=pl.DataFrame({"id": [E[1], E[2]], "version": [2, 2]}), reason="stale"),
        Diff.of("memory_nodes", "strengthen", updates=ids(N[5], N[6]).with_columns(importance=pl.lit(6.0))),
        Diff.of("memory_nodes", "decay_importance", updates=ids(N[6], N[7]).with_columns(importance=pl.Series([5.5, 4.0]))),
        Diff.of("soul_profiles", "soul_corrections", updates=pl.DataFrame({"id": [SOUL], "version": [1], "value": ["curt"]})),
        Diff.of("memory_edges", "synthetic_links", inserts=new_edge),
    ])


def split_holds(d: Diff, snap: Snapshot, policy: HoldsConfig, gate_failed: bool = False) -> holds.HoldSplit:
    """The split of one scope's diff (a shard of one)."""
    return holds.split_holds(as_shard_diff(d, snap.scope_path), Shard.of(snap), policy, {snap.scope_path: gate_failed})


def ids_of(d: Diff, table: str, kind: str) -> list[str]:
    return sorted(d.table(table).frames()[kind].get_column("id").to_list())


def held_ids(split, table: str, kind: str) -> dict[str, str]:
    rows = split.rows.filter((pl.col("table") == table) & (pl.col("kind") == kind))
    return dict(zip(rows["id"], rows["reason"], strict=True))


def test_golden_split_exact():
    snap, d = snapshot(), diff()
    split = split_holds(d, snap, HoldsConfig())
    assert held_ids(split, "memory_nodes", "deletes") == {N[0]: "delete_share", N[1]: "delete_share", N[2]: "delete_share",
                                                          N[3]: "delete_share", N[9]: "used_node"}
    # E0 and E2 touch the held N0 and N9; E1 (N6→N7) touches no held node and goes tonight
    assert held_ids(split, "memory_edges", "deletes") == {E[0]: "with_held_node", E[2]: "with_held_node"}
    assert held_ids(split, "soul_profiles", "updates") == {SOUL: "soul_change"}
    assert ids_of(split.apply, "memory_nodes", "deletes") == [W]  # working-memory expiry is routine
    assert ids_of(split.apply, "memory_edges", "deletes") == [E[1]]
    assert split.apply.table("memory_nodes").updates.height == 4  # no importance rule without the gate
    assert split.apply.table("memory_edges").inserts.height == 1  # an insert to a node that stays is fine
    assert "soul_profiles" not in split.apply.tables
    assert split.summaries() == {SCOPE: {
        "rows": {"memory_edges": {"deletes": 2}, "memory_nodes": {"deletes": 5}, "soul_profiles": {"updates": 1}},
        "reasons": {"delete_share": 4, "soul_change": 1, "used_node": 1, "with_held_node": 2},
        "phases": {"prune_orphans": 5, "soul_corrections": 1, "supersession": 2},
        "cells": {"prune_orphans": {"delete_share": 4, "with_held_node": 1}, "soul_corrections": {"soul_change": 1},
                  "supersession": {"used_node": 1, "with_held_node": 1}},
        "why": ["the run deletes 5 of 10 semantic nodes (50.0 %; the policy holds more than 5 % or more than 500)",
                "the run changes the agent's SOUL profile (soul_profiles)",
                "the run deletes memories the agent used (explicit positive recall feedback)"],
    }}
    # row for row: nothing lost, nothing doubled
    for table, td in d.tables.items():
        for kind, frame in td.frames().items():
            got = split.apply.table(table).frames()[kind].height + split.held.table(table).frames()[kind].height
            assert got == frame.height, (table, kind)


def test_the_applied_part_passes_validation():
    snap, d = snapshot(), diff()
    assert validate_diff(d, snap).height == 0  # the golden diff is itself valid
    for gate in (False, True):
        split = split_holds(d, snap, HoldsConfig(), gate_failed=gate)
        assert validate_diff(split.apply, snap).height == 0, gate


def test_a_failed_gate_holds_every_destructive_row_and_the_lowered_importance():
    split = split_holds(diff(), snapshot(), HoldsConfig(), gate_failed=True)
    assert set(held_ids(split, "memory_nodes", "deletes")) == {*N[:4], N[9], W}
    assert held_ids(split, "memory_nodes", "deletes")[W] == "gate_failed"
    assert held_ids(split, "memory_edges", "deletes") == dict.fromkeys(E, "gate_failed")
    # N7 lowered 5.0 → 4.0 (held); N6 raised by strengthen then lowered to 5.5 by decay: net 5.5 > 5.0, applies
    assert held_ids(split, "memory_nodes", "updates") == {N[7]: "gate_failed"}
    assert ids_of(split.apply, "memory_nodes", "updates") == [N[5], N[6], N[6]]
    assert any("gate" in w for w in split.why[SCOPE])


def test_each_rule_alone_and_off():
    snap, d = snapshot(), diff()
    off = split_holds(d, snap, HoldsConfig(enabled=False))
    assert not off.held.has_changes and off.summaries() == {}
    assert off.apply.row_counts() == d.row_counts()
    lenient = HoldsConfig(max_delete_share=1.0, soul_changes=False)
    split = split_holds(d, snap, lenient)  # only the used node's delete waits, with its edge
    assert held_ids(split, "memory_nodes", "deletes") == {N[9]: "used_node"}
    assert held_ids(split, "memory_edges", "deletes") == {E[2]: "with_held_node"}
    none = split_holds(d, snap, lenient.model_copy(update={"used_deletes": False}))
    assert not none.held.has_changes
    by_count = split_holds(d, snap, HoldsConfig(max_delete_share=1.0, max_deletes=4, soul_changes=False, used_deletes=False))
    assert set(held_ids(by_count, "memory_nodes", "deletes").values()) == {"delete_count"}  # 5 > 4
    exactly = split_holds(d, snap, HoldsConfig(max_delete_share=0.5, soul_changes=False, used_deletes=False))
    assert not exactly.held.has_changes  # 5 of 10 is not more than 50 %


def test_phase_helpers():
    split = split_holds(diff(), snapshot(), HoldsConfig())
    assert phases_of(split.held) == ["prune_orphans", "soul_corrections", "supersession"]
    one = only_phases(split.held, {"soul_corrections"})
    assert one.row_counts() == {"soul_profiles": {"inserts": 0, "updates": 1, "deletes": 0}}


def test_a_planned_prune_of_40_percent_is_held_and_the_rest_applies():
    """Real phases on a snapshot: 4 of 10 semantic nodes are weak old orphans (prune_orphans)."""
    snap = snapshot().with_frames({"memory_edges": snapshot().table("memory_edges").head(0),
                                   "soul_profiles": snapshot().table("soul_profiles").head(0),
                                   "recall_events": snapshot().table("recall_events").head(0)})
    result = transform(snap, load_config(), NOW)
    assert ids_of(result.diff, "memory_nodes", "deletes") == N[:4]
    split = holds.split_holds(result.diff, result.shard, HoldsConfig())
    assert ids_of(split.held, "memory_nodes", "deletes") == N[:4]
    assert split.apply.table("memory_nodes").deletes.height == 0
    assert split.apply.table("memory_nodes").updates.height == result.diff.table("memory_nodes").updates.height
    assert validate_diff(split.apply, snap).height == 0


# -- the closure under the graph (SPEC §9 as amended; issue 29) ---------------------------------------
def _graph(edges: list[tuple[str, str]], layers: dict[str, str] | None = None) -> Snapshot:
    """Ten old semantic nodes N0–N9 (importance 5; ``layers`` overrides a node's layer) and ``edges``
    (E0, E1, … in order)."""
    base = snapshot()
    nodes = base.table("memory_nodes").filter(pl.col("id").is_in(N)).with_columns(
        pl.col("id").replace_strict({**{n: "semantic" for n in N}, **(layers or {})}, default="semantic").alias("layer"))
    e = tables.conform("memory_edges", pl.DataFrame({
        "id": [f"00000000-0000-4000-a000-{i:012d}" for i in range(len(edges))], "scope_path": SCOPE, "tenant_id": "acme",
        "source_id": [a for a, _ in edges], "target_id": [b for _, b in edges], "relation": "RELATED_TO", "weight": 1.0,
        "properties": "{}", "created_at": OLD, "updated_at": OLD, "version": 2}))
    return base.with_frames({"memory_nodes": nodes, "memory_edges": e, "soul_profiles": base.table("soul_profiles").head(0)})


def _deletes(node_ids: list[str], edge_ids: list[str], phase: str = "prune_orphans") -> Diff:
    parts = [Diff.of("memory_nodes", phase, deletes=ids(*node_ids), reason="test")]
    if edge_ids:
        parts.append(Diff.of("memory_edges", phase, deletes=pl.DataFrame({"id": edge_ids, "version": [2] * len(edge_ids)}),
                             reason="with node"))
    return Diff.combine(parts)


def test_issue_29_in_miniature_an_edge_goes_with_the_endpoint_that_goes_tonight():
    """The fresh-clone night of issue 29: U (TTL expired, but the agent used it) has its delete held
    (used_node); its edge U—V has V at the other end, an orphan pruned tonight.  The edge must go with
    V tonight — held with U it would point at a node the store no longer has."""
    used, other = N[9], N[1]  # recall_events: N9 has explicit positive feedback
    for source, target in ((used, other), (other, used)):  # the held node as the edge's source, then as its target
        snap = _graph([(source, target)])
        d = _deletes([used, other], ["00000000-0000-4000-a000-000000000000"])
        split = split_holds(d, snap, HoldsConfig(max_delete_share=1.0))
        assert held_ids(split, "memory_nodes", "deletes") == {used: "used_node"}
        assert held_ids(split, "memory_edges", "deletes") == {}
        assert ids_of(split.apply, "memory_nodes", "deletes") == [other]
        assert ids_of(split.apply, "memory_edges", "deletes") == ["00000000-0000-4000-a000-000000000000"]
        assert validate_diff(split.apply, snap).height == 0  # the applied part alone: no dangling edge
        # and the old split (the edge held with U) is exactly what validation rejects
        wrong = Diff.combine([Diff.of("memory_nodes", "prune_orphans", deletes=ids(other), reason="test")])
        failures = validate_diff(wrong, snap)
        assert failures.get_column("check").to_list() == ["no surviving edge points at a deleted node"]


def test_a_held_node_keeps_its_edges_only_while_no_other_endpoint_goes():
    """Held N9 (used): its edge to N8 (N8 stays) waits with it, whether N9 is the edge's source or its
    target; its edge to N1 (pruned tonight) goes tonight with N1."""
    for e0, e1 in (((N[9], N[8]), (N[9], N[1])), ((N[8], N[9]), (N[1], N[9]))):
        snap = _graph([e0, e1])
        d = _deletes([N[9], N[1]], [f"00000000-0000-4000-a000-{i:012d}" for i in range(2)])
        split = split_holds(d, snap, HoldsConfig(max_delete_share=1.0))
        assert held_ids(split, "memory_edges", "deletes") == {"00000000-0000-4000-a000-000000000000": "with_held_node"}
        assert ids_of(split.apply, "memory_edges", "deletes") == ["00000000-0000-4000-a000-000000000001"]
        assert validate_diff(split.apply, snap).height == 0


def test_a_meta_node_whose_clusters_delete_is_held_keeps_its_new_members_waiting_too():
    """Phase 4 drops the members that fell out of the top max_members and adds the new ones; a failed
    gate holds the drop (a delete), so the adds wait too (cluster_cap): the applied part never takes
    the META node over its cap."""
    meta = N[0]
    snap = _graph([(meta, N[1]), (meta, N[2])])
    new = pl.DataFrame({"id": ["00000000-0000-4000-a000-000000000050"], "scope_path": SCOPE, "tenant_id": "acme",
                        "source_id": [meta], "target_id": [N[3]], "relation": "CLUSTERS", "weight": 1.0})
    snap = snap.with_frames({"memory_edges": snap.table("memory_edges").with_columns(pl.lit("CLUSTERS").alias("relation"))})
    d = Diff.combine([
        Diff.of("memory_edges", "meta_nodes", deletes=pl.DataFrame({"id": ["00000000-0000-4000-a000-000000000001"],
                                                                     "version": [2]}), reason="member left the top"),
        Diff.of("memory_edges", "meta_nodes", inserts=new),
        # phase 4's own update of the META node (its text names the new member) and another phase's of N5
        Diff.of("memory_nodes", "meta_nodes", updates=pl.DataFrame({"id": [meta], "version": [1], "scope_path": SCOPE,
                                                                    "properties": ['{"summary": "parts 1, 3"}']})),
        Diff.of("memory_nodes", "strengthen", updates=pl.DataFrame({"id": [N[5]], "version": [1], "scope_path": SCOPE,
                                                                    "importance": [6.0]})),
    ])
    split = split_holds(d, snap, HoldsConfig(), gate_failed=True)
    assert held_ids(split, "memory_edges", "deletes") == {"00000000-0000-4000-a000-000000000001": "gate_failed"}
    assert held_ids(split, "memory_edges", "inserts") == {"00000000-0000-4000-a000-000000000050": "cluster_cap"}
    assert held_ids(split, "memory_nodes", "updates") == {meta: "cluster_cap"}  # the text waits with its members
    applied = {(t, k): n for t, kinds in split.apply.row_counts().items() for k, n in kinds.items() if n}
    assert applied == {("memory_nodes", "updates"): 1}  # N5's raise applies
    # the gate passing: both apply
    assert not split_holds(d, snap, HoldsConfig(), gate_failed=False).held.has_changes


def test_identity_drift_is_routine_and_soul_corrections_wait():
    """SPEC §9 as amended: drift's bounded steps are not held by default; SOUL corrections are."""
    snap = snapshot()
    d = Diff.combine([
        Diff.of("soul_profiles", "drift", updates=pl.DataFrame({"id": [SOUL], "version": [1], "value": ["0.5100"]})),
    ])
    assert not split_holds(d, snap, HoldsConfig()).held.has_changes
    assert held_ids(split_holds(d, snap, HoldsConfig(drift_changes=True)), "soul_profiles", "updates") == {SOUL: "soul_change"}
    corrected = Diff.of("soul_profiles", "soul_corrections", updates=pl.DataFrame({"id": [SOUL], "version": [1], "value": ["curt"]}))
    assert held_ids(split_holds(corrected, snap, HoldsConfig()), "soul_profiles", "updates") == {SOUL: "soul_change"}


# -- close_selection: what an approval of some held rows must take with them (issue 37 item 7) --------
def _close(held: Diff, snap: Snapshot, pick: list[tuple[str, str, str, str]]) -> set[tuple[str, str, str, str]]:
    """close_selection of the held rows ``pick`` ((table, kind, id, phase)) → the (table, kind, id, phase) it takes."""
    held = as_shard_diff(held, SCOPE)
    chosen = Diff({t: type(td)(**{k: f.filter(pl.struct(pl.col("id").cast(pl.String), "phase").is_in(
        [{"id": i, "phase": p} for tt, kk, i, p in pick if (tt, kk) == (t, k)])) for k, f in td.frames().items()})
        for t, td in held.tables.items()})
    closed = holds.close_selection(held, chosen, Shard.of(snap))
    return {(t, k, str(i), p) for t, td in closed.tables.items() for k, f in td.frames().items()
            for i, p in f.select(pl.col("id").cast(pl.String), "phase").iter_rows()}


EDGE = [f"00000000-0000-4000-a000-{i:012d}" for i in range(4)]


def test_close_selection_takes_the_edges_of_a_chosen_node_by_either_end():
    """A held node delete takes every held edge delete that touches it — as the edge's source and as its
    target (a closure by source_id alone leaves E1 pointing at the deleted N8)."""
    snap = _graph([(N[8], N[1]), (N[2], N[8]), (N[3], N[4])])
    held = _deletes([N[8], N[3]], EDGE[:3], phase="prune_orphans")
    got = _close(held, snap, [("memory_nodes", "deletes", N[8], "prune_orphans")])
    assert got == {("memory_nodes", "deletes", N[8], "prune_orphans"), ("memory_edges", "deletes", EDGE[0], "prune_orphans"),
                   ("memory_edges", "deletes", EDGE[1], "prune_orphans")}


def _meta_case() -> tuple[Snapshot, Diff]:
    """A META node N0 with members N1, N2 (CLUSTERS E0, E1); phase 4 drops N2 (E1), adds N3 (E9) and
    rewrites N0's text; another META node N5's insert of N6 (E8) stands apart."""
    snap = _graph([(N[0], N[1]), (N[0], N[2])])
    snap = snap.with_frames({"memory_edges": snap.table("memory_edges").with_columns(pl.lit("CLUSTERS").alias("relation"))})
    new = pl.DataFrame({"id": ["00000000-0000-4000-a000-000000000009", "00000000-0000-4000-a000-000000000008"],
                        "scope_path": SCOPE, "tenant_id": "acme", "source_id": [N[0], N[5]], "target_id": [N[3], N[6]],
                        "relation": "CLUSTERS", "weight": 1.0})
    held = Diff.combine([
        Diff.of("memory_edges", "meta_nodes", deletes=pl.DataFrame({"id": [EDGE[1]], "version": [2]}), reason="left the top"),
        Diff.of("memory_edges", "meta_nodes", inserts=new),
        Diff.of("memory_nodes", "meta_nodes", updates=pl.DataFrame({"id": [N[0]], "version": [3],
                                                                    "properties": ['{"summary": "parts 1, 3"}']})),
    ])
    return snap, held


def test_close_selection_keeps_a_meta_nodes_text_and_its_clusters_rows_together():
    snap, held = _meta_case()
    group = {("memory_edges", "deletes", EDGE[1], "meta_nodes"),
             ("memory_edges", "inserts", "00000000-0000-4000-a000-000000000009", "meta_nodes"),
             ("memory_nodes", "updates", N[0], "meta_nodes")}
    for one in sorted(group):  # any one of the META node's rows takes the others — its text too — and nothing of N5
        assert _close(held, snap, [one]) == group, one


def test_close_selection_takes_every_row_of_a_chosen_id_in_the_table_whatever_its_phase():
    """same_row: the held rows of one id in one table go together (an approval that bumped N6's version
    through one phase's row would leave the other phase's row failing the guard for ever)."""
    snap = _graph([])
    held = Diff.combine([
        Diff.of("memory_nodes", "strengthen", updates=ids(N[6]).with_columns(importance=pl.lit(6.0))),
        Diff.of("memory_nodes", "decay_importance", updates=ids(N[6], N[7]).with_columns(importance=pl.Series([5.5, 4.0]))),
    ])
    assert _close(held, snap, [("memory_nodes", "updates", N[6], "strengthen")]) == {
        ("memory_nodes", "updates", N[6], "strengthen"), ("memory_nodes", "updates", N[6], "decay_importance")}


def test_close_selection_is_a_fixpoint_across_phases():
    """A chosen update of the META node N0 by decay (a lowered importance, held by a failed gate) takes
    N0's phase-4 update (same_row), and that update takes N0's CLUSTERS rows (its text names the new
    members): one pass of the rules misses the CLUSTERS rows — they are reached only through the
    second rule's row, of another phase."""
    snap, meta_rows = _meta_case()
    held = Diff.combine([meta_rows, Diff.of("memory_nodes", "decay_importance",
                                             updates=ids(N[0]).with_columns(importance=pl.lit(1.0)))])
    got = _close(held, snap, [("memory_nodes", "updates", N[0], "decay_importance")])
    assert got == {("memory_nodes", "updates", N[0], "decay_importance"), ("memory_nodes", "updates", N[0], "meta_nodes"),
                   ("memory_edges", "deletes", EDGE[1], "meta_nodes"),
                   ("memory_edges", "inserts", "00000000-0000-4000-a000-000000000009", "meta_nodes")}


def test_a_held_row_keeps_every_row_of_its_id_in_the_table_waiting():
    """same_row in the split: drift's update of the SOUL row is routine (not held by default), but the
    same row's SOUL correction is held — so drift's waits too: applied tonight it would bump the row's
    version and the held correction could never pass the version guard on approval."""
    snap = snapshot()
    d = Diff.combine([
        Diff.of("soul_profiles", "soul_corrections", updates=pl.DataFrame({"id": [SOUL], "version": [1], "value": ["curt"]})),
        Diff.of("soul_profiles", "drift", updates=pl.DataFrame({"id": [SOUL], "version": [1], "value": ["0.5100"]})),
    ])
    split = split_holds(d, snap, HoldsConfig())
    rows = split.rows.select("phase", "reason").sort("phase").rows()
    assert rows == [("drift", "same_row"), ("soul_corrections", "soul_change")]
    assert "soul_profiles" not in split.apply.tables or not split.apply.table("soul_profiles").has_changes
