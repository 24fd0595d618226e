"""Replay over a date range: each stored snapshot in range replays at its own run's as_of and
reproduces its hash; with a second config each is compared; the Prefect flow does the same."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from deep_sleep.transforms.config import ConsolidationConfig, load_config

from deep_sleep.jobs.ledger import last_runs, runs_markdown
from deep_sleep.jobs.replay_range import find_snapshots, range_markdown, replay_range
from deep_sleep.run.pipeline import consolidate
from tests.storeutil import small_graph

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


def test_replay_range_replays_each_snapshot_in_range_at_its_own_as_of(store, scope, runs_dir, tmp_path):
    small_graph(store, scope, NOW - timedelta(days=2))
    days = [NOW - timedelta(days=2), NOW - timedelta(days=1), NOW]
    runs = [consolidate(store, scope, d, runs_dir=runs_dir).report() for d in days]
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
    run = consolidate(store, scope, NOW, runs_dir=runs_dir).report()
    params = ReplayParameters(scope=scope.display(), runs_dir=str(runs_dir), dsn=store.dsn, out=str(tmp_path / "out"),
                              compare_config={"working_ttl": {"enabled": False}})
    (summary,) = deep_sleep_replay(params)
    assert summary["reproduces"] is True and summary["diff_hash"] == run.diff_hash and summary["as_of_source"] == "ledger"
    assert summary["comparison"]["counter_deltas"] == {"working_ttl_pruned": -1}
    assert "working_ttl" in (tmp_path / "out" / "replay.md").read_text()
    with pytest.raises(ValueError, match="either snapshot_dir"):
        ReplayParameters(runs_dir=str(runs_dir))
