"""Replay comparison: stored snapshots reproduce their runs' hashes; two configs or two diff
directories compare row by row, per phase, with counter deltas."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import polars as pl
import psycopg
import pytest

from deep_sleep.core.diff import Diff
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.jobs.compare import (
    compare_configs,
    compare_diffs,
    compare_dirs,
    comparison_markdown,
    find_snapshots,
    range_markdown,
    replay_range,
    replay_snapshot,
    replay_stored,
)
from deep_sleep.jobs.ledger import last_runs, runs_markdown
from deep_sleep.run.stages import consolidate_scope
from deep_sleep.transforms.config import ConsolidationConfig, load_config
from tests.storeutil import small_graph

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
ID = ["00000000-0000-0000-0000-00000000000" + str(i) for i in range(4)]


def test_compare_diffs_names_rows_only_in_a_only_in_b_and_changed_columns():
    a = Diff.combine([
        Diff.of("memory_nodes", "strengthen", updates=pl.DataFrame({"id": ID[:3], "version": [1, 1, 1], "importance": [5.5, 5.5, 5.5]})),
        Diff.of("memory_nodes", "working_ttl", deletes=pl.DataFrame({"id": [ID[3]], "version": [2]}), reason="ttl"),
    ])
    b = Diff.of("memory_nodes", "strengthen", updates=pl.DataFrame(
        {"id": ID[1:3] + [ID[3]], "version": [1, 1, 1], "importance": [5.5, 6.0, 6.0]}))
    cmp = compare_diffs(a, b)
    assert not cmp.identical
    got = {(r["phase"], r["kind"], r["id"], r["side"], tuple(r["columns"])) for r in cmp.rows.iter_rows(named=True)}
    assert got == {("strengthen", "updates", ID[0], "only_a", ()), ("strengthen", "updates", ID[3], "only_b", ()),
                   ("strengthen", "updates", ID[2], "changed", ("importance",)), ("working_ttl", "deletes", ID[3], "only_a", ())}
    changed = cmp.rows.filter(pl.col("side") == "changed").row(0, named=True)
    assert (json.loads(changed["a"]), json.loads(changed["b"])) == ({"importance": 5.5}, {"importance": 6.0})
    strengthen = cmp.summary.filter(pl.col("phase") == "strengthen").row(0, named=True)
    assert (strengthen["only_a"], strengthen["only_b"], strengthen["changed"], strengthen["same"]) == (1, 1, 1, 1)
    assert compare_diffs(a, a).identical


def test_replay_of_a_stored_run_reproduces_its_hash_and_two_configs_compare_per_phase(store, scope, runs_dir, tmp_path):
    small_graph(store, scope, NOW)
    run = consolidate_scope(store, scope, as_of=NOW, base_dir=runs_dir)
    assert run.status == "applied" and run.rows_changed

    # the stored snapshot, replayed at the ledger's as_of, gives the run's diff byte for byte
    (stored,) = find_snapshots(runs_dir, scope)
    replay = replay_stored(stored, ConsolidationConfig(), store=store)
    assert (replay.as_of, replay.as_of_source, replay.recorded_hash) == (NOW, "ledger", run.diff_hash)
    assert replay.reproduces and replay.report.diff_hash == run.diff_hash and replay.report.counters == run.counters
    assert replay_stored(stored.path, ConsolidationConfig()).as_of_source == "report"  # no store: the run's report.json
    assert replay.legacy_hash is None  # computed only on a mismatch

    # a run recorded before the binary hash encoding (its ledger row holds the ndjson hash) still reproduces
    old = Diff.read(run.diff_uri).ndjson_content_hash()
    with psycopg.connect(store.dsn, autocommit=True) as con:
        con.execute("UPDATE consolidation_runs SET diff_hash = %s WHERE run_id = %s", (old, run.run_id))
    replay_old = replay_stored(stored, ConsolidationConfig(), store=store)
    assert replay_old.recorded_hash == old != replay_old.report.diff_hash
    assert replay_old.legacy_hash == old and replay_old.reproduces
    with psycopg.connect(store.dsn, autocommit=True) as con:
        con.execute("UPDATE consolidation_runs SET diff_hash = %s WHERE run_id = %s", ("0" * 64, run.run_id))
    assert replay_stored(stored, ConsolidationConfig(), store=store).reproduces is False
    with psycopg.connect(store.dsn, autocommit=True) as con:
        con.execute("UPDATE consolidation_runs SET diff_hash = %s WHERE run_id = %s", (run.diff_hash, run.run_id))

    # A/B: a bigger strengthen increment changes exactly the strengthened rows' importance
    snap = Snapshot.read(run.snapshot_uri)
    bigger = load_config(overrides={"strengthen": {"increment": 1.0}})
    cmp = compare_configs(snap, ConsolidationConfig(), bigger, NOW, label_a="0.5", label_b="1.0")
    strengthened = cmp.differing(phase="strengthen")
    assert strengthened.height == 3 and set(strengthened["side"]) == {"changed"}
    assert strengthened["columns"].to_list() == [["importance"]] * 3
    assert {(json.loads(r["a"])["importance"], json.loads(r["b"])["importance"]) for r in strengthened.iter_rows(named=True)} == {(5.5, 6.0)}
    assert cmp.counter_deltas() == {}  # the same nodes are strengthened, just more

    # A/B: a phase disabled — its rows are only in A, its counter drops, the phase table says why
    no_ttl = load_config(overrides={"working_ttl": {"enabled": False}})
    cmp = compare_configs(snap, ConsolidationConfig(), no_ttl, NOW)
    ttl = cmp.differing(phase="working_ttl")
    assert sorted(zip(ttl["table"], ttl["kind"], ttl["side"])) == [("memory_edges", "deletes", "only_a"), ("memory_nodes", "deletes", "only_a")]
    assert cmp.differing().height == ttl.height  # no other phase moves
    assert cmp.counter_deltas() == {"working_ttl_pruned": -1} and cmp.counter_deltas("working_ttl") == {"working_ttl_pruned": -1}
    assert cmp.phases.filter(pl.col("phase") == "working_ttl").row(0) == ("working_ttl", "ran", "skipped: disabled by config")
    md = comparison_markdown(cmp)
    assert "working_ttl_pruned" in md and "| working_ttl | memory_nodes | deletes | 1 | 0 | 0 | 0 |" in md

    # two code versions' diff directories compare the same way, and the comparison is written as JSON
    replay_snapshot(snap, ConsolidationConfig(), NOW, out=tmp_path / "v1")
    replay_snapshot(snap, no_ttl, NOW, out=tmp_path / "v2")
    from_dirs = compare_dirs(tmp_path / "v1", tmp_path / "v2")
    assert from_dirs.rows.equals(cmp.rows) and from_dirs.counter_deltas() == {"working_ttl_pruned": -1}
    written = json.loads(from_dirs.write(tmp_path / "cmp").read_text())
    assert written["rows_total"] == 2 and written["hash_a"] == run.diff_hash and not written["identical"]
    assert {r["phase"] for r in written["rows"]} == {"working_ttl"}


def test_replay_range_replays_each_snapshot_in_range_at_its_own_as_of(store, scope, runs_dir, tmp_path):
    small_graph(store, scope, NOW - timedelta(days=2))
    days = [NOW - timedelta(days=2), NOW - timedelta(days=1), NOW]
    runs = [consolidate_scope(store, scope, as_of=d, base_dir=runs_dir) for d in days]
    assert [r.status for r in runs] == ["applied"] * 3
    taken = [s.taken_at for s in find_snapshots(runs_dir, scope)]
    assert len(taken) == 3 and taken == sorted(taken)

    no_strengthen = load_config(overrides={"strengthen": {"enabled": False}})
    results = replay_range(runs_dir, scope.display(), taken[1], taken[2], ConsolidationConfig(), no_strengthen,
                           store=store, out=tmp_path / "replays")
    assert [r.as_of for r in results] == days[1:]  # the ledger's as_of, not taken_at
    assert all(r.reproduces for r in results)
    assert [r.report.diff_hash for r in results] == [r.diff_hash for r in runs[1:]]
    assert all(r.comparison is not None for r in results)
    summary = json.loads((tmp_path / "replays" / "replay_range.json").read_text())
    assert [s["reproduces"] for s in summary] == [True, True]
    assert (results[0].out / "comparison" / "comparison.json").is_file() and (results[0].out / "b" / "report.json").is_file()
    assert "reproduces" in range_markdown(results)
    # the ledger backend of `deep-sleep report`
    ledger = last_runs(store, scope, limit=2)
    assert [r.as_of for r in ledger] == [days[2], days[1]] and all(r.status == "applied" for r in ledger)
    assert runs[2].run_id[:8] in runs_markdown(ledger)


@pytest.mark.flow
def test_replay_flow_over_a_date_range_with_a_comparison(prefect_harness, store, scope, runs_dir, tmp_path):
    from deep_sleep.flows.replay import ReplayParameters, deep_sleep_replay

    small_graph(store, scope, NOW)
    run = consolidate_scope(store, scope, as_of=NOW, base_dir=runs_dir)
    params = ReplayParameters(scope=scope.display(), runs_dir=str(runs_dir), dsn=store.dsn, out=str(tmp_path / "out"),
                              compare_config={"working_ttl": {"enabled": False}})
    (summary,) = deep_sleep_replay(params)
    assert summary["reproduces"] is True and summary["diff_hash"] == run.diff_hash and summary["as_of_source"] == "ledger"
    assert summary["comparison"]["counter_deltas"] == {"working_ttl_pruned": -1}
    assert "working_ttl" in (tmp_path / "out" / "replay.md").read_text()
    with pytest.raises(ValueError, match="either snapshot_dir"):
        ReplayParameters(runs_dir=str(runs_dir))
