"""Run health: "capability is not occurrence", at fleet scale (issue 16).

A consolidation that silently stops doing its job looks exactly like one with nothing to do.
After a night, :func:`health` reads the ledger and the store (set-based SQL, once for the whole
fleet) and raises an alert per scope for each of:

* ``idle_with_activity`` — the scope had activity (new episodic sessions or access-log rows) before
  each of its last ``idle_nights`` applied nightly runs, yet none of them changed a row;
* ``skipped_with_input`` — the last nightly run skipped a phase for "missing input" although the
  store held input that phase should have processed: rows of that input (:data:`MISSING_INPUT`)
  created (nodes: updated) at or before the run's ``as_of``, less the rows the run itself set aside
  before the phase looked — the rows it quarantined, and the rows an earlier phase of the same run
  took away (:data:`CONSUMED_EARLIER`: working memory working_ttl expired before drift, events
  episodic_summary summarised before synthetic_links).  Those rows are still in the store after the
  run whenever its deletes are held (a failed recall-quality gate holds them all), and a phase that
  finds nothing left of them has done its job, not skipped it;
* ``conflict_rate`` — the last nightly run lost more than ``max_conflict_rate`` of its writes to
  live-write conflicts (conflicts / (rows changed + conflicts));
* ``quarantine_jump`` — the last run quarantined at least ``quarantine_jump_min`` rows and more
  than ``quarantine_jump_factor`` × the most the scope's previous runs quarantined;
* ``gated_too_long`` — the scope's last applied nightly run is older than ``gated_factor`` ×
  ``gating.min_interval_hours`` (or it has rows and never had one that long after its first row).

:func:`alerts_from_rows` holds the rules (pure, over the rows the queries return); :func:`health`
runs the queries.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta

from psycopg.rows import dict_row

from deep_sleep.core.config import HealthConfig
from deep_sleep.core.scope import Scope
from deep_sleep.core.snapshot import utc
from deep_sleep.store.db import Store

#: "missing input" skip reasons → the store rows that are that input (table, extra condition on ``x``).
MISSING_INPUT = {
    "missing input: no episodic events": ("episodic_events", "true"),
    "missing input: no recall events": ("recall_events", "true"),
    "missing input: no pending connections": ("pending_connections", "consumed_by_run IS NULL"),
    "missing input: no working memory": ("memory_nodes", "layer = 'working'"),
}

#: Input that an earlier phase of the same run takes away before the skipping phase looks, so that
#: its absence there is the roster working, not a phase failing: (skipping phase, reason) → (the
#: earlier phase, the condition on ``x`` true for the rows that phase takes, ``w.at`` being the run's
#: ``as_of``).  Applies only when the earlier phase ran in that run (``phases_run``).
#:
#: * drift (D4) reads working memory after working_ttl (phase 8) expired it: a working note whose
#:   ``updated_at + ttl_hours`` is at or before ``as_of`` is gone by then (working_ttl's own rule; a
#:   note without a numeric, finite ``ttl_hours`` never expires).
#: * synthetic_links (11) reads the events episodic_summary (phase 10) left: an event a summary node
#:   of its scope names in ``source_ids`` was summarised (and deleted) before it.
#:
#: The earlier phase's deletes may be held (a failed recall-quality gate holds every delete), so the
#: rows are still in the store after the run although the run's own diff removed them: the store
#: alone cannot tell these rows from input that was missed.
CONSUMED_EARLIER = {
    ("drift", "missing input: no working memory"): (
        "working_ttl",
        "CASE WHEN (x.properties->>'ttl_hours') ~ '^[-+]?([0-9]+[.]?[0-9]*|[.][0-9]+)([eE][-+]?[0-9]{1,3})?$' "
        "THEN extract(epoch FROM w.at - x.updated_at) * 1000000 "
        ">= trunc((x.properties->>'ttl_hours')::numeric * 3600000000) ELSE false END"),
    ("synthetic_links", "missing input: no episodic events"): (
        "episodic_summary",
        "EXISTS (SELECT 1 FROM memory_nodes s WHERE s.scope_path = x.scope_path "
        "AND s.label = 'META:episodic_summary' AND s.properties->'source_ids' ? x.id::text)"),
}


@dataclass(frozen=True)
class Alert:
    scope_path: str
    check: str
    message: str

    @property
    def scope(self) -> str:
        return str(Scope.parse(self.scope_path))


def alerts_from_rows(runs: Iterable[dict], active_windows: set[tuple[str, datetime]], inputs: set[tuple[str, str, str]],
                     first_rows: dict[str, datetime], as_of: datetime, min_interval_hours: float,
                     config: HealthConfig) -> list[Alert]:
    """The alerts, from each scope's applied nightly runs (newest first: ``scope_path``, ``as_of``,
    ``changed``, ``conflicts``, ``quarantined``, ``phases_skipped``), the (scope, run as_of) pairs with
    activity before that run, the (scope, phase, skip reason) triples whose phase skipped input it should
    have processed, and each scope's
    oldest row time (pure)."""
    by_scope: dict[str, list[dict]] = {}
    for r in runs:
        by_scope.setdefault(r["scope_path"], []).append(r)
    out: list[Alert] = []
    limit = timedelta(hours=config.gated_factor * min_interval_hours)
    for scope_path in sorted(set(by_scope) | set(first_rows)):
        mine = sorted(by_scope.get(scope_path, []), key=lambda r: r["as_of"], reverse=True)
        if mine:
            last = mine[0]
            recent = mine[: config.idle_nights]
            if (len(recent) == config.idle_nights and all(r["changed"] == 0 for r in recent)
                    and all((scope_path, r["as_of"]) in active_windows for r in recent)):
                out.append(Alert(scope_path, "idle_with_activity",
                                 f"{config.idle_nights} nightly runs in a row changed nothing although the scope had "
                                 "new sessions or accesses before each"))
            for phase, reason in sorted((last["phases_skipped"] or {}).items()):
                if (scope_path, phase, reason) in inputs:
                    out.append(Alert(scope_path, "skipped_with_input",
                                     f"{phase} was skipped ({reason}) although the store had that input"))
            writes = last["changed"] + last["conflicts"]
            if writes and last["conflicts"] / writes > config.max_conflict_rate:
                out.append(Alert(scope_path, "conflict_rate",
                                 f"{last['conflicts']} of {writes} writes conflicted with live writes "
                                 f"({last['conflicts'] / writes:.0%} > {config.max_conflict_rate:.0%})"))
            before = max((r["quarantined"] for r in mine[1:]), default=0)
            if last["quarantined"] >= config.quarantine_jump_min and last["quarantined"] > config.quarantine_jump_factor * before:
                out.append(Alert(scope_path, "quarantine_jump",
                                 f"{last['quarantined']} rows quarantined (the most before: {before})"))
            if as_of - last["as_of"] > limit:
                out.append(Alert(scope_path, "gated_too_long",
                                 f"last applied nightly run {(as_of - last['as_of']).total_seconds() / 3600:.0f} h ago "
                                 f"(> {config.gated_factor:g} × {min_interval_hours:g} h)"))
        elif scope_path in first_rows and as_of - first_rows[scope_path] > limit:
            out.append(Alert(scope_path, "gated_too_long",
                             f"never consolidated, although its first row is "
                             f"{(as_of - first_rows[scope_path]).total_seconds() / 3600:.0f} h old"))
    return out


#: Runs per scope the rules look at (the idle streak, and the quarantine history a jump is measured against).
HISTORY = 10

_RUNS_SQL = """
SELECT run_id, scope_path, as_of, conflicts, phases_run, phases_skipped, changed, quarantined, previous_as_of FROM (
    SELECT run_id, scope_path, as_of, conflicts, phases_run, phases_skipped,
           coalesce((SELECT sum((k.value)::bigint) FROM jsonb_each(rows_changed) t, jsonb_each_text(t.value) k), 0)::bigint AS changed,
           coalesce((SELECT sum((k.value)::bigint) FROM jsonb_each(quarantined) t, jsonb_each_text(t.value) k), 0)::bigint AS quarantined,
           lead(as_of) OVER w AS previous_as_of, row_number() OVER w AS n
    FROM consolidation_runs WHERE status = 'applied' AND mode = 'nightly' AND as_of <= %(as_of)s
    WINDOW w AS (PARTITION BY scope_path ORDER BY as_of DESC)
) r WHERE n <= %(history)s
"""

# Input rows of the skipping run's scope at its as_of that the run neither quarantined nor (when the
# earlier phase ran: ``w.taken``) had an earlier phase take away.
_INPUT_SQL = """
SELECT w.scope_path FROM unnest(%(paths)s::text[], %(at)s::timestamptz[], %(runs)s::uuid[], %(taken)s::boolean[])
    AS w(scope_path, at, run_id, taken)
WHERE EXISTS (SELECT 1 FROM {table} x WHERE x.scope_path = w.scope_path AND {cond} AND x.{stamp} <= w.at
                AND NOT (w.taken AND {consumed})
                AND NOT EXISTS (SELECT 1 FROM consolidation_quarantine q WHERE q.run_id = w.run_id
                                  AND q.table_name = '{table}' AND q.row_id = x.id::text))
"""

_ACTIVE_SQL = """
WITH w AS (SELECT unnest(%(paths)s::text[]) AS scope_path, unnest(%(tos)s::timestamptz[]) AS hi,
                  unnest(%(froms)s::timestamptz[]) AS lo)
SELECT w.scope_path, w.hi FROM w
WHERE EXISTS (SELECT 1 FROM episodic_events e WHERE e.scope_path = w.scope_path AND e.created_at <= w.hi
                AND (w.lo IS NULL OR e.created_at > w.lo))
   OR EXISTS (SELECT 1 FROM memory_access_log a WHERE a.scope_path = w.scope_path AND a.accessed_at <= w.hi
                AND (w.lo IS NULL OR a.accessed_at > w.lo))
"""

_FIRST_ROWS_SQL = "SELECT scope_path, min(created_at) FROM memory_nodes WHERE scope_path IS NOT NULL GROUP BY 1"


def health(store: Store, as_of: datetime, config: HealthConfig | None = None,
           min_interval_hours: float = 24.0) -> list[Alert]:
    """Every alert of the fleet at ``as_of`` (see the module docstring)."""
    config = config or HealthConfig()
    as_of = utc(as_of)
    with store.pg() as con, con.cursor(row_factory=dict_row) as cur:
        runs = cur.execute(_RUNS_SQL, {"as_of": as_of, "history": max(HISTORY, config.idle_nights)}).fetchall()
        recent: dict[str, list[dict]] = {}
        for r in sorted(runs, key=lambda r: r["as_of"], reverse=True):
            recent.setdefault(r["scope_path"], []).append(r)
        windows = [r for rs in recent.values() for r in rs[: config.idle_nights]]
        active = set()
        if windows:
            rows = cur.execute(_ACTIVE_SQL, {"paths": [r["scope_path"] for r in windows],
                                             "tos": [r["as_of"] for r in windows],
                                             "froms": [r["previous_as_of"] for r in windows]}).fetchall()
            active = {(r["scope_path"], r["hi"]) for r in rows}
        inputs = set()
        asked: dict[tuple[str, str], list[dict]] = {}  # (phase, reason) → the last runs that skipped it so
        for rs in recent.values():
            for phase, reason in (rs[0]["phases_skipped"] or {}).items():
                if reason in MISSING_INPUT:
                    asked.setdefault((phase, reason), []).append(rs[0])
        for (phase, reason), last in sorted(asked.items()):  # one query per (phase, input), for the whole fleet
            table, cond = MISSING_INPUT[reason]
            earlier, consumed = CONSUMED_EARLIER.get((phase, reason), (None, "false"))
            sql = _INPUT_SQL.format(table=table, cond=cond, consumed=consumed,
                                    stamp="updated_at" if table == "memory_nodes" else "created_at")
            found = cur.execute(sql, {"paths": [r["scope_path"] for r in last], "at": [r["as_of"] for r in last],
                                      "runs": [r["run_id"] for r in last],
                                      "taken": [earlier in (r["phases_run"] or []) for r in last]}).fetchall()
            inputs |= {(r["scope_path"], phase, reason) for r in found}
        first = {r["scope_path"]: r["min"] for r in cur.execute(_FIRST_ROWS_SQL).fetchall()}
    return alerts_from_rows(runs, active, inputs, first, as_of, min_interval_hours, config)


def health_markdown(alerts: list[Alert]) -> str:
    if not alerts:
        return "run health: no alerts"
    lines = [f"run health: {len(alerts)} alert(s)", "", "| scope | check | what |", "|---|---|---|"]
    lines += [f"| {a.scope} | {a.check} | {a.message} |" for a in alerts]
    return "\n".join(lines)


__all__ = ["Alert", "CONSUMED_EARLIER", "HealthConfig", "MISSING_INPUT", "alerts_from_rows", "health", "health_markdown"]
