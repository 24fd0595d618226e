"""Which scopes are due for their nightly run (SPEC §3, last paragraph) — one set-based query for the fleet.

A scope is due when it has never had an applied nightly run, when its last one is at least
``min_interval_hours`` older than ``as_of``, or when it has had ``min_sessions`` or more new
sessions (distinct ``episodic_events.session_id`` created after the last run's ``as_of``) —
whichever comes first.  Every other scope is skipped with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from deep_sleep.core.config import GatingConfig
from deep_sleep.store.db import Store

DUE_SQL = """
WITH scopes AS (
    SELECT DISTINCT scope_path FROM memory_nodes WHERE scope_path IS NOT NULL
    UNION SELECT DISTINCT scope_path FROM episodic_events WHERE scope_path IS NOT NULL
),
last AS (
    SELECT scope_path, max(as_of) AS as_of FROM consolidation_runs
    WHERE status = 'applied' AND mode = 'nightly' GROUP BY scope_path
),
sessions AS (
    SELECT e.scope_path, count(DISTINCT e.session_id) AS n
    FROM episodic_events e JOIN last l ON l.scope_path = e.scope_path
    WHERE e.created_at > l.as_of AND e.created_at <= %(as_of)s
    GROUP BY e.scope_path
)
SELECT s.scope_path, l.as_of AS last_as_of, coalesce(x.n, 0) AS sessions
FROM scopes s LEFT JOIN last l USING (scope_path) LEFT JOIN sessions x USING (scope_path)
ORDER BY s.scope_path
"""


@dataclass(frozen=True)
class Gate:
    """One scope's verdict: due or not, and why."""

    scope_path: str
    due: bool
    reason: str
    last_as_of: datetime | None
    sessions: int


def gate(last_as_of: datetime | None, sessions: int, as_of: datetime, config: GatingConfig) -> tuple[bool, str]:
    """Pure rule: (due, reason)."""
    if last_as_of is None:
        return True, "never consolidated"
    hours = (as_of - last_as_of).total_seconds() / 3600
    if hours >= config.min_interval_hours:
        return True, f"last run {hours:.1f} h ago (≥ {config.min_interval_hours:g} h)"
    if sessions >= config.min_sessions:
        return True, f"{sessions} new sessions (≥ {config.min_sessions})"
    return False, (f"gated: last run {hours:.1f} h ago (< {config.min_interval_hours:g} h) and "
                   f"{sessions} new sessions (< {config.min_sessions})")


def due_scopes(store: Store, as_of: datetime, config: GatingConfig) -> list[Gate]:
    """Every scope of the store with its verdict, in scope_path order."""
    with store.pg() as con:
        rows = con.execute(DUE_SQL, {"as_of": as_of}).fetchall()
    out = []
    for scope_path, last, sessions in rows:
        due, reason = gate(last, int(sessions), as_of, config)
        out.append(Gate(scope_path, due, reason, last, int(sessions)))
    return out
