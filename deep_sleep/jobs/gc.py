"""Retention: remove old run directories and archive rows, never silently breaking an undo (issue 16).

Run directories grow every night (a 1M-node scope's snapshot is ~180 MB of Parquet).  ``gc``
removes the directories and ``consolidation_archive`` rows of runs older than ``keep_days``:

* a run that can still be undone (applied, not an undo, not undone, not marked otherwise) needs
  its snapshot (prior values of updated columns), its diff (which columns it changed) and its
  archive rows (deleted rows): those are **kept** unless ``force`` — and then the run's ledger row
  is marked ``not_undoable`` (with why and when), so the ledger never points at missing files
  while claiming the run can be undone, and ``deep-sleep undo`` refuses it by name;
* a run that cannot be undone any more (failed, undone, an undo, already marked) needs nothing:
  its files and archive rows go;
* a directory with no ledger row (a run that died before its ledger row, a stray copy) and the
  nightly's own ``_nightly/<night>/`` folders go when older than the cutoff;
* a shard's directory (``_shards/<as_of>_<shard id>``) holds the files of every run of the shard
  (the ledger rows whose ``diff_uri`` is its ``diff/``): it is kept while any of them can be undone,
  and ``force`` marks them all;
* archive rows are this runs directory's runs' and those of runs that keep no files (quick naps);
  a run whose files live under another runs directory is left to that directory's gc;
* a run whose held rows still await a decision (the current run of its scope for a held phase:
  :func:`deep_sleep.jobs.queue.pending`) keeps its directory, even with ``force``: approving needs
  its held rows and snapshot (issue 37).  Superseded held rows expired and need nothing; a run whose
  files are gone anyway (an earlier release's gc) can still be rejected by phase from the ledger.

The runs directory may be an object-store URL (``s3://bucket/runs``, any fsspec file system): the
directories are listed, sized and removed through fsspec (a "directory" there is a key prefix;
a nightly folder's age is its newest object's).

:func:`plan_gc` decides (pure: directory entries and ledger rows in, actions out);
:func:`gc` lists, decides and carries it out (``dry_run``: decides and reports only).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
from psycopg.rows import dict_row

from deep_sleep.core.errors import InputError
from deep_sleep.core.files import is_remote, join, local_path
from deep_sleep.core.snapshot import utc
from deep_sleep.store.db import Store

_RUN_DIR = re.compile(r"^(\d{8}T\d{6}\.\d{6}Z)_([0-9a-f-]{36})$")


@dataclass(frozen=True)
class RunDir:
    """A directory under the runs directory: a run's (``run_id`` known) or the nightly's own."""

    path: Path | str  # a local path, or a URL on an object store
    stamp: datetime | None  # the as_of in the directory name, or the directory's mtime
    run_id: str | None
    bytes: int
    runs: tuple[str, ...] = ()  # a shard's directory: the runs whose files it holds (filled by gc)


@dataclass(frozen=True)
class LedgerRun:
    """The ledger facts retention needs about one run."""

    run_id: str
    as_of: datetime
    status: str
    mode: str
    undone: bool
    not_undoable: str | None

    @property
    def undoable(self) -> bool:
        return self.status == "applied" and self.mode != "undo" and not self.undone and self.not_undoable is None


@dataclass(frozen=True)
class GcAction:
    path: Path | str | None  # None: archive rows only
    run_id: str | None
    remove: bool
    reason: str
    marks_not_undoable: bool = False
    bytes: int = 0
    run_ids: tuple[str, ...] = ()  # a shard's directory: its runs (marked or cleared together)

    @property
    def runs(self) -> tuple[str, ...]:
        return self.run_ids or ((self.run_id,) if self.run_id else ())


@dataclass(frozen=True)
class GcResult:
    """What a gc did (or, with ``dry_run``, would do)."""

    cutoff: datetime
    dry_run: bool
    actions: tuple[GcAction, ...] = ()
    archive_rows_removed: int = 0
    runs_marked_not_undoable: tuple[str, ...] = field(default=())

    @property
    def removed(self) -> list[GcAction]:
        return [a for a in self.actions if a.remove and a.path is not None]

    @property
    def kept(self) -> list[GcAction]:
        return [a for a in self.actions if not a.remove]

    @property
    def bytes_freed(self) -> int:
        return sum(a.bytes for a in self.removed)


def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def list_run_dirs(runs_dir: str | Path) -> list[RunDir]:
    """Every run directory (``<scope>/<as_of>_<run_id>``) and nightly folder (``_nightly/<night>``)."""
    if is_remote(runs_dir):
        return _list_remote(str(runs_dir))
    base = local_path(runs_dir)
    out: list[RunDir] = []
    if not base.is_dir():
        return out
    for scope_dir in sorted(p for p in base.iterdir() if p.is_dir()):
        for d in sorted(p for p in scope_dir.iterdir() if p.is_dir()):
            m = _RUN_DIR.match(d.name)
            if m:
                stamp = datetime.strptime(m.group(1), "%Y%m%dT%H%M%S.%fZ").replace(tzinfo=UTC)
                out.append(RunDir(d, stamp, m.group(2), _size(d)))
            elif scope_dir.name == "_nightly":
                out.append(RunDir(d, datetime.fromtimestamp(d.stat().st_mtime, UTC), None, _size(d)))
    return out


def _list_remote(location: str) -> list[RunDir]:
    """:func:`list_run_dirs` on an object store (fsspec): each level is a listing of key prefixes."""
    import fsspec

    fs, root = fsspec.core.url_to_fs(location)
    fs.invalidate_cache()
    out: list[RunDir] = []
    if not fs.isdir(root):
        return out

    def subdirs(path: str) -> list[str]:
        return sorted(e["name"] for e in fs.ls(path, detail=True) if e["type"] == "directory")

    for scope_dir in subdirs(root):
        for d in subdirs(scope_dir):
            name = d.rstrip("/").rsplit("/", 1)[-1]
            found = fs.find(d, detail=True)
            size = sum(int(e.get("size") or 0) for e in found.values())
            m = _RUN_DIR.match(name)
            if m:
                stamp = datetime.strptime(m.group(1), "%Y%m%dT%H%M%S.%fZ").replace(tzinfo=UTC)
                out.append(RunDir(fs.unstrip_protocol(d), stamp, m.group(2), size))
            elif scope_dir.rstrip("/").endswith("/_nightly"):
                times = [e.get("LastModified") or e.get("mtime") for e in found.values()]
                times = [utc(x) if isinstance(x, datetime) else datetime.fromtimestamp(float(x), UTC)
                         for x in times if x is not None]
                out.append(RunDir(fs.unstrip_protocol(d), max(times) if times else None, None, size))
    return out


def _shard_runs(con, dirs: list[RunDir], known: set[str]) -> list[RunDir]:
    """Fill ``runs`` of the directories whose name's id is no run's: a shard's directory holds the runs
    whose ledger ``diff_uri`` is its ``diff/`` (what :mod:`deep_sleep.flows.nightly` records)."""
    wanted = {_diff_uri(d.path): i for i, d in enumerate(dirs) if d.run_id and d.run_id not in known}
    if not wanted:
        return dirs
    found: dict[int, list[str]] = {}
    for run_id, diff_uri in con.execute("SELECT run_id::text, diff_uri FROM consolidation_runs WHERE diff_uri = ANY(%s)",
                                        (list(wanted),)).fetchall():
        found.setdefault(wanted[diff_uri], []).append(run_id)
    return [replace(d, runs=tuple(sorted(found[i]))) if i in found else d for i, d in enumerate(dirs)]


def _prefix(runs_dir: Path | str) -> str:
    """What the ledger's ``diff_uri`` of a run under ``runs_dir`` starts with."""
    return str(runs_dir).rstrip("/") + "/" if is_remote(runs_dir) else str(Path(runs_dir).resolve()) + "/"


def _diff_uri(path: Path | str) -> str:
    return join(str(path), "diff") if is_remote(path) else str((Path(path) / "diff").resolve())


def plan_gc(dirs: Iterable[RunDir], runs: Mapping[str, LedgerRun], cutoff: datetime, force: bool,
            archived_runs: Iterable[str] = (), awaiting: Mapping[str, int] | None = None) -> list[GcAction]:
    """What to do with each directory older than ``cutoff`` and each old run's archive rows (pure).
    ``awaiting``: run id → its held rows still awaiting a decision (those runs' directories stay)."""
    awaiting = awaiting or {}
    actions: list[GcAction] = []
    seen: set[str] = set()
    for d in dirs:
        if d.runs:  # a shard's directory: one decision for all its runs
            waiting = sum(awaiting.get(r, 0) for r in d.runs)
            if waiting and max((runs[r].as_of for r in d.runs if r in runs), default=cutoff) < cutoff:
                actions.append(GcAction(d.path, None, False, _awaiting_why(waiting), bytes=d.bytes, run_ids=d.runs))
            else:
                actions.extend(_plan_shard_dir(d, [runs[r] for r in d.runs if r in runs], cutoff, force))
            seen.update(d.runs)
            continue
        run = runs.get(d.run_id) if d.run_id else None
        age = run.as_of if run is not None else d.stamp
        if age is None or age >= cutoff:
            continue
        if run is not None and awaiting.get(run.run_id):
            actions.append(GcAction(d.path, run.run_id, False, _awaiting_why(awaiting[run.run_id]), bytes=d.bytes))
            seen.add(run.run_id)
        elif run is None:
            why = "a nightly folder" if d.run_id is None else "no ledger row"
            actions.append(GcAction(d.path, d.run_id, True, why, bytes=d.bytes))
        elif not run.undoable:
            actions.append(GcAction(d.path, run.run_id, True, f"run {run.status}, cannot be undone", bytes=d.bytes))
            seen.add(run.run_id)
        elif force:
            actions.append(GcAction(d.path, run.run_id, True, "forced: the run can no longer be undone",
                                    marks_not_undoable=True, bytes=d.bytes))
            seen.add(run.run_id)
        else:
            actions.append(GcAction(d.path, run.run_id, False, "kept: the run can still be undone (--force removes it)",
                                    bytes=d.bytes))
            seen.add(run.run_id)
    for rid in sorted(set(archived_runs) - seen):  # old runs with archive rows but no directory (quick naps)
        run = runs.get(rid)
        if run is None or run.as_of >= cutoff:
            continue
        if not run.undoable:
            actions.append(GcAction(None, rid, True, f"archive of a run {run.status}, cannot be undone"))
        elif force:
            actions.append(GcAction(None, rid, True, "forced: archive removed, the run can no longer be undone",
                                    marks_not_undoable=True))
        else:
            actions.append(GcAction(None, rid, False, "kept: the archive of a run that can still be undone"))
    return actions


def _awaiting_why(rows: int) -> str:
    return (f"kept: {rows} held row(s) await a decision (`deep-sleep held`; approve or reject them, or a newer run "
            "of the scope supersedes them), even with --force")


def _plan_shard_dir(d: RunDir, members: list[LedgerRun], cutoff: datetime, force: bool) -> list[GcAction]:
    """A shard's directory: removed when its newest run is older than ``cutoff`` and none of its runs
    can be undone any more (or ``force``: the undoable ones are marked); kept otherwise."""
    if not members or max(r.as_of for r in members) >= cutoff:
        return []
    undoable = tuple(r.run_id for r in members if r.undoable)
    ids = tuple(r.run_id for r in members)
    if not undoable:
        return [GcAction(d.path, None, True, f"shard of {len(ids)} run(s), none can be undone", bytes=d.bytes, run_ids=ids)]
    if force:
        return [GcAction(d.path, None, True, f"forced: the shard's {len(undoable)} undoable run(s) can no longer be undone",
                         marks_not_undoable=True, bytes=d.bytes, run_ids=ids)]
    return [GcAction(d.path, None, False, f"kept: {len(undoable)} run(s) of the shard can still be undone "
                     "(--force removes it)", bytes=d.bytes, run_ids=ids)]


_LEDGER_SQL = """
SELECT r.run_id::text AS run_id, r.as_of, r.status, r.mode, r.not_undoable,
       EXISTS (SELECT 1 FROM consolidation_runs u WHERE u.undo_of = r.run_id AND u.status = 'applied') AS undone
FROM consolidation_runs r WHERE r.as_of < %s OR r.run_id = ANY(%s::uuid[])
"""


def gc(store: Store, runs_dir: str | Path, keep_days: float, *, force: bool = False, dry_run: bool = False,
       now: datetime | None = None) -> GcResult:
    """Remove run directories and archive rows older than ``keep_days`` (see the module docstring)."""
    if keep_days < 0:
        raise InputError(f"--keep-days must be 0 or more, got {keep_days}")
    cutoff = utc(now or datetime.now(UTC)) - timedelta(days=keep_days)
    dirs = list_run_dirs(runs_dir)
    ids = [d.run_id for d in dirs if d.run_id]
    with store.pg() as con, con.cursor(row_factory=dict_row) as cur:
        runs = {r["run_id"]: LedgerRun(**r) for r in cur.execute(_LEDGER_SQL, (cutoff, ids)).fetchall()}
        dirs = _shard_runs(con, dirs, set(runs))
        members = [r for d in dirs for r in d.runs if r not in runs]
        if members:
            runs |= {r["run_id"]: LedgerRun(**r) for r in cur.execute(_LEDGER_SQL, (cutoff, members)).fetchall()}
        # Archive rows of this runs directory's runs, and of runs that keep no files (quick naps);
        # a run whose files live under another runs directory is that directory's gc's to decide.
        archived = [r["run_id"] for r in cur.execute(
            "SELECT DISTINCT a.run_id::text AS run_id FROM consolidation_archive a "
            "JOIN consolidation_runs r USING (run_id) WHERE r.as_of < %s "
            "AND (r.diff_uri IS NULL OR starts_with(r.diff_uri, %s))", (cutoff, _prefix(runs_dir))).fetchall()]
    from deep_sleep.jobs.queue import pending

    queue = pending(store)
    awaiting = dict(queue.group_by("run_id").agg(pl.col("rows").sum()).iter_rows()) if queue.height else {}
    actions = plan_gc(dirs, runs, cutoff, force, archived, awaiting)
    marked = tuple(sorted({r for a in actions if a.marks_not_undoable for r in a.runs if r in runs and runs[r].undoable}))
    gone = sorted({r for a in actions if a.remove for r in a.runs if r in runs})
    removed_rows = 0
    if dry_run:
        return GcResult(cutoff, True, tuple(actions), 0, marked)
    # The ledger first: a crash after it and before the files go leaves files nobody may undo
    # from (removed by the next gc), never a ledger row promising an undo whose files are gone.
    with store.pg() as con:
        with con.transaction():
            if marked:
                con.execute("UPDATE consolidation_runs SET not_undoable = %s WHERE run_id = ANY(%s::uuid[]) "
                            "AND not_undoable IS NULL",
                            (f"before-images removed by gc at {datetime.now(UTC).isoformat(timespec='seconds')}", list(marked)))
            if gone:
                removed_rows = con.execute("DELETE FROM consolidation_archive WHERE run_id = ANY(%s::uuid[])",
                                           (gone,)).rowcount
                con.execute("UPDATE consolidation_runs SET files_removed_at = now() WHERE run_id = ANY(%s::uuid[])",
                            ([r for a in actions if a.remove and a.path is not None for r in a.runs if r in runs],))
    for a in actions:
        if a.remove and a.path is not None:
            _remove(a.path)
    return GcResult(cutoff, False, tuple(actions), removed_rows, marked)


def _remove(path: Path | str) -> None:
    """Remove a run directory: on an object store every object under its prefix (fsspec), on local
    disk the tree and then the scope's folder once empty."""
    if is_remote(path):
        import fsspec

        fs, root = fsspec.core.url_to_fs(str(path))
        if fs.exists(root):
            fs.rm(root, recursive=True)
        return
    path = Path(path)
    shutil.rmtree(path, ignore_errors=True)
    try:
        path.parent.rmdir()  # the scope's folder, once empty
    except OSError:
        pass


def gc_markdown(result: GcResult) -> str:
    """A short report of a gc for the terminal."""
    verb = "would remove" if result.dry_run else "removed"
    lines = [f"gc (cutoff {result.cutoff.isoformat(timespec='seconds')}): {verb} {len(result.removed)} "
             f"director{'y' if len(result.removed) == 1 else 'ies'} ({result.bytes_freed / 1e6:.1f} MB), "
             f"{result.archive_rows_removed} archive rows; kept {len(result.kept)} (still undoable, or held rows awaiting a decision)"]
    if result.runs_marked_not_undoable:
        lines.append(f"marked not undoable: {', '.join(r[:8] for r in result.runs_marked_not_undoable)}")
    for a in result.actions:
        where = a.path if a.path is not None else f"archive of run {a.run_id}"
        lines.append(f"  {'remove' if a.remove else 'keep  '}  {where}  — {a.reason}")
    return "\n".join(lines)


__all__ = ["GcAction", "GcResult", "LedgerRun", "RunDir", "gc", "gc_markdown", "list_run_dirs", "plan_gc"]
