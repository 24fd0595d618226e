"""Undo one applied run: put back what it changed, unless a row changed since (SPEC §6).

Where the before-images are:

- rows the run **deleted** are in ``consolidation_archive`` (``to_jsonb`` of the whole row);
- prior values of the columns the run **updated** are in its stored snapshot
  (``consolidation_runs.snapshot_uri``); which columns it changed, in its diff directory
  (``diff_uri``, ``<table>.updates.parquet``);
- rows the run **inserted** are listed in the diff (``<table>.inserts.parquet``).

"Unless a row changed since", per kind of change:

- updated row: restored only if its ``version`` is exactly the snapshot's + 1 (the trigger bumps
  it once per UPDATE and the apply writes each row once) *and* it still holds exactly the values
  the run wrote (the rest of its snapshot columns included).  That second test matters for rows
  the apply skipped as conflicts: a live writer made the one change, so there is nothing of the
  run's to undo.  Restored rows get the snapshot's values of the changed columns back, byte for
  byte — and their ``version`` bumps once more (the undo is an UPDATE like any other).
- inserted row: deleted only if its ``version`` is still 1 and it holds exactly what the run
  inserted.  Removed rows are archived under the undo's own run id (``op = 'undo'``), so an undo
  never loses data either.
- deleted row: re-inserted from the archive (``jsonb_populate_record``) unless a row with that id,
  or with the same natural key (any unique constraint), exists again.  INSERT fires no version
  trigger, so the row comes back byte for byte: every column, ``version``, embedding and
  timestamps included.

Everything happens in one transaction under the scope's advisory lock (the apply's lock), set
based: the before/after images are staged through ADBC into temporary tables and each kind of
change is reverted by one guarded statement.  The ledger records it: the undone run's status
becomes ``'undone'`` and a new row (``mode = 'undo'``, ``status = 'applied'``, ``undo_of`` = the
run) holds ``rows_changed`` (what the undo itself wrote: updates = restored rows, deletes =
removed inserts, inserts = re-inserted rows), ``conflicts`` (rows not restored) and
``not_restored`` (table → kind of the undone change → reason → rows).  A run may be undone even
if later runs applied after it; rows they touched since fail the guards and are reported.
Undoing an undo, an undone run or a failed run is refused; nothing is written then.

    >>> result = undo(store, "6f1c…")                 # doctest: +SKIP
    >>> result.reverted                               # doctest: +SKIP
    {'memory_nodes': {'updates': 3, 'deletes': 1}, 'memory_edges': {'inserts': 6}}
    >>> result.not_restored.select("table", "kind", "id", "reason")   # doctest: +SKIP
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import polars as pl

from deep_sleep.core import tables
from deep_sleep.core.diff import Diff, TableDiff
from deep_sleep.core.errors import DeepSleepError
from deep_sleep.core.scope import Scope
from deep_sleep.core.snapshot import MANIFEST, Snapshot
from deep_sleep.jobs.errors import UndoError
from deep_sleep.jobs.ledger import RunRecord, get_run
from deep_sleep.run.console import markdown_table
from deep_sleep.store.db import Store

KEYS = ("id", "expected_version", "phase")
AFTER = "__after"  # suffix of the staged columns holding what the run wrote
DONE = "_ds_undo_done"  # temp table: (table_name, kind, id) of every reverted row
NOT_RESTORED_SCHEMA = {"table": pl.String(), "kind": pl.String(), "id": pl.String(), "reason": pl.String(),
                       "live_version": pl.Int64()}

GONE = "deleted since the run's snapshot"
NOT_THERE = "not in the store (the apply skipped it as a conflict, or it was deleted since)"
CHANGED = "changed since the run"
NOT_WRITTEN_UPDATE = "not written by this run (a live write came first; the apply skipped it as a conflict)"
NOT_WRITTEN_INSERT = "not written by this run (the id was already taken when the run applied)"
NO_BEFORE_IMAGE = "no before-image in the run's snapshot"
ID_EXISTS = "a row with this id exists again"
KEY_EXISTS = "a row with the same natural key exists"



@dataclass(frozen=True)
class UndoResult:
    """What an undo did.

    run_id: the run undone.  undo_run_id: the undo's own ledger row.  scope_path: their scope.
    reverted: table → kind of the run's change (``inserts`` removed, ``updates`` restored,
      ``deletes`` re-inserted) → rows.
    not_restored: one row per change left as it is: table, kind, id, reason, live_version (the
      row's version now; null when it is gone).
    """

    run_id: str
    undo_run_id: str
    scope_path: str
    reverted: dict[str, dict[str, int]] = field(default_factory=dict)
    not_restored: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=NOT_RESTORED_SCHEMA))

    @property
    def complete(self) -> bool:
        """True when every change of the run was reverted."""
        return self.not_restored.height == 0

    def not_restored_counts(self) -> dict[str, dict[str, dict[str, int]]]:
        """table → kind → reason → rows."""
        out: dict[str, dict[str, dict[str, int]]] = {}
        for r in self.not_restored.group_by("table", "kind", "reason").len().sort("table", "kind", "reason").iter_rows(named=True):
            out.setdefault(r["table"], {}).setdefault(r["kind"], {})[r["reason"]] = int(r["len"])
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "undo_run_id": self.undo_run_id, "scope_path": self.scope_path,
                "reverted": self.reverted, "not_restored": self.not_restored.to_dicts()}


# -- the SQL (pure) --------------------------------------------------------------------------

def stage_name(table: str, kind: str) -> str:
    return f"_ds_undo_{table}_{kind}"


def _lit(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _same(table: str, column: str, staged: str) -> str:
    return f"t.{column} IS NOT DISTINCT FROM {tables.columns(table)[column].cast_sql('s.' + staged)}"


def _mark(table: str, kind: str, ids: str) -> str:
    return (f" marked AS (INSERT INTO {DONE} (table_name, kind, id) SELECT '{table}', '{kind}', {ids} RETURNING 1)"
            f" SELECT count(*) AS n FROM marked")


def remove_inserts_sql(table: str, present: list[str]) -> str:
    """Delete the rows the run inserted that are unchanged (version 1, the inserted values) and archive
    them under the undo's run id.  Parameters: $1 scope_path, $2 undo run id, $3 archive reason."""
    guards = " AND ".join(["t.version = 1", *(_same(table, c, c) for c in present if c not in ("id", "version"))])
    return (
        f"WITH gone AS (DELETE FROM {table} t USING {stage_name(table, 'inserts')} s"
        f" WHERE t.id = s.id::uuid AND t.scope_path = $1 AND {guards} RETURNING t.*),"
        f" archived AS (INSERT INTO consolidation_archive (run_id, table_name, row_id, op, reason, row)"
        f" SELECT $2::uuid, '{table}', gone.id::text, 'undo', $3, to_jsonb(gone) FROM gone RETURNING row_id),"
        + _mark(table, "inserts", "row_id FROM archived")
    )


def restore_updates_sql(table: str, changed: list[str], unchanged: list[str]) -> str:
    """Put the snapshot's values of ``changed`` back on rows the run updated and nobody touched since:
    version = snapshot + 1, ``changed`` hold what the run wrote, ``unchanged`` hold the snapshot's
    values.  Parameters: $1 scope_path."""
    cols = tables.columns(table)
    sets = ", ".join(f"{c} = {cols[c].cast_sql('s.' + c)}" for c in changed)
    guards = " AND ".join(["t.version = s.expected_version + 1", *(_same(table, c, c + AFTER) for c in changed),
                           *(_same(table, c, c) for c in unchanged)])
    return (
        f"WITH done AS (UPDATE {table} t SET {sets} FROM {stage_name(table, 'updates')} s"
        f" WHERE t.id = s.id::uuid AND t.scope_path = $1 AND {guards} RETURNING t.id),"
        + _mark(table, "updates", "id::text FROM done")
    )


def reinsert_deletes_sql(table: str) -> str:
    """Re-insert the run's archived rows of ``table`` whose id and natural keys are free.
    Parameters: $1 scope_path, $2 the undone run id."""
    return (
        f"WITH src AS (SELECT a.row FROM consolidation_archive a WHERE a.run_id = $2::uuid"
        f" AND a.table_name = '{table}' AND a.op = 'delete' AND a.row->>'scope_path' = $1),"
        f" ins AS (INSERT INTO {table} OVERRIDING SYSTEM VALUE SELECT r.* FROM src,"
        f" LATERAL jsonb_populate_record(NULL::{table}, src.row) r"
        f" WHERE NOT EXISTS (SELECT 1 FROM {table} x WHERE x.id = r.id) ON CONFLICT DO NOTHING RETURNING id),"
        + _mark(table, "deletes", "id::text FROM ins")
    )


def not_restored_sql(table: str, kind: str) -> str:
    """The changes of ``kind`` in ``table`` left as they are, with the reason.  $1 scope_path[, $2 run id]."""
    skipped = f"NOT EXISTS (SELECT 1 FROM {DONE} d WHERE d.table_name = '{table}' AND d.kind = '{kind}' AND d.id = {{id}})"
    if kind == "deletes":
        return (
            f"SELECT a.row_id AS id, CASE WHEN x.id IS NOT NULL THEN {_lit(ID_EXISTS)} ELSE {_lit(KEY_EXISTS)} END AS reason,"
            f" x.version AS live_version FROM consolidation_archive a LEFT JOIN {table} x ON x.id = (a.row->>'id')::uuid"
            f" WHERE a.run_id = $2::uuid AND a.table_name = '{table}' AND a.op = 'delete' AND a.row->>'scope_path' = $1"
            f" AND {skipped.format(id='a.row_id')} ORDER BY a.row_id"
        )
    expected = "s.expected_version + 1" if kind == "updates" else "1"
    not_written = NOT_WRITTEN_UPDATE if kind == "updates" else NOT_WRITTEN_INSERT
    gone = GONE if kind == "updates" else NOT_THERE
    return (
        f"SELECT s.id, CASE WHEN t.id IS NULL THEN {_lit(gone)} WHEN t.version <> {expected} THEN {_lit(CHANGED)}"
        f" ELSE {_lit(not_written)} END AS reason, t.version AS live_version"
        f" FROM {stage_name(table, kind)} s LEFT JOIN {table} t ON t.id = s.id::uuid AND t.scope_path = $1"
        f" WHERE {skipped.format(id='s.id')} ORDER BY s.id"
    )


UNDONE_SQL = "UPDATE consolidation_runs SET status = 'undone' WHERE run_id = $1::uuid AND status = 'applied'"
UNDO_LEDGER_SQL = (
    "INSERT INTO consolidation_runs (run_id, scope_path, mode, as_of, started_at, finished_at, status,"
    " rows_changed, conflicts, undo_of, not_restored)"
    " VALUES ($1::uuid, $2, 'undo', $3, $3, now(), 'applied', $4::jsonb, $5, $6::uuid, $7::jsonb)"
)


# -- before-images from files ----------------------------------------------------------------

@dataclass(frozen=True)
class _Staged:
    """What one table needs staged: the run's inserts, and its updated rows' before/after images."""

    inserts: pl.DataFrame | None = None
    updates: pl.DataFrame | None = None
    changed: tuple[str, ...] = ()
    unchanged: tuple[str, ...] = ()
    missing: tuple[str, ...] = ()  # updated ids the snapshot has no row for


def _snapshot_rows(snapshot_dir: Path, table: str, ids: pl.Series) -> pl.DataFrame:
    """The snapshot's rows of ``table`` with these ids, read without loading the whole table."""
    manifest = json.loads((snapshot_dir / MANIFEST).read_text())
    entry = (manifest.get("tables") or {}).get(table)
    if not entry:
        return tables.empty(table)
    frame = pl.scan_parquet(snapshot_dir / (entry.get("file") or f"{table}.parquet")).filter(pl.col("id").is_in(ids.implode())).collect()
    fill = {"scope_path": manifest["scope_path"], "tenant_id": Scope.parse(manifest["scope_path"]).tenant_id}
    frame = frame.with_columns(pl.lit(v).alias(k) for k, v in fill.items() if k not in frame.columns)
    return tables.conform(table, frame).select(c.name for c in tables.TABLES[table])


def _stage_updates(table: str, updates: pl.DataFrame, snapshot_dir: Path, scope_path: str) -> _Staged:
    changed = [c for c in updates.columns if c not in KEYS]
    keys = updates.group_by("id", maintain_order=True).agg(pl.col("expected_version").first())
    before = _snapshot_rows(snapshot_dir, table, keys.get_column("id"))
    missing = keys.join(before, on="id", how="anti").get_column("id").to_list()
    # What the apply wrote: the snapshot row with every phase's changes folded in (as the apply folds them).
    view = Snapshot.empty(scope_path, datetime.now(UTC)).with_frames({table: before})
    after = Diff({table: TableDiff(updates=updates)}).fold(view).table(table)
    unchanged = [c.name for c in tables.TABLES[table] if c.name not in (*changed, "id", "version")]
    staged = (
        keys.join(before.drop("version"), on="id", how="inner")
        .join(after.select("id", *[pl.col(c).alias(c + AFTER) for c in changed]), on="id", how="left")
    )
    return _Staged(updates=staged, changed=tuple(changed), unchanged=tuple(unchanged), missing=tuple(missing))


def _prepare(run: RunRecord) -> dict[str, _Staged]:
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
    if not Path(run.diff_uri).is_dir():
        raise UndoError(
            f"{where} changed {_kinds(changed)} but its diff directory {run.diff_uri} is not there; "
            "the list of rows it inserted and updated lives only there. Nothing was changed. "
            "Restore the run directory from backup and retry."
        )
    diff = Diff.read(run.diff_uri)
    out: dict[str, _Staged] = {}
    for table, td in diff.tables.items():
        staged = _Staged()
        if td.inserts.height:
            present = [c for c in td.inserts.columns if c in tables.columns(table)]
            staged = _Staged(inserts=td.inserts.select(present))
        if td.updates.height:
            snap = Path(run.snapshot_uri) if run.snapshot_uri else None
            if snap is None or not (snap / MANIFEST).is_file():
                raise UndoError(
                    f"{where} updated {td.updates.height} row(s) of {table}, but its snapshot "
                    f"{run.snapshot_uri or '(none recorded)'} is not there: the prior values of updated columns live only "
                    "there. Nothing was changed. Restore the run directory from backup and retry."
                )
            up = _stage_updates(table, td.updates, snap, run.scope_path)
            staged = _Staged(inserts=staged.inserts, updates=up.updates, changed=up.changed,
                             unchanged=up.unchanged, missing=up.missing)
        out[table] = staged
    return out


def _kinds(changed: dict[str, dict[str, int]]) -> str:
    return ", ".join(f"{t} {k}={n}" for t, kinds in sorted(changed.items()) for k, n in kinds.items() if n)


def _refuse(run: RunRecord) -> None:
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


# -- the executor ----------------------------------------------------------------------------

def _scalar(cur, sql: str, params: tuple) -> Any:
    cur.execute(sql, parameters=params)
    return cur.fetch_arrow_table().column(0)[0].as_py()


def _frame(cur, sql: str, params: tuple) -> pl.DataFrame:
    cur.execute(sql, parameters=params)
    return pl.from_arrow(cur.fetch_arrow_table())  # type: ignore[return-value]


def _node_tables_first(names) -> list[str]:
    return sorted(names, key=lambda t: (t != "memory_nodes", t))


def undo(store: Store, run_id: str) -> UndoResult:
    """Revert run ``run_id`` where its rows are as it left them; report the rest.  See the module docstring.

    Raises :class:`UndoError` (nothing written) for an unknown, failed, undone or undo run, or when
    the run's files holding before-images are gone.
    """
    try:
        run = get_run(store, run_id)
    except DeepSleepError as exc:
        raise UndoError(str(exc)) from None
    _refuse(run)
    staged = _prepare(run)
    scope = run.scope_path
    undo_id = str(uuid.uuid4())
    started = datetime.now(UTC)
    reverted: dict[str, dict[str, int]] = {}
    missed: list[pl.DataFrame] = []

    def count(table: str, kind: str, n: int) -> None:
        if n:
            reverted.setdefault(table, {})[kind] = n

    with store.transaction() as cur:
        cur.execute("DISCARD TEMP")  # staging tables an earlier undo or apply left on this pooled connection
        _scalar(cur, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))::text", (scope,))
        # Re-read under the lock: a racing undo (or a second click) sees the first one's verdict.
        current = _frame(cur, "SELECT status, mode FROM consolidation_runs WHERE run_id = $1::uuid FOR UPDATE", (run.run_id,))
        if current.height != 1 or current["status"][0] != "applied":
            _refuse(get_run(store, run.run_id))
        cur.execute(f"CREATE TEMPORARY TABLE {DONE} (table_name text, kind text, id text) ON COMMIT DROP")
        for table, st in staged.items():
            for kind, frame in (("inserts", st.inserts), ("updates", st.updates)):
                if frame is not None and frame.height:
                    cur.adbc_ingest(stage_name(table, kind), frame.to_arrow(), mode="create", temporary=True)
        # 1. rows the run inserted, 2. values it changed, 3. rows it deleted (nodes before edges).
        for table in _node_tables_first(t for t, st in staged.items() if st.inserts is not None and st.inserts.height):
            reason = f"inserted by run {run.run_id}, removed by its undo"
            count(table, "inserts", _scalar(cur, remove_inserts_sql(table, staged[table].inserts.columns), (scope, undo_id, reason)))
            missed.append(_frame(cur, not_restored_sql(table, "inserts"), (scope,)).with_columns(
                pl.lit(table).alias("table"), pl.lit("inserts").alias("kind")))
        for table in _node_tables_first(t for t, st in staged.items() if st.updates is not None):
            st = staged[table]
            if st.updates.height:
                count(table, "updates", _scalar(cur, restore_updates_sql(table, list(st.changed), list(st.unchanged)), (scope,)))
                missed.append(_frame(cur, not_restored_sql(table, "updates"), (scope,)).with_columns(
                    pl.lit(table).alias("table"), pl.lit("updates").alias("kind")))
            if st.missing:
                missed.append(pl.DataFrame({"id": list(st.missing)}).with_columns(
                    pl.lit(NO_BEFORE_IMAGE).alias("reason"), pl.lit(None, pl.Int64).alias("live_version"),
                    pl.lit(table).alias("table"), pl.lit("updates").alias("kind")))
        archived = _frame(cur, "SELECT DISTINCT table_name FROM consolidation_archive WHERE run_id = $1::uuid AND op = 'delete'",
                          (run.run_id,))["table_name"].to_list()
        unknown = [t for t in archived if t not in tables.MUTABLE]
        if unknown:
            raise UndoError(f"run {run.run_id} archived rows of {', '.join(unknown)}, which this version does not know; "
                            "nothing was changed")
        for table in _node_tables_first(archived):
            count(table, "deletes", _scalar(cur, reinsert_deletes_sql(table), (scope, run.run_id)))
            missed.append(_frame(cur, not_restored_sql(table, "deletes"), (scope, run.run_id)).with_columns(
                pl.lit(table).alias("table"), pl.lit("deletes").alias("kind")))
        not_restored = _not_restored(missed)
        result = UndoResult(run_id=run.run_id, undo_run_id=undo_id, scope_path=scope, reverted=reverted,
                            not_restored=not_restored)
        if _scalar(cur, f"WITH u AS ({UNDONE_SQL} RETURNING 1) SELECT count(*) FROM u", (run.run_id,)) != 1:
            raise UndoError(f"run {run.run_id} changed status while it was being undone; nothing was changed")
        cur.execute(UNDO_LEDGER_SQL, parameters=(
            undo_id, scope, started, json.dumps(_writes(reverted), sort_keys=True), not_restored.height, run.run_id,
            json.dumps(result.not_restored_counts(), sort_keys=True)))
    return result


def _not_restored(parts: list[pl.DataFrame]) -> pl.DataFrame:
    cols = list(NOT_RESTORED_SCHEMA)
    frames = [p.select(pl.col(c).cast(t) for c, t in NOT_RESTORED_SCHEMA.items()) for p in parts if p.height]
    if not frames:
        return pl.DataFrame(schema=NOT_RESTORED_SCHEMA)
    return pl.concat(frames).sort("table", "kind", "id").select(cols)


def _writes(reverted: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """The undo's own writes (the ledger's ``rows_changed``): each reverted change is its inverse."""
    inverse = {"inserts": "deletes", "updates": "updates", "deletes": "inserts"}
    return {t: {inverse[k]: n for k, n in kinds.items()} for t, kinds in reverted.items()}


# -- rendering -------------------------------------------------------------------------------

def undo_markdown(result: UndoResult, limit: int = 50) -> str:
    """The undo as Markdown: what was reverted per table, and every change left alone with its reason."""
    scope = Scope.parse(result.scope_path).display()
    verdict = "complete" if result.complete else f"{result.not_restored.height} change(s) not restored"
    parts = [f"# Undo of run `{result.run_id}` — `{scope}` — {verdict}", "", f"undo run `{result.undo_run_id}`", ""]
    rows = [[t, str(k.get("inserts", 0)), str(k.get("updates", 0)), str(k.get("deletes", 0))]
            for t, k in sorted(result.reverted.items())]
    parts += ["## Reverted", markdown_table(["table", "inserted rows removed", "updated rows restored", "deleted rows re-inserted"],
                                            rows or [["(nothing)", "0", "0", "0"]]), ""]
    if not result.complete:
        summary = [[t, k, reason, str(n)] for t, kinds in result.not_restored_counts().items()
                   for k, reasons in kinds.items() for reason, n in reasons.items()]
        parts += ["## Not restored (left as they are now)", markdown_table(["table", "change", "reason", "rows"], summary), ""]
        shown = result.not_restored.head(limit)
        parts += [markdown_table(["table", "change", "id", "reason", "live version"],
                                 [[r["table"], r["kind"], r["id"], r["reason"], "" if r["live_version"] is None else str(r["live_version"])]
                                  for r in shown.iter_rows(named=True)])]
        if result.not_restored.height > limit:
            parts += [f"… and {result.not_restored.height - limit} more"]
        parts += [""]
    return "\n".join(parts)
