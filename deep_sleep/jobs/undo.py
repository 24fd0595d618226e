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

The parts: :mod:`~deep_sleep.jobs.undo_plan` refuses what cannot be undone, reads the
before-images and lists the guarded statements (pure, before anything is written);
:mod:`~deep_sleep.jobs.undo_sql` builds those statements; this module runs them in one
transaction, records the undo in the ledger, and renders the result.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import polars as pl

from deep_sleep.core import tables
from deep_sleep.core.errors import DeepSleepError
from deep_sleep.core.scope import Scope
from deep_sleep.jobs.errors import UndoError
from deep_sleep.jobs.ledger import get_run, run_config
from deep_sleep.jobs.undo_plan import prepare, refuse, undo_steps
from deep_sleep.jobs.undo_sql import (
    DONE,
    NO_BEFORE_IMAGE,
    UNDO_LEDGER_SQL,
    UNDONE_SQL,
    stage_name,
)
from deep_sleep.run.console import markdown_table
from deep_sleep.store.db import Store

NOT_RESTORED_SCHEMA = {"table": pl.String(), "kind": pl.String(), "id": pl.String(), "reason": pl.String(),
                       "live_version": pl.Int64()}


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


# -- the executor ----------------------------------------------------------------------------

def _scalar(cur, sql: str, params: tuple) -> Any:
    cur.execute(sql, parameters=params)
    return cur.fetch_arrow_table().column(0)[0].as_py()


def _frame(cur, sql: str, params: tuple) -> pl.DataFrame:
    cur.execute(sql, parameters=params)
    return pl.from_arrow(cur.fetch_arrow_table())  # type: ignore[return-value]


def undo(store: Store, run_id: str, config=None) -> UndoResult:
    """Revert run ``run_id`` where its rows are as it left them; report the rest.  See the module docstring.

    ``config`` (default: the run's own, :func:`~deep_sleep.jobs.ledger.run_config`): its ``meta_nodes.max_members``
    caps the CLUSTERS edges a META node gets back.  Raises :class:`UndoError` (nothing written) for an
    unknown, failed, undone or undo run, or when the run's files holding before-images are gone.
    """
    try:
        run = get_run(store, run_id)
    except DeepSleepError as exc:
        raise UndoError(str(exc)) from None
    refuse(run)
    staged = prepare(run)
    from deep_sleep.run.slots import DEFAULT_APPLY_SLOTS, apply_slot

    cluster_cap = (config or run_config(run)).meta_nodes.max_members  # a META node's CLUSTERS edges (SPEC §3)
    scope = run.scope_path
    undo_id = str(uuid.uuid4())
    started = datetime.now(UTC)
    reverted: dict[str, dict[str, int]] = {}
    missed: list[pl.DataFrame] = []

    with apply_slot(store.dsn, DEFAULT_APPLY_SLOTS), store.transaction() as cur:  # a slot, as every apply
        cur.execute("DISCARD TEMP")  # staging tables an earlier undo or apply left on this pooled connection
        _scalar(cur, "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))::text", (scope,))
        # Re-read under the lock: a racing undo (or a second click) sees the first one's verdict.
        current = _frame(cur, "SELECT status, mode FROM consolidation_runs WHERE run_id = $1::uuid FOR UPDATE", (run.run_id,))
        if current.height != 1 or current["status"][0] != "applied":
            refuse(get_run(store, run.run_id))
        archived = _frame(cur, "SELECT DISTINCT table_name FROM consolidation_archive WHERE run_id = $1::uuid AND op = 'delete'",
                          (run.run_id,))["table_name"].to_list()
        unknown = [t for t in archived if t not in tables.MUTABLE]
        if unknown:
            raise UndoError(f"run {run.run_id} archived rows of {', '.join(unknown)}, which this version does not know; "
                            "nothing was changed")
        cur.execute(f"CREATE TEMPORARY TABLE {DONE} (table_name text, kind text, id text) ON COMMIT DROP")
        for table, st in staged.items():
            for kind, frame in (("inserts", st.inserts), ("updates", st.updates)):
                if frame is not None and frame.height:
                    cur.adbc_ingest(stage_name(table, kind), frame.to_arrow(), mode="create", temporary=True)
        for step in undo_steps(run.run_id, scope, undo_id, staged, archived, cluster_cap):
            n = _scalar(cur, step.sql, step.params)
            if n:
                reverted.setdefault(step.table, {})[step.kind] = n
            missed.append(_frame(cur, step.not_restored_sql, step.not_restored_params).with_columns(
                pl.lit(step.table).alias("table"), pl.lit(step.kind).alias("kind")))
        for table, st in staged.items():
            if st.missing:
                missed.append(pl.DataFrame({"id": list(st.missing)}).with_columns(
                    pl.lit(NO_BEFORE_IMAGE).alias("reason"), pl.lit(None, pl.Int64).alias("live_version"),
                    pl.lit(table).alias("table"), pl.lit("updates").alias("kind")))
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
