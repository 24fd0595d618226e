"""Issue 12 item 7: the runs directory on an object store (``s3://…``), against a local S3 (moto's
server in the test process, loopback only).  A real night (Prefect, Postgres) over a shard of several
scopes and a shard of one writes every file to the bucket and nothing stays on local disk; the ledger
names ``s3://`` URLs; replay, undo, approve/reject and gc read the run back from the bucket."""

from __future__ import annotations

import tempfile
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from deep_sleep.core.scope import Scope
from tests.jobs.test_approve import live_ids, seed_40_percent
from tests.jobs.test_undo import rows
from tests.s3util import fresh_s3, new_bucket
from tests.storeutil import small_graph

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


def _applied_runs(store, scopes: list[Scope]) -> dict[str, dict]:
    with store.pg() as con:
        rows = con.execute("SELECT scope_path, run_id::text, status, diff_hash, snapshot_uri, diff_uri, hold_status"
                           " FROM consolidation_runs WHERE scope_path = ANY(%s) AND mode = 'nightly'",
                           ([s.path for s in scopes],)).fetchall()
    keys = ("run_id", "status", "diff_hash", "snapshot_uri", "diff_uri", "hold_status")
    return {r[0]: dict(zip(keys, r[1:])) for r in rows}


@pytest.fixture(scope="module")
def s3_night(prefect_harness, store, s3_endpoint, tmp_path_factory):
    """One night with ``runs_dir = s3://<bucket>/runs`` over 4 scopes in shards of at most 3 (a shard of
    three and a shard of one).  The first and the last scope (one in each shard) would delete 40 % of
    their nodes: held for approval.  Local staging goes to a temp dir of the module's own and the
    working directory is an empty one (a URL mangled into a local path would land there); both stay
    so for the whole module (approve, undo and gc stage there too)."""
    from deep_sleep.flows.nightly import NightlyParameters, run_nightly

    root = tmp_path_factory.mktemp("s3night")
    tmp, cwd = root / "tmp", root / "cwd"
    tmp.mkdir()
    cwd.mkdir()
    tag = uuid.uuid4().hex[:8]
    scopes = [Scope.root("org", f"s3{tag}").child("brand", f"b{i}") for i in range(4)]
    weak = {s.path: seed_40_percent(store, s)["weak"] for s in (scopes[0], scopes[3])}
    for s in scopes[1:3]:
        small_graph(store, s, NOW)
    before = {s.path: rows(store, s, without_version=True) for s in scopes}
    bucket = new_bucket(s3_endpoint)
    runs = f"s3://{bucket}/runs"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(tempfile, "tempdir", str(tmp))
        mp.setenv("DEEP_SLEEP_CACHE_DIR", str(root / "cache"))
        mp.chdir(cwd)
        summary = run_nightly(NightlyParameters(as_of=NOW, dsn=store.dsn, runs_dir=runs,
                                                scopes=[s.display() for s in scopes], shard_scopes=3, data_quality=True))
        yield {"summary": summary, "scopes": scopes, "runs": runs, "bucket": bucket, "tmp": tmp, "cwd": cwd,
               "weak": weak, "before": before, "root": root}


def _nothing_local(night) -> None:
    """No staging directory left, nothing under the working directory (no folder named ``s3:``)."""
    assert list(night["tmp"].iterdir()) == [] and list(night["cwd"].iterdir()) == []


@pytest.mark.flow
def test_a_night_on_s3_applies_every_scope_and_leaves_its_files_in_the_bucket_only(store, s3_night):
    summary, scopes, runs = s3_night["summary"], s3_night["scopes"], s3_night["runs"]
    assert summary["due"] == 4 and summary["shards"] == 2, summary
    assert summary["applied"] == 4 and summary["failed"] == 0, summary["rows"]
    ledger = _applied_runs(store, scopes)
    assert {r["status"] for r in ledger.values()} == {"applied"} and len(ledger) == 4
    assert ledger[scopes[0].path]["hold_status"] == ledger[scopes[3].path]["hold_status"] == "pending"
    fs = fresh_s3()
    for r in ledger.values():
        assert r["snapshot_uri"].startswith(runs + "/") and r["diff_uri"].startswith(runs + "/"), r
        assert fs.isfile(r["snapshot_uri"] + "/manifest.json"), r["snapshot_uri"]
    shard_dirs = {r["diff_uri"] for r in ledger.values()}
    assert len(shard_dirs) == 2  # the shard of three shares one diff directory; the shard of one has its own
    many = [d for d in shard_dirs if "/_shards/" in d]
    (one,) = shard_dirs - set(many)
    assert fs.isfile(many[0] + "/reports.parquet") and fs.isfile(one + "/report.json")
    objects = fs.find(s3_night["bucket"])
    assert any(o.endswith("memory_nodes.updates.parquet") for o in objects)
    # the held rows of the first scope are in the bucket too (written by the apply, published after it)
    assert any("/held/" in o for o in objects), objects
    # the night's data-quality results went to the bucket, not to a local folder named after the URL
    assert summary["data_quality"]["results_path"].startswith(runs + "/_nightly/"), summary["data_quality"]
    assert fs.isfile(summary["data_quality"]["results_path"])
    _nothing_local(s3_night)


@pytest.mark.flow
def test_replay_compare_and_read_scope_diff_from_s3_give_the_ledger_hash(store, s3_night, tmp_path, capsys):
    from deep_sleep.cli import main
    from deep_sleep.run.layout import read_scope_diff, read_scope_report

    scopes = s3_night["scopes"]
    ledger = _applied_runs(store, scopes)
    for s in scopes:
        r = ledger[s.path]
        assert read_scope_diff(r["diff_uri"], s.path).content_hash() == r["diff_hash"], s
        assert read_scope_report(r["diff_uri"], s.path).diff_hash == r["diff_hash"]
    for s in (scopes[1], scopes[3]):  # a scope of the shard of three, the shard of one
        r, out = ledger[s.path], tmp_path / f"replay-{s.levels[-1][1]}"
        code = main(["replay", r["snapshot_uri"], "--as-of", NOW.isoformat(), "--out", str(out), "--scope", s.display()])
        assert code == 0 and f"hash {r['diff_hash']}" in capsys.readouterr().out
        assert main(["compare", r["diff_uri"], str(out), "--scope", s.display()]) == 0, capsys.readouterr().out
    _nothing_local(s3_night)


@pytest.mark.flow
def test_approve_and_reject_read_the_held_rows_from_s3(store, s3_night):
    from deep_sleep.jobs.approve import approve, read_holds, reject
    from deep_sleep.jobs.ledger import get_run
    from deep_sleep.jobs.undo import undo
    from deep_sleep.run.layout import read_scope_report

    scopes, runs, weak = s3_night["scopes"], s3_night["runs"], s3_night["weak"]
    many, one = scopes[0], scopes[3]  # held in the shard of three, and in the shard of one
    ledger = _applied_runs(store, scopes)
    assert set(weak[many.path]) <= live_ids(store, many) and set(weak[one.path]) <= live_ids(store, one)
    h = read_holds(store, ledger[many.path]["run_id"])
    assert h.pending == ["prune_orphans"] and "4 of 10 semantic nodes" in h.why()[0]

    d = approve(store, ledger[many.path]["run_id"], decided_by="test")
    assert d.applied == {"memory_nodes": {"deletes": 4}} and d.conflicts == 0
    assert not (set(weak[many.path]) & live_ids(store, many))
    approval = get_run(store, d.approval_run_id)
    fs = fresh_s3()
    assert approval.diff_uri.startswith(runs + "/_shards/") and fs.isfile(approval.diff_uri + "/report.json")
    assert read_scope_report(approval.diff_uri).status == "applied"

    r = reject(store, ledger[one.path]["run_id"], decided_by="test")
    assert r.held_rows == {"memory_nodes": {"deletes": 4}} and set(weak[one.path]) <= live_ids(store, one)
    # the decision is noted in the run's report.json in the bucket
    assert read_scope_report(ledger[one.path]["diff_uri"]).held["decisions"] == {"prune_orphans": "rejected"}
    # the approval is a run of its own, with its files in the bucket: undo reads them back
    assert undo(store, d.approval_run_id).complete and set(weak[many.path]) <= live_ids(store, many)
    _nothing_local(s3_night)


@pytest.mark.flow
def test_undo_of_an_s3_run_restores_the_store(store, s3_night, capsys):
    from deep_sleep.cli import main

    s = s3_night["scopes"][1]
    run_id = _applied_runs(store, [s])[s.path]["run_id"]
    assert rows(store, s, without_version=True) != s3_night["before"][s.path]  # the night changed it
    code = main(["--dsn", store.dsn, "undo", run_id])
    assert code == 0, capsys.readouterr().out
    assert rows(store, s, without_version=True) == s3_night["before"][s.path]
    _nothing_local(s3_night)


@pytest.mark.flow
def test_gc_lists_keeps_and_removes_run_directories_on_s3(store, s3_night, capsys):
    from deep_sleep.cli import main
    from deep_sleep.core import files
    from deep_sleep.jobs.gc import gc, list_run_dirs
    from deep_sleep.jobs.ledger import get_run

    scopes, runs = s3_night["scopes"], s3_night["runs"]
    ledger = _applied_runs(store, scopes)
    shard_dir, single_dir = files.parent(ledger[scopes[0].path]["diff_uri"]), files.parent(ledger[scopes[3].path]["diff_uri"])
    dirs = {d.path: d for d in list_run_dirs(runs)}
    nightly = [p for p in dirs if "/_nightly/" in p]
    assert {shard_dir, single_dir} <= set(dirs) and len(nightly) == 1, sorted(dirs)
    assert all(d.bytes > 0 for d in dirs.values())
    fs = fresh_s3()

    assert main(["--dsn", store.dsn, "gc", "--keep-days", "100000", "--runs-dir", runs, "--dry-run"]) == 0
    assert "would remove 0 directories" in capsys.readouterr().out
    later = datetime.now(UTC) + timedelta(days=60)
    dry = gc(store, runs, 30, dry_run=True, now=later)
    assert nightly[0] in {a.path for a in dry.removed} and fs.isdir(nightly[0])
    result = gc(store, runs, 30, now=later)
    # the shard's directory holds runs that can still be undone (scopes 0 and 2): kept, as is the shard of one's
    assert {shard_dir, single_dir} <= {a.path for a in result.kept}
    assert fs.isdir(shard_dir) and fs.isdir(single_dir) and not fs.exists(nightly[0])
    assert result.runs_marked_not_undoable == ()

    forced = gc(store, runs, 30, force=True, now=later)
    undoable = {ledger[s.path]["run_id"] for s in (scopes[0], scopes[2], scopes[3])}  # scope 1's run was undone
    marked = set(forced.runs_marked_not_undoable)
    assert undoable <= marked
    # besides this night's runs, only runs that keep no files (quick naps: their archive rows belong to every
    # runs directory's gc) — on the session's shared store, those of tests that ran earlier (tests/online)
    others = [get_run(store, r) for r in marked - undoable]
    assert all(r.diff_uri is None and r.mode == "quick_nap" for r in others), others
    assert fresh_s3().find(f"{s3_night['bucket']}/runs") == []
    assert all(get_run(store, r).not_undoable for r in undoable)
    _nothing_local(s3_night)
