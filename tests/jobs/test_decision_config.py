"""Issue 37: a decision uses the configuration of the run it decides.  ``approve`` and ``undo`` have no
``--config``; a night with ``meta_nodes.max_members = 3`` got 4 CLUSTERS edges from an approval on the
command line, which used the default configuration.  Every run now records its configuration beside
its diff (``config.json``) and approve and undo decide with it."""

from __future__ import annotations

import json
from datetime import timedelta

from deep_sleep.cli import main
from deep_sleep.jobs.ledger import get_run, run_config
from deep_sleep.run import pipeline
from deep_sleep.transforms.config import ConsolidationConfig
from tests.run.test_holds_store import NOW, _clusters, held_cluster_swap
from tests.storeutil import insert, node, scalar


def test_a_cli_approval_keeps_the_cap_of_the_run_it_approves(store, scope, runs_dir, capsys):
    """META:project clusters its top 3 of 5; a lifted member and a failing gate hold the swap (the stale
    member's CLUSTERS delete, the new member's insert).  A live write then touches the stale member's
    edge, so at the approval its delete loses to the version guard: the new member's edge would make
    4 — under the default cap (10) it landed; under the run's own cap (3) it is a conflict."""
    cap = 3
    assert ConsolidationConfig().meta_nodes.max_members > cap + 1
    config, members, _, _, held = held_cluster_swap(store, scope, runs_dir, cap=cap, chain=True)
    recorded = json.loads(_config_file(held.diff_uri).read_text())
    assert recorded["meta_nodes"]["max_members"] == cap and recorded == config.model_dump(mode="json")
    assert run_config(get_run(store, held.run_id)) == config

    with store.pg() as con:  # a live write touches the stale member's CLUSTERS edge: its held delete will lose
        con.execute("UPDATE memory_edges SET weight = weight WHERE scope_path = %s AND relation = 'CLUSTERS' AND target_id = %s",
                    (scope.path, members[2]["id"]))
        con.commit()
    assert main(["--dsn", store.dsn, "approve", held.run_id[:8]]) == 0  # no --config: the run's own
    out = capsys.readouterr().out
    assert "approved" in out and "conflict(s)" in out
    clusters = _clusters(store, "META:project", scope)
    assert len(clusters) == cap and members[2]["id"] in clusters and members[4]["id"] not in clusters, clusters
    approval = scalar(store, "SELECT run_id::text FROM consolidation_runs WHERE approval_of = %s", held.run_id)
    assert run_config(get_run(store, approval)) == config  # an undo of the approval decides with it too


def _config_file(diff_uri: str):
    from pathlib import Path

    return Path(diff_uri) / "config.json"


def test_a_run_without_a_recorded_configuration_is_decided_with_the_current_one(store, scope, runs_dir, monkeypatch):
    """Runs of earlier releases recorded none: the current configuration (file, environment) decides."""
    insert(store, "memory_nodes", [node(scope, "project: apollo", NOW - timedelta(hours=3))])
    report = pipeline.consolidate(store, scope, NOW, ConsolidationConfig(meta_nodes={"max_members": 4}),
                                  runs_dir=runs_dir).report()
    _config_file(report.diff_uri).unlink()
    monkeypatch.setenv("DEEP_SLEEP_META_NODES__MAX_MEMBERS", "7")
    assert run_config(get_run(store, report.run_id)).meta_nodes.max_members == 7
