"""Replay (SPEC §8): a snapshot directory, even one written by hand, becomes a diff with no database."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import polars as pl
import pytest

from deep_sleep.cli import main
from deep_sleep.core.diff import Diff
from deep_sleep.core.errors import DiffError
from deep_sleep.core.files import write_atomic
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.snapshot import Snapshot


def _hand_written_snapshot(directory):
    """Only two tables, written with plain Polars and a hand-made manifest."""
    directory.mkdir()
    pl.DataFrame({
        "id": ["11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222"],
        "scope_path": ["org\x1fhand"] * 2, "tenant_id": ["hand"] * 2,
        "layer": ["semantic", "working"], "label": ["project: a", "note: b"],
        "properties": ["{}", '{"ttl_hours": 1}'], "importance": [5.0, 5.0],
        "updated_at": [datetime(2026, 3, 1, 10, tzinfo=UTC)] * 2, "version": [1, 1],
    }).write_parquet(directory / "memory_nodes.parquet")
    pl.DataFrame({
        "node_id": ["11111111-1111-1111-1111-111111111111"] * 2,
        "accessed_at": [datetime(2026, 3, 1, 11, tzinfo=UTC), datetime(2026, 3, 1, 11, 30, tzinfo=UTC)],
    }).write_parquet(directory / "memory_access_log.parquet")
    (directory / "manifest.json").write_text(json.dumps({
        "scope_path": "org\x1fhand", "taken_at": "2026-03-01T12:00:00Z", "previous_run_as_of": None, "schema_version": 1,
        "tables": {"memory_nodes": {"file": "memory_nodes.parquet", "rows": 2},
                   "memory_access_log": {"file": "memory_access_log.parquet", "rows": 2}},
    }))


def test_hand_written_partial_snapshot_replays_through_the_cli(tmp_path, capsys):
    snap_dir = tmp_path / "snap"
    _hand_written_snapshot(snap_dir)
    out = tmp_path / "diff"
    assert main(["replay", str(snap_dir), "--as-of", "2026-03-01T12:00:00Z", "--out", str(out)]) == 0
    report = ConsolidationReport.read(out)
    assert report.counters["nodes_strengthened"] == 1
    assert report.counters["working_ttl_pruned"] == 1
    assert report.status == "planned" and not report.errors
    diff = Diff.read(out)
    assert diff.content_hash() == report.diff_hash
    assert diff.table("memory_nodes").updates.get_column("importance").to_list() == [5.5]
    assert "nodes_strengthened" in capsys.readouterr().out
    # the same replay again: the same bytes
    out2 = tmp_path / "diff2"
    assert main(["replay", str(snap_dir), "--as-of", "2026-03-01T12:00:00Z", "--out", str(out2)]) == 0
    assert ConsolidationReport.read(out2).diff_hash == report.diff_hash


def test_missing_tables_read_as_empty(tmp_path):
    snap_dir = tmp_path / "snap"
    _hand_written_snapshot(snap_dir)
    snap = Snapshot.read(snap_dir)
    assert snap.table("memory_edges").height == 0
    assert snap.table("memory_nodes").schema["updated_at"] == pl.Datetime("us", "UTC")


def test_bad_snapshot_directories_get_clear_errors(tmp_path, capsys):
    assert main(["replay", str(tmp_path), "--as-of", "2026-03-01T12:00:00Z", "--out", str(tmp_path / "o")]) == 2
    assert "manifest.json is missing" in capsys.readouterr().err
    snap_dir = tmp_path / "snap"
    _hand_written_snapshot(snap_dir)
    manifest = json.loads((snap_dir / "manifest.json").read_text())
    manifest["tables"]["memory_nodes"]["rows"] = 3
    (snap_dir / "manifest.json").write_text(json.dumps(manifest))
    assert main(["replay", str(snap_dir), "--as-of", "2026-03-01T12:00:00Z", "--out", str(tmp_path / "o")]) == 2
    assert "manifest says 3 rows, file has 2" in capsys.readouterr().err
    assert main(["replay", str(snap_dir), "--as-of", "yesterday", "--out", str(tmp_path / "o")]) == 2
    assert "not an ISO 8601 timestamp" in capsys.readouterr().err


def test_report_writes_are_atomic_and_a_torn_report_gets_a_clear_error(tmp_path):
    report = ConsolidationReport(scope_path="acme/u1", as_of="2026-03-01T12:00:00+00:00", run_id="r1")
    report.write(tmp_path)
    assert ConsolidationReport.read(tmp_path) == report
    # a write that fails half-way (here: text UTF-8 cannot encode) leaves the old file and no temp file
    with pytest.raises(UnicodeEncodeError):
        write_atomic(tmp_path / "report.json", '{"scope_path": "\ud800"}')
    assert ConsolidationReport.read(tmp_path) == report
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
    (tmp_path / "report.json").write_text("")  # what a kill during a plain write_text used to leave
    with pytest.raises(DiffError, match="report.json is not a readable report"):
        ConsolidationReport.read(tmp_path)
    with pytest.raises(DiffError, match="not a planned diff directory"):
        ConsolidationReport.read(tmp_path / "nowhere")
