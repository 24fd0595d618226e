"""Crafted bad diffs are rejected by name, row and phase, and never reach the store."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import polars as pl
import pytest
from deep_sleep.transforms.config import ConsolidationConfig
from deep_sleep.validation import SNAPSHOT_COLUMNS, failed_scopes, validate_diff

from deep_sleep.core.diff import Diff, TableDiff
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run import pipeline
from deep_sleep.run.apply import apply
from deep_sleep.run.layout import VALIDATION_FILE
from deep_sleep.run.transform import Transformed, as_shard_diff, transform
from deep_sleep.store.extract import extract
from deep_sleep.validation.quarantine import SHARD_QUARANTINE_SCHEMA
from tests.storeutil import dump, insert, node, scalar, small_graph

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


@pytest.fixture
def graph(store, scope):
    ids = small_graph(store, scope, NOW)
    soul = node(scope, "SOUL:name", NOW - timedelta(days=40), importance=9.0)
    insert(store, "memory_nodes", [soul])
    ids["soul"] = [soul["id"]]
    return ids


def _nodes(snap, ids):
    return snap.table("memory_nodes").filter(pl.col("id").is_in(ids)).select("id", "version")


def _bad_diffs(snap, ids, scope):
    """check → (a diff that breaks it, the phase and the row id the failure must name)."""
    other = "org\x1fsomeone-else"
    hot = ids["hot"][0]
    stranger, outsider, dangling = str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())
    return {
        "importance within [1, 10]": (Diff.of("memory_nodes", "strengthen", updates=_nodes(snap, [hot]).with_columns(importance=pl.lit(11.0))), "strengthen", hot),
        "expected_version equals the snapshot's version": (Diff.of("memory_nodes", "strengthen", updates=_nodes(snap, [hot]).with_columns(version=pl.lit(99, pl.Int64), importance=pl.lit(6.0))), "strengthen", hot),
        "references a row of the snapshot": (Diff.of("memory_nodes", "prune_orphans", deletes=pl.DataFrame({"id": [stranger], "version": [1]}), reason="x"), "prune_orphans", stranger),
        "protected labels (SOUL:, AGENT_IDENTITY:) are never deleted": (Diff.of("memory_nodes", "prune_orphans", deletes=_nodes(snap, ids["soul"]), reason="x"), "prune_orphans", ids["soul"][0]),
        "no surviving edge points at a deleted node": (Diff.of("memory_nodes", "prune_orphans", deletes=_nodes(snap, [hot]), reason="x"), "prune_orphans", hot),
        "scope_path equals the run's scope": (Diff.of("memory_nodes", "meta_nodes", inserts=pl.DataFrame({"id": [outsider], "scope_path": [other], "tenant_id": [scope.tenant_id], "layer": ["semantic"], "label": ["META:x"], "importance": [5.0]})), "meta_nodes", outsider),
        "one row per id and phase": (Diff.of("memory_nodes", "meta_nodes", inserts=pl.DataFrame({"id": [ids["hot"][1]] * 2, "scope_path": [scope.path] * 2, "tenant_id": [scope.tenant_id] * 2, "layer": ["semantic"] * 2, "label": ["META:y"] * 2, "importance": [5.0] * 2})), "meta_nodes", ids["hot"][1]),
        "edge ends are live nodes of the scope": (Diff.of("memory_edges", "pending_edges", inserts=pl.DataFrame({"id": [dangling], "scope_path": [scope.path], "tenant_id": [scope.tenant_id], "source_id": [hot], "target_id": [str(uuid.uuid4())], "relation": ["R"], "weight": [1.0]})), "pending_edges", dangling),
        "no row both updated and deleted": (Diff({"memory_nodes": TableDiff(
            updates=Diff.of("memory_nodes", "x", updates=_nodes(snap, ids["cold"]).with_columns(importance=pl.lit(6.0))).table("memory_nodes").updates,
            deletes=Diff.of("memory_nodes", "y", deletes=_nodes(snap, ids["cold"]), reason="r").table("memory_nodes").deletes)}), "x", ids["cold"][0]),
        "updates never change scope_path or tenant_id": (Diff.of("memory_nodes", "strengthen", updates=_nodes(snap, [hot]).with_columns(tenant_id=pl.lit("someone-else"))), "strengthen", hot),
    }


def test_each_crafted_bad_diff_is_rejected_by_name_row_and_phase(store, scope, graph):
    snap = extract(store, scope)
    for check, (diff, phase, row_id) in _bad_diffs(snap, graph, scope).items():
        failures = validate_diff(diff, snap)
        # the same diff in the shard form (a scope_path on every row), against the shard of one
        assert failures.equals(validate_diff(as_shard_diff(diff, scope.path), Shard.of(snap))), check
        assert check in failures.get_column("check").to_list(), (check, failures)
        named = failures.filter(pl.col("check") == check).select("table", "phase", "id", "scope_path").unique().rows()
        table = "memory_edges" if check == "edge ends are live nodes of the scope" else "memory_nodes"
        owner = "org\x1fsomeone-else" if check == "scope_path equals the run's scope" else scope.path  # the row's own scope
        assert named == [(table, phase, row_id, owner)], (check, named)


def test_an_update_naming_another_scope_references_no_row_of_the_snapshot(store, scope, graph):
    """An update's scope_path is its row's own scope (plan adds it): one naming another scope names a
    row that scope's snapshot does not hold — that scope's failure, and no scope of the shard's, so it
    fails them all — whether it comes in the single-scope form or the shard form."""
    snap = extract(store, scope)
    hot = graph["hot"][0]
    other = "org\x1fsomeone-else"
    moved = Diff.of("memory_nodes", "strengthen", updates=_nodes(snap, [hot]).with_columns(scope_path=pl.lit(other)))
    for diff, against in ((moved, snap), (as_shard_diff(moved, scope.path), Shard.of(snap))):
        failures = validate_diff(diff, against)
        assert failures.select("check", "table", "phase", "id", "scope_path").rows() == [
            ("references a row of the snapshot", "memory_nodes", "strengthen", hot, other)]
        assert failed_scopes(failures, Shard.of(snap)) == {scope.path}


def test_validate_diff_reads_only_the_snapshot_columns_it_names(store, scope, graph, tmp_path):
    """SNAPSHOT_COLUMNS are the snapshot columns validate_diff reads: a snapshot read with only those
    gives every crafted bad diff (and a real plan's diff) the same verdicts."""
    snap = extract(store, scope)
    pruned = Snapshot.read(snap.write(tmp_path / "snap"), columns=SNAPSHOT_COLUMNS)
    assert pruned.table("memory_nodes").columns != snap.table("memory_nodes").columns
    for check, (diff, _, _) in _bad_diffs(snap, graph, scope).items():
        assert validate_diff(diff, snap).equals(validate_diff(diff, pruned)), check
    result = transform(snap, ConsolidationConfig(), NOW)
    assert validate_diff(result.diff, pruned).height == 0


def test_a_real_plan_passes_validation(store, scope, graph):
    snap = extract(store, scope)
    result = transform(snap, ConsolidationConfig(), NOW)
    assert result.diff.has_changes
    assert validate_diff(result.diff, result.shard).height == 0  # the shard form
    assert validate_diff(result.scope_diff(), snap).height == 0  # the single-scope form


def _validate_and_apply(store, snap, diff, scope, tmp_path):
    """The Validate and Apply stages on a plan of ``snap`` whose diff is ``diff`` (a single scope's, in
    the shard form); the final state, the ledger row, the store before and after."""
    run_id = str(uuid.uuid4())
    shard = Shard.of(snap)
    diff = as_shard_diff(diff, scope.path)
    report = ConsolidationReport(scope_path=scope.path, as_of="2026-11-20T03:00:00Z", run_id=run_id,
                                 diff_hash=diff.content_hash())
    planned = Transformed(shard, diff, {scope.path: report}, pl.DataFrame(schema=SHARD_QUARANTINE_SCHEMA))
    (tmp_path / "diff").mkdir()  # the Transform stage would have made it
    ctx = pipeline.Context.of(NOW, ConsolidationConfig(), scopes=scope, store=store, diff_dir=tmp_path / "diff",
                              run_ids={scope.path: run_id})
    before = dump(store, scope)
    state = pipeline.run((pipeline.Validate(), pipeline.Apply()), ctx,
                         pipeline.State(shard=shard, transformed=planned, reports={scope.path: report}))
    after = dump(store, scope)
    with store.pg() as con:
        ledger = con.execute("SELECT status, errors FROM consolidation_runs WHERE run_id = %s", (run_id,)).fetchone()
    return state, ledger, before, after


@pytest.mark.parametrize("check", ["scope_path equals the run's scope", "importance within [1, 10]",
                                   "no surviving edge points at a deleted node"])
def test_failed_validation_is_recorded_and_nothing_is_applied(store, scope, graph, tmp_path, check):
    snap = extract(store, scope)
    bad, phase, _ = _bad_diffs(snap, graph, scope)[check]
    state, ledger, before, after = _validate_and_apply(store, snap, bad, scope, tmp_path)
    report = state.report()
    assert report.status == "failed"
    assert any(check in e and phase in e for e in report.errors), report.errors
    assert check in state.failures.get_column("check").to_list()
    assert (tmp_path / "diff" / VALIDATION_FILE).exists()
    assert state.applied[scope.path].status == "failed"
    assert after["memory_nodes"] == before["memory_nodes"] and after["memory_edges"] == before["memory_edges"]
    status, errors = ledger
    assert status == "failed" and errors


def test_a_valid_diff_passes_the_same_stages_and_is_applied(store, scope, graph, tmp_path):
    """The control of the test above: the same stages apply a valid diff and record the run."""
    snap = extract(store, scope)
    hot = graph["hot"][0]
    good = Diff.of("memory_nodes", "strengthen", updates=_nodes(snap, [hot]).with_columns(importance=pl.lit(6.0)))
    state, ledger, _, _ = _validate_and_apply(store, snap, good, scope, tmp_path)
    assert state.failures.height == 0 and state.report().status == "applied"
    assert state.applied[scope.path].applied["memory_nodes"]["updates"] == 1
    assert ledger[0] == "applied"
    assert scalar(store, "SELECT importance FROM memory_nodes WHERE id = %s", hot) == 6.0


def test_apply_never_touches_another_scope_even_if_asked(store, scope, graph):
    """Defence in depth: every apply statement also filters on the run's scope_path."""
    other = scope.parent.child("brand", "b2")
    twin = node(other, "project: twin", NOW - timedelta(hours=1))
    insert(store, "memory_nodes", [twin])
    diff = Diff.of("memory_nodes", "strengthen", updates=pl.DataFrame({"id": [twin["id"]], "version": [1], "importance": [9.0]}))
    report = ConsolidationReport(scope_path=scope.path, as_of="2026-11-20T03:00:00Z", run_id=str(uuid.uuid4()))
    result = apply(store, as_shard_diff(diff, scope.path), {scope.path: report}, mode="nightly")
    assert result[scope.path].status == "applied"
    assert result[scope.path].conflicts == 1
    assert scalar(store, "SELECT importance FROM memory_nodes WHERE id = %s", twin["id"]) == 5.0
    assert scalar(store, "SELECT version FROM memory_nodes WHERE id = %s", twin["id"]) == 1


def test_caps_are_checked(store, scope, graph):
    snap = extract(store, scope)
    hot = graph["hot"]
    # a sixth CO_OCCURRED neighbour for one node (five existing + one new)
    others = [str(uuid.uuid4()) for _ in range(6)]
    nodes = pl.DataFrame({"id": others, "scope_path": [scope.path] * 6, "tenant_id": [scope.tenant_id] * 6,
                          "layer": ["semantic"] * 6, "label": [f"x {i}" for i in range(6)], "importance": [5.0] * 6})
    edges = pl.DataFrame({"id": [str(uuid.uuid4()) for _ in range(6)], "scope_path": [scope.path] * 6,
                          "tenant_id": [scope.tenant_id] * 6, "source_id": [hot[0]] * 6, "target_id": others,
                          "relation": ["CO_OCCURRED"] * 6, "weight": [1.0] * 6})
    diff = Diff.combine([Diff.of("memory_nodes", "cooccurrence", inserts=nodes), Diff.of("memory_edges", "cooccurrence", inserts=edges)])
    failures = validate_diff(diff, snap)
    assert "no node over 5 CO_OCCURRED neighbours" in failures.get_column("check").to_list()
    assert validate_diff(diff, snap, ConsolidationConfig(cooccurrence={"max_neighbours": 6})).height == 0
    # a per-run cap
    skills = pl.DataFrame({"id": [str(uuid.uuid4()) for _ in range(6)], "scope_path": [scope.path] * 6,
                           "tenant_id": [scope.tenant_id] * 6, "name": [f"s{i}" for i in range(6)], "status": ["draft"] * 6})
    failures = validate_diff(Diff.of("procedural_skills", "procedural_promotion", inserts=skills), snap)
    assert "per-run cap of procedural_promotion: at most 5 procedural_skills inserts" in failures.get_column("check").to_list()
    active = skills.head(1).with_columns(status=pl.lit("active"))
    failures = validate_diff(Diff.of("procedural_skills", "procedural_promotion", inserts=active), snap)
    assert failures.get_column("check").to_list() == ["consolidation never creates or activates a skill"]
