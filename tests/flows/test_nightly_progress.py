"""Issue 13, items 10 and 11: a long command shows progress — the nightly prints scopes done / due,
rows changed and elapsed seconds to stderr as applies finish — and its summary counts quarantined rows."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

from deep_sleep.core.scope import Scope
from tests.storeutil import insert, node, small_graph

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


def test_nightly_prints_progress(prefect_harness, store, tmp_path, capfd):
    from deep_sleep.flows.nightly import NightlyParameters, run_nightly

    tag = uuid.uuid4().hex[:8]
    scopes = [Scope.root("org", f"prog{tag}").child("brand", f"b{i}") for i in range(2)]
    for s in scopes:
        small_graph(store, s, NOW)
    insert(store, "memory_nodes", [node(scopes[0], "project: broken", NOW - timedelta(hours=1), importance=float("nan"))])
    summary = run_nightly(NightlyParameters(as_of=NOW, dsn=store.dsn, runs_dir=str(tmp_path / "runs"),
                                            scopes=[s.display() for s in scopes], data_quality=False, progress=True))
    assert summary["applied"] == 2, summary["rows"]
    err = capfd.readouterr().err
    lines = re.findall(r"deep-sleep nightly: (\d+)/2 scopes done, ([\d,]+) rows changed, [\d.]+ s", err)
    assert [int(done) for done, _ in lines] == [1, 2]
    assert int(lines[-1][1].replace(",", "")) > 0
    by_scope = {r["scope"]: r["quarantined"] for r in summary["rows"]}  # the summary the CLI prints
    assert by_scope == {scopes[0].display(): 1, scopes[1].display(): 0}


def test_a_health_alert_fails_the_night_and_keeps_its_summary(prefect_harness, store, tmp_path):
    """Issue 16, run health: an alert ends the flow run Failed (configurable) with the summary as its result."""
    from deep_sleep.flows.nightly import NightlyParameters, deep_sleep_nightly, run_nightly

    tag = uuid.uuid4().hex[:8]
    forgotten = Scope.root("org", f"forgot{tag}")  # rows for days, never consolidated
    insert(store, "memory_nodes", [node(forgotten, "topic: old", NOW - timedelta(hours=100))])
    ran = Scope.root("org", f"ran{tag}")
    small_graph(store, ran, NOW)
    params = NightlyParameters(as_of=NOW, dsn=store.dsn, runs_dir=str(tmp_path / "runs"), scopes=[ran.display()],
                               data_quality=False)
    state = deep_sleep_nightly(params, return_state=True)
    assert state.is_failed() and "run-health alert" in state.message
    summary = state.result(raise_on_failure=False)
    assert summary["applied"] == 1
    mine = [a for a in summary["health"] if a["scope_path"] == forgotten.path]
    assert [a["check"] for a in mine] == ["gated_too_long"]
    assert run_nightly(params.model_copy(update={"as_of": NOW + timedelta(minutes=1)}))["health"]  # the CLI's path
    relaxed = params.model_copy(update={"as_of": NOW + timedelta(minutes=2), "config": {"health": {"fail_nightly": False}}})
    state = deep_sleep_nightly(relaxed, return_state=True)
    assert state.is_completed() and state.result()["health"]
