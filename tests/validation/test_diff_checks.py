"""Crafted bad diffs are rejected by name, row and phase, and never reach the store."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import polars as pl
import pytest
from deep_sleep.transforms.config import ConsolidationConfig
from deep_sleep.validation import SNAPSHOT_COLUMNS, validate_diff

from deep_sleep.core.diff import Diff, TableDiff
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run.apply import apply_diff
from deep_sleep.run.plan import plan
from deep_sleep.run.stages import apply_stage, validate_stage
from deep_sleep.store.extract import extract
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
        "updates never change scope_path or tenant_id": (Diff.of("memory_nodes", "strengthen", updates=_nodes(snap, [hot]).with_columns(scope_path=pl.lit("org\x1fsomeone-else"))), "strengthen", hot),
    }


def test_each_crafted_bad_diff_is_rejected_by_name_row_and_phase(store, scope, graph, tmp_path):
    snap = extract(store, scope)
    # the validate stage reads only SNAPSHOT_COLUMNS: the verdicts must be the same
    pruned = Snapshot.read(snap.write(tmp_path / "snap"), columns=SNAPSHOT_COLUMNS)
    assert pruned.table("memory_nodes").columns != snap.table("memory_nodes").columns
    for check, (diff, phase, row_id) in _bad_diffs(snap, graph, scope).items():
        failures = validate_diff(diff, snap)
        assert failures.equals(validate_diff(diff, pruned)), check
        assert check in failures.get_column("check").to_list(), (check, failures)
        named = failures.filter(pl.col("check") == check).select("table", "phase", "id").unique().rows()
        table = "memory_edges" if check == "edge ends are live nodes of the scope" else "memory_nodes"
        assert named == [(table, phase, row_id)], (check, named)


def test_a_real_plan_passes_validation(store, scope, graph):
    snap = extract(store, scope)
    result = plan(snap, ConsolidationConfig(), NOW)
    assert result.diff.has_changes
    assert validate_diff(result.diff, snap).height == 0


def test_failed_validation_is_recorded_and_nothing_is_applied(store, scope, graph, tmp_path):
    snap = extract(store, scope)
    snap_dir = snap.write(tmp_path / "snapshot")
    bad = _bad_diffs(snap, graph, scope)["scope_path equals the run's scope"][0]
    diff_dir = tmp_path / "diff"
    bad.write(diff_dir)
    run_id = str(uuid.uuid4())
    ConsolidationReport(scope_path=scope.path, as_of="2026-11-20T03:00:00Z", run_id=run_id, diff_hash=bad.content_hash()).write(diff_dir)
    before = dump(store, scope)
    report = validate_stage(snap_dir, diff_dir)
    assert report.status == "failed"
    assert any("scope_path equals the run's scope" in e and "meta_nodes" in e for e in report.errors)
    assert (diff_dir / "validation.parquet").exists()
    apply_stage(store, diff_dir)
    after = dump(store, scope)
    assert after["memory_nodes"] == before["memory_nodes"]
    with store.pg() as con:
        status, errors = con.execute("SELECT status, errors FROM consolidation_runs WHERE run_id = %s", (run_id,)).fetchone()
    assert status == "failed" and errors


def test_apply_never_touches_another_scope_even_if_asked(store, scope, graph):
    """Defence in depth: every apply statement also filters on the run's scope_path."""
    other = scope.parent.child("brand", "b2")
    twin = node(other, "project: twin", NOW - timedelta(hours=1))
    insert(store, "memory_nodes", [twin])
    diff = Diff.of("memory_nodes", "strengthen", updates=pl.DataFrame({"id": [twin["id"]], "version": [1], "importance": [9.0]}))
    report = ConsolidationReport(scope_path=scope.path, as_of="2026-11-20T03:00:00Z", run_id=str(uuid.uuid4()))
    result = apply_diff(store, diff, report)
    assert result.conflicts == 1
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
