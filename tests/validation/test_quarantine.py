"""Bad stored rows are quarantined with a named reason; the good rows are consolidated; nothing is lost."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import polars as pl
import pytest
from deep_sleep.transforms.config import ConsolidationConfig
from deep_sleep.validation.quarantine import REASONS, quarantine

from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run import pipeline
from deep_sleep.run import transform as transform_module
from deep_sleep.run.transform import transform
from deep_sleep.store.extract import extract
from tests.storeutil import access, edge, insert, node, scalar

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
#: A row's time far beyond both as_of and the extract's own time (the store's clock): "in the future"
#: is after the later of the two (issue 32), and the extract reads the store's clock.
FUTURE = datetime(2100, 1, 1, tzinfo=UTC)
COUNTED = ("memory_nodes", "memory_edges", "episodic_events", "procedural_skills", "recall_events", "pending_connections")


def _corpus(store, scope):
    """One good little graph plus one stored row per class of corruption.  Returns id → expected reason."""
    t = NOW - timedelta(hours=2)
    good = [node(scope, f"project: good {i}", t) for i in range(3)]
    insert(store, "memory_nodes", good)
    insert(store, "memory_access_log", [access(scope, n["id"], NOW - timedelta(minutes=m)) for n in good for m in (5, 6)])
    expected: dict[str, str] = {}

    def bad_node(reason, **kw):
        row = node(scope, kw.pop("label", "project: bad"), kw.pop("updated_at", t), **kw)
        expected[row["id"]] = reason
        return row

    bad_nodes = [
        bad_node("importance is not a finite number", importance=float("nan")),
        bad_node("importance is not a finite number", importance=float("inf")),
        bad_node("importance outside [1, 10]", importance=11.0),
        bad_node("empty label", label="   "),
        bad_node("control characters in label", label="project:\x07bell"),
        bad_node("timestamp in the future", updated_at=FUTURE),
    ]
    insert(store, "memory_nodes", bad_nodes)
    # written after as_of but before the extract (the store's clock is past NOW + 3 days): not from the
    # future, so not quarantined (issue 32)
    insert(store, "memory_nodes", [node(scope, "project: written after as_of", NOW + timedelta(days=3))])
    not_object = node(scope, "project: array props", t)
    expected[not_object["id"]] = "properties is not a JSON object"
    insert(store, "memory_nodes", [{**not_object, "properties": "[1, 2, 3]"}])
    scalar_props = node(scope, "project: scalar props", t)
    expected[scalar_props["id"]] = "properties is not a JSON object"
    insert(store, "memory_nodes", [{**scalar_props, "properties": '"just a string"'}])

    other_scope_node = node(scope.parent.child("brand", "elsewhere"), "project: theirs", t)
    insert(store, "memory_nodes", [other_scope_node])
    edges = {
        "dangling edge: endpoint not a node of this scope": edge(scope, good[0]["id"], str(uuid.uuid4()), at=t),
        "edge endpoint is quarantined": edge(scope, good[1]["id"], bad_nodes[0]["id"], at=t),
        "weight is negative or not finite": {**edge(scope, good[0]["id"], good[1]["id"], at=t), "weight": -1.0},
    }
    cross = edge(scope, good[2]["id"], other_scope_node["id"], at=t)  # an edge into another scope
    expected[cross["id"]] = "dangling edge: endpoint not a node of this scope"
    for reason, row in edges.items():
        expected[row["id"]] = reason
    insert(store, "memory_edges", [*edges.values(), cross])

    ev = lambda content, metadata="{}": {"id": str(uuid.uuid4()), "scope_path": scope.path, "tenant_id": scope.tenant_id,  # noqa: E731
                                         "session_id": "s1", "content": content, "metadata": metadata, "created_at": t}
    good_event, empty_event, bad_meta = ev("I deployed the thing"), ev("  "), ev("ok", '"a string"')
    expected[empty_event["id"]] = "empty content"
    expected[bad_meta["id"]] = "metadata is not a JSON object"
    insert(store, "episodic_events", [good_event, empty_event, bad_meta])

    skill = {"id": str(uuid.uuid4()), "scope_path": scope.path, "tenant_id": scope.tenant_id, "name": "deploy",
             "steps": '{"not": "a list"}', "status": "draft"}
    expected[skill["id"]] = "steps is not a JSON array"
    insert(store, "procedural_skills", [skill])
    recall = {"id": str(uuid.uuid4()), "scope_path": scope.path, "tenant_id": scope.tenant_id, "query": "q",
              "node_id": good[0]["id"], "similarity": 0.5, "features": [0.1] * 11, "score": 0.5, "created_at": t}
    expected[recall["id"]] = "features must have 12 values"
    insert(store, "recall_events", [recall])
    pending = {"id": str(uuid.uuid4()), "scope_path": scope.path, "tenant_id": scope.tenant_id,
               "source_label": "", "target_label": "project: good 0", "relation": "R", "created_at": t}
    expected[pending["id"]] = "empty label"
    insert(store, "pending_connections", [pending])
    return good, expected


def _counts(store, scope):
    return {t: scalar(store, f"SELECT count(*) FROM {t} WHERE scope_path = %s", scope.path) for t in COUNTED}


def test_bad_input_corpus_is_quarantined_good_rows_consolidated_nothing_lost(store, scope, runs_dir):
    good, expected = _corpus(store, scope)
    assert len(set(expected.values())) >= 12
    before = _counts(store, scope)
    report = pipeline.consolidate(store, scope, as_of=NOW, runs_dir=runs_dir).report()
    assert report.status == "applied", report.errors
    assert not report.errors
    # every bad row is recorded with exactly its own reason
    with store.pg() as con:
        recorded = dict(con.execute(
            "SELECT row_id, reason FROM consolidation_quarantine WHERE run_id = %s", (report.run_id,)).fetchall())
    assert recorded == expected
    assert sum(n for per in report.quarantined.values() for n in per.values()) == len(expected)
    assert set(expected.values()) <= set(REASONS)
    # the quarantined rows are untouched in the store (same version, same values)
    assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE id = ANY(%s::uuid[]) AND version = 1",
                  [i for i in expected if i in recorded]) >= 8
    assert scalar(store, "SELECT importance FROM memory_nodes WHERE id = %s",
                  next(i for i, r in expected.items() if r == "importance outside [1, 10]")) == 11.0
    # the good rows were consolidated
    assert report.counters["nodes_strengthened"] == 3
    assert scalar(store, "SELECT min(importance) FROM memory_nodes WHERE id = ANY(%s::uuid[])", [g["id"] for g in good]) == 5.5
    # reconcile: rows after + rows the run deleted (archived) - rows it inserted = rows before
    after = _counts(store, scope)
    for table in COUNTED:
        changed = report.rows_changed.get(table, {})
        assert after[table] + changed.get("deletes", 0) - changed.get("inserts", 0) == before[table], table
    archived = scalar(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s", report.run_id)
    assert archived == sum(c.get("deletes", 0) for c in report.rows_changed.values())


def test_duplicate_ids_in_a_snapshot_are_quarantined_both(tmp_path):
    rows = pl.DataFrame({"id": ["a", "a", "b"], "scope_path": ["org\x1fx"] * 3, "tenant_id": ["x"] * 3,
                         "layer": ["semantic"] * 3, "label": ["p: 1", "p: 2", "p: 3"], "properties": ["{}"] * 3,
                         "importance": [5.0] * 3, "updated_at": [NOW] * 3, "version": [1] * 3})
    snap = Snapshot(scope_path="org\x1fx", taken_at=NOW, frames={"memory_nodes": rows})
    clean, q = quarantine(snap, NOW)
    assert clean.table("memory_nodes").get_column("id").to_list() == ["b"]
    assert q.select("id", "reason").rows() == [("a", "duplicate id"), ("a", "duplicate id")]
    assert json.loads(q.get_column("row")[0])["label"] in ("p: 1", "p: 2")


def test_checks_beside_the_phases_give_the_sequential_plan_and_rerun_when_rows_are_quarantined(store, scope, monkeypatch):
    """On big snapshots transform() checks rows in a second thread while the phases run on the rows as
    extracted; when a row is quarantined, the phases run again on the clean snapshot."""
    _, expected = _corpus(store, scope)
    snap = Shard.of(extract(store, scope))
    sequential = transform(snap, ConsolidationConfig(), NOW)
    unchecked = transform(snap, ConsolidationConfig(), NOW, check_rows=False)
    assert unchecked.report.diff_hash != sequential.report.diff_hash  # the bad rows change the diff
    monkeypatch.setattr(transform_module, "OVERLAP_ROWS", 0)
    runs = []
    real = transform_module._run_phases
    monkeypatch.setattr(transform_module, "_run_phases", lambda s, *a: runs.append(s) or real(s, *a))
    overlapped = transform(snap, ConsolidationConfig(), NOW)
    assert len(runs) == 2 and runs[0] is snap and runs[1] is overlapped.shard  # optimistic run, then the rerun
    assert overlapped.report.diff_hash == sequential.report.diff_hash
    assert overlapped.quarantined.equals(sequential.quarantined) and set(overlapped.quarantined["id"]) == set(expected)
    assert overlapped.report.counters == sequential.report.counters
    # nothing to quarantine: the optimistic run stands, no rerun
    runs.clear()
    clean = transform(overlapped.shard, ConsolidationConfig(), NOW)
    assert len(runs) == 1 and clean.quarantined.height == 0
    assert clean.report.diff_hash == transform(overlapped.shard, ConsolidationConfig(), NOW, check_rows=False).report.diff_hash


def test_a_phase_failing_beside_the_checks_is_rerun_on_the_clean_snapshot_or_its_error_raised(store, scope, monkeypatch):
    _corpus(store, scope)
    snap = Shard.of(extract(store, scope))
    sequential = transform(snap, ConsolidationConfig(), NOW)
    monkeypatch.setattr(transform_module, "OVERLAP_ROWS", 0)
    real = transform_module._run_phases

    def fails_on_the_extracted_rows(s, *a):
        if s is snap:  # the optimistic run, on rows the checks will quarantine
            raise ValueError("a phase choked on a bad row")
        return real(s, *a)

    monkeypatch.setattr(transform_module, "_run_phases", fails_on_the_extracted_rows)
    rerun = transform(snap, ConsolidationConfig(), NOW)
    assert rerun.report.diff_hash == sequential.report.diff_hash and rerun.quarantined.height
    # nothing to quarantine: the phase's own error is raised, not swallowed
    clean = sequential.shard
    monkeypatch.setattr(transform_module, "_run_phases", lambda s, *a: (_ for _ in ()).throw(ValueError("a real bug")))
    with pytest.raises(ValueError, match="a real bug"):
        transform(clean, ConsolidationConfig(), NOW)
