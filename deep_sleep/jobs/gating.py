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
WITH counted AS (
    SELECT scope_path, count(*) AS n, true AS listed FROM memory_nodes WHERE scope_path IS NOT NULL GROUP BY scope_path
    UNION ALL SELECT scope_path, count(*), true FROM episodic_events WHERE scope_path IS NOT NULL GROUP BY scope_path
    UNION ALL SELECT scope_path, count(*), false FROM memory_edges WHERE scope_path IS NOT NULL GROUP BY scope_path
),
scopes AS (SELECT scope_path, sum(n) AS n FROM counted GROUP BY scope_path HAVING bool_or(listed)),
last AS (
    SELECT scope_path, max(as_of) AS as_of FROM consolidation_runs
    WHERE status = 'applied' AND mode = 'nightly' GROUP BY scope_path
)
SELECT s.scope_path, l.as_of AS last_as_of,
       CASE WHEN l.as_of IS NULL THEN 0 ELSE (
           SELECT count(DISTINCT e.session_id) FROM episodic_events e
           WHERE e.scope_path = s.scope_path AND e.created_at > l.as_of AND e.created_at <= %(as_of)s) END AS sessions,
       s.n AS rows
FROM scopes s LEFT JOIN last l USING (scope_path)
ORDER BY s.scope_path
"""

#: The counts above are index-only scans of the tables' ``scope_path`` indexes (a fifth of the heaps'
#: pages), and a scope's new sessions one range of ``episodic_events_scope_created``.  Postgres's
#: default ``random_page_cost = 4`` (a spinning disk's) makes the planner read the whole heaps
#: instead, which took two to three times as long on the 100k-scope fleet (benchmarks/README.md).
#: Set for the gating query's own transaction only.
DUE_PLANNER = "SET LOCAL random_page_cost = 1.1"


@dataclass(frozen=True)
class Gate:
    """One scope's verdict: due or not, and why; ``rows``: its nodes, edges and events (for sharding)."""

    scope_path: str
    due: bool
    reason: str
    last_as_of: datetime | None
    sessions: int
    rows: int = 0


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
        con.execute(DUE_PLANNER)
        rows = con.execute(DUE_SQL, {"as_of": as_of}).fetchall()
    out = []
    for scope_path, last, sessions, size in rows:
        due, reason = gate(last, int(sessions), as_of, config)
        out.append(Gate(scope_path, due, reason, last, int(sessions), int(size or 0)))
    return out


def shards_of(sizes: list[tuple[str, int]], max_rows: int, max_scopes: int) -> list[list[str]]:
    """Group scopes (``(scope_path, rows)`` in the order given) into shards of at most ``max_rows``
    rows and ``max_scopes`` scopes, greedily in order; a scope bigger than ``max_rows`` is a shard of
    its own.  Pure; every scope lands in exactly one shard.

    >>> shards_of([("a", 3), ("b", 3), ("c", 9), ("d", 1)], max_rows=6, max_scopes=10)
    [['a', 'b'], ['c'], ['d']]
    """
    if max_rows < 1 or max_scopes < 1:
        from deep_sleep.core.errors import ConfigError

        raise ConfigError(f"shards need max_rows ≥ 1 and max_scopes ≥ 1 (got {max_rows}, {max_scopes})")
    out: list[list[str]] = []
    current: list[str] = []
    rows = 0
    for scope_path, n in sizes:
        if current and (rows + n > max_rows or len(current) >= max_scopes):
            out.append(current)
            current, rows = [], 0
        current.append(scope_path)
        rows += n
    if current:
        out.append(current)
    return out
