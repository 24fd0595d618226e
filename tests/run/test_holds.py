"""Issue 16 item 2: split_holds (pure) — a golden case, each rule alone, the applied part valid."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl

from deep_sleep.core import tables
from deep_sleep.core.diff import Diff
from deep_sleep.core.holds_config import HoldsConfig
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run.holds import only_phases, phases_of, split_holds
from deep_sleep.run.plan import plan
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
    assert split.apply.table("memory_nodes").deletes["id"].to_list() == [W]  # working-memory expiry is routine
    assert split.apply.table("memory_edges").deletes["id"].to_list() == [E[1]]
    assert split.apply.table("memory_nodes").updates.height == 4  # no importance rule without the gate
    assert split.apply.table("memory_edges").inserts.height == 1  # an insert to a node that stays is fine
    assert "soul_profiles" not in split.apply.tables
    assert split.summary() == {
        "rows": {"memory_edges": {"deletes": 2}, "memory_nodes": {"deletes": 5}, "soul_profiles": {"updates": 1}},
        "reasons": {"delete_share": 4, "soul_change": 1, "used_node": 1, "with_held_node": 2},
        "phases": {"prune_orphans": 5, "soul_corrections": 1, "supersession": 2},
        "why": ["the run deletes 5 of 10 semantic nodes (50.0 %; the policy holds more than 5 % or more than 500)",
                "the run changes the agent's SOUL profile (soul_profiles)",
                "the run deletes memories the agent used (explicit positive recall feedback)"],
    }
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
    assert sorted(split.apply.table("memory_nodes").updates["id"]) == [N[5], N[6], N[6]]
    assert split.why[-1] != "" and any("gate" in w for w in split.why)


def test_each_rule_alone_and_off():
    snap, d = snapshot(), diff()
    off = split_holds(d, snap, HoldsConfig(enabled=False))
    assert not off.held.has_changes and off.apply is d and off.summary() == {}
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
    result = plan(snap, load_config(), NOW)
    pruned = result.diff.table("memory_nodes").deletes
    assert sorted(pruned["id"]) == N[:4]
    split = split_holds(result.diff, snap, HoldsConfig())
    assert sorted(split.held.table("memory_nodes").deletes["id"]) == N[:4]
    assert split.apply.table("memory_nodes").deletes.height == 0
    assert split.apply.table("memory_nodes").updates.height == result.diff.table("memory_nodes").updates.height
    assert validate_diff(split.apply, snap).height == 0
