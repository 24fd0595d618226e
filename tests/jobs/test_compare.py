"""Replay comparison: a stored snapshot reproduces its run's hash; two configs or two diff
directories compare row by row, per phase, with counter deltas (date ranges: test_replay_range.py)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import polars as pl
import psycopg
from deep_sleep.transforms.config import ConsolidationConfig, load_config

from deep_sleep.core.diff import Diff
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.jobs.compare import (
    compare_configs,
    compare_diffs,
    compare_dirs,
    comparison_markdown,
)
from deep_sleep.jobs.replay_range import find_snapshots, replay_snapshot, replay_stored
from deep_sleep.run.pipeline import consolidate
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
    run = consolidate(store, scope, NOW, runs_dir=runs_dir).report()
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
