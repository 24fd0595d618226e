"""The nightly's gating query (``due_scopes``) on a store of its own: which scopes it lists, their
verdicts, new sessions and row counts, against the rule computed here from the rows inserted."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from deep_sleep.core.config import GatingConfig
from deep_sleep.core.scope import Scope
from deep_sleep.jobs.gating import due_scopes
from tests.storeutil import create_database, drop_database, edge, insert, node

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


@pytest.fixture
def gstore(admin_dsn):
    name = f"ds_gating_{os.getpid()}"
    yield create_database(admin_dsn, name)
    drop_database(admin_dsn, name)


def _events(scope: Scope, sessions: list[str | None], at: datetime) -> list[dict]:
    return [{"id": str(uuid.uuid4()), "scope_path": scope.path, "tenant_id": scope.tenant_id, "session_id": s,
             "content": "turn", "created_at": at} for s in sessions]


def _run(scope: Scope, as_of: datetime, status: str = "applied", mode: str = "nightly") -> dict:
    return {"run_id": str(uuid.uuid4()), "scope_path": scope.path, "mode": mode, "as_of": as_of,
            "started_at": as_of, "status": status}


def test_due_scopes_lists_every_scope_with_nodes_or_events_its_verdict_sessions_and_rows(gstore):
    org = Scope.root("org", "g")
    never, busy, quiet, old = (org.child("brand", b) for b in ("never", "busy", "quiet", "old"))
    prefix = Scope.root("org", "g").child("brand", "qui")  # a string prefix of "quiet"
    only_events, only_edges = org.child("brand", "events"), org.child("brand", "edges")
    hour_ago, two_days = NOW - timedelta(hours=1), NOW - timedelta(days=2)
    nodes = {s: [node(s, f"n{i}", two_days) for i in range(k)]
             for s, k in ((never, 3), (busy, 2), (quiet, 4), (old, 1), (prefix, 2))}
    insert(gstore, "memory_nodes", [r for rows in nodes.values() for r in rows])
    insert(gstore, "memory_edges", [edge(never, nodes[never][0]["id"], nodes[never][1]["id"]),
                                    edge(quiet, nodes[quiet][0]["id"], nodes[quiet][1]["id"]),
                                    edge(quiet, nodes[quiet][1]["id"], nodes[quiet][2]["id"]),
                                    edge(only_edges, str(uuid.uuid4()), str(uuid.uuid4()))])
    insert(gstore, "episodic_events",
           _events(busy, [f"s{i}" for i in range(20)] + ["s0", "s1"], NOW - timedelta(minutes=30))  # 20 distinct
           + _events(busy, ["before"], hour_ago - timedelta(minutes=1))   # before the last run: not new
           + _events(busy, ["later"], NOW + timedelta(minutes=5))         # after as_of: not seen yet
           + _events(quiet, ["a", "b", None], NOW - timedelta(minutes=10))
           + _events(prefix, [f"p{i}" for i in range(25)], NOW - timedelta(minutes=10))  # never run: no session count
           + _events(only_events, ["x"], two_days))
    runs = [_run(busy, hour_ago), _run(busy, two_days),
            _run(quiet, hour_ago), _run(quiet, NOW - timedelta(minutes=20), status="failed"),
            _run(quiet, NOW - timedelta(minutes=15), mode="quick_nap"),
            _run(old, NOW - timedelta(hours=24))]
    with gstore.pg() as con:  # the ledger is no snapshot table: straight SQL
        con.cursor().executemany("INSERT INTO consolidation_runs (run_id, scope_path, mode, as_of, started_at, status) "
                                 "VALUES (%(run_id)s, %(scope_path)s, %(mode)s, %(as_of)s, %(started_at)s, %(status)s)", runs)
    # a legacy row (no scope_path) is the backfill's, not the nightly's
    insert(gstore, "memory_nodes", [{**node(org, "legacy", two_days), "scope_path": None}])

    got = {g.scope_path: g for g in due_scopes(gstore, NOW, GatingConfig())}

    assert list(got) == sorted(got)  # in scope_path order
    assert set(got) == {s.path for s in (never, busy, quiet, old, prefix, only_events)}  # edges alone list nothing
    expect = {  # scope: (due, last run's as_of, new sessions, nodes + edges + events)
        never: (True, None, 0, 3 + 1),
        busy: (True, hour_ago, 20, 2 + 24),
        quiet: (False, hour_ago, 2, 4 + 2 + 3),  # a failed nightly and a quick nap are not the last run
        old: (True, NOW - timedelta(hours=24), 0, 1),
        prefix: (True, None, 0, 2 + 25),
        only_events: (True, None, 0, 1),
    }
    for s, (due, last, sessions, rows) in expect.items():
        g = got[s.path]
        assert (g.due, g.last_as_of, g.sessions, g.rows) == (due, last, sessions, rows), s.display()
    assert "20 new sessions" in got[busy.path].reason and got[quiet.path].reason.startswith("gated")
