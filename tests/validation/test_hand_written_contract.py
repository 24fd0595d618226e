"""Issue 13, items 1 and 2 (SPEC §1, §8): hand-written snapshots without ``version`` columns replay,
and ``soul_profiles`` is identified by (scope_path, key) — in quarantine, in the phases and in apply."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import polars as pl

from deep_sleep.cli import main
from deep_sleep.core.diff import Diff
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run.apply import apply
from deep_sleep.run.transform import as_shard_diff
from deep_sleep.validation.quarantine import quarantine
from tests.storeutil import insert, scalar

S = "org\x1fhand"
T = datetime(2026, 3, 1, 10, tzinfo=UTC)
AS_OF = "2026-03-01T12:00:00Z"


def _write(directory, frames: dict[str, pl.DataFrame]) -> None:
    directory.mkdir(parents=True)
    for name, frame in frames.items():
        frame.write_parquet(directory / f"{name}.parquet")
    (directory / "manifest.json").write_text(json.dumps({
        "scope_path": S, "taken_at": AS_OF, "previous_run_as_of": None, "schema_version": 1,
        "tables": {k: {"file": f"{k}.parquet", "rows": f.height} for k, f in frames.items()},
    }))


def _versionless(directory) -> None:
    """Nodes (with versions), 120 old episodic events and one pending edge without a version column,
    one soul profile with neither id nor version, and a user's edit of that profile's key."""
    a, b, soul = (str(uuid.uuid4()) for _ in range(3))
    _write(directory, {
        "memory_nodes": pl.DataFrame({
            "id": [a, b, soul], "layer": ["semantic"] * 3, "label": ["alpha", "beta", "SOUL:name"],
            "properties": ["{}", "{}", json.dumps({"_last_edited_by": "user_manual_edit", "value": "New"})],
            "importance": [5.0] * 3, "updated_at": [T] * 3, "version": [1, 1, 1]}),
        "episodic_events": pl.DataFrame({
            "id": [str(uuid.uuid4()) for _ in range(120)], "session_id": ["s"] * 120,
            "content": [f"event {i}" for i in range(120)], "metadata": ["{}"] * 120,
            "created_at": [T - timedelta(days=60, minutes=-i) for i in range(120)]}),
        "pending_connections": pl.DataFrame({
            "id": [str(uuid.uuid4())], "source_label": ["alpha"], "target_label": ["beta"], "relation": ["KNOWS"],
            "weight": [1.0], "created_at": [T]}),
        "soul_profiles": pl.DataFrame({"key": ["name"], "value": ["Old"], "updated_at": [T - timedelta(days=3)]}),
    })


def test_snapshot_without_version_columns_replays(tmp_path):
    _versionless(tmp_path / "snap")
    out = tmp_path / "diff"
    assert main(["replay", str(tmp_path / "snap"), "--as-of", AS_OF, "--out", str(out)]) == 0
    report = ConsolidationReport.read(out)
    assert report.status == "planned" and not report.errors
    diff = Diff.read(out)
    deletes = diff.table("episodic_events").deletes
    assert deletes.height == 50 and deletes.get_column("expected_version").null_count() == 50
    assert diff.table("pending_connections").updates.get_column("outcome").to_list() == ["created"]


def test_soul_profile_without_id_is_updated_by_key_not_inserted(tmp_path):
    _versionless(tmp_path / "snap")
    snap = Snapshot.read(tmp_path / "snap")
    clean, quarantined = quarantine(snap, datetime(2026, 3, 1, 12, tzinfo=UTC))
    assert quarantined.filter(pl.col("table") == "soul_profiles").height == 0
    out = tmp_path / "diff"
    assert main(["replay", str(tmp_path / "snap"), "--as-of", AS_OF, "--out", str(out)]) == 0
    profiles = Diff.read(out).table("soul_profiles")
    assert profiles.inserts.height == 0
    assert profiles.updates.select("key", "value").rows() == [("name", "New")]


def test_soul_profiles_quarantine_checks_the_key_not_the_id():
    snap = Snapshot(S, T, frames={"soul_profiles": pl.DataFrame({
        "key": ["name", "name", "", None, "role"], "value": ["a", "b", "c", "d", "e"]})}).as_read("/nowhere")
    _, quarantined = quarantine(snap, T)
    reasons = sorted(quarantined.get_column("reason").to_list())
    assert reasons == ["duplicate key", "duplicate key", "null or empty key", "null or empty key"]


def test_apply_updates_soul_profiles_by_key_and_guards_null_versions_on_existence(store, scope):
    profile_id, event_id = str(uuid.uuid4()), str(uuid.uuid4())
    insert(store, "soul_profiles", [{"id": profile_id, "scope_path": scope.path, "tenant_id": scope.tenant_id,
                                     "key": "name", "value": "Old"}])
    insert(store, "episodic_events", [{"id": event_id, "scope_path": scope.path, "tenant_id": scope.tenant_id,
                                       "session_id": "s", "content": "hello", "metadata": {}}])
    stand_in = str(uuid.uuid4())  # a hand-written snapshot's profile id: not the store's
    diff = Diff.combine([
        Diff.of("soul_profiles", "soul_corrections", updates=pl.DataFrame(
            {"id": [stand_in], "version": pl.Series([None], dtype=pl.Int64), "key": ["name"], "value": ["New"]})),
        Diff.of("episodic_events", "episodic_summary", reason="summarised", deletes=pl.DataFrame(
            {"id": [event_id, str(uuid.uuid4())], "version": pl.Series([None, None], dtype=pl.Int64)})),
    ])
    report = ConsolidationReport(scope_path=scope.path, as_of="2026-03-01T12:00:00Z", run_id=str(uuid.uuid4()))
    result = apply(store, as_shard_diff(diff, scope.path), {scope.path: report}, mode="nightly")[scope.path]
    assert result.status == "applied" and result.error is None
    assert scalar(store, "SELECT value FROM soul_profiles WHERE id = %s", profile_id) == "New"
    assert scalar(store, "SELECT count(*) FROM episodic_events WHERE id = %s", event_id) == 0
    assert result.applied["episodic_events"]["deletes"] == 1 and result.conflicts == 1  # the missing id
