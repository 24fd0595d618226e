"""Run health: every alert fires on a store seeded to fire it, and on none that should not."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

from deep_sleep.cli import main
from deep_sleep.core.scope import Scope
from deep_sleep.jobs.health import HealthConfig, alerts_from_rows, health
from tests.storeutil import insert, node

NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
H = timedelta(hours=1)


def _ledger(store, scope: Scope, as_of: datetime, changed: int = 0, conflicts: int = 0, quarantined: int = 0,
            skipped: dict | None = None) -> None:
    with store.pg() as con:
        con.execute(
            "INSERT INTO consolidation_runs (run_id, scope_path, mode, as_of, started_at, status, rows_changed, conflicts, "
            "quarantined, phases_skipped) VALUES (%s, %s, 'nightly', %s, %s, 'applied', %s, %s, %s, %s)",
            (str(uuid.uuid4()), scope.path, as_of, as_of, json.dumps({"memory_nodes": {"updates": changed}}), conflicts,
             json.dumps({"memory_edges": {"weight not finite": quarantined}} if quarantined else {}),
             json.dumps(skipped or {})))
        con.commit()


def _event(scope: Scope, at: datetime) -> dict:
    return {"id": str(uuid.uuid4()), "scope_path": scope.path, "tenant_id": scope.tenant_id, "session_id": "s",
            "content": "hello", "created_at": at}


def _scopes(n: int) -> list[Scope]:
    tag = uuid.uuid4().hex[:8]
    return [Scope.root("org", f"h{tag}").child("agent", str(i)) for i in range(n)]


def _fired(store, scopes: list[Scope], **kw) -> dict[str, set[str]]:
    alerts = health(store, NOW, HealthConfig(**kw), min_interval_hours=24)
    mine = {s.path for s in scopes}
    out: dict[str, set[str]] = {s.path: set() for s in scopes}
    for a in alerts:
        if a.scope_path in mine:
            out[a.scope_path].add(a.check)
    return out


def test_each_alert_fires_where_it_should_and_nowhere_else(store):
    idle, quiet, busy, skipped, empty, conflicted, calm, jumped, steady, gated, never = _scopes(11)
    for s in (idle, quiet, busy):
        for night in (3, 2, 1):
            _ledger(store, s, NOW - night * 24 * H + H, changed=5 if s is busy else 0)
            if s is not quiet:
                insert(store, "episodic_events", [_event(s, NOW - night * 24 * H)])  # activity before each run
    insert(store, "episodic_events", [_event(skipped, NOW - 30 * H)])
    for s in (skipped, empty):
        _ledger(store, s, NOW - 2 * H, changed=3, skipped={"episodic_summary": "missing input: no episodic events"})
    _ledger(store, conflicted, NOW - 2 * H, changed=70, conflicts=30)
    _ledger(store, calm, NOW - 2 * H, changed=90, conflicts=10)
    for s, history, last in ((jumped, 3, 50), (steady, 40, 50)):
        _ledger(store, s, NOW - 26 * H, changed=1, quarantined=history)
        _ledger(store, s, NOW - 2 * H, changed=1, quarantined=last)
    _ledger(store, gated, NOW - 60 * H, changed=1)
    insert(store, "memory_nodes", [node(never, "topic: x", NOW - 100 * H)])  # created_at a day before that

    fired = _fired(store, [idle, quiet, busy, skipped, empty, conflicted, calm, jumped, steady, gated, never])
    assert fired[idle.path] >= {"idle_with_activity"} and "idle_with_activity" not in fired[quiet.path] | fired[busy.path]
    assert "skipped_with_input" in fired[skipped.path] and "skipped_with_input" not in fired[empty.path]
    assert "conflict_rate" in fired[conflicted.path] and "conflict_rate" not in fired[calm.path]
    assert "quarantine_jump" in fired[jumped.path] and "quarantine_jump" not in fired[steady.path]
    assert fired[gated.path] == {"gated_too_long"} and fired[never.path] == {"gated_too_long"}
    for s in (quiet, busy, empty, calm, steady):  # ran recently, nothing wrong
        assert not fired[s.path] - {"gated_too_long"}, (s, fired[s.path])
    assert not fired[busy.path] and not fired[calm.path]
    # thresholds are configuration
    assert "idle_with_activity" not in _fired(store, [idle], idle_nights=4)[idle.path]
    assert "conflict_rate" not in _fired(store, [conflicted], max_conflict_rate=0.5)[conflicted.path]


def test_the_cli_exits_1_when_an_alert_fires(store, capsys):
    (gated,) = _scopes(1)
    _ledger(store, gated, NOW - 60 * H, changed=1)
    code = main(["--dsn", store.dsn, "health", "--as-of", NOW.isoformat(), "--scope", gated.display()])
    out = capsys.readouterr().out
    assert code == 1 and "gated_too_long" in out and gated.display() in out


def test_rules_are_pure_and_need_every_night_of_the_streak():
    s = "org\x1fx"
    runs = [{"scope_path": s, "as_of": NOW - n * 24 * H, "changed": 0, "conflicts": 0, "quarantined": 0,
             "phases_skipped": {}} for n in range(3)]
    active = {(s, r["as_of"]) for r in runs}
    cfg = HealthConfig()
    assert [a.check for a in alerts_from_rows(runs, active, set(), {}, NOW, 24, cfg)] == ["idle_with_activity"]
    assert alerts_from_rows(runs, active - {(s, runs[1]["as_of"])}, set(), {}, NOW, 24, cfg) == []
    assert alerts_from_rows(runs[:2], active, set(), {}, NOW, 24, cfg) == []
