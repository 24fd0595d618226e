"""Retention: old run directories and archive rows go; nothing an undo still needs goes without --force,
and the ledger never claims a run can be undone once its before-images are gone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from deep_sleep.cli import main
from deep_sleep.jobs.errors import UndoError
from deep_sleep.jobs.gc import GcAction, LedgerRun, RunDir, gc, list_run_dirs, plan_gc
from deep_sleep.jobs.ledger import get_run
from deep_sleep.jobs.undo import undo
from deep_sleep.run.pipeline import consolidate
from tests.storeutil import scalar, small_graph

NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
CUT = NOW - timedelta(days=30)


def _run(rid: str, days_ago: float, status: str = "applied", mode: str = "nightly", undone: bool = False,
         not_undoable: str | None = None) -> LedgerRun:
    return LedgerRun(rid, NOW - timedelta(days=days_ago), status, mode, undone, not_undoable)


def test_plan_keeps_what_an_undo_needs_unless_forced():
    dirs = [RunDir(Path(f"/r/s/{n}"), NOW - timedelta(days=d), rid, 100) for n, d, rid in (
        ("old-applied", 40, "a"), ("old-failed", 40, "f"), ("old-undone", 40, "u"), ("new-applied", 3, "n"),
        ("orphan", 50, "o"))] + [RunDir(Path("/r/_nightly/x"), NOW - timedelta(days=45), None, 7)]
    runs = {"a": _run("a", 40), "f": _run("f", 40, status="failed"), "u": _run("u", 40, undone=True),
            "n": _run("n", 3), "q": _run("q", 60, mode="quick_nap"), "m": _run("m", 60, not_undoable="gc")}
    plain = {(a.path.name if a.path else f"archive:{a.run_id}"): a for a in plan_gc(dirs, runs, CUT, False, ["q", "m", "a"])}
    assert not plain["old-applied"].remove and "undone" in plain["old-applied"].reason
    assert plain["old-failed"].remove and plain["old-undone"].remove and plain["orphan"].remove and plain["x"].remove
    assert "new-applied" not in plain  # younger than the cutoff: not considered at all
    assert not plain["archive:q"].remove  # a quick nap's deletes are undoable from the archive alone
    assert plain["archive:m"].remove  # already marked not undoable
    assert not any(a.marks_not_undoable for a in plain.values())
    forced = {(a.path.name if a.path else f"archive:{a.run_id}"): a for a in plan_gc(dirs, runs, CUT, True, ["q", "m"])}
    assert forced["old-applied"].remove and forced["old-applied"].marks_not_undoable
    assert forced["archive:q"].remove and forced["archive:q"].marks_not_undoable
    assert not forced["old-failed"].marks_not_undoable
    assert all(isinstance(a, GcAction) for a in forced.values())


def _invariant(store) -> list[str]:
    """Runs the ledger says can be undone whose files are missing (must be none)."""
    bad = []
    with store.pg() as con:
        for rid, snap, diff in con.execute(
                "SELECT run_id::text, snapshot_uri, diff_uri FROM consolidation_runs r WHERE status = 'applied' "
                "AND mode = 'nightly' AND not_undoable IS NULL "
                "AND NOT EXISTS (SELECT 1 FROM consolidation_runs u WHERE u.undo_of = r.run_id)").fetchall():
            if (snap and not Path(snap).is_dir()) or (diff and not Path(diff).is_dir()):
                bad.append(rid)
    return bad


def test_gc_on_the_store(store, scope, runs_dir, capsys):
    small_graph(store, scope, NOW - timedelta(days=40))
    old = consolidate(store, scope, NOW - timedelta(days=40), runs_dir=runs_dir).report()
    second = consolidate(store, scope, NOW - timedelta(days=39), runs_dir=runs_dir).report()
    undo(store, second.run_id)  # an undone run needs nothing any more
    recent = consolidate(store, scope, NOW - timedelta(days=2), runs_dir=runs_dir).report()
    assert {old.status, second.status, recent.status} == {"applied"}
    archived_old = scalar(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s", old.run_id)
    assert archived_old > 0  # the first run deleted rows (the expired working node and its edge)
    dirs = {d.run_id: d.path for d in list_run_dirs(runs_dir)}
    assert {old.run_id, second.run_id, recent.run_id} <= set(dirs)

    dry = gc(store, runs_dir, 30, dry_run=True, now=NOW)
    assert [a.run_id for a in dry.removed] == [second.run_id] and all(p.is_dir() for p in dirs.values())

    result = gc(store, runs_dir, 30, now=NOW)
    assert not dirs[second.run_id].exists()
    assert dirs[old.run_id].is_dir() and dirs[recent.run_id].is_dir()  # old is still undoable: kept
    assert scalar(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s", old.run_id) == archived_old
    assert get_run(store, second.run_id).files_removed_at is not None
    assert result.runs_marked_not_undoable == () and _invariant(store) == []

    forced = gc(store, runs_dir, 30, force=True, now=NOW)
    assert forced.runs_marked_not_undoable == (old.run_id,)
    assert not dirs[old.run_id].exists() and dirs[recent.run_id].is_dir()
    assert scalar(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s", old.run_id) == 0
    record = get_run(store, old.run_id)
    assert record.not_undoable and "gc" in record.not_undoable
    assert _invariant(store) == []
    with pytest.raises(UndoError, match="can no longer be undone"):
        undo(store, old.run_id)

    # the CLI (cutoff from the wall clock: 100,000 days keeps everything)
    code = main(["--dsn", store.dsn, "gc", "--keep-days", "100000", "--runs-dir", str(runs_dir), "--dry-run"])
    assert code == 0 and "would remove 0 directories" in capsys.readouterr().out


def test_a_shard_directory_is_kept_while_any_of_its_runs_can_be_undone(store, scope, runs_dir):
    """A nightly shard's directory (``_shards/<as_of>_<shard id>``) is named after no run: it holds the
    files of every run of the shard, and goes only when none of them can be undone (or ``force``)."""
    import uuid

    from deep_sleep.core.scope import Scope
    from deep_sleep.transforms.config import load_config

    other = Scope.root("org", scope.tenant_id + "x").child("brand", "b1")
    as_of = NOW - timedelta(days=40)
    for s in (scope, other):
        small_graph(store, s, as_of)
    shard_id = str(uuid.uuid4())
    base = runs_dir / "_shards" / f"{as_of.strftime('%Y%m%dT%H%M%S.%fZ')}_{shard_id}"
    applied = consolidate(store, [scope, other], as_of, load_config(overrides={"holds": {"enabled": False}}),
                          runs_dir=runs_dir, run_id=shard_id)
    assert (base / "snapshot").is_dir() and (base / "diff").is_dir()  # a shard of many: under _shards/
    ids = {r.run_id for r in applied.reports.values()}
    assert {r.status for r in applied.reports.values()} == {"applied"}
    (listed,) = [d for d in list_run_dirs(runs_dir) if d.path == base]
    assert listed.run_id not in ids  # the shard's id, not a run's

    kept = gc(store, runs_dir, 30, now=NOW)
    assert base.is_dir() and [a.path for a in kept.kept if a.path is not None] == [base]
    undo(store, applied.reports[scope.path].run_id)  # one run undone, the other still undoable: kept
    assert gc(store, runs_dir, 30, now=NOW).removed == [] and base.is_dir()
    forced = gc(store, runs_dir, 30, force=True, now=NOW)
    assert forced.runs_marked_not_undoable == (applied.reports[other.path].run_id,) and not base.exists()
    assert _invariant(store) == []


def test_a_forced_gc_of_one_runs_directory_leaves_the_runs_of_another_alone(store, scope, tmp_path):
    """Archive rows are swept with the runs directory that holds the run's files (and for runs that keep
    none, the quick naps): a forced gc of ``a/`` neither removes the archive of a run under ``b/`` nor
    marks it not undoable."""
    from deep_sleep.core.scope import Scope

    other = Scope.root("org", scope.tenant_id + "y").child("brand", "b1")
    as_of = NOW - timedelta(days=40)
    runs = {}
    for s, d in ((scope, tmp_path / "a"), (other, tmp_path / "b")):
        small_graph(store, s, as_of)
        runs[d.name] = consolidate(store, s, as_of, runs_dir=d).report()
    kept_rows = scalar(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s", runs["b"].run_id)
    assert kept_rows > 0 and {r.status for r in runs.values()} == {"applied"}

    forced = gc(store, tmp_path / "a", 30, force=True, now=NOW)
    assert runs["a"].run_id in forced.runs_marked_not_undoable
    assert runs["b"].run_id not in forced.runs_marked_not_undoable
    assert scalar(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s", runs["b"].run_id) == kept_rows
    assert get_run(store, runs["b"].run_id).not_undoable is None
    undo(store, runs["b"].run_id)  # still undoable
