"""The held queue across runs and scopes (SPEC §9 as amended: "held rows are counted and approvable
by reason and phase across scopes, not only run by run"; ``deep-sleep held``, ``approve`` /
``reject`` with a selection).

What the queue counts is what an operator must decide: the **pending rows of the current run per
scope and phase** (issue 37).  :func:`pending` reads the ledger once:

1. every applied run that held rows (``consolidation_runs.held``, written in the apply's own
   transaction) of the selection's scopes, pending *and* decided;
2. **supersession, before any other filter**: per (scope, phase) the newest of those runs (by
   ``as_of``, then start) is current; an older run's rows of that phase are *superseded* — the newer
   run re-planned the phase from a newer snapshot, and approving the older plan would apply a stale
   one.  A decided newer run supersedes as well: rejecting the newest plan never revives an older
   one.  Superseded rows leave the queue (they *expire*: still in the ledger and the run's files,
   never applied by a bulk decision);
3. each run's held rows per phase and reason (``held.cells``) less the rows decided so far
   (``consolidation_decided_rows``; a whole-phase decision of an earlier release decides its phase);
4. the selection: ``--reason`` (rows held for that reason), ``--phase``, ``--scope`` (a scope and
   its descendants, by path, never by string prefix of an id), ``--older-than`` (runs at least that
   old) — applied to rows, after supersession.

One row per (run, phase) with pending rows of the selection.  :func:`grouped` counts them by reason,
by phase and by scope — counts first; the rows of one run are ``deep-sleep plan``'s and the run's
``held/`` files.

:func:`decide` approves or rejects the selection run by run — each run one transaction with the
version guard and the graph closure of :func:`deep_sleep.jobs.approve.approve` (a run is a scope:
each scope stays atomic), taking exactly the selected rows plus the rows their closure needs (which
each decision lists) — and reports every run's outcome; a run refused (decided meanwhile, its
snapshot gone, its selection invalid) is named with the reason and the others go on.  Superseded
rows are never approved; ``include_superseded`` (reject only) records a rejection of them too.
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

__all__ = ["Outcome", "Selection", "by_run", "decide", "grouped", "pending", "queue_markdown"]

#: Every applied run that held rows, of the scope (and below) or of every scope.
_RUNS_SQL = """
SELECT r.run_id::text, r.scope_path, r.as_of, r.started_at, r.hold_status, r.held::text, r.diff_uri
FROM consolidation_runs r
WHERE r.status = 'applied' AND r.hold_status <> 'none' AND r.mode NOT IN ('approve', 'undo')
  AND (%(scope)s::text IS NULL OR r.scope_path = %(scope)s OR starts_with(r.scope_path, %(scope)s || %(sep)s))
ORDER BY r.as_of, r.started_at, r.run_id
"""
#: The rows decided so far of the given runs, per phase and reason; and their whole-phase decisions.
_DECIDED_SQL = """
SELECT run_id::text, phase, reason, count(*) FROM consolidation_decided_rows
WHERE run_id = ANY(%(runs)s::uuid[]) GROUP BY 1, 2, 3
"""
_WHOLE_SQL = "SELECT run_id::text, phase FROM consolidation_decisions WHERE NOT by_rows AND run_id = ANY(%(runs)s::uuid[])"

_SCHEMA = {"run_id": pl.String, "scope_path": pl.String, "as_of": pl.Datetime("us", "UTC"), "phase": pl.String,
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


def _cells(held: dict[str, Any], scope_path: str, diff_uri: str | None) -> dict[str, dict[str, int]]:
    """phase → reason → held rows of a run: the ledger's ``held.cells``; for runs of earlier releases
    derived from ``phases`` and ``reasons`` when one of them has a single entry, else read from the
    run's ``held/reasons.parquet`` (a phase's rows count as ``unknown`` when that is gone)."""
    if "cells" in held:
        return {p: {r: int(n) for r, n in rs.items()} for p, rs in held["cells"].items()}
    phases, reasons = held.get("phases") or {}, held.get("reasons") or {}
    if len(phases) == 1:
        return {next(iter(phases)): {r: int(n) for r, n in reasons.items()}}
    if len(reasons) == 1:
        return {p: {next(iter(reasons)): int(n)} for p, n in phases.items()}
    if diff_uri:
        from deep_sleep.run.holds import read_held

        try:
            _, rows = read_held(diff_uri, scope_path)
        except (DeepSleepError, OSError):
            rows = None
        if rows is not None and rows.height:
            out: dict[str, dict[str, int]] = {}
            for p, r, n in rows.group_by("phase", "reason").len().iter_rows():
                out.setdefault(p, {})[r] = n
            return out
    return {p: {"unknown": int(n)} for p, n in phases.items()}


def pending(store: Store, selection: Selection | None = None, *, include_superseded: bool = False) -> pl.DataFrame:
    """One row per (run, phase) with pending held rows of the selection: run_id, scope_path, as_of,
    phase, reasons (JSON: reason → pending rows of the selection), rows (their sum), superseded_by
    (the newer run of the scope holding rows of that phase — null for the current run; superseded
    rows are left out unless ``include_superseded``).  Oldest first.  See the module docstring."""
    sel = selection or Selection()
    if sel.older_than is not None and sel.now is None:
        raise InputError("queue: older_than needs now (the time it is measured from)")
    before = sel.now - sel.older_than if sel.older_than is not None else None
    scope = Scope.coerce(sel.scope).path if sel.scope is not None else None
    with store.pg() as con:
        runs = con.execute(_RUNS_SQL, {"scope": scope, "sep": SEP}).fetchall()
        open_runs = [r[0] for r in runs if r[4] in ("pending", "partial")]
        decided = con.execute(_DECIDED_SQL, {"runs": open_runs}).fetchall() if open_runs else []
        whole = con.execute(_WHOLE_SQL, {"runs": open_runs}).fetchall() if open_runs else []
    done: dict[tuple[str, str, str], int] = {(r, p, why): int(n) for r, p, why, n in decided}
    whole_phase = {(r, p) for r, p in whole}
    newest: dict[tuple[str, str], str] = {}  # (scope, phase) → the newest run holding it (rows come oldest first)
    held_of: dict[str, dict[str, Any]] = {}
    for run_id, path, _as_of, _started, _status, held_text, _uri in runs:
        held = json.loads(held_text) if held_text else {}
        held_of[run_id] = held
        for p in held.get("phases") or {}:
            newest[(path, p)] = run_id
    out: list[dict[str, Any]] = []
    for run_id, path, as_of, _started, status, _held, diff_uri in runs:
        if status not in ("pending", "partial") or (before is not None and as_of > before):
            continue
        for phase, reasons in sorted(_cells(held_of[run_id], path, diff_uri).items()):
            if (sel.phase is not None and phase != sel.phase) or (run_id, phase) in whole_phase:
                continue
            left = {r: n - done.get((run_id, phase, r), 0) for r, n in reasons.items()}
            left = {r: n for r, n in sorted(left.items()) if n > 0 and (sel.reason is None or r == sel.reason)}
            current = newest[(path, phase)]
            if not left or (current != run_id and not include_superseded):
                continue
            out.append({"run_id": run_id, "scope_path": path, "as_of": as_of, "phase": phase,
                        "reasons": json.dumps(left, sort_keys=True), "rows": sum(left.values()),
                        "superseded_by": current if current != run_id else None})
    return pl.DataFrame(out, schema=_SCHEMA)


def by_run(queue: pl.DataFrame) -> pl.DataFrame:
    """The queue per run (oldest first): run_id, scope_path, as_of, phases, rows, superseded (phases)."""
    return (queue.group_by("run_id", maintain_order=True)
            .agg(pl.col("scope_path").first(), pl.col("as_of").first(), pl.col("phase").alias("phases"),
                 pl.col("rows").sum(), pl.col("superseded_by").is_not_null().sum().alias("superseded")))


def _reason_rows(queue: pl.DataFrame) -> pl.DataFrame:
    """One row per (run, phase, reason) of the queue with its pending rows."""
    rows = [{"run_id": run_id, "scope_path": s, "phase": p, "reason": r, "rows": int(n)}
            for run_id, s, p, text in queue.select("run_id", "scope_path", "phase", "reasons").iter_rows()
            for r, n in json.loads(text).items()]
    return pl.DataFrame(rows, schema={"run_id": pl.String, "scope_path": pl.String, "phase": pl.String,
                                      "reason": pl.String, "rows": pl.Int64})


def grouped(queue: pl.DataFrame) -> dict[str, pl.DataFrame]:
    """The queue counted three ways: by reason (runs, pending rows), by phase (runs, rows), by scope
    (runs, rows, superseded phases)."""
    cells = _reason_rows(queue)
    reason = (cells.group_by("reason").agg(pl.col("run_id").n_unique().alias("runs"), pl.col("rows").sum())
              .sort("reason").cast({"runs": pl.Int64}))
    phase = (queue.group_by("phase").agg(pl.col("run_id").n_unique().alias("runs"), pl.col("rows").sum())
             .sort("phase").cast({"runs": pl.Int64}))
    scope = (queue.group_by("scope_path").agg(pl.col("run_id").n_unique().alias("runs"), pl.col("rows").sum(),
                                              pl.col("superseded_by").is_not_null().sum().alias("superseded"))
             .sort("scope_path").cast({"runs": pl.Int64}))
    return {"reason": reason, "phase": phase, "scope": scope}


def queue_markdown(queue: pl.DataFrame, selection: Selection | None = None, runs: bool = False, limit: int = 50,
                   expired: pl.DataFrame | None = None) -> str:
    """The queue as Markdown: totals, then counts by reason, phase and scope; with ``runs`` one line
    per run (oldest first, up to ``limit``).  ``expired``: the superseded rows of the selection
    (:func:`pending` with ``include_superseded``), counted on the totals line."""
    sel = selection or Selection()
    g = grouped(queue)
    n_runs = queue.get_column("run_id").n_unique() if queue.height else 0
    lines = [f"# Held queue — {sel.describe()}", "",
             f"{n_runs} run(s) in {queue.get_column('scope_path').n_unique() if queue.height else 0} scope(s) "
             f"hold {int(queue.get_column('rows').sum()) if queue.height else 0} row(s) awaiting a decision "
             "(the current run per scope and phase)"]
    gone = expired.filter(pl.col("superseded_by").is_not_null()) if expired is not None and expired.height else None
    if gone is not None and gone.height:
        lines[-1] += (f"; {int(gone.get_column('rows').sum())} more row(s) in {gone.get_column('run_id').n_unique()} "
                      "older run(s) expired (superseded by a newer run of their scope and phase; kept in the ledger)")
    lines.append("")
    if not queue.height:
        return "\n".join(lines)
    lines += ["## By reason", "| reason | runs | held rows |", "|---|---|---|"]
    lines += [f"| {r} | {n} | {m} |" for r, n, m in g["reason"].iter_rows()]
    lines += ["", "## By phase", "| phase | runs | held rows |", "|---|---|---|"]
    lines += [f"| {p} | {n} | {m} |" for p, n, m in g["phase"].iter_rows()]
    top = g["scope"].sort("rows", descending=True).head(limit)
    lines += ["", f"## By scope (the {top.height} holding most)", "| scope | runs | held rows |", "|---|---|---|"]
    lines += [f"| {Scope.parse(s).display()} | {n} | {m} |" for s, n, m, _ in top.iter_rows()]
    if runs:
        per_run = by_run(queue)
        reasons = _reason_rows(queue).group_by("run_id").agg(pl.struct("reason", "rows"))
        text = {r: json.dumps({x["reason"]: x["rows"] for x in xs}, sort_keys=True) for r, xs in reasons.iter_rows()}
        lines += ["", "## Runs", "| run | scope | as_of | phases | reasons |", "|---|---|---|---|---|"]
        for r in per_run.head(limit).iter_rows(named=True):
            lines.append(f"| {r['run_id'][:8]} | {Scope.parse(r['scope_path']).display()} | {r['as_of']:%Y-%m-%d %H:%M} | "
                         f"{', '.join(r['phases'])} | {text.get(r['run_id'], '')} |")
    return "\n".join(lines)


@dataclass
class Outcome:
    """A bulk decision: per run, what was decided (a :class:`~deep_sleep.jobs.approve.Decision`) or why
    not; ``skipped_superseded``: the (run, phase) pairs of the selection that expired (left alone)."""

    decision: str
    selection: Selection
    decided: list[Any] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)  # (run id, reason)
    skipped_superseded: int = 0

    @property
    def ok(self) -> bool:
        return not self.refused

    @property
    def closure(self) -> list[dict[str, str]]:
        """Every row the closure under the graph added to the selection, with its run."""
        return [{"run_id": d.run_id, **row} for d in self.decided for row in d.closure]


def decide(store: Store, verb: str, selection: Selection, decided_by: str | None = None, *,
           include_superseded: bool = False, progress: Callable[[str], None] | None = None) -> Outcome:
    """Approve (``verb`` ``approve``) or reject the selection's pending rows of the current run per
    scope and phase, run by run (each one transaction, version-guarded, closed under the graph: the
    rows held for another reason are decided only when the closure needs them, and listed).
    ``include_superseded`` (reject only): the expired rows of older runs are rejected too.  Never
    raises for one run: a refused run is listed with why."""
    from deep_sleep.jobs.approve import approve, reject

    if verb not in ("approve", "reject"):
        raise InputError(f"queue: verb must be approve or reject, got {verb!r}")
    if include_superseded and verb == "approve":
        raise InputError("approve: superseded rows expired (a newer run re-planned their phase) and are never approved; "
                         "leave out --include-superseded (it is for reject)")
    act = approve if verb == "approve" else reject
    queue = pending(store, selection, include_superseded=True)
    out = Outcome(verb, selection)
    if not include_superseded:
        out.skipped_superseded = int(queue.get_column("superseded_by").is_not_null().sum()) if queue.height else 0
        queue = queue.filter(pl.col("superseded_by").is_null())
    per_run = by_run(queue)
    for i, (run_id, phases) in enumerate(per_run.select("run_id", "phases").iter_rows(), 1):
        try:
            out.decided.append(act(store, run_id, decided_by=decided_by, reason=selection.reason, phases=phases))
        except DeepSleepError as exc:
            out.refused.append((run_id, str(exc)))
        if progress and (i % 100 == 0 or i == per_run.height):
            progress(f"{verb}: {i}/{per_run.height} run(s)")
    return out
