"""The real ``deep_sleep`` Prefect flow (local test harness) against the real store."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from deep_sleep.core.report import ConsolidationReport
from tests.storeutil import scalar, small_graph

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


@pytest.mark.flow
def test_flow_consolidates_a_scope_and_leaves_an_artifact(prefect_harness, store, scope, runs_dir):
    from deep_sleep.flows.consolidate import DeepSleepParameters, deep_sleep
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    ids = small_graph(store, scope, NOW)
    result = deep_sleep(DeepSleepParameters(scope=scope.display(), as_of=NOW, dsn=store.dsn, runs_dir=str(runs_dir)))
    report = ConsolidationReport.from_dict(result)
    assert report.status == "applied", report.errors
    assert report.counters["nodes_strengthened"] == 3
    assert report.counters["working_ttl_pruned"] == 1
    assert {"extract", "transform", "validate", "apply", "strengthen", "working_ttl"} <= set(report.timings)
    # the store, read back
    assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE id = ANY(%s::uuid[]) AND importance = 5.5", ids["hot"]) == 3
    assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE id = %s", ids["expired"][0]) == 0
    assert scalar(store, "SELECT status FROM consolidation_runs WHERE run_id = %s", report.run_id) == "applied"
    # the Markdown report artifact
    key = "deep-sleep-" + scope.display().lower().replace("/", "-")
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])))
    assert artifacts and "nodes_strengthened" in artifacts[0].data

    # a second night at the same as_of finds nothing to do
    again = ConsolidationReport.from_dict(
        deep_sleep(DeepSleepParameters(scope=scope.display(), as_of=NOW, dsn=store.dsn, runs_dir=str(runs_dir))))
    assert again.status == "applied" and again.rows_changed == {} and not any(again.counters.values())
