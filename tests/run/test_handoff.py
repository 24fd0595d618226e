"""In-process hand-off between stages: what a stage leaves in memory is exactly what the next stage
would read from the files, it is refused once the files change, and runs give the same result
with it and without it."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime

import polars as pl
import pytest
from deep_sleep.transforms.config import ConsolidationConfig

from deep_sleep.core.diff import Diff
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.dev.seed import SeedSpec, scopes_of, seed_store
from deep_sleep.run import handoff
from deep_sleep.run.stages import (
    _clean_snapshot,
    apply_stage,
    extract_stage,
    plan_stage,
    validate_stage,
)
from tests.storeutil import create_database, drop_database, dump

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
SPEC = SeedSpec(tenants=1, scopes_per_tenant=2, nodes_per_scope=300, seed=11, now=NOW, days=30)


@pytest.fixture
def seeded(admin_dsn):
    name = f"ds_handoff_{os.getpid()}"
    store = create_database(admin_dsn, name)
    seed_store(store, SPEC)
    yield store, name
    drop_database(admin_dsn, name)


def _same_frames(a: dict[str, pl.DataFrame], b: dict[str, pl.DataFrame]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].schema == b[name].schema, name
        assert a[name].equals(b[name]), name


def test_values_handed_over_equal_what_the_files_give(seeded, tmp_path):
    store, _ = seeded
    handoff.clear()
    scope = scopes_of(SPEC)[0]
    snap_dir = extract_stage(store, scope, NOW, ConsolidationConfig(), tmp_path / "snapshot")
    mem = handoff.take("snapshot", snap_dir)
    disk = Snapshot.read(snap_dir)
    assert mem is not None and handoff.take("snapshot", snap_dir) is None  # taken once
    assert (mem.scope_path, mem.taken_at, mem.previous_run_as_of, mem.source) == (
        disk.scope_path, disk.taken_at, disk.previous_run_as_of, disk.source)
    _same_frames(dict(mem.frames), dict(disk.frames))

    diff_dir = plan_stage(snap_dir, ConsolidationConfig(), NOW, tmp_path / "diff")
    clean, diff = handoff.take("plan", diff_dir)
    assert diff.has_changes
    back = Diff.read(diff_dir)
    for name in set(diff.tables) | set(back.tables):
        _same_frames(diff.table(name).frames(), back.table(name).frames())
    disk_clean = _clean_snapshot(Snapshot.read(snap_dir), diff_dir)
    _same_frames(dict(clean.frames), dict(disk_clean.frames))


def test_a_changed_file_an_evicted_entry_or_the_switch_means_reading_the_files(tmp_path, monkeypatch):
    handoff.clear()
    d = tmp_path / "d"
    d.mkdir()
    (d / "a.parquet").write_bytes(b"1")
    handoff.put("diff", d, "value", rows=1, ignore=frozenset({"report.json"}))
    (d / "report.json").write_text("{}")  # ignored: a later stage rewrites it
    assert handoff.take("diff", d) == "value"
    handoff.put("diff", d, "value", rows=1)
    (d / "a.parquet").write_bytes(b"2")  # same size, new content
    os.utime(d / "a.parquet", ns=(1, 1))
    assert handoff.take("diff", d) is None
    handoff.put("diff", d, "value", rows=1)
    (d / "b.parquet").write_bytes(b"")  # a new file
    assert handoff.take("diff", d) is None
    for i in range(handoff.ENTRIES + 1):
        (tmp_path / str(i)).mkdir()
        handoff.put("snapshot", tmp_path / str(i), i, rows=1)
    assert handoff.take("snapshot", tmp_path / "0") is None  # the oldest went
    assert handoff.take("snapshot", tmp_path / str(handoff.ENTRIES)) == handoff.ENTRIES
    handoff.put("snapshot", tmp_path / "1", "big", rows=handoff.ROWS - 1)  # the others' rows make it too many
    assert handoff.take("snapshot", tmp_path / "2") is None and handoff.take("snapshot", tmp_path / "1") == "big"
    handoff.put("snapshot", tmp_path / "1", "too big", rows=handoff.ROWS + 1)
    assert handoff.take("snapshot", tmp_path / "1") is None
    monkeypatch.setenv("DEEP_SLEEP_HANDOFF", "0")
    handoff.put("diff", d, "value", rows=1)
    assert handoff.take("diff", d) is None and handoff.take("snapshot", tmp_path / "1") is None


def test_a_run_gives_the_same_store_with_and_without_the_hand_off(seeded, admin_dsn, tmp_path, monkeypatch):
    """The same seeded database twice: one run with the hand-off, one reading every file; the same
    report and the same store come out, row for row."""
    scope = scopes_of(SPEC)[0]
    results = {}
    taken: list[str] = []
    real_take = handoff.take
    monkeypatch.setattr(handoff, "take", lambda kind, d: (v := real_take(kind, d)) is not None and taken.append(kind) or v)
    for mode in ("handed over", "from files"):
        name = f"ds_handoff_{os.getpid()}_{mode[0]}"
        store = create_database(admin_dsn, name, template=seeded[1])
        try:
            monkeypatch.setenv("DEEP_SLEEP_HANDOFF", "1" if mode == "handed over" else "0")
            handoff.clear()
            snap_dir = extract_stage(store, scope, NOW, ConsolidationConfig(), tmp_path / mode / "snapshot")
            diff_dir = plan_stage(snap_dir, ConsolidationConfig(), NOW, tmp_path / mode / "diff", run_id=str(uuid.uuid4()))
            assert validate_stage(snap_dir, diff_dir).status != "failed"
            report = apply_stage(store, diff_dir)
            assert taken == (["snapshot", "plan", "diff"] if mode == "handed over" else [])
            taken.clear()
            rows = dump(store, scope)
            del rows["consolidation_runs"]  # run ids differ
            results[mode] = (report, rows)
        finally:
            drop_database(admin_dsn, name)
    (ra, da), (rb, db) = results.values()
    assert ra.status == rb.status == "applied" and ra.rows_changed
    assert (ra.rows_changed, ra.counters, ra.diff_hash) == (rb.rows_changed, rb.counters, rb.diff_hash)
    assert da == db
