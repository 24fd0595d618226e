"""The shard value: slices equal single-scope snapshots, the directory round-trips, errors name the file."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import polars as pl
import pytest

from deep_sleep.core import tables
from deep_sleep.core.errors import ScopeError, SnapshotError
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.dev.fleet import FleetSpec, generate_fleet

T = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
PREV = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)


def _snapshots(n: int = 5) -> list[Snapshot]:
    frames = generate_fleet(FleetSpec(scopes=n, nodes=30, templates=2, now=T))
    out = []
    for i, path in enumerate(sorted(frames["memory_nodes"]["scope_path"].unique())):
        mine = {t: tables.conform(t, f.filter(pl.col("scope_path") == path)) for t, f in frames.items() if f.height}
        out.append(Snapshot(path, T, PREV if i % 2 else None, mine))
    return out


def _same(a: Snapshot, b: Snapshot) -> None:
    assert (a.scope_path, a.taken_at, a.previous_run_as_of) == (b.scope_path, b.taken_at, b.previous_run_as_of)
    for name in set(a.frames) | set(b.frames):
        assert a.table(name).equals(b.table(name)), name


def test_scopes_slice_back_to_the_snapshots_they_came_from():
    snaps = _snapshots()
    shuffled = list(reversed(snaps))
    shard = Shard.from_snapshots(shuffled)
    assert shard.scope_paths == tuple(sorted(s.scope_path for s in snaps))
    for snap in snaps:
        _same(shard.scope(snap.scope_path), snap)
        assert shard.row_counts(snap.scope_path) == snap.row_counts()
    assert sum(shard.row_counts(s)["memory_edges"] for s in shard.scope_paths) == shard.table("memory_edges").height


def test_rows_in_any_order_are_grouped_by_scope_keeping_their_order():
    snaps = _snapshots(4)
    mixed = pl.concat([s.table("memory_nodes") for s in snaps]).sample(fraction=1.0, shuffle=True, seed=3)
    shard = Shard.from_frames({s.scope_path: s.previous_run_as_of for s in snaps}, T, {"memory_nodes": mixed})
    for s in snaps:
        got = shard.rows_of("memory_nodes", s.scope_path)
        assert got.equals(mixed.filter(pl.col("scope_path") == s.scope_path))


def test_prefix_scopes_never_mix(tmp_path):
    a = Snapshot("org\x1fac", T, None, {"memory_nodes": _snapshots(1)[0].table("memory_nodes").with_columns(
        pl.lit("org\x1fac").alias("scope_path"), pl.lit("ac").alias("tenant_id"))})
    b = Snapshot("org\x1facme", T, PREV, {"memory_nodes": _snapshots(1)[0].table("memory_nodes").head(3).with_columns(
        pl.lit("org\x1facme").alias("scope_path"), pl.lit("acme").alias("tenant_id"))})
    shard = Shard.read(Shard.from_snapshots([b, a]).write(tmp_path / "s"))
    _same(shard.scope("org\x1fac"), Snapshot("org\x1fac", T, None, {"memory_nodes": a.table("memory_nodes")}))
    assert shard.rows_of("memory_nodes", "org\x1facme").height == 3
    assert shard.previous_run_as_of["org\x1facme"] == PREV
    with pytest.raises(ScopeError, match="not in this shard"):
        shard.scope("org\x1facm")


def test_directory_round_trip_and_manifest(tmp_path):
    snaps = _snapshots()
    shard = Shard.from_snapshots(snaps)
    out = shard.write(tmp_path / "shard")
    manifest = json.loads((out / "manifest.json").read_text())
    assert [e["scope_path"] for e in manifest["scopes"]] == list(shard.scope_paths)
    assert "scope_path" not in manifest  # several scopes: not a single-scope manifest
    for e, s in zip(manifest["scopes"], sorted(snaps, key=lambda s: s.scope_path)):
        assert e["rows"] == s.row_counts()
        assert (e["previous_run_as_of"] is None) == (s.previous_run_as_of is None)
    back = Shard.read(out)
    for s in snaps:
        _same(back.scope(s.scope_path), s)


def test_single_scope_snapshots_are_shards_of_one(tmp_path):
    snap = _snapshots(1)[0]
    snap.write(tmp_path / "single")
    shard = Shard.read(tmp_path / "single")
    assert shard.scope_paths == (snap.scope_path,)
    _same(shard.scope(snap.scope_path), Snapshot.read(tmp_path / "single"))
    one = Shard.of(snap).write(tmp_path / "one")
    assert Snapshot.read(one).scope_path == snap.scope_path  # a shard of one writes a valid single-scope manifest


def test_bad_shard_manifests_name_the_problem(tmp_path):
    out = Shard.from_snapshots(_snapshots(2)).write(tmp_path / "s")
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["scopes"][1]["scope_path"] = "org\x1f"
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SnapshotError, match=r"scopes\[1\]"):
        Shard.read(out)
    manifest["scopes"] = []
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(SnapshotError, match="non-empty list"):
        Shard.read(out)


def test_replay_of_one_scope_of_a_shard_equals_the_replay_of_its_own_snapshot(tmp_path):
    """SPEC §8: `deep-sleep replay SHARD_DIR --scope S` replays one scope; the diff hash is the single-scope one."""
    from deep_sleep.cli import main
    from deep_sleep.core.report import ConsolidationReport

    snaps = _snapshots(3)
    Shard.from_snapshots(snaps).write(tmp_path / "shard")
    target = sorted(snaps, key=lambda s: s.scope_path)[1]
    target.write(tmp_path / "single")
    args = ["--dsn", "postgresql://nobody@127.0.0.1:1/none", "replay"]
    assert main([*args, str(tmp_path / "single"), "--as-of", T.isoformat(), "--out", str(tmp_path / "a")]) in (0, 1)
    assert main([*args, str(tmp_path / "shard"), "--as-of", T.isoformat(), "--out", str(tmp_path / "b"),
                 "--scope", target.scope_path]) in (0, 1)
    a, b = ConsolidationReport.read(tmp_path / "a"), ConsolidationReport.read(tmp_path / "b")
    assert a.diff_hash == b.diff_hash and a.counters == b.counters and a.scope_path == b.scope_path
    assert any(a.counters.values())
    # Without --scope, the whole shard in one pass: a shard diff directory, each scope readable out of it.
    assert main([*args, str(tmp_path / "shard"), "--as-of", T.isoformat(), "--out", str(tmp_path / "c")]) in (0, 1)
    from deep_sleep.run.layout import read_scope_diff, read_scope_report

    one = read_scope_report(tmp_path / "c", target.scope_path)
    assert one.diff_hash == a.diff_hash and one.counters == a.counters
    assert read_scope_diff(tmp_path / "c", target.scope_path).content_hash() == a.diff_hash


# ---------------------------------------------------------------------------------------------
# issue 32: a manifest names files inside its own directory only, in both readers


def _manifests(tmp_path):
    """(reader, directory) for a single-scope snapshot read as a Snapshot and as a shard of one, and a
    shard of two; each directory has a ``memory_nodes.parquet`` copy beside it in ``x/``, as a
    neighbouring snapshot would."""
    snaps = _snapshots(2)
    single = snaps[0].write(tmp_path / "single")
    shard = Shard.from_snapshots(snaps).write(tmp_path / "shard")
    (tmp_path / "x").mkdir()
    (tmp_path / "x" / "memory_nodes.parquet").write_bytes((single / "memory_nodes.parquet").read_bytes())
    return [(Snapshot.read, single), (Shard.read, single), (Shard.read, shard)]


def _point(directory, file) -> None:
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["tables"]["memory_nodes"]["file"] = file
    (directory / "manifest.json").write_text(json.dumps(manifest))


@pytest.mark.parametrize("file", ["../x/memory_nodes.parquet", "/etc/passwd", "memory_nodes.parquet/../../x/memory_nodes.parquet"])
def test_a_manifest_naming_a_file_outside_its_directory_is_refused_by_both_readers(tmp_path, file):
    for read, directory in _manifests(tmp_path):
        _point(directory, file)
        with pytest.raises(SnapshotError) as caught:
            read(directory)
        assert f"tables.memory_nodes.file {file!r} is outside the snapshot directory {directory}; table files are read " \
               'from the snapshot directory only: name it like "memory_nodes.parquet"' in str(caught.value), read


def test_a_link_out_of_the_snapshot_directory_is_refused_and_a_path_inside_it_is_read(tmp_path):
    for read, directory in _manifests(tmp_path):
        (directory / "nodes.parquet").unlink(missing_ok=True)
        (directory / "nodes.parquet").symlink_to(tmp_path / "x" / "memory_nodes.parquet")
        _point(directory, "nodes.parquet")
        with pytest.raises(SnapshotError, match=r"'nodes.parquet' is a link to .*/x/memory_nodes.parquet, outside the snapshot directory"):
            read(directory)
        _point(directory, "./memory_nodes.parquet")  # inside: read as ever
        assert read(directory).table("memory_nodes").height


@pytest.mark.parametrize(("edit", "needle"), [
    (lambda m: m["tables"]["memory_nodes"].update(file=5), "tables.memory_nodes.file must be a file name, got a JSON int"),
    (lambda m: m["tables"].update(memory_nodes="memory_nodes.parquet"), "tables.memory_nodes must be an object"),
    (lambda m: m.update(taken_at="9999-12-31T23:59:59-12:00"), "taken_at '9999-12-31T23:59:59-12:00' is not an ISO 8601 timestamp within years 1–9999"),
    (lambda m: m.update(taken_at=20261130), "taken_at must be an ISO 8601 timestamp string, got a JSON int"),
])
def test_bad_manifest_fields_are_snapshot_errors_in_both_readers(tmp_path, edit, needle):
    for read, directory in _manifests(tmp_path):
        manifest = json.loads((directory / "manifest.json").read_text())
        edit(manifest)
        (directory / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(SnapshotError, match=needle.replace("(", r"\(").replace(".", r"\.")):
            read(directory)
