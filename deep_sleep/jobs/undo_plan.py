"""Planning an undo, before anything is written: refuse a run that cannot be undone, read its
before-images from its files (:func:`prepare`), and list the guarded statements to run, in order
(:func:`undo_steps`).  Reads only the run's diff and snapshot directories; never the store."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import polars as pl

from deep_sleep.core import tables
from deep_sleep.core.diff import Diff, TableDiff
from deep_sleep.core.errors import DeepSleepError
from deep_sleep.core.scope import Scope
from deep_sleep.core.snapshot import MANIFEST, table_file, Snapshot
from deep_sleep.jobs.errors import UndoError
from deep_sleep.jobs.ledger import RunRecord
from deep_sleep.jobs.undo_sql import (
    AFTER,
    not_restored_sql,
    CLEAR,
    reinsert_deletes_sql,
    remove_inserts_sql,
    restore_updates_sql,
)

KEYS = ("id", "expected_version", "phase")


@dataclass(frozen=True)
class Staged:
    """What one table needs staged: the run's inserts, and its updated rows' before/after images."""

    inserts: pl.DataFrame | None = None
    updates: pl.DataFrame | None = None
    changed: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()  # updated ids the snapshot has no row for
    cleared: tuple[str, ...] = ()  # write-only columns (vectors) the run wrote: set to null where it did (CLEAR)


def _snapshot_rows(snapshot_dir: Path, table: str, ids: pl.Series, scope_path: str) -> pl.DataFrame:
    """The snapshot's rows of ``table`` with these ids, read without loading the whole table (a
    shard's snapshot holds many scopes: only ``scope_path``'s rows)."""
    mpath = snapshot_dir / MANIFEST
    manifest = json.loads(mpath.read_text())
    entry = (manifest.get("tables") or {}).get(table)
    if not entry:
        return tables.empty(table)
    scan = pl.scan_parquet(table_file(snapshot_dir, mpath, table, entry))  # inside the snapshot directory only
    wanted = pl.col("id").is_in(ids.implode())
    if "scope_path" in scan.collect_schema().names():
        wanted = wanted & (pl.col("scope_path") == scope_path)
    frame = scan.filter(wanted).collect()
    fill = {"scope_path": scope_path, "tenant_id": Scope.parse(scope_path).tenant_id}
    frame = frame.with_columns(pl.lit(v).alias(k) for k, v in fill.items() if k not in frame.columns)
    return tables.conform(table, frame).select(c.name for c in tables.TABLES[table])


def _stage_updates(table: str, updates: pl.DataFrame, snapshot_dir: Path, scope_path: str) -> Staged:
    own = tables.columns(table)
    changed = [c for c in updates.columns if c not in KEYS and c in own]
    # A vector the run wrote with a node's new text (tables.WRITE_ONLY: a META node's refreshed summary) has
    # no before-image — snapshots carry no vectors — so it cannot be put back: it is cleared on the rows the
    # run wrote one for, with the text it embeds, and `deep-sleep reembed` computes the restored text's vector.
    cleared = [c for c in updates.columns if c not in KEYS and c not in own]
    keys = updates.group_by("id", maintain_order=True).agg(
        pl.col("expected_version").first(),
        pl.any_horizontal([pl.col(c).is_not_null().any() for c in cleared] or [pl.lit(False)]).alias(CLEAR))
    before = _snapshot_rows(snapshot_dir, table, keys.get_column("id"), scope_path)
    missing = keys.join(before, on="id", how="anti").get_column("id").to_list()
    # What the apply wrote: the snapshot row with every phase's changes folded in (as the apply folds them).
    view = Snapshot.empty(scope_path, datetime.now(UTC)).with_frames({table: before})
    after = Diff({table: TableDiff(updates=updates)}).fold(view).table(table)
    unchanged = [c.name for c in tables.TABLES[table] if c.name not in (*changed, "id", "version")]
    staged = (
        keys.join(before.drop("version"), on="id", how="inner")
        .join(after.select("id", *[pl.col(c).alias(c + AFTER) for c in changed]), on="id", how="left")
    )
    return Staged(updates=staged, changed=tuple(changed), unchanged=tuple(unchanged), missing=tuple(missing),
                  cleared=tuple(cleared))


def without_rows(diff: Diff, held: Diff) -> Diff:
    """``diff`` minus the rows of ``held`` (same table, kind and id)."""
    if not held.has_changes:
        return diff
    out = {}
    for name, td in diff.tables.items():
        frames = {}
        for kind, frame in td.frames().items():
            gone = held.table(name).frames().get(kind)
            if frame.height and gone is not None and gone.height:
                ids = gone.get_column("id").cast(pl.String).implode()
                frame = frame.filter(~pl.col("id").cast(pl.String).is_in(ids))
            frames[kind] = frame
        out[name] = TableDiff(**frames)
    return Diff(out)


def prepare(run: RunRecord) -> dict[str, Staged]:
    """Read the run's diff (and, for updates, its snapshot); refuse when a before-image is out of reach."""
    changed = run.rows_changed or {}
    needs_files = any(k.get("updates") or k.get("inserts") for k in changed.values())
    if not needs_files:
        return {}
    where = f"run {run.run_id} ({run.mode}, scope {run.scope})"
    if not run.diff_uri:
        raise UndoError(
            f"{where} changed {_kinds(changed)} but recorded no diff directory (quick naps keep none), so which rows "
            "it inserted and what the rows it updated held before are unknown; it cannot be undone. Nothing was changed."
        )
    from deep_sleep.core.files import fetch_dir, is_remote

    try:
        diff_dir = fetch_dir(run.diff_uri)
    except DeepSleepError:
        diff_dir = None
    if diff_dir is None or not diff_dir.is_dir():
        raise UndoError(
            f"{where} changed {_kinds(changed)} but its diff directory {run.diff_uri} is not there; "
            "the list of rows it inserted and updated lives only there. Nothing was changed. "
            "Restore the run directory from backup and retry."
        )
    from deep_sleep.run.holds import read_held
    from deep_sleep.run.layout import read_scope_diff

    # The rows the run held for approval never applied with it (an approval is a run of its own):
    # what this run changed is its diff minus its held rows.
    diff = without_rows(read_scope_diff(diff_dir, run.scope_path), read_held(run.diff_uri, run.scope_path)[0])
    out: dict[str, Staged] = {}
    for table, td in diff.tables.items():
        staged = Staged()
        if td.inserts.height:
            present = [c for c in td.inserts.columns if c in tables.columns(table)]
            staged = Staged(inserts=td.inserts.select(present))
        if td.updates.height:
            snap = None
            if run.snapshot_uri:
                try:
                    snap = fetch_dir(run.snapshot_uri) if is_remote(run.snapshot_uri) else Path(run.snapshot_uri)
                except DeepSleepError:
                    snap = None
            if snap is None or not (snap / MANIFEST).is_file():
                raise UndoError(
                    f"{where} updated {td.updates.height} row(s) of {table}, but its snapshot "
                    f"{run.snapshot_uri or '(none recorded)'} is not there: the prior values of updated columns live only "
                    "there. Nothing was changed. Restore the run directory from backup and retry."
                )
            up = _stage_updates(table, td.updates, snap, run.scope_path)
            staged = Staged(inserts=staged.inserts, updates=up.updates, changed=up.changed,
                             unchanged=up.unchanged, missing=up.missing, cleared=up.cleared)
        out[table] = staged
    return out


def _kinds(changed: dict[str, dict[str, int]]) -> str:
    return ", ".join(f"{t} {k}={n}" for t, kinds in sorted(changed.items()) for k, n in kinds.items() if n)


def refuse(run: RunRecord) -> None:
    """Raise when the run cannot be undone."""
    if run.mode == "undo":
        raise UndoError(f"run {run.run_id} is itself an undo (of run {run.undo_of}); an undo cannot be undone — "
                        "re-run consolidation for the scope instead")
    if run.status == "undone":
        by = f" by undo run {run.undone_by}" if run.undone_by else ""
        raise UndoError(f"run {run.run_id} (scope {run.scope}) was already undone{by}; nothing to do")
    if run.status != "applied":
        raise UndoError(f"run {run.run_id} (scope {run.scope}) has status {run.status!r}: it applied nothing, so there is "
                        "nothing to undo")
    if run.not_undoable:
        raise UndoError(f"run {run.run_id} (scope {run.scope}) can no longer be undone: {run.not_undoable} "
                        "(`deep-sleep gc --force`); nothing was changed")


@dataclass(frozen=True)
class UndoStep:
    """One guarded statement of an undo: revert one kind of change (``inserts`` removed, ``updates``
    restored, ``deletes`` re-inserted) in one table, then list the changes it left as they are.

    sql, params: the revert; returns one row, the count of reverted rows.
    not_restored_sql, not_restored_params: the changes left, with the reason (id, reason, live_version).
    """

    table: str
    kind: str
    sql: str
    params: tuple
    not_restored_sql: str
    not_restored_params: tuple


def _node_tables_first(names: Iterable[str]) -> list[str]:
    return sorted(names, key=lambda t: (t != "memory_nodes", t))


def _edge_tables_first(names: Iterable[str]) -> list[str]:
    return sorted(names, key=lambda t: (t != "memory_edges", t))


def undo_steps(run_id: str, scope_path: str, undo_run_id: str, staged: dict[str, Staged],
               archived: Iterable[str], cluster_cap: int | None = None) -> tuple[UndoStep, ...]:
    """The statements that undo run ``run_id``, in order: 1. remove the rows it inserted, 2. restore
    the values it changed, 3. re-insert the rows it deleted (``archived``: the tables it archived
    rows of).  Removals take edges before nodes, re-inserts nodes before edges, so the graph is whole
    after every statement; ``cluster_cap``: no META node gets more CLUSTERS edges back than this
    (:func:`~deep_sleep.jobs.undo_sql.reinsert_deletes_sql`).  A pure function of its arguments."""
    steps = []
    for table in _edge_tables_first(t for t, st in staged.items() if st.inserts is not None and st.inserts.height):
        reason = f"inserted by run {run_id}, removed by its undo"
        steps.append(UndoStep(table, "inserts", remove_inserts_sql(table, staged[table].inserts.columns),
                              (scope_path, undo_run_id, reason), not_restored_sql(table, "inserts"), (scope_path,)))
    for table in _node_tables_first(t for t, st in staged.items() if st.updates is not None and st.updates.height):
        st = staged[table]
        steps.append(UndoStep(table, "updates", restore_updates_sql(table, list(st.changed), list(st.unchanged),
                                                                      list(st.cleared)),
                              (scope_path,), not_restored_sql(table, "updates"), (scope_path,)))
    for table in _node_tables_first(archived):
        steps.append(UndoStep(table, "deletes", reinsert_deletes_sql(table, cluster_cap), (scope_path, run_id),
                              not_restored_sql(table, "deletes", cluster_cap), (scope_path, run_id)))
    return tuple(steps)
