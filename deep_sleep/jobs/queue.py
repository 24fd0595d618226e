"""The held queue across runs and scopes (SPEC §9 as amended: "held rows are counted and approvable
by reason and phase across scopes, not only run by run"; ``deep-sleep held``, ``approve`` /
``reject`` with a selection).

:func:`pending` reads the ledger once: every applied run whose held rows are not all decided
(``hold_status`` ``pending`` or ``partial``), with its pending phases (held phases less the decided
ones, ``consolidation_decisions``) and its held rows by reason and by phase (``consolidation_runs.held``,
written in the apply's own transaction).  A :class:`Selection` narrows it: ``--reason`` (runs holding
rows for that reason), ``--phase``, ``--scope`` (a scope and its descendants, by path, never by string
prefix of an id), ``--older-than`` (runs at least that old).  :func:`grouped` counts it by reason, by
phase and by scope — counts first; the rows of one run are ``deep-sleep plan``'s and the run's
``held/`` files.

A run is *superseded* when a newer run of the same scope holds rows of the same phase: the newer
one re-planned them from a newer snapshot, and approving the older one would mostly meet version
conflicts.  Bulk decisions (:func:`decide`) therefore take, per scope and phase, the newest pending
run only; ``include_superseded`` takes them all (e.g. to reject a backlog).

:func:`decide` approves or rejects the selection run by run — each run one transaction with the
version guard and the graph closure of :func:`deep_sleep.jobs.approve.approve` (a run is a scope:
each scope stays atomic) — and reports every run's outcome; a run refused (decided meanwhile, its
snapshot gone, its selection invalid) is named with the reason and the others go on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import polars as pl

from deep_sleep.core.errors import DeepSleepError, InputError
from deep_sleep.core.scope import SEP, Scope
from deep_sleep.store.db import Store

__all__ = ["Outcome", "Selection", "decide", "grouped", "pending", "queue_markdown"]

_QUEUE_SQL = """
SELECT r.run_id::text, r.scope_path, r.as_of, r.mode, r.held::text,
       coalesce((SELECT array_agg(d.phase ORDER BY d.phase) FROM consolidation_decisions d WHERE d.run_id = r.run_id),
                '{}') AS decided
FROM consolidation_runs r
WHERE r.status = 'applied' AND r.hold_status IN ('pending', 'partial') AND r.mode <> 'approve'
  AND (%(scope)s::text IS NULL OR r.scope_path = %(scope)s OR starts_with(r.scope_path, %(scope)s || %(sep)s))
  AND (%(before)s::timestamptz IS NULL OR r.as_of <= %(before)s)
ORDER BY r.as_of, r.run_id
"""

_SCHEMA = {"run_id": pl.String, "scope_path": pl.String, "as_of": pl.Datetime("us", "UTC"), "phases": pl.List(pl.String),
           "reasons": pl.String, "rows": pl.Int64, "superseded_by": pl.String}


@dataclass(frozen=True)
class Selection:
    """Which held rows: by ``reason``, ``phase``, ``scope`` (and its descendants), ``older_than`` a
    duration before ``now``.  Empty: everything pending."""

    reason: str | None = None
    phase: str | None = None
    scope: Scope | str | None = None
    older_than: timedelta | None = None
    now: datetime | None = None

    def describe(self) -> str:
        parts = [f"reason {self.reason}" if self.reason else "", f"phase {self.phase}" if self.phase else "",
                 f"scope {Scope.coerce(self.scope).display()} and below" if self.scope else "",
                 f"older than {self.older_than}" if self.older_than else ""]
        return ", ".join(p for p in parts if p) or "everything pending"


def pending(store: Store, selection: Selection | None = None) -> pl.DataFrame:
    """One row per pending run of the selection: run_id, scope_path, as_of, phases (pending, of the
    selection), reasons (JSON: reason → held rows of the run), rows (held rows of the run),
    superseded_by (the newer run of the scope holding rows of one of those phases, or null)."""
    sel = selection or Selection()
    if sel.older_than is not None and sel.now is None:
        raise InputError("queue: older_than needs now (the time it is measured from)")
    before = sel.now - sel.older_than if sel.older_than is not None else None
    scope = Scope.coerce(sel.scope).path if sel.scope is not None else None
    with store.pg() as con:
        rows = con.execute(_QUEUE_SQL, {"scope": scope, "sep": SEP, "before": before}).fetchall()
    out: list[dict[str, Any]] = []
    newest: dict[tuple[str, str], str] = {}  # (scope, phase) → the newest run holding it (rows come oldest first)
    for run_id, path, as_of, _mode, held_text, decided in rows:
        held = json.loads(held_text) if held_text else {}
        phases = [p for p in sorted(held.get("phases") or {}) if p not in set(decided or ())]
        for p in phases:
            newest[(path, p)] = run_id
        reasons = held.get("reasons") or {}
        if sel.phase is not None:
            phases = [p for p in phases if p == sel.phase]
        if not phases or (sel.reason is not None and not reasons.get(sel.reason)):
            continue
        out.append({"run_id": run_id, "scope_path": path, "as_of": as_of, "phases": phases,
                    "reasons": json.dumps(reasons, sort_keys=True),
                    "rows": sum(n for kinds in (held.get("rows") or {}).values() for n in kinds.values())})
    for row in out:
        later = {newest[(row["scope_path"], p)] for p in row["phases"]} - {row["run_id"]}
        row["superseded_by"] = min(later) if later else None
    return pl.DataFrame(out, schema=_SCHEMA)


def grouped(queue: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """The queue counted three ways: by reason (runs, held rows), by phase (runs), by scope (runs, rows)."""
    by_reason: dict[str, list[int]] = {}
    for (text,) in queue.select("reasons").iter_rows():
        for reason, n in json.loads(text).items():
            acc = by_reason.setdefault(reason, [0, 0])
            acc[0] += 1
            acc[1] += int(n)
    reason = pl.DataFrame([{"reason": r, "runs": a[0], "rows": a[1]} for r, a in sorted(by_reason.items())],
                          schema={"reason": pl.String, "runs": pl.Int64, "rows": pl.Int64})
    phase = (queue.select("run_id", pl.col("phases")).explode("phases").rename({"phases": "phase"})
             .group_by("phase").agg(pl.len().alias("runs")).sort("phase"))
    scope = (queue.group_by("scope_path").agg(pl.len().alias("runs"), pl.col("rows").sum(),
                                              pl.col("superseded_by").is_not_null().sum().alias("superseded"))
             .sort("scope_path"))
    return {"reason": reason, "phase": phase, "scope": scope}


def queue_markdown(queue: pl.DataFrame, selection: Selection | None = None, runs: bool = False, limit: int = 50) -> str:
    """The queue as Markdown: totals, then counts by reason, phase and scope; with ``runs`` one line
    per run (oldest first, up to ``limit``)."""
    sel = selection or Selection()
    g = grouped(queue)
    sup = queue.get_column("superseded_by").is_not_null().sum() if queue.height else 0
    lines = [f"# Held queue — {sel.describe()}", "",
             f"{queue.height} run(s) in {queue.get_column('scope_path').n_unique() if queue.height else 0} scope(s) "
             f"hold {int(queue.get_column('rows').sum()) if queue.height else 0} row(s) awaiting a decision"
             + (f"; {sup} run(s) superseded by a newer run of their scope" if sup else ""), ""]
    if not queue.height:
        return "\n".join(lines)
    lines += ["## By reason", "| reason | runs | held rows |", "|---|---|---|"]
    lines += [f"| {r} | {n} | {m} |" for r, n, m in g["reason"].iter_rows()]
    lines += ["", "## By phase", "| phase | runs |", "|---|---|"]
    lines += [f"| {p} | {n} |" for p, n in g["phase"].iter_rows()]
    top = g["scope"].sort("rows", descending=True).head(limit)
    lines += ["", f"## By scope (the {top.height} holding most)", "| scope | runs | held rows | superseded |", "|---|---|---|---|"]
    lines += [f"| {Scope.parse(s).display()} | {n} | {m} | {k} |" for s, n, m, k in top.iter_rows()]
    if runs:
        lines += ["", "## Runs", "| run | scope | as_of | phases | reasons | superseded by |", "|---|---|---|---|---|---|"]
        for r in queue.head(limit).iter_rows(named=True):
            lines.append(f"| {r['run_id'][:8]} | {Scope.parse(r['scope_path']).display()} | {r['as_of']:%Y-%m-%d %H:%M} | "
                         f"{', '.join(r['phases'])} | {r['reasons']} | {(r['superseded_by'] or '')[:8]} |")
    return "\n".join(lines)


@dataclass
class Outcome:
    """A bulk decision: per run, what was decided (a :class:`~deep_sleep.jobs.approve.Decision`) or why not."""

    decision: str
    selection: Selection
    decided: list[Any] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (run id, reason)
    skipped_superseded: int = 0

    @property
    def ok(self) -> bool:
        return not self.refused


def decide(store: Store, verb: str, selection: Selection, decided_by: str | None = None, *,
           include_superseded: bool = False, progress: Callable[[str], None] | None = None) -> Outcome:
    """Approve (``verb`` ``approve``) or reject the selection's pending phases, run by run (each one
    transaction, version-guarded, closed under the graph); the newest run per scope and phase only,
    unless ``include_superseded``.  Never raises for one run: a refused run is listed with why."""
    from deep_sleep.jobs.approve import approve, reject

    if verb not in ("approve", "reject"):
        raise InputError(f"queue: verb must be approve or reject, got {verb!r}")
    act = approve if verb == "approve" else reject
    queue = pending(store, selection)
    out = Outcome(verb, selection)
    if not include_superseded:
        out.skipped_superseded = int(queue.get_column("superseded_by").is_not_null().sum()) if queue.height else 0
        queue = queue.filter(pl.col("superseded_by").is_null())
    for i, (run_id, phases) in enumerate(queue.select("run_id", "phases").iter_rows(), 1):
        for phase in phases:
            try:
                out.decided.append(act(store, run_id, phase, decided_by=decided_by))
            except DeepSleepError as exc:
                if "already" in str(exc) and any(d.run_id == run_id and phase in d.phases for d in out.decided):
                    continue  # an earlier phase's closure decided this one too
                out.refused.append((run_id, str(exc)))
        if progress and (i % 100 == 0 or i == queue.height):
            progress(f"{verb}: {i}/{queue.height} run(s)")
    return out
