"""The gate's own probes (deep_sleep/run/probes.py, SPEC §9 as amended 2026-12-06, issue 36 item 3):
a night that folds turns keeps them findable and is measured and passes; a night that prunes the
facts it was asked about fails; a night that changes nothing findable says so; the sample is
bounded and seeded; and the verdict reaches the gate's report and holds the destructive rows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl

from deep_sleep.core import tables
from deep_sleep.core.scope import Scope
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run.gate import recall_gate
from deep_sleep.run.probes import probe_gate
from deep_sleep.run.transform import as_shard_diff, transform
from deep_sleep.transforms.config import load_config
from tests.storeutil import word_of

AS_OF = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
SCOPE = Scope.root("org", "probes").child("agent", "a1")
TOPICS = ["volcano", "harbour", "violin", "glacier", "lantern", "orchard", "saffron", "compass", "meteor", "tundra",
          "falcon", "marble", "quartz", "ember", "walrus", "cactus", "nebula", "canyon", "pepper", "raven"]


def _id(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


def _event(n: int) -> dict:
    at = AS_OF - timedelta(days=40) + timedelta(minutes=n)
    topic = TOPICS[n % len(TOPICS)]
    return {"id": _id(n), "scope_path": SCOPE.path, "tenant_id": SCOPE.tenant_id, "session_id": f"s{n // 20}",
            "content": f"Ada: we talked about the {topic} {word_of(n)} and the plan {n * 7} for it",
            "metadata": "{}", "created_at": at, "version": 1}


def _node(n: int, label: str, importance: float = 5.0, age_days: float = 60.0) -> dict:
    at = AS_OF - timedelta(days=age_days)
    return {"id": _id(10_000 + n), "scope_path": SCOPE.path, "tenant_id": SCOPE.tenant_id, "layer": "semantic",
            "label": label, "properties": "{}", "importance": importance, "access_count": 0, "created_at": at,
            "updated_at": at, "last_decayed_at": None, "version": 1}


def _snapshot(events: list[dict], nodes: list[dict]) -> Snapshot:
    rows = {"episodic_events": events, "memory_nodes": nodes}
    frames = {name: tables.conform(name, pl.DataFrame(r, schema_overrides={c.name: c.dtype for c in tables.TABLES[name]}))
              if r else tables.empty(name) for name, r in rows.items()}
    return Snapshot(SCOPE.path, AS_OF, None, frames)


def _night(snap: Snapshot, phases: list[str], overrides: dict | None = None):
    config = load_config(overrides=overrides)
    result = transform(snap, config, AS_OF, phases=phases, embed=False)
    return Shard.of(snap), as_shard_diff(result.scope_diff(), SCOPE.path), config


def test_a_night_that_folds_turns_is_measured_and_passes():
    """130 events: phase 10 folds the oldest 50 into a summary whose word key holds their words, so a
    query made from a folded turn's text finds the summary after as it found the turn before."""
    snap = _snapshot([_event(n) for n in range(130)], [])
    shard, diff, config = _night(snap, ["episodic_summary"])
    result = probe_gate(shard, diff, config)[SCOPE.path]
    assert result.status == "measured"
    assert result.kinds == {"folded": 8}
    assert result.probes == 8 and result.found_before == 8 and result.found_after == 8
    assert not result.failed


def test_pruning_a_fact_or_two_of_many_passes_and_pruning_most_fails():
    """The verdict weighs the loss against the scope's memory: 2 weak facts pruned of 30 rows is a
    6.7 pp loss (passes at 10); 20 of 30 is 66.7 pp (fails)."""
    strong = [_node(100 + n, f"{TOPICS[n % 20]} {TOPICS[(n + 7) % 20]} plan {word_of(n)}", importance=9.0) for n in range(28)]
    weak = [_node(n, f"{TOPICS[n]} fact about the {TOPICS[(n + 3) % 20]} trip", importance=2.0) for n in range(2)]
    shard, diff, config = _night(_snapshot([], strong + weak), ["prune_orphans"])
    few = probe_gate(shard, diff, config)[SCOPE.path]
    assert (few.candidates, few.memory, few.found_before, few.found_after) == (2, 30, 2, 0)
    assert round(few.drop_pp, 1) == 6.7 and not few.failed
    weak = [_node(n, f"{TOPICS[n % 20]} fact about the {TOPICS[(n + 3) % 20]} trip {n}", importance=2.0) for n in range(20)]
    shard, diff, config = _night(_snapshot([], strong[:10] + weak), ["prune_orphans"])
    most = probe_gate(shard, diff, config)[SCOPE.path]
    assert (most.candidates, most.memory, most.probes) == (20, 30, 8) and most.found_after == 0
    assert round(most.drop_pp, 1) == round(100 * 20 * most.found_before / 8 / 30, 1) and most.failed


def test_a_night_that_prunes_what_was_findable_fails():
    """Facts pruned (importance below 9, old, no neighbour): each was found by its own words before,
    nothing carries it after — a drop of 100 pp."""
    nodes = [_node(n, f"{TOPICS[n]} fact about the {TOPICS[(n + 3) % 20]} trip") for n in range(6)]
    snap = _snapshot([], nodes)
    shard, diff, config = _night(snap, ["prune_orphans"], {"prune_orphans": {"importance_factor": 0.9}})
    assert diff.table("memory_nodes").deletes.height == 6
    result = probe_gate(shard, diff, config)[SCOPE.path]
    assert (result.status, result.probes, result.found_before, result.found_after) == ("measured", 6, 6, 0)
    assert result.failed and (result.candidates, result.memory, result.drop_pp) == (6, 6, 100.0)
    verdict = recall_gate(shard, diff, config)[SCOPE.path]
    assert verdict.status == "measured" and verdict.failed
    assert verdict.to_report()["probes"]["found_after"] == 0
    assert "probes: 6 → 0 of 6" in verdict.detail and "6.0 of 6 rows estimated unfindable" in verdict.detail
    assert "FAILED" in verdict.detail


def test_a_night_that_changes_nothing_findable_says_so():
    snap = _snapshot([_event(n) for n in range(20)], [_node(1, "volcano trip")])
    shard, diff, config = _night(snap, ["episodic_summary", "prune_orphans"])
    assert not diff.has_changes
    assert probe_gate(shard, diff, config)[SCOPE.path].status == "nothing_removed"
    verdict = recall_gate(shard, diff, config)[SCOPE.path]
    assert verdict.status == "nothing_removed" and not verdict.failed and not verdict.measured


def test_the_sample_is_bounded_and_seeded():
    snap = _snapshot([_event(n) for n in range(130)], [])
    shard, diff, _ = _night(snap, ["episodic_summary"])
    for probes in (1, 3, 50):
        config = load_config(overrides={"gate": {"probes": probes}})
        assert probe_gate(shard, diff, config)[SCOPE.path].probes == min(probes, 50)
    config = load_config(overrides={"gate": {"probes": 0}})
    assert probe_gate(shard, diff, config)[SCOPE.path].status == "nothing_removed"
    a = probe_gate(shard, diff, load_config(overrides={"gate": {"probe_seed": 7}}))
    b = probe_gate(shard, diff, load_config(overrides={"gate": {"probe_seed": 7}}))
    assert a == b


def test_a_budget_too_small_for_the_summary_passage_loses_the_folded_turn():
    """The reader's unit: with a 100-character budget a summary's passage (up to max_passage_chars)
    does not fit, while the turn itself did — folded turns are then not findable within the budget."""
    snap = _snapshot([_event(n) for n in range(130)], [])
    shard, diff, config = _night(snap, ["episodic_summary"], {"recall": {"budget_chars": 100}})
    result = probe_gate(shard, diff, config)[SCOPE.path]
    # 50 of the scope's 130 rows estimated lost: 38.5 pp
    assert (result.found_before, result.found_after, result.failed) == (8, 0, True)
    assert round(result.drop_pp, 1) == 38.5


def test_demoted_facts_are_probed_and_stay_findable():
    """Decay lowers importance; the word ranking does not read importance, so a demoted fact is found
    after as before (decay changes what the reranker's small adjustment sees, not what is found)."""
    nodes = [_node(n, f"{TOPICS[n]} note", importance=6.0, age_days=45) for n in range(4)]
    snap = _snapshot([], nodes)
    shard, diff, config = _night(snap, ["decay_importance"])
    result = probe_gate(shard, diff, config)[SCOPE.path]
    assert result.kinds == {"demoted": 4}
    assert (result.found_before, result.found_after, result.failed) == (4, 4, False)


def test_a_shard_gives_each_scope_its_own_verdict():
    """Two scopes in one shard: the probes of each are its own (rows are ranked within their scope)."""
    other = Scope.root("org", "probes").child("agent", "a2")
    snap = _snapshot([_event(n) for n in range(130)], [])
    pruned = _snapshot([], [_node(n, f"{TOPICS[n]} fact") for n in range(4)])
    moved = pruned.table("memory_nodes").with_columns(pl.lit(other.path).alias("scope_path"))
    shard = Shard(tuple(sorted([SCOPE.path, other.path], key=str.encode)), AS_OF, {}, {
        "episodic_events": snap.table("episodic_events"), "memory_nodes": moved})
    config = load_config(overrides={"prune_orphans": {"importance_factor": 0.9}})
    result = transform(shard, config, AS_OF, phases=["episodic_summary", "prune_orphans"], embed=False)
    verdicts = probe_gate(result.shard, result.diff, config)
    assert verdicts[SCOPE.path].status == "measured" and not verdicts[SCOPE.path].failed
    assert verdicts[other.path].status == "measured" and verdicts[other.path].failed
