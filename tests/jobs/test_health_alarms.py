"""Issue 32, item 3: health without false alarms.  Every alert :mod:`deep_sleep.jobs.health` can raise
fires on a miniature store seeded to need it, and none fires on a fresh fleet (the product's own
seeder, with recall feedback) consolidated night after night through the real flow and the CLI,
whose nights exit 0."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from deep_sleep.core.scope import Scope
from deep_sleep.jobs.health import CONSUMED_EARLIER, MISSING_INPUT, HealthConfig, health
from tests.storeutil import insert, node

NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
FLEET_NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
H = timedelta(hours=1)
NO_WORKING = "missing input: no working memory"
NO_EVENTS = "missing input: no episodic events"
#: Every check health.py raises (its module docstring lists the same five).
CHECKS = ("idle_with_activity", "skipped_with_input", "conflict_rate", "quarantine_jump", "gated_too_long")


def _ledger(store, scope: Scope, as_of: datetime, changed: int = 1, conflicts: int = 0, quarantined: int = 0,
            skipped: dict | None = None, ran: tuple[str, ...] = ()) -> str:
    run_id = str(uuid.uuid4())
    with store.pg() as con:
        con.execute(
            "INSERT INTO consolidation_runs (run_id, scope_path, mode, as_of, started_at, status, rows_changed, conflicts, "
            "quarantined, phases_skipped, phases_run) VALUES (%s, %s, 'nightly', %s, %s, 'applied', %s, %s, %s, %s, %s)",
            (run_id, scope.path, as_of, as_of, json.dumps({"memory_nodes": {"updates": changed}}), conflicts,
             json.dumps({"memory_edges": {"weight not finite": quarantined}} if quarantined else {}),
             json.dumps(skipped or {}), json.dumps(list(ran))))
        con.commit()
    return run_id


def _scopes(n: int) -> list[Scope]:
    tag = uuid.uuid4().hex[:8]
    return [Scope.root("org", f"ha{tag}").child("agent", str(i)) for i in range(n)]


def _fired(store, scopes: list[Scope]) -> dict[str, set[str]]:
    mine = {s.path: set() for s in scopes}
    for a in health(store, NOW, HealthConfig(), min_interval_hours=24):
        if a.scope_path in mine:
            mine[a.scope_path].add(a.check)
    return mine


def _event(scope: Scope, at: datetime) -> dict:
    return {"id": str(uuid.uuid4()), "scope_path": scope.path, "tenant_id": scope.tenant_id, "session_id": "s",
            "content": "hello", "created_at": at}


# -- each alert fires on a store seeded to need it ---------------------------------------------------

def test_idle_with_activity_fires(store):
    (idle,) = _scopes(1)
    for night in (3, 2, 1):  # three runs that changed nothing, each after a new session
        insert(store, "episodic_events", [_event(idle, NOW - night * 24 * H)])
        _ledger(store, idle, NOW - night * 24 * H + H, changed=0)
    assert _fired(store, [idle])[idle.path] == {"idle_with_activity"}


def test_skipped_with_input_fires(store):
    (missed,) = _scopes(1)
    insert(store, "memory_nodes", [node(missed, "note: live", NOW - 3 * H, layer="working",
                                        properties={"ttl_hours": 24})])  # alive at the run: drift's input
    _ledger(store, missed, NOW - 2 * H, skipped={"drift": NO_WORKING}, ran=("working_ttl",))
    assert _fired(store, [missed])[missed.path] == {"skipped_with_input"}


def test_conflict_rate_fires(store):
    (conflicted,) = _scopes(1)
    _ledger(store, conflicted, NOW - 2 * H, changed=70, conflicts=30)
    assert _fired(store, [conflicted])[conflicted.path] == {"conflict_rate"}


def test_the_conflict_rate_is_conflicts_over_all_attempted_writes(store):
    """Issue 37 item 7: the rate is conflicts / (rows changed + conflicts) — the share of the run's
    writes that lost to live writes — and fires when *more than* ``max_conflict_rate`` (0.2): 20 of 100
    writes is at the limit (conflicts / changed would say 25 %); 25 of 100 is over it; a run whose
    every write conflicted (0 changed) is 100 %; a run that wrote nothing has no rate."""
    at_limit, over, all_lost, idle = _scopes(4)
    _ledger(store, at_limit, NOW - 2 * H, changed=80, conflicts=20)
    _ledger(store, over, NOW - 2 * H, changed=75, conflicts=25)
    _ledger(store, all_lost, NOW - 2 * H, changed=0, conflicts=5)
    _ledger(store, idle, NOW - 2 * H, changed=0, conflicts=0)
    assert HealthConfig().max_conflict_rate == 0.2
    fired = _fired(store, [at_limit, over, all_lost, idle])
    assert [("conflict_rate" in fired[s.path]) for s in (at_limit, over, all_lost, idle)] == [False, True, True, False]
    (alert,) = [a for a in health(store, NOW, HealthConfig(), min_interval_hours=24)
                if a.scope_path == over.path and a.check == "conflict_rate"]
    assert "25 of 100 writes" in alert.message and "(25% > 20%)" in alert.message


def test_quarantine_jump_fires(store):
    (jumped,) = _scopes(1)
    _ledger(store, jumped, NOW - 26 * H, quarantined=3)
    _ledger(store, jumped, NOW - 2 * H, quarantined=50)
    assert _fired(store, [jumped])[jumped.path] == {"quarantine_jump"}


def test_gated_too_long_fires(store):
    gated, never = _scopes(2)
    _ledger(store, gated, NOW - 60 * H)
    insert(store, "memory_nodes", [node(never, "topic: x", NOW - 100 * H)])
    fired = _fired(store, [gated, never])
    assert fired[gated.path] == {"gated_too_long"} and fired[never.path] == {"gated_too_long"}


def test_the_tests_above_cover_every_check():
    import inspect

    from deep_sleep.jobs import health as module

    raised = set(__import__("re").findall(r'Alert\(scope_path, "(\w+)"', inspect.getsource(module)))
    assert raised == set(CHECKS)
    assert all(f"test_{check}_fires" in globals() for check in CHECKS)


# -- skipped_with_input: what a phase should have processed ------------------------------------------

def test_input_an_earlier_phase_of_the_run_took_is_not_skipped_input(store):
    """Drift reads working memory after working_ttl expired it, synthetic_links the events
    episodic_summary left; the run's held deletes leave those rows in the store (the issue's false
    alarm). Input the run quarantined is not input either. The same rows without the earlier phase
    having run (disabled), or read by a phase that sees them whatever came before, do fire."""
    expired, ttl_off, quarantined, summarised, promoted = _scopes(5)
    for s in (expired, ttl_off):  # both notes past their ttl at the run's as_of
        insert(store, "memory_nodes", [node(s, "note: old", NOW - 5 * H, layer="working", properties={"ttl_hours": 2}),
                                       node(s, "note: older", NOW - 30 * H, layer="working",
                                            properties={"ttl_hours": "24"})])
    _ledger(store, expired, NOW - 2 * H, skipped={"drift": NO_WORKING}, ran=("working_ttl", "decay_importance"))
    _ledger(store, ttl_off, NOW - 2 * H, skipped={"drift": NO_WORKING, "working_ttl": "disabled by config"})

    bad = node(quarantined, "note: broken", NOW - 3 * H, layer="working", properties={"ttl_hours": 24})
    insert(store, "memory_nodes", [bad])
    run = _ledger(store, quarantined, NOW - 2 * H, skipped={"drift": NO_WORKING}, ran=("working_ttl",))
    with store.pg() as con:
        con.execute("INSERT INTO consolidation_quarantine (run_id, scope_path, table_name, row_id, reason, row) "
                    "VALUES (%s, %s, 'memory_nodes', %s, 'timestamp in the future', '{}')", (run, quarantined.path, bad["id"]))
        con.commit()

    for s, phase in ((summarised, "synthetic_links"), (promoted, "procedural_promotion")):
        events = [_event(s, NOW - 10 * H), _event(s, NOW - 9 * H)]
        insert(store, "episodic_events", events)
        insert(store, "memory_nodes", [node(s, "META:episodic_summary", NOW - 2 * H,
                                            properties={"source_ids": [e["id"] for e in events]})])
        _ledger(store, s, NOW - 2 * H, skipped={phase: NO_EVENTS}, ran=("episodic_summary",))

    fired = _fired(store, [expired, ttl_off, quarantined, summarised, promoted])
    assert fired == {expired.path: set(), ttl_off.path: {"skipped_with_input"}, quarantined.path: set(),
                     summarised.path: set(),
                     promoted.path: {"skipped_with_input"}}  # promotion reads the extracted events
    assert all(reason in MISSING_INPUT for _, reason in CONSUMED_EARLIER)


# -- a fresh fleet raises none ------------------------------------------------------------------------

@pytest.fixture
def fleet_store(admin_dsn):
    from deep_sleep.dev.fleet import FleetSpec, seed_fleet
    from deep_sleep.store.db import create_database, drop_database

    name = f"ds_health_fleet_{uuid.uuid4().hex[:8]}"
    store = create_database(admin_dsn, name)
    # `deep-sleep seed --fleet 8 --nodes 60 --recalls` (seed 7): two of its scopes have every working
    # note expired by the first night and fail their recall-quality gate, so working_ttl's deletes are
    # held and the notes stay in the store while drift finds no working memory (the false alarm).
    spec = FleetSpec(scopes=8, nodes=60, seed=7, recalls=True, now=FLEET_NOW)
    seed_fleet(store, spec)
    yield store
    drop_database(admin_dsn, name)


@pytest.mark.flow
def test_a_fresh_fleet_with_recall_feedback_raises_no_alert(prefect_harness, fleet_store, tmp_path, monkeypatch,
                                                            capsys):
    from deep_sleep.cli import main
    from deep_sleep.flows.nightly import NightlyParameters, run_nightly

    params = NightlyParameters(as_of=FLEET_NOW, dsn=fleet_store.dsn, runs_dir=str(tmp_path / "runs"), data_quality=False)
    held = 0
    for night in range(2):
        summary = run_nightly(params.model_copy(update={"as_of": FLEET_NOW + night * 24 * H}))
        assert summary["applied"] == 8 and summary["failed"] == 0, summary["rows"]
        assert summary["health"] == [], summary["health"]
        held += summary["held_rows"]
    assert held, "the fleet no longer fails any gate: this test would not see the held-deletes case"
    with fleet_store.pg() as con:  # the case of the issue is there: drift skipped while expired notes stay
        skipped = con.execute("SELECT count(*) FROM consolidation_runs r WHERE phases_skipped->>'drift' = %s "
                              "AND EXISTS (SELECT 1 FROM memory_nodes n WHERE n.scope_path = r.scope_path "
                              "AND n.layer = 'working')", (NO_WORKING,)).fetchone()[0]
    assert skipped

    monkeypatch.delenv("DEEP_SLEEP_DSN", raising=False)  # the CLI hands its DSN to the flow through it
    code = main(["--dsn", fleet_store.dsn, "nightly", "--as-of", (FLEET_NOW + 48 * H).isoformat(),
                 "--runs-dir", str(tmp_path / "cli"), "--no-data-quality"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "8 scopes: 8 due, 8 applied, 0 failed, 0 skipped" in out and "run health" not in out
    assert main(["--dsn", fleet_store.dsn, "health", "--as-of", (FLEET_NOW + 48 * H).isoformat()]) == 0
    assert "run health: no alerts" in capsys.readouterr().out
