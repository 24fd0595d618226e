"""The seed's own end-to-end scenario (issue: "capability is not occurrence"): a realistic scope —
40+ nodes, 120 episodic entries, timestamps backdated over 90 days — goes through the real
``deep_sleep`` Prefect flow on real Postgres; every phase with input reports work, and the store,
read back, shows each effect."""

from __future__ import annotations

import os
from datetime import UTC, datetime

import pytest

from deep_sleep.core.report import ConsolidationReport
from deep_sleep.dev.seed import SeedSpec, scopes_of, seed_store
from tests.storeutil import create_database, drop_database

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


@pytest.fixture
def seeded(admin_dsn):
    name = f"ds_e2e_{os.getpid()}"
    store = create_database(admin_dsn, name)
    spec = SeedSpec(tenants=1, scopes_per_tenant=1, nodes_per_scope=40, seed=9, now=NOW, days=90)
    seed_store(store, spec)
    yield store, scopes_of(spec)[-1]
    drop_database(admin_dsn, name)


def _count(store, sql, *params):
    with store.pg() as con:
        return con.execute(sql, params).fetchone()[0]


@pytest.mark.flow
def test_seed_scenario_through_the_real_flow(prefect_harness, seeded, tmp_path):
    from deep_sleep.flows.consolidate import DeepSleepParameters, deep_sleep

    store, scope = seeded
    p = scope.path
    assert _count(store, "SELECT count(*) FROM memory_nodes WHERE scope_path = %s", p) >= 30
    events_before = _count(store, "SELECT count(*) FROM episodic_events WHERE scope_path = %s", p)
    assert events_before >= 120
    assert _count(store, "SELECT extract(day FROM %s - min(updated_at)) FROM memory_nodes WHERE scope_path = %s", NOW, p) >= 60
    importance_before = _count(store, "SELECT sum(importance) FROM memory_nodes WHERE scope_path = %s AND layer = 'semantic'", p)

    report = ConsolidationReport.from_dict(
        deep_sleep(DeepSleepParameters(scope=scope.display(), as_of=NOW, dsn=store.dsn, runs_dir=str(tmp_path / "runs"))))
    assert report.status == "applied" and report.errors == []
    ran_with_input = [ph for ph in report.phases_run]
    idle = [ph for ph in ran_with_input if not any(report.counters_by_phase.get(ph, {}).values())]
    assert idle == [], f"phases that had input but did nothing: {idle} (skipped: {report.phases_skipped})"
    assert not any(reason.startswith("disabled") for reason in report.phases_skipped.values())

    # read the store back: each effect is there
    assert _count(store, "SELECT count(*) FROM memory_edges WHERE scope_path = %s AND relation = 'CO_OCCURRED' "
                         "AND created_at = %s", p, NOW) == report.counters_by_phase["cooccurrence"].get("edges_created", 0)
    assert _count(store, "SELECT count(*) FROM memory_nodes WHERE scope_path = %s AND properties->>'risk_tagged_at' IS NOT NULL", p) \
        >= report.counters["risk_nodes_tagged"] > 0
    assert _count(store, "SELECT count(*) FROM memory_edges WHERE scope_path = %s AND valid_to IS NOT NULL "
                         "AND properties ? 'superseded_by'", p) >= report.counters["facts_superseded"] > 0
    assert _count(store, "SELECT count(*) FROM memory_nodes WHERE scope_path = %s AND label LIKE 'META:%%' "
                         "AND label <> 'META:episodic_summary'", p) >= report.counters["meta_nodes_created"] > 0
    assert _count(store, "SELECT value FROM soul_profiles WHERE scope_path = %s AND key = 'name'", p)
    assert _count(store, "SELECT count(*) FROM memory_nodes WHERE scope_path = %s AND layer = 'working' "
                         "AND updated_at + ((properties->>'ttl_hours')::float8 * interval '1 hour') <= %s", p, NOW) == 0
    assert _count(store, "SELECT count(*) FROM memory_nodes WHERE scope_path = %s AND last_decayed_at = %s", p, NOW) \
        == report.counters["nodes_decayed"] > 0
    assert _count(store, "SELECT count(*) FROM episodic_events WHERE scope_path = %s", p) == events_before - 50
    assert _count(store, "SELECT count(*) FROM memory_nodes WHERE scope_path = %s AND label = 'META:episodic_summary'", p) == 1
    assert _count(store, "SELECT count(*) FROM memory_edges WHERE scope_path = %s AND relation = 'SYNTHETIC_LINK'", p) \
        >= report.counters["synthetic_edges_created"] > 0
    assert _count(store, "SELECT count(*) FROM procedural_skills WHERE scope_path = %s AND source = 'consolidation' "
                         "AND status = 'draft' AND created_at = %s", p, NOW) == report.counters["draft_skills_promoted"] > 0
    assert _count(store, "SELECT count(*) FROM procedural_skills WHERE scope_path = %s AND source = 'consolidation' "
                         "AND status = 'active'", p) == 0
    assert _count(store, "SELECT steps FROM reranker_models WHERE scope_path = %s", p) >= 1
    assert _count(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s", report.run_id) \
        == sum(k.get("deletes", 0) for k in report.rows_changed.values())
    assert importance_before is not None
