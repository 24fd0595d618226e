"""The quick nap on the real store (SPEC §5): every 10th turn naps, its window starts at the
previous run of either mode, its targeted snapshot holds only what phases 1, 5 and 10 read, the
summary ids it fetches are the ones phase 10 writes, and a live write during a nap wins."""

from __future__ import annotations

import uuid
from datetime import timedelta

import psycopg
import pytest

from deep_sleep.online.nap import nap_snapshot, quick_nap
from deep_sleep.online.turn import record_turn
from deep_sleep.run.pipeline import consolidate
from tests.online.helpers import NOW, rows
from tests.storeutil import scalar


def test_quick_nap_fires_on_the_10th_turn_and_its_window_starts_at_the_previous_nap(store, scope):
    receipts = []
    for turn in range(1, 21):
        ops = [{"op": "upsert_node", "label": "project: alpha", "properties": {"turn": turn}}]
        if turn in (5, 15):
            ops.append({"op": "upsert_node", "label": "project: beta"})
        if turn == 3:
            ops.append({"op": "upsert_node", "label": "SOUL:name", "properties": {"_last_edited_by": "user_manual_edit", "value": "Nova"}})
        if turn <= 10:
            ops += [{"op": "create_event", "content": f"turn {turn} event {e}"} for e in range(12)]
        receipts.append(record_turn(store, scope, ops, now=NOW + timedelta(minutes=turn)))

    assert [r.turn for r in receipts] == list(range(1, 21))
    assert [r.turn for r in receipts if r.quick_nap is not None] == [10, 20]
    first, second = receipts[9].quick_nap, receipts[19].quick_nap
    assert first.status == "applied" and second.status == "applied", (first.errors, second.errors)
    assert first.phases_run == ["strengthen", "soul_corrections", "episodic_summary"]
    # 10 turns: alpha written 10 times (beta once), one SOUL edit, 120 events > 100 (a turn with events of its
    # own writes no turn-summary event beside them)
    assert {k: v for k, v in first.counters.items() if v} == {"nodes_strengthened": 1, "soul_updates": 1, "episodes_summarized": 50}
    # turns 11-20: alpha again; beta's second access is alone in this window, its first was counted by nap 1
    assert {k: v for k, v in second.counters.items() if v} == {"nodes_strengthened": 1}

    alpha, beta = receipts[0].ids("upsert_node")[0], receipts[4].ids("upsert_node")[1]
    assert scalar(store, "SELECT importance FROM memory_nodes WHERE id = %s", alpha) == 6.0
    assert scalar(store, "SELECT importance FROM memory_nodes WHERE id = %s", beta) == 5.0
    assert scalar(store, "SELECT value FROM soul_profiles WHERE scope_path = %s AND key = 'name'", scope.path) == "Nova"
    assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE scope_path = %s AND label = 'META:episodic_summary'", scope.path) == 1
    # turns 11-20 create no event: each writes its turn-summary event
    assert scalar(store, "SELECT count(*) FROM episodic_events WHERE scope_path = %s", scope.path) == 120 + 10 - 50
    runs = rows(store, "SELECT mode, status, as_of, counters->'nodes_strengthened' FROM consolidation_runs WHERE scope_path = %s ORDER BY as_of", scope.path)
    assert runs == [("quick_nap", "applied", NOW + timedelta(minutes=10), 1), ("quick_nap", "applied", NOW + timedelta(minutes=20), 1)]
    assert scalar(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s AND table_name = 'episodic_events'", first.run_id) == 50

    # the targeted snapshot holds only what phases 1, 5, 10 read
    with psycopg.connect(store.dsn) as con:
        from deep_sleep.transforms.config import ConsolidationConfig

        snap = nap_snapshot(con, scope, NOW + timedelta(minutes=25), ConsolidationConfig())
    assert snap.previous_run_as_of == NOW + timedelta(minutes=20)
    assert snap.table("memory_access_log").height == 0 and snap.table("memory_nodes").height == 0
    assert snap.table("episodic_events").height == 80 and snap.table("soul_profiles").height == 1


@pytest.mark.parametrize("count,threshold,batch,batches", [(130, 100, 50, 1), (99, 100, 50, 1), (400, 100, 50, 3), (151, 100, 25, 4), (260, 10, 50, 9), (30, 10, 50, 2)])
def test_summary_candidates_are_the_ids_phase_10_writes(count, threshold, batch, batches):
    """The targeted extract fetches existing summary nodes by the ids phase 10 would write: the
    same rule as the phase, checked against the phase itself (same-instant events tie on id)."""
    import polars as pl
    from deep_sleep.transforms.episodic_summary import (
        EpisodicSummaryConfig,
        episodic_summary,
    )

    from deep_sleep.core.snapshot import Snapshot
    from deep_sleep.core.tables import conform
    from deep_sleep.online.nap import summary_candidates

    cfg = EpisodicSummaryConfig(threshold=threshold, batch_size=batch, max_batches=batches)
    ids = sorted(str(uuid.uuid4()) for _ in range(count))
    events = conform("episodic_events", pl.DataFrame({
        "id": ids, "scope_path": "org\x1fa", "tenant_id": "a", "content": "x", "metadata": "{}", "version": 1,
        "created_at": [NOW - timedelta(minutes=i // 3) for i in range(count)],
    })).sort("created_at", "id")
    expected = episodic_summary(Snapshot("org\x1fa", NOW, frames={"episodic_events": events}), cfg, NOW).diff.table("memory_nodes").inserts
    got = summary_candidates("org\x1fa", events.head(threshold + batch * batches), cfg)
    assert got == (expected.get_column("id").to_list() if expected.height else [])


def test_the_nightly_does_not_restrengthen_what_a_nap_counted(store, scope, runs_dir):
    for turn in range(1, 11):
        record_turn(store, scope, [{"op": "upsert_node", "label": "project: alpha"}], now=NOW + timedelta(minutes=turn))
    alpha = scalar(store, "SELECT id::text FROM memory_nodes WHERE scope_path = %s AND label = 'project: alpha'", scope.path)
    assert scalar(store, "SELECT importance FROM memory_nodes WHERE id = %s", alpha) == 5.5
    report = consolidate(store, scope, NOW + timedelta(hours=1), runs_dir=runs_dir).report()
    assert report.status == "applied"
    assert report.counters["nodes_strengthened"] == 0
    assert scalar(store, "SELECT importance FROM memory_nodes WHERE id = %s", alpha) == 5.5


def test_quick_nap_on_a_connection_and_a_live_write_conflict(store, scope):
    """A nap through a caller's connection; a node changed by a live turn between the nap's
    snapshot and its apply keeps the live value and is counted as a conflict."""
    from deep_sleep.transforms import QUICK_NAP
    from deep_sleep.transforms.config import ConsolidationConfig

    from deep_sleep.online.pg import store_of
    from deep_sleep.run.apply import apply
    from deep_sleep.run.transform import transform

    for turn in range(1, 3):
        record_turn(store, scope, [{"op": "upsert_node", "label": "project: gamma"}], now=NOW + timedelta(minutes=turn), nap=False)
    with psycopg.connect(store.dsn) as con:
        config = ConsolidationConfig()
        snap = nap_snapshot(con, scope, NOW + timedelta(minutes=5), config)
        planned = transform(snap, config, NOW + timedelta(minutes=5), phases=QUICK_NAP)
        record_turn(con, scope, [{"op": "upsert_node", "label": "project: gamma", "importance": 9}], now=NOW + timedelta(minutes=4), nap=False)
        # planned.diff is a shard diff (a shard of one): every row carries its scope_path
        results = apply(store_of(con), planned.diff, {scope.path: planned.report.with_(run_id=str(uuid.uuid4()))},
                        mode="quick_nap")
        assert results[scope.path].status == "applied" and results[scope.path].conflicts == 1
        assert scalar(store, "SELECT importance FROM memory_nodes WHERE scope_path = %s AND label = 'project: gamma'", scope.path) == 9.0
        report = quick_nap(con, scope, as_of=NOW + timedelta(minutes=6))
    assert report.status == "applied" and report.counters["nodes_strengthened"] == 0  # the window starts at the last nap
