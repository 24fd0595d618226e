"""A day of live turns over a fleet (``live_day``): the fleet benchmark's input for a second night."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import pytest

from deep_sleep.dev.errors import SeedError
from deep_sleep.dev.fleet import FleetSpec, fleet_scope, generate_fleet, live_day
from deep_sleep.dev.seed import load
from deep_sleep.run import pipeline
from deep_sleep.store.db import create_database, drop_database

NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
DAY = timedelta(days=1)
TABLES = ("memory_nodes", "episodic_events", "memory_access_log")


@pytest.fixture(scope="module")
def fleet(admin_dsn):
    """A fleet of 3 scopes on a database of its own (a live day writes into the scopes it is given,
    and this module's nights consolidate them), the first night at NOW applied."""
    name = f"ds_live_day_{os.getpid()}"
    store = create_database(admin_dsn, name)
    load(store, generate_fleet(FleetSpec(scopes=3, nodes=40, templates=2, now=NOW, seed=5)))
    first = pipeline.run(pipeline.NIGHT, pipeline.Context.of(NOW, scopes=[fleet_scope(i).path for i in range(3)],
                                                            store=store, holds=False))  # no run directory: no holds
    assert {r.status for r in first.reports.values()} == {"applied"}
    yield store
    drop_database(admin_dsn, name)


def _counts(store, scope_path: str) -> dict[str, int]:
    with store.pg() as con:
        return {t: con.execute(f"SELECT count(*) FROM {t} WHERE scope_path = %s", (scope_path,)).fetchone()[0]
                for t in TABLES}


def test_a_live_day_writes_the_named_scopes_turns_into_each_scope_only_and_feeds_the_next_night(fleet):
    day_scopes, bystander = [fleet_scope(0).path, fleet_scope(1).path], fleet_scope(2).path
    before = {s: _counts(fleet, s) for s in (*day_scopes, bystander)}

    written = live_day(fleet, NOW, turns=6, scopes=day_scopes)

    # per scope: 6 new facts + 6 revisited nodes + 1 working note; 6 summary events; 3 accesses a turn
    assert written == {"memory_nodes": 2 * 13, "episodic_events": 2 * 6, "memory_access_log": 2 * 18}
    for s in day_scopes:
        assert _counts(fleet, s) == {"memory_nodes": before[s]["memory_nodes"] + 7,
                                     "episodic_events": before[s]["episodic_events"] + 6,
                                     "memory_access_log": before[s]["memory_access_log"] + 18}
    assert _counts(fleet, bystander) == before[bystander]
    with fleet.pg() as con:
        # every access of the day is of a node of the same scope, and every row of the day lies in it
        stray = con.execute(
            "SELECT count(*) FROM memory_access_log a WHERE a.accessed_at > %s AND NOT EXISTS ("
            " SELECT 1 FROM memory_nodes n WHERE n.id = a.node_id AND n.scope_path = a.scope_path)", (NOW,)).fetchone()[0]
        assert stray == 0
        revisited = con.execute(
            "SELECT scope_path, count(*), min(updated_at), max(updated_at) FROM memory_nodes"
            " WHERE updated_at > %s AND created_at <= %s GROUP BY scope_path ORDER BY 1", (NOW, NOW)).fetchall()
        assert [r[:2] for r in revisited] == [(s, 6) for s in sorted(day_scopes)]
        assert all(NOW < lo <= hi < NOW + DAY for _, _, lo, hi in revisited)
        sessions = con.execute("SELECT count(DISTINCT session_id) FROM episodic_events WHERE created_at > %s"
                               " AND scope_path = %s", (NOW, day_scopes[0])).fetchone()[0]
        assert sessions == 2

    # the next night finds the day's work: the revisited nodes' versions moved on, the note expired
    second = pipeline.run(pipeline.NIGHT, pipeline.Context.of(NOW + DAY, scopes=day_scopes, store=fleet, holds=False))
    for s in day_scopes:
        report = second.reports[s]
        assert report.status == "applied", report.errors
        assert report.counters["working_ttl_pruned"] >= 1  # the day's note (and any template note due by then)
        co = report.counters_by_phase.get("cooccurrence", {})  # a turn's two nodes co-occur
        assert co.get("edges_created", 0) + co.get("edges_reinforced", 0) >= 1, report.counters_by_phase
        assert report.conflicts == 0
    with fleet.pg() as con:
        notes = con.execute("SELECT count(*) FROM memory_nodes WHERE label = 'scratch of day 1'").fetchone()[0]
    assert notes == 0


def test_a_live_day_refuses_nonsense_counts(fleet):
    with pytest.raises(SeedError, match="turns and day must be >= 1"):
        live_day(fleet, NOW, turns=0)
