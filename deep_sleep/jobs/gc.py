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
  nightly's own ``_nightly/<night>/`` folders go when older than the cutoff.

:func:`plan_gc` decides (pure: directory entries and ledger rows in, actions out);
:func:`gc` lists, decides and carries it out (``dry_run``: decides and reports only).
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from psycopg.rows import dict_row

from deep_sleep.core.errors import InputError
from deep_sleep.core.snapshot import utc
from deep_sleep.store.db import Store

_RUN_DIR = re.compile(r"^(\d{8}T\d{6}\.\d{6}Z)_([0-9a-f-]{36})$")


@dataclass(frozen=True)
class RunDir:
    """A directory under the runs directory: a run's (``run_id`` known) or the nightly's own."""

    path: Path
    stamp: datetime | None  # the as_of in the directory name, or the directory's mtime
    run_id: str | None
    bytes: int


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
    path: Path | None  # None: archive rows only
    run_id: str | None
    remove: bool
    reason: str
    marks_not_undoable: bool = False
    bytes: int = 0


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
    base = Path(runs_dir)
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


def plan_gc(dirs: Iterable[RunDir], runs: Mapping[str, LedgerRun], cutoff: datetime, force: bool,
            archived_runs: Iterable[str] = ()) -> list[GcAction]:
    """What to do with each directory older than ``cutoff`` and each old run's archive rows (pure)."""
    actions: list[GcAction] = []
    seen: set[str] = set()
    for d in dirs:
        run = runs.get(d.run_id) if d.run_id else None
        age = run.as_of if run is not None else d.stamp
        if age is None or age >= cutoff:
            continue
        if run is None:
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
        archived = [r["run_id"] for r in cur.execute(
            "SELECT DISTINCT a.run_id::text AS run_id FROM consolidation_archive a "
            "JOIN consolidation_runs r USING (run_id) WHERE r.as_of < %s", (cutoff,)).fetchall()]
    actions = plan_gc(dirs, runs, cutoff, force, archived)
    marked = tuple(sorted({a.run_id for a in actions if a.marks_not_undoable and a.run_id}))
    gone = sorted({a.run_id for a in actions if a.remove and a.run_id and a.run_id in runs})
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
                            ([a.run_id for a in actions if a.remove and a.path is not None and a.run_id in runs],))
    for a in actions:
        if a.remove and a.path is not None:
            shutil.rmtree(a.path, ignore_errors=True)
            try:
                a.path.parent.rmdir()  # the scope's folder, once empty
            except OSError:
                pass
    return GcResult(cutoff, False, tuple(actions), removed_rows, marked)


def gc_markdown(result: GcResult) -> str:
    """A short report of a gc for the terminal."""
    verb = "would remove" if result.dry_run else "removed"
    lines = [f"gc (cutoff {result.cutoff.isoformat(timespec='seconds')}): {verb} {len(result.removed)} "
             f"director{'y' if len(result.removed) == 1 else 'ies'} ({result.bytes_freed / 1e6:.1f} MB), "
             f"{result.archive_rows_removed} archive rows; kept {len(result.kept)} (still undoable)"]
    if result.runs_marked_not_undoable:
        lines.append(f"marked not undoable: {', '.join(r[:8] for r in result.runs_marked_not_undoable)}")
    for a in result.actions:
        where = a.path if a.path is not None else f"archive of run {a.run_id}"
        lines.append(f"  {'remove' if a.remove else 'keep  '}  {where}  — {a.reason}")
    return "\n".join(lines)


__all__ = ["GcAction", "GcResult", "LedgerRun", "RunDir", "gc", "gc_markdown", "list_run_dirs", "plan_gc"]
