"""Approve or reject the rows a run held back (SPEC §9; ``deep-sleep approve|reject RUN_ID``).

Where things are: the held rows are a diff directory under the run's diff directory
(``<diff_uri>/held/``, :mod:`deep_sleep.run.holds`), so they survive with the run's files; the
ledger row (``consolidation_runs``) has ``held`` (what and why; ``cells``: phase → reason → rows)
and ``hold_status``; decisions are **by row** (issue 37): each decided held row is one row of
``consolidation_decided_rows`` (primary key run, table, kind, id, phase: a row is decided once),
with its reason and whether the closure added it, and each (decision, phase) it touched one row of
``consolidation_decisions``.  The decided rows, not ``hold_status``, say what is still pending; a
whole-phase decision of an earlier release (``by_rows`` false) decided its phase.

:func:`approve` applies the pending held rows it selects — of the run's current phases (or of one
``phase``), only those held for ``reason`` when given — so that what it applies is valid on its own
(SPEC §9 as amended):

- the selection is closed under the graph (:func:`deep_sleep.run.holds.close_selection`): a node
  delete takes the held edge deletes that touch it, a META node's ``CLUSTERS`` rows and its own
  update go together, every row of an id goes with it.  The rows the closure added, whatever their
  phase or reason, are decided too and listed (:attr:`Decision.closure`, the notes); a closure that
  reaches a rejected row is refused, one that reaches a row of a superseded phase too;
- rows of a phase a newer run of the scope held rows of (pending or decided) are *superseded*: they
  expired and are never applied (asked by ``phase``: refused, naming the newer run);
- it is validated (every SPEC §4 check) against the run's snapshot with the run's applied part
  and the rows approved so far folded in — the state the held rows were planned to follow;
- it is applied by :func:`deep_sleep.run.apply.apply_batch` — the very statements and version guard
  of a nightly apply, in one transaction that also writes the decision rows and the run's
  ``hold_status``: a row that a live writer changed since the run's snapshot fails the guard, is left
  as the writer left it and is counted in ``conflicts``; deletes archive their before-images; edges
  held with a node whose delete conflicts stay.  Two approvals of one row race on its decided row's
  primary key: the first commits, the second waits, fails on it and rolls back — it writes nothing,
  and says so (:class:`~deep_sleep.jobs.errors.HoldError`).

The approval is recorded as a ledger row of its own (``mode = 'approve'``, ``approval_of`` = the
run) with a run directory of its own beside the run's (``<scope>/<as_of>_<approval id>/``: ``diff/``
exactly the rows it applied, ``snapshot/`` the run's snapshot rows of what it updates), so
``deep-sleep undo`` undoes an approval like any run and ``gc`` keeps or removes its files by its own
ledger row; it carries the run's own as_of, so it never moves a scope's "previous run" (those queries
read ``mode = 'nightly'``).  What it applied and its conflicts are its ledger row's ``rows_changed``
and ``conflicts`` (``consolidation_decisions.approval_run_id`` names it).

:func:`reject` records the decision and applies nothing — the selection plus the closure's rows held
only because of it (``with_held_node``, ``cluster_cap``, ``same_row``); rows held for a reason of
their own stay pending.  The held files stay for the record (``deep-sleep gc`` removes them with
the run's directories once nothing awaits a decision); a run whose files are gone is rejected by
phase from the ledger.

Refused, with nothing written (:class:`~deep_sleep.jobs.errors.HoldError`): a run that is not in the
ledger, not applied (failed or undone), holds nothing, whose held phases (or the one asked for) are
already decided, whose snapshot is gone (the approval could not be validated), or whose selection
fails validation; approving rows whose files are gone.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from collections.abc import Collection
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import polars as pl

from deep_sleep.core import files
from deep_sleep.core.diff import Diff, TableDiff
from deep_sleep.core.errors import DeepSleepError
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot, utc
from deep_sleep.jobs.errors import HoldError
from deep_sleep.jobs.ledger import RunRecord, get_run, run_config
from deep_sleep.jobs.undo_plan import without_rows
from deep_sleep.run import holds
from deep_sleep.run.apply import apply_batch, batch_statements, vector_conflicts
from deep_sleep.run.layout import read_scope_diff, read_scope_report, read_scope_snapshot, write_config
from deep_sleep.run.slots import DEFAULT_APPLY_SLOTS, apply_slot
from deep_sleep.run.pipeline import failure_messages
from deep_sleep.run.transform import as_shard_diff
from deep_sleep.run.statements import LOCK_SQL, Statement
from deep_sleep.store.db import Store
from deep_sleep.transforms.config import ConsolidationConfig
from deep_sleep.validation import validate_diff

DECISIONS_SQL = (
    "SELECT phase, decision, decided_at, decided_by, decision_id::text, by_rows FROM consolidation_decisions"
    " WHERE run_id = %s::uuid ORDER BY decided_at, phase"
)
#: The rows decided so far (migration 028): one row per held row a decision took.
DECIDED_ROWS_SQL = (
    "SELECT table_name AS \"table\", kind, row_id AS id, phase, decision FROM consolidation_decided_rows"
    " WHERE run_id = %s::uuid"
)
#: The run's held phases (ledger) and, per phase, the newest later run of the scope that holds rows of
#: it — pending or decided (a superseding run: it re-planned that phase from a newer snapshot).
SUPERSEDED_SQL = """
SELECT p.phase, p.n, (SELECT n.run_id::text FROM consolidation_runs n
                      WHERE n.scope_path = r.scope_path AND n.status = 'applied' AND n.mode NOT IN ('approve', 'undo')
                        AND (n.as_of, n.started_at) > (r.as_of, r.started_at) AND n.held -> 'phases' ? p.phase
                      ORDER BY n.as_of DESC, n.started_at DESC LIMIT 1)
FROM consolidation_runs r CROSS JOIN LATERAL jsonb_each_text(coalesce(r.held -> 'phases', '{}'::jsonb)) AS p(phase, n)
WHERE r.run_id = %s::uuid
"""
#: One decision row per (decision, phase) it touched (parameters: decision_id, run_id, phase, decision,
#: decided_by, that phase's rows it decided as JSON, approval_run_id or null).
DECIDE_SQL = (
    "INSERT INTO consolidation_decisions (decision_id, run_id, phase, decision, decided_by, held_rows, approval_run_id, by_rows)"
    " VALUES ($1::uuid, $2::uuid, $3, $4, $5, $6::jsonb, $7::uuid, true)"
)
#: A decision of a run whose held files are gone: its whole phase (it cannot list the rows).
DECIDE_PHASE_SQL = (
    "INSERT INTO consolidation_decisions (decision_id, run_id, phase, decision, decided_by, held_rows, approval_run_id, by_rows)"
    " VALUES ($1::uuid, $2::uuid, $3, $4, $5, $6::jsonb, $7::uuid, false)"
)
#: The rows a decision took (parameters: run_id, decision, decision_id, the rows as a JSON array of
#: {t: table, k: kind, i: id, p: phase, r: reason, c: added by the closure}).  A row decided twice
#: violates the primary key: two racing decisions of one row, the second rolls back.
DECIDE_ROWS_SQL = (
    "INSERT INTO consolidation_decided_rows (run_id, table_name, kind, row_id, phase, reason, decision, decision_id, closure)"
    " SELECT $1::uuid, x.t, x.k, x.i, x.p, x.r, $2, $3::uuid, x.c"
    " FROM jsonb_to_recordset($4::jsonb) AS x(t text, k text, i text, p text, r text, c boolean)"
)
#: The run's hold_status from its decided rows (parameters: the run's held rows, the run id, the rows
#: and approved rows of its whole-phase decisions of earlier releases).
STATUS_SQL = """
UPDATE consolidation_runs r SET hold_status = CASE
    WHEN d.n = 0 THEN 'pending'
    WHEN d.n < $1::bigint THEN 'partial'
    WHEN d.approved = d.n THEN 'approved'
    WHEN d.approved = 0 THEN 'rejected'
    ELSE 'decided' END
FROM (SELECT count(*) + $3::bigint AS n, count(*) FILTER (WHERE decision = 'approved') + $4::bigint AS approved
      FROM consolidation_decided_rows WHERE run_id = $2::uuid) d
WHERE r.run_id = $2::uuid
"""
UNIQUE_VIOLATION = "23505"
#: A held row's key within its run: (table, kind, id, phase) — the diff keeps one row per phase.
ROW_KEY = ("table", "kind", "id", "phase")
_DECIDED_SCHEMA = {"table": pl.String, "kind": pl.String, "id": pl.String, "phase": pl.String, "decision": pl.String}


@dataclass(frozen=True)
class Holds:
    """What a run holds: the held diff (a shard diff of one scope), one row per held row with its
    reason, and the decisions so far.

    phases: phase → table → kind → held rows (every held row, decided or not).  decided: phase →
    {decision, decided_at, decided_by, decision_id} for the phases whose every row is decided
    (``decision`` ``approved``, ``rejected``, or ``decided`` when mixed).  rows_decided: one row per
    decided held row (table, kind, id, phase, decision).  superseded: phase → the newest later run of
    the scope holding rows of that phase (its rows here expired).  held_counts: phase → held rows, from
    the ledger (what remains known when the files are gone: ``files_gone``).
    """

    run: RunRecord
    diff: Diff
    reasons: pl.DataFrame
    phases: dict[str, dict[str, dict[str, int]]]
    decided: dict[str, dict[str, Any]] = field(default_factory=dict)
    rows_decided: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=_DECIDED_SCHEMA))
    superseded: dict[str, str] = field(default_factory=dict)
    held_counts: dict[str, int] = field(default_factory=dict)
    legacy: dict[str, str] = field(default_factory=dict)  # phase → decision of a whole-phase decision
    files_gone: bool = False

    @property
    def pending(self) -> list[str]:
        return [p for p in self.phases if p not in self.decided]

    @property
    def pending_rows(self) -> pl.DataFrame:
        """The reasons rows (one per held row) not decided yet."""
        return self.reasons.join(self.rows_decided.select(*ROW_KEY), on=list(ROW_KEY), how="anti", maintain_order="left")

    def why(self) -> list[str]:
        """The report's sentences on why rows were held (empty when its report.json is gone)."""
        try:
            return list(read_scope_report(self.run.diff_uri, self.run.scope_path).held.get("why", []))
        except (DeepSleepError, OSError):  # the run's files are gone (gc) or unreadable
            return []


@dataclass(frozen=True)
class Decision:
    """One ``approve`` or ``reject``: the phases it decided, the rows it took (``held_rows``), which of
    them the closure under the graph added to the selection (``closure``: one dict per row, table,
    kind, id, phase, reason), and (approve) what landed."""

    run_id: str
    decision: str
    phases: list[str]
    held_rows: dict[str, dict[str, int]]
    applied: dict[str, dict[str, int]] = field(default_factory=dict)
    conflicts: int = 0
    decision_id: str = ""
    approval_run_id: str | None = None
    notes: list[str] = field(default_factory=list)
    closure: list[dict[str, str]] = field(default_factory=list)
    selected: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _counts(diff: Diff) -> dict[str, dict[str, int]]:
    return {t: {k: n for k, n in kinds.items() if n} for t, kinds in diff.row_counts().items() if any(kinds.values())}


def _row_counts(rows: pl.DataFrame) -> dict[str, dict[str, int]]:
    """table → kind → rows of a frame of row keys."""
    out: dict[str, dict[str, int]] = {}
    for t, k, n in rows.group_by("table", "kind").len().sort("table", "kind").iter_rows():
        out.setdefault(t, {})[k] = n
    return out


def keys_of(diff: Diff) -> pl.DataFrame:
    """The (table, kind, id, phase) of every row of ``diff``."""
    parts = [f.select(pl.lit(t).alias("table"), pl.lit(k).alias("kind"), pl.col("id").cast(pl.String), pl.col("phase"))
             for t, td in diff.tables.items() for k, f in td.frames().items() if f.height]
    return pl.concat(parts).unique(maintain_order=True) if parts else pl.DataFrame(schema={c: pl.String for c in ROW_KEY})


def restrict(diff: Diff, keys: pl.DataFrame, keep: bool = True) -> Diff:
    """The rows of ``diff`` whose (table, kind, id, phase) is (``keep``) or is not in ``keys``."""
    out = {}
    for t, td in diff.tables.items():
        frames = {}
        for k, f in td.frames().items():
            if f.height:
                mine = keys.filter((pl.col("table") == t) & (pl.col("kind") == k)).select("id", "phase").unique()
                hit = (f.select(pl.col("id").cast(pl.String), "phase")
                       .join(mine.with_columns(pl.lit(True).alias("_hit")), on=["id", "phase"], how="left",
                             maintain_order="left").get_column("_hit").fill_null(False))
                f = f.filter(hit if keep else ~hit)
            frames[k] = f
        out[t] = TableDiff(**frames)
    return Diff(out)


def read_holds(store: Store, run_id: str) -> Holds:
    """The held rows of ``run_id`` (a UUID or an unambiguous prefix) and the decisions taken on them."""
    run = get_run(store, run_id)  # LedgerError (an InputError) naming an unknown run
    diff, reasons = (holds.read_held(run.diff_uri, run.scope_path) if run.diff_uri
                     else (Diff.empty(), pl.DataFrame(schema=holds.REASONS_SCHEMA)))
    reasons = reasons.unique(subset=list(ROW_KEY), keep="first", maintain_order=True)
    with store.pg() as con:
        ledger = con.execute(SUPERSEDED_SQL, (run.run_id,)).fetchall()
        rows = con.execute(DECISIONS_SQL, (run.run_id,)).fetchall()
        by_row = con.execute(DECIDED_ROWS_SQL, (run.run_id,)).fetchall()
    held_counts = {p: int(n) for p, n, _ in ledger}
    superseded = {p: newer for p, _, newer in ledger if newer}
    phases = {p: _counts(holds.only_phases(diff, {p})) for p in holds.phases_of(diff)}
    files_gone = not phases and bool(held_counts)
    if files_gone:  # gc removed the files: the ledger still says what was held (rejectable by phase)
        phases = {p: {} for p in sorted(held_counts)}
    legacy = {p: d for p, d, _, _, _, by_rows in rows if not by_rows}
    decided_rows = pl.DataFrame(by_row, schema=_DECIDED_SCHEMA, orient="row")
    if legacy and reasons.height:  # a whole-phase decision of an earlier release decided every row of it
        whole = [reasons.filter(pl.col("phase") == p).select(*ROW_KEY).with_columns(pl.lit(d).alias("decision"))
                 for p, d in legacy.items()]
        decided_rows = pl.concat([decided_rows, *whole]).unique(subset=list(ROW_KEY), keep="first")
    done = decided_rows.group_by("phase").agg(pl.len().alias("n"), pl.col("decision").unique().alias("ds"))
    fully: dict[str, set[str]] = {}
    for p, n, ds in done.iter_rows():
        total = held_counts.get(p) if files_gone or not reasons.height else reasons.filter(pl.col("phase") == p).height
        if total is not None and n >= total:
            fully[p] = set(ds)
    for p, d in legacy.items():
        fully.setdefault(p, {d})
    decided = {}
    for p, ds in fully.items():
        last = [r for r in rows if r[0] == p][-1:] or [(p, None, None, None, None, True)]
        decided[p] = {"decision": ds.pop() if len(ds) == 1 else "decided", "decided_at": last[0][2],
                      "decided_by": last[0][3], "decision_id": last[0][4]}
    return Holds(run, diff, reasons, phases, decided, decided_rows, superseded, held_counts, legacy, files_gone)


def _to_decide(h: Holds, phase: str | None, verb: str, reason: str | None = None,
               phases: Collection[str] | None = None) -> pl.DataFrame:
    """The pending held rows (reasons rows) the call selects: of ``phase`` (or ``phases``; else every
    pending phase), held for ``reason`` when given.  Refuses (HoldError) what cannot be decided."""
    run = h.run
    if run.status != "applied" or run.mode in ("approve", "undo"):
        raise HoldError(f"run {run.run_id} is {run.status} ({run.mode}): only an applied run's held rows can be {verb.rstrip('e')}ed")
    if not h.phases:
        where = f"{run.diff_uri}/{holds.HELD_DIR}" if run.diff_uri else "its diff directory (the ledger names none)"
        raise HoldError(f"run {run.run_id} holds nothing ({where} has no held rows); nothing to {verb}")
    wanted = [phase] if phase is not None else sorted(phases) if phases is not None else None
    if phase is not None:
        if phase not in h.phases:
            raise HoldError(f"run {run.run_id} holds no rows of phase {phase!r}; its held phases: {', '.join(h.phases)}")
        if phase in h.decided:
            d = h.decided[phase]
            raise HoldError(f"phase {phase!r} of run {run.run_id} was already {d['decision']} at {d['decided_at']}"
                            f"{' by ' + d['decided_by'] if d['decided_by'] else ''}; a decision is final")
    elif not h.pending:
        done = ", ".join(f"{p}: {d['decision']}" for p, d in h.decided.items())
        raise HoldError(f"every held phase of run {run.run_id} is already decided ({done}); a decision is final")
    if h.files_gone:
        if verb == "approve":
            raise HoldError(f"run {run.run_id}: its held rows are gone ({run.diff_uri} was removed by gc); they cannot be "
                            "approved — reject them (the next night re-plans them)")
        return pl.DataFrame({"table": "", "kind": "", "id": "", "phase": [p for p in (wanted or h.pending) if p in h.pending],
                             "reason": reason or ""}, schema={c: pl.String for c in (*ROW_KEY, "reason")})
    rows = h.pending_rows
    if wanted is not None:
        rows = rows.filter(pl.col("phase").is_in(wanted))
    if reason is not None:
        rows = rows.filter(pl.col("reason") == reason)
    if not rows.height:
        what = (f" held for {reason}" if reason else "") + (f" of phase(s) {', '.join(wanted)}" if wanted else "")
        raise HoldError(f"run {run.run_id} has no pending held rows{what}; nothing to {verb} "
                        f"(its pending rows by reason: {_by_reason(h.pending_rows)})")
    return rows.select(*ROW_KEY, "reason")


def _by_reason(rows: pl.DataFrame) -> str:
    return ", ".join(f"{r} {n}" for r, n in rows.group_by("reason").len().sort("reason").iter_rows()) or "none"


def _decision_statements(h: Holds, rows: pl.DataFrame, decision: str, decision_id: str, decided_by: str | None,
                         approval_run_id: str | None) -> list[Statement]:
    """The decision rows (one per phase touched, and one per held row taken: ``rows`` with ``reason``
    and ``closure``) and the run's new hold_status, as statements of the deciding transaction."""
    out = []
    for (p,), part in rows.group_by("phase", maintain_order=True):
        out.append(Statement("decide", DECIDE_SQL, (decision_id, h.run.run_id, p, decision, decided_by,
                                                    json.dumps(_row_counts(part), sort_keys=True), approval_run_id),
                             table="consolidation_decisions"))
    payload = rows.select(pl.col("table").alias("t"), pl.col("kind").alias("k"), pl.col("id").alias("i"),
                          pl.col("phase").alias("p"), pl.col("reason").alias("r"), pl.col("closure").alias("c"))
    out.append(Statement("decide", DECIDE_ROWS_SQL, (h.run.run_id, decision, decision_id, payload.write_json()),
                         table="consolidation_decided_rows"))
    out.append(_status_statement(h))
    return out


def _status_statement(h: Holds) -> Statement:
    legacy_rows = sum(h.held_counts.get(p, 0) for p in h.legacy)
    legacy_approved = sum(h.held_counts.get(p, 0) for p, d in h.legacy.items() if d == "approved")
    total = sum(h.held_counts.values()) or h.reasons.height
    return Statement("decide", STATUS_SQL, (total, h.run.run_id, legacy_rows, legacy_approved), table="consolidation_runs")


def _raced(h: Holds, phases: list[str]) -> HoldError:
    return HoldError(f"run {h.run.run_id}: held rows of phase(s) {', '.join(phases)} were decided by another call "
                     "meanwhile; nothing was written (see `deep-sleep report`)")


def _is_unique_violation(exc: BaseException) -> bool:
    return isinstance(exc, psycopg.errors.UniqueViolation) or getattr(exc, "sqlstate", None) == UNIQUE_VIOLATION


_CLOSURE_WHY = "an edge goes with its node, a META node's CLUSTERS rows and its text go together, every row of an id goes together"


def _selection(h: Holds, selected: pl.DataFrame, snapshot: Snapshot | None, verb: str) -> tuple[Diff, pl.DataFrame, list[str]]:
    """The held rows to decide for ``selected`` (reasons rows), closed under the graph (module
    docstring): the diff to apply, one row per row taken (table, kind, id, phase, reason, closure: not
    selected, the closure needed it), and notes for the operator."""
    shard = Shard.of(snapshot if snapshot is not None else Snapshot(h.run.scope_path, None, None, {}))
    closed = keys_of(holds.close_selection(h.diff, restrict(h.diff, selected), shard))
    closed = closed.join(h.reasons.select(*ROW_KEY, "reason"), on=list(ROW_KEY), how="left", maintain_order="left")
    decided = closed.join(h.rows_decided, on=list(ROW_KEY), how="inner")
    if verb == "approve":
        rejected = decided.filter(pl.col("decision") == "rejected")
        if rejected.height:
            raise HoldError(f"run {h.run.run_id}: approving the selection would apply {rejected.height} held row(s) that were "
                            f"rejected ({_describe(rejected)}; {_CLOSURE_WHY}); nothing was written")
    take = closed.join(h.rows_decided.select(*ROW_KEY), on=list(ROW_KEY), how="anti", maintain_order="left")
    chosen = selected.select(*ROW_KEY).with_columns(pl.lit(True).alias("_sel"))
    take = take.join(chosen, on=list(ROW_KEY), how="left", maintain_order="left").with_columns(
        (~pl.col("_sel").fill_null(False)).alias("closure")).drop("_sel")
    if verb == "reject":  # a rejection takes the rows held only because of the ones it rejects
        take = take.filter(~pl.col("closure") | pl.col("reason").is_in(list(holds.CLOSURE_RULES)))
    added = take.filter(pl.col("closure"))
    expired = sorted(set(added.get_column("phase").unique().to_list()) & set(h.superseded))
    if verb == "approve" and expired:
        raise HoldError(f"run {h.run.run_id}: approving the selection would apply held rows of phase(s) {', '.join(expired)}, "
                        f"superseded by run {h.superseded[expired[0]]} (they expired: the newer run re-planned them); "
                        "nothing was written")
    notes = ([f"the closure added {added.height} held row(s) that were not selected ({_describe(added)}; {_CLOSURE_WHY})"]
             if added.height else [])
    return restrict(h.diff, take), take.select(*ROW_KEY, "reason", "closure"), notes


def _describe(rows: pl.DataFrame, limit: int = 6) -> str:
    """``rows`` (table, kind, id, phase, reason) counted per (phase, reason, table, kind), with a few ids."""
    parts = []
    for (phase, reason, t, k), part in rows.group_by("phase", "reason", "table", "kind", maintain_order=True):
        ids = part.get_column("id").to_list()
        parts.append(f"{len(ids)} {t} {k} of {phase} held as {reason}: {', '.join(ids[:limit])}"
                     + (f" … (+{len(ids) - limit})" if len(ids) > limit else ""))
    return "; ".join(parts)


def _validate(h: Holds, chosen: Diff, snapshot: Snapshot, config: ConsolidationConfig) -> None:
    """Every SPEC §4 check of ``chosen`` against the run's snapshot with its applied part — and the held
    rows approved so far — folded in."""
    whole = as_shard_diff(read_scope_diff(h.run.diff_uri, h.run.scope_path), h.run.scope_path)
    approved = h.rows_decided.filter(pl.col("decision") == "approved").select(*ROW_KEY)
    applied = without_rows(whole, restrict(h.diff, approved, keep=False))
    base = applied.fold(Shard.of(snapshot))
    failures = validate_diff(chosen, base, config)
    if failures.height:
        raise HoldError(f"run {h.run.run_id}: the held rows to approve fail validation on the run's snapshot with its "
                        "applied part (nothing was written):\n" + "\n".join(failure_messages(failures)))


def _snapshot(h: Holds) -> Snapshot:
    if not h.run.snapshot_uri:
        raise HoldError(f"run {h.run.run_id} recorded no snapshot: what its held rows follow is unknown, so an approval "
                        "cannot be validated; nothing was written (reject the held rows, the next night re-plans them)")
    try:
        return read_scope_snapshot(h.run.snapshot_uri, h.run.scope_path)
    except (DeepSleepError, OSError) as exc:
        raise HoldError(f"run {h.run.run_id}: its snapshot {h.run.snapshot_uri} cannot be read ({exc}); an approval "
                        "cannot be validated without it; nothing was written") from None


def _current(h: Holds, selected: pl.DataFrame, phase: str | None) -> tuple[pl.DataFrame, list[str]]:
    """``selected`` less the rows of superseded phases (they expired: never approved).  A phase asked
    for by name that is superseded is refused; otherwise the expired phases are left with a note."""
    gone = sorted(set(selected.get_column("phase").unique().to_list()) & set(h.superseded))
    if not gone:
        return selected, []
    newer = ", ".join(f"{p} by run {h.superseded[p]}" for p in gone)
    left = selected.filter(~pl.col("phase").is_in(gone))
    if phase is not None or not left.height:
        raise HoldError(f"run {h.run.run_id}: its held rows of {newer.replace(' by ', ' are superseded by ')} (a newer run of "
                        "the scope re-planned the phase and holds its rows): they expired and cannot be approved; "
                        "decide the newer run's (`deep-sleep held`)")
    return left, [f"phase(s) {newer} superseded: their held rows expired and were left"]


def approve(store: Store, run_id: str, phase: str | None = None, decided_by: str | None = None,
            config: ConsolidationConfig | None = None, *, reason: str | None = None,
            phases: Collection[str] | None = None) -> Decision:
    """Apply the pending held rows of ``run_id`` — every current phase's, or ``phase``'s (``phases``'),
    only those held for ``reason`` when given — plus the rows their closure under the graph needs,
    through the version guard, and record the decision (row by row) in the same transaction; see the
    module docstring.  Rows of a superseded phase are never applied.  ``config`` (default: the
    configuration the run ran with, :func:`~deep_sleep.jobs.ledger.run_config`) gives the validation's
    bounds and the ``CLUSTERS`` cap."""
    h = read_holds(store, run_id)
    todo = _to_decide(h, phase, "approve", reason, phases)  # before the snapshot: an undo or approval run is refused as such
    todo, notes = _current(h, todo, phase)
    snapshot = _snapshot(h)
    chosen, taken, closure_notes = _selection(h, todo, snapshot, "approve")
    notes = [*notes, *closure_notes]
    phases = sorted(taken.get_column("phase").unique().to_list())
    config = config or run_config(h.run)
    _validate(h, chosen, snapshot, config)
    foreign = vector_conflicts(store, chosen)
    if foreign:
        raise HoldError(f"run {h.run.run_id}: {next(iter(foreign.values()))}")
    approval_id = str(uuid.uuid4())
    location = _approval_dir(h.run, approval_id)
    remote = files.is_remote(location)  # the run's files are on an object store: stage here, publish there
    base = Path(tempfile.mkdtemp(prefix="deep-sleep-approval-")) if remote else Path(location)
    one = chosen.by_scope((h.run.scope_path,)).get(h.run.scope_path, Diff.empty())  # the single-scope layout
    try:
        out = one.write(base / "diff")
        snap_dir = _before_images(snapshot, one).write(base / "snapshot")
        snap_uri, diff_uri = ((files.join(location, "snapshot"), files.join(location, "diff")) if remote
                              else (str(snap_dir.resolve()), str(out.resolve())))
        report = ConsolidationReport(
            scope_path=h.run.scope_path, as_of=h.run.as_of.isoformat(), phases_run=phases, rows_changed=_counts(one),
            diff_hash=one.content_hash(), run_id=approval_id, snapshot_uri=snap_uri, diff_uri=diff_uri,
            notes={"approve": [f"held rows of run {h.run.run_id}" + (f", phase {phase}" if phase else "")
                               + (f", held for {reason}" if reason else ""), *notes]},
            approval_of=h.run.run_id,
        )
        report.write(out)
        write_config(out, config)  # an undo of the approval decides with it too
        if remote:  # before the apply: its ledger row names these files
            files.publish_dir(base, location)
        planned = batch_statements(chosen, {h.run.scope_path: report}, cluster_cap=config.meta_nodes.max_members)
        decide = _decision_statements(h, taken, "approved", approval_id, decided_by, approval_id)
        at = next(i for i, s in enumerate(planned.statements) if s.step == "lock") + 1
        planned = replace(planned, statements=(*planned.statements[:at], *decide, *planned.statements[at:]))
        try:
            with apply_slot(store.dsn, DEFAULT_APPLY_SLOTS):  # an approval's apply holds a slot as any apply does
                applied, conflicts = apply_batch(store, planned, {h.run.scope_path: report}, "approve",
                                                 datetime.now(UTC))[h.run.scope_path]
        except Exception as exc:
            if _is_unique_violation(exc):
                raise _raced(h, phases) from None
            raise
        report.with_(status="applied", rows_changed=applied, conflicts=conflicts).write(out)
        if remote:
            files.publish_file(out / "report.json", files.join(diff_uri, "report.json"))
    finally:
        if remote:
            shutil.rmtree(base, ignore_errors=True)
    decision = Decision(h.run.run_id, "approved", phases, _counts(chosen), applied, conflicts,
                        decision_id=approval_id, approval_run_id=approval_id, notes=notes,
                        closure=_closure_rows(taken), selected=todo.height)
    _update_report(h.run, decision)
    return decision


def _approval_dir(run: RunRecord, approval_id: str) -> str:
    """A run directory of its own, beside the run's (``<scope>/<as_of>_<approval id>``; a URL when the
    run's files are on an object store): ``gc`` keeps or removes it by the approval's own ledger row,
    as any run's."""
    stamp = utc(run.as_of).strftime("%Y%m%dT%H%M%S.%fZ")
    return files.join(files.parent(files.parent(run.diff_uri)), f"{stamp}_{approval_id}")


def _before_images(snapshot: Snapshot, todo: Diff) -> Snapshot:
    """The run's snapshot rows of what the approval updates (what ``deep-sleep undo`` restores them
    from); deleted rows are archived by the apply, inserted ones are in the diff."""
    frames = {t: snapshot.table(t).filter(pl.col("id").cast(pl.String).is_in(td.updates.get_column("id").cast(pl.String).implode()))
              for t, td in todo.tables.items() if td.updates.height}
    return Snapshot(snapshot.scope_path, snapshot.taken_at, snapshot.previous_run_as_of, frames)


def reject(store: Store, run_id: str, phase: str | None = None, decided_by: str | None = None, *,
           reason: str | None = None, phases: Collection[str] | None = None) -> Decision:
    """Discard the pending held rows of ``run_id`` (every pending phase's, or ``phase``'s / ``phases'``;
    only those held for ``reason`` when given) and the rows held only because of them (the closure's
    rows held as with_held_node, cluster_cap or same_row): record the decision, row by row, in one
    transaction; apply nothing.  A run whose held files are gone is rejected by phase (the ledger says
    what it held)."""
    h = read_holds(store, run_id)
    todo = _to_decide(h, phase, "reject", reason, phases)
    decision_id = str(uuid.uuid4())
    notes: list[str] = []
    if h.files_gone:
        if reason is not None:
            raise HoldError(f"run {h.run.run_id}: its held files are gone ({h.run.diff_uri} was removed by gc), so its rows "
                            f"held for {reason} cannot be told from the others; reject its phases instead (without a reason)")
        decided = sorted(set(todo.get_column("phase").to_list()))
        statements = [Statement("decide", DECIDE_PHASE_SQL, (decision_id, h.run.run_id, p, "rejected", decided_by,
                                                             json.dumps({"rows": h.held_counts.get(p, 0)}), None))
                      for p in decided]
        statements.append(_status_statement(replace(h, legacy={**h.legacy, **{p: "rejected" for p in decided}})))
        held_rows: dict[str, dict[str, int]] = {"(files gone)": {"rows": sum(h.held_counts.get(p, 0) for p in decided)}}
        taken = pl.DataFrame(schema={**{c: pl.String for c in ROW_KEY}, "reason": pl.String, "closure": pl.Boolean})
        notes.append(f"the held files are gone (gc): phase(s) {', '.join(decided)} rejected whole, from the ledger")
    else:
        try:
            snapshot: Snapshot | None = read_scope_snapshot(h.run.snapshot_uri, h.run.scope_path) if h.run.snapshot_uri else None
        except (DeepSleepError, OSError):
            snapshot = None  # an edge delete's ends are unknown: only same-id and META rows close the selection
        _, taken, notes = _selection(h, todo, snapshot, "reject")
        decided = sorted(taken.get_column("phase").unique().to_list())
        statements = _decision_statements(h, taken, "rejected", decision_id, decided_by, None)
        held_rows = _row_counts(taken)
    try:
        with store.transaction() as cur:
            cur.execute(LOCK_SQL, parameters=(json.dumps([h.run.scope_path]),))  # the scope's apply lock, as every decision
            cur.fetch_arrow_table()
            for s in statements:
                cur.execute(s.sql, parameters=s.params)
    except Exception as exc:
        if _is_unique_violation(exc):
            raise _raced(h, decided) from None
        raise
    decision = Decision(h.run.run_id, "rejected", decided, held_rows, decision_id=decision_id, notes=notes,
                        closure=_closure_rows(taken), selected=todo.height)
    _update_report(h.run, decision)
    return decision


def _closure_rows(taken: pl.DataFrame) -> list[dict[str, str]]:
    return taken.filter(pl.col("closure")).select(*ROW_KEY, "reason").to_dicts()


def _update_report(run: RunRecord, decision: Decision) -> None:
    """Note the decision in the run's ``report.json`` (``held.decisions``), when the file is still there
    (on an object store: fetched, rewritten and put back).  The ledger is the record; this is a courtesy."""
    if not run.diff_uri:
        return
    try:
        local = files.fetch_dir(run.diff_uri)
    except DeepSleepError:  # the run's files are gone (gc)
        return
    if not (local / "report.json").exists():
        return
    report = ConsolidationReport.read(local)
    if not report.held:
        return
    decisions = {**report.held.get("decisions", {}), **{p: decision.decision for p in decision.phases}}
    report.with_(held={**report.held, "decisions": decisions}).write(local)
    if files.is_remote(run.diff_uri):
        files.publish_file(local / "report.json", files.join(run.diff_uri, "report.json"))


def holds_markdown(h: Holds) -> str:
    """The held rows of a run per phase, with their decisions, as Markdown (the approval form's description)."""
    from deep_sleep.run.console import markdown_table

    rows = []
    for p, by_table in h.phases.items():
        what = "; ".join(f"{t}: " + ", ".join(f"{n} {k}" for k, n in kinds.items()) for t, kinds in by_table.items())
        d = h.decided.get(p)
        left = h.pending_rows.filter(pl.col("phase") == p).height
        state = (d["decision"] if d else f"pending ({left} row(s))" if left == sum(sum(k.values()) for k in by_table.values())
                 else f"partly decided, {left} row(s) pending")
        if p in h.superseded and not d:
            state = f"expired: superseded by run {h.superseded[p][:8]}"
        rows.append([p, what, state])
    why = h.why()
    head = f"Run `{h.run.run_id}` (`{h.run.scope}`, as_of {h.run.as_of:%Y-%m-%d %H:%M}) holds rows for approval."
    return "\n\n".join([head, *(f"- {w}" for w in why), markdown_table(["phase", "held rows", "decision"], rows)]) + "\n"


def decision_text(d: Decision) -> str:
    """One line for the terminal (and the notes, if any)."""
    held = sum(n for kinds in d.held_rows.values() for n in kinds.values())
    text = f"run {d.run_id}: {d.decision} {held} held row(s) of {', '.join(d.phases)}"
    if d.closure:
        text += f" ({d.selected} selected, {len(d.closure)} added by the closure under the graph)"
    if d.decision == "approved":
        landed = sum(n for kinds in d.applied.values() for n in kinds.values())
        text += f"; applied {landed}, {d.conflicts} conflict(s) (rows changed since the snapshot, left as they are)"
    return "\n".join([text, *(f"note: {n}" for n in d.notes)])
