"""Approve or reject the rows a run held back (SPEC §9; ``deep-sleep approve|reject RUN_ID``).

Where things are: the held rows are a diff directory under the run's diff directory
(``<diff_uri>/held/``, :mod:`deep_sleep.run.holds`), so they survive with the run's files; the
ledger row (``consolidation_runs``) has ``held`` (what and why) and ``hold_status``; each decision
is one row per phase in ``consolidation_decisions`` (``PRIMARY KEY (run_id, phase)``: a phase's
held rows are decided once).  The decisions table, not ``hold_status``, says what is still pending.

:func:`approve` applies the held rows of the still-pending phases (or of one ``phase``) so that what
it applies is valid on its own (SPEC §9 as amended):

- the selection is closed under the graph (:func:`deep_sleep.run.holds.close_selection`): a node
  delete takes the held edge deletes that touch it, a META node's ``CLUSTERS`` rows and its own
  update go together.  A closure that reaches into another pending phase decides that phase too
  (and says so); one that reaches into a rejected phase is refused;
- it is validated (every SPEC §4 check) against the run's snapshot with the run's applied part
  folded in — the state the held rows were planned to follow;
- it is applied by :func:`deep_sleep.run.apply.apply_batch` — the very statements and version guard
  of a nightly apply, in one transaction that also writes the decision rows and the run's
  ``hold_status``: a row that a live writer changed since the run's snapshot fails the guard, is left
  as the writer left it and is counted in ``conflicts``; deletes archive their before-images; edges
  held with a node whose delete conflicts stay.  Two approvals of one run race on the decision rows'
  primary key: the first commits, the second waits, fails on it and rolls back — it writes nothing,
  and says so (:class:`~deep_sleep.jobs.errors.HoldError`).

The approval is recorded as a ledger row of its own (``mode = 'approve'``, ``approval_of`` = the
run) with a run directory of its own beside the run's (``<scope>/<as_of>_<approval id>/``: ``diff/``
exactly the rows it applied, ``snapshot/`` the run's snapshot rows of what it updates), so
``deep-sleep undo`` undoes an approval like any run and ``gc`` keeps or removes its files by its own
ledger row; it carries the run's own as_of, so it never moves a scope's "previous run" (those queries
read ``mode = 'nightly'``).  What it applied and its conflicts are its ledger row's ``rows_changed``
and ``conflicts`` (``consolidation_decisions.approval_run_id`` names it).

:func:`reject` records the decision and applies nothing; the held files stay for the record
(``deep-sleep gc`` removes them with the run's directories).

Refused, with nothing written (:class:`~deep_sleep.jobs.errors.HoldError`): a run that is not in the
ledger, not applied (failed or undone), holds nothing, whose held phases (or the one asked for) are
already decided, whose snapshot is gone (the approval could not be validated), or whose selection
fails validation.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import polars as pl

from deep_sleep.core import files
from deep_sleep.core.diff import Diff
from deep_sleep.core.errors import DeepSleepError
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot, utc
from deep_sleep.jobs.errors import HoldError
from deep_sleep.jobs.ledger import RunRecord, get_run
from deep_sleep.jobs.undo_plan import without_rows
from deep_sleep.run import holds
from deep_sleep.run.apply import apply_batch, batch_statements
from deep_sleep.run.slots import DEFAULT_APPLY_SLOTS, apply_slot
from deep_sleep.run.layout import read_scope_diff, read_scope_report, read_scope_snapshot
from deep_sleep.run.pipeline import failure_messages
from deep_sleep.run.transform import as_shard_diff
from deep_sleep.run.statements import LOCK_SQL, Statement
from deep_sleep.store.db import Store
from deep_sleep.transforms.config import ConsolidationConfig, load_config
from deep_sleep.validation import validate_diff

DECISIONS_SQL = (
    "SELECT phase, decision, decided_at, decided_by, decision_id::text FROM consolidation_decisions"
    " WHERE run_id = %s::uuid ORDER BY phase"
)
#: One decision row (parameters: decision_id, run_id, phase, decision, decided_by, held_rows JSON,
#: approval_run_id or null).  A second decision of the same (run, phase) violates the primary key.
DECIDE_SQL = (
    "INSERT INTO consolidation_decisions (decision_id, run_id, phase, decision, decided_by, held_rows, approval_run_id)"
    " VALUES ($1::uuid, $2::uuid, $3, $4, $5, $6::jsonb, $7::uuid)"
)
#: The run's hold_status from its decisions (parameters: the number of held phases, the run id).
STATUS_SQL = """
UPDATE consolidation_runs r SET hold_status = CASE
    WHEN d.n < $1 THEN 'partial'
    WHEN d.approved = d.n THEN 'approved'
    WHEN d.approved = 0 THEN 'rejected'
    ELSE 'decided' END
FROM (SELECT count(*) AS n, count(*) FILTER (WHERE decision = 'approved') AS approved
      FROM consolidation_decisions WHERE run_id = $2::uuid) d
WHERE r.run_id = $2::uuid
"""
UNIQUE_VIOLATION = "23505"


@dataclass(frozen=True)
class Holds:
    """What a run holds: the held diff (a shard diff of one scope), one row per held row with its
    reason, and the decisions so far.

    phases: phase → table → kind → held rows.  decided: phase → {decision, decided_at, decided_by, decision_id}.
    """

    run: RunRecord
    diff: Diff
    reasons: pl.DataFrame
    phases: dict[str, dict[str, dict[str, int]]]
    decided: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def pending(self) -> list[str]:
        return [p for p in self.phases if p not in self.decided]

    def why(self) -> list[str]:
        """The report's sentences on why rows were held (empty when its report.json is gone)."""
        try:
            return list(read_scope_report(self.run.diff_uri, self.run.scope_path).held.get("why", []))
        except (DeepSleepError, OSError):  # the run's files are gone (gc) or unreadable
            return []


@dataclass(frozen=True)
class Decision:
    """One ``approve`` or ``reject``: the phases it decided, the rows they held, and (approve) what landed."""

    run_id: str
    decision: str
    phases: list[str]
    held_rows: dict[str, dict[str, int]]
    applied: dict[str, dict[str, int]] = field(default_factory=dict)
    conflicts: int = 0
    decision_id: str = ""
    approval_run_id: str | None = None
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _counts(diff: Diff) -> dict[str, dict[str, int]]:
    return {t: {k: n for k, n in kinds.items() if n} for t, kinds in diff.row_counts().items() if any(kinds.values())}


def read_holds(store: Store, run_id: str) -> Holds:
    """The held rows of ``run_id`` (a UUID or an unambiguous prefix) and the decisions taken on them."""
    run = get_run(store, run_id)  # LedgerError (an InputError) naming an unknown run
    diff, reasons = (holds.read_held(run.diff_uri, run.scope_path) if run.diff_uri
                     else (Diff.empty(), pl.DataFrame(schema=holds.REASONS_SCHEMA)))
    phases = {p: _counts(holds.only_phases(diff, {p})) for p in holds.phases_of(diff)}
    with store.pg() as con:
        rows = con.execute(DECISIONS_SQL, (run.run_id,)).fetchall()
    decided = {p: {"decision": d, "decided_at": at, "decided_by": by, "decision_id": did} for p, d, at, by, did in rows}
    return Holds(run, diff, reasons, phases, decided)


def _to_decide(h: Holds, phase: str | None, verb: str) -> list[str]:
    run = h.run
    if run.status != "applied" or run.mode in ("approve", "undo"):
        raise HoldError(f"run {run.run_id} is {run.status} ({run.mode}): only an applied run's held rows can be {verb}d")
    if not h.phases:
        where = f"{run.diff_uri}/{holds.HELD_DIR}" if run.diff_uri else "its diff directory (the ledger names none)"
        raise HoldError(f"run {run.run_id} holds nothing ({where} has no held rows); nothing to {verb}")
    if phase is not None:
        if phase not in h.phases:
            raise HoldError(f"run {run.run_id} holds no rows of phase {phase!r}; its held phases: {', '.join(h.phases)}")
        if phase in h.decided:
            d = h.decided[phase]
            raise HoldError(f"phase {phase!r} of run {run.run_id} was already {d['decision']} at {d['decided_at']}"
                            f"{' by ' + d['decided_by'] if d['decided_by'] else ''}; a decision is final")
        return [phase]
    if not h.pending:
        done = ", ".join(f"{p}: {d['decision']}" for p, d in h.decided.items())
        raise HoldError(f"every held phase of run {run.run_id} is already decided ({done}); a decision is final")
    return h.pending


def _decision_statements(h: Holds, phases: list[str], decision: str, decision_id: str, decided_by: str | None,
                         approval_run_id: str | None) -> list[Statement]:
    """The decision rows and the run's new hold_status, as statements of the deciding transaction."""
    out = [Statement("decide", DECIDE_SQL, (decision_id, h.run.run_id, p, decision, decided_by,
                                           json.dumps(h.phases[p], sort_keys=True), approval_run_id),
                     table="consolidation_decisions") for p in phases]
    out.append(Statement("decide", STATUS_SQL, (len(h.phases), h.run.run_id), table="consolidation_runs"))
    return out


def _raced(h: Holds, phases: list[str]) -> HoldError:
    return HoldError(f"run {h.run.run_id}: phase(s) {', '.join(phases)} were decided by another call meanwhile; "
                     "nothing was written (see `deep-sleep report`)")


def _is_unique_violation(exc: BaseException) -> bool:
    return isinstance(exc, psycopg.errors.UniqueViolation) or getattr(exc, "sqlstate", None) == UNIQUE_VIOLATION


def _selection(h: Holds, phases: list[str], snapshot: Snapshot) -> tuple[Diff, list[str], list[str]]:
    """The rows to apply for ``phases``, closed under the graph (module docstring), the phases that
    decides, and notes for the operator."""
    shard = Shard.of(snapshot)
    chosen = holds.close_selection(h.diff, holds.only_phases(h.diff, set(phases)), shard)
    reached = set(holds.phases_of(chosen)) - set(phases)
    rejected = sorted(p for p in reached if p in h.decided)
    if rejected:
        raise HoldError(f"run {h.run.run_id}: approving {', '.join(phases)} would apply held rows of phase(s) "
                        f"{', '.join(rejected)}, which were {h.decided[rejected[0]]['decision']} (an edge goes with its node, "
                        "a META node's CLUSTERS rows and its text go together); nothing was written")
    notes = [f"the held rows of {', '.join(phases)} need rows of {', '.join(sorted(reached))} (an edge goes with its node, "
             "a META node's CLUSTERS rows and its text go together): those phases are decided too"] if reached else []
    return chosen, sorted(set(phases) | reached), notes


def _validate(h: Holds, chosen: Diff, snapshot: Snapshot, config: ConsolidationConfig) -> None:
    """Every SPEC §4 check of ``chosen`` against the run's snapshot with its applied part folded in."""
    whole = as_shard_diff(read_scope_diff(h.run.diff_uri, h.run.scope_path), h.run.scope_path)
    applied = without_rows(whole, h.diff)
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


def approve(store: Store, run_id: str, phase: str | None = None, decided_by: str | None = None,
            config: ConsolidationConfig | None = None) -> Decision:
    """Apply the held rows of ``run_id`` (every still-pending phase, or ``phase``) through the version
    guard, and record the decision in the same transaction; see the module docstring."""
    h = read_holds(store, run_id)
    todo = _to_decide(h, phase, "approve")  # before the snapshot: an undo or approval run is refused as such
    snapshot = _snapshot(h)
    chosen, phases, notes = _selection(h, todo, snapshot)
    config = config or load_config()
    _validate(h, chosen, snapshot, config)
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
            notes={"approve": [f"held rows of run {h.run.run_id}" + (f", phase {phase}" if phase else ""), *notes]},
            approval_of=h.run.run_id,
        )
        report.write(out)
        if remote:  # before the apply: its ledger row names these files
            files.publish_dir(base, location)
        planned = batch_statements(chosen, {h.run.scope_path: report}, cluster_cap=config.meta_nodes.max_members)
        decide = _decision_statements(h, phases, "approved", approval_id, decided_by, approval_id)
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
                        decision_id=approval_id, approval_run_id=approval_id, notes=notes)
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


def reject(store: Store, run_id: str, phase: str | None = None, decided_by: str | None = None) -> Decision:
    """Discard the held rows of ``run_id`` (every still-pending phase, or ``phase``): record the decision
    in one transaction, apply nothing."""
    h = read_holds(store, run_id)
    phases = _to_decide(h, phase, "reject")
    decision_id = str(uuid.uuid4())
    try:
        with store.transaction() as cur:
            cur.execute(LOCK_SQL, parameters=(json.dumps([h.run.scope_path]),))  # the scope's apply lock, as every decision
            cur.fetch_arrow_table()
            for s in _decision_statements(h, phases, "rejected", decision_id, decided_by, None):
                cur.execute(s.sql, parameters=s.params)
    except Exception as exc:
        if _is_unique_violation(exc):
            raise _raced(h, phases) from None
        raise
    decision = Decision(h.run.run_id, "rejected", phases, _counts(holds.only_phases(h.diff, set(phases))),
                        decision_id=decision_id)
    _update_report(h.run, decision)
    return decision


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
        rows.append([p, what, d["decision"] if d else "pending"])
    why = h.why()
    head = f"Run `{h.run.run_id}` (`{h.run.scope}`, as_of {h.run.as_of:%Y-%m-%d %H:%M}) holds rows for approval."
    return "\n\n".join([head, *(f"- {w}" for w in why), markdown_table(["phase", "held rows", "decision"], rows)]) + "\n"


def decision_text(d: Decision) -> str:
    """One line for the terminal (and the notes, if any)."""
    held = sum(n for kinds in d.held_rows.values() for n in kinds.values())
    text = f"run {d.run_id}: {d.decision} {held} held row(s) of {', '.join(d.phases)}"
    if d.decision == "approved":
        landed = sum(n for kinds in d.applied.values() for n in kinds.values())
        text += f"; applied {landed}, {d.conflicts} conflict(s) (rows changed since the snapshot, left as they are)"
    return "\n".join([text, *(f"note: {n}" for n in d.notes)])
