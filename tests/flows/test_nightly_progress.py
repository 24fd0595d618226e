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
                                            scopes=[s.display() for s in scopes], data_quality=False, progress=True,
                                            shard_scopes=1))  # two shards: a line after each
    assert summary["applied"] == 2, summary["rows"]
    err = capfd.readouterr().err
    lines = re.findall(r"deep-sleep nightly: \d/2 shards, (\d+)/2 scopes done, ([\d,]+) rows changed, [\d.]+ s", err)
    assert [int(done) for done, _ in lines] == [1, 2]
    assert int(lines[-1][1].replace(",", "")) > 0
    by_scope = {r["scope"]: r["quarantined"] for r in summary["rows"]}  # the summary the CLI prints
    assert by_scope == {scopes[0].display(): 1, scopes[1].display(): 0}


def test_a_health_alert_fails_the_night_and_keeps_its_summary(prefect_harness, store, tmp_path):
    """Issue 16, run health: an alert about a scope of the night ends the flow run Failed (configurable)
    with the summary as its result; alerts about scopes the night did not consider are not its own."""
    from deep_sleep.flows.nightly import NightFailedHealth, NightlyParameters, deep_sleep_nightly, run_nightly

    tag = uuid.uuid4().hex[:8]
    elsewhere = Scope.root("org", f"forgot{tag}")  # never consolidated for days, but not in this night
    insert(store, "memory_nodes", [node(elsewhere, "topic: old", NOW - timedelta(hours=100))])
    a, b = Scope.root("org", f"ran{tag}a"), Scope.root("org", f"ran{tag}b")
    for s in (a, b):
        small_graph(store, s, NOW)
    params = NightlyParameters(as_of=NOW, dsn=store.dsn, runs_dir=str(tmp_path / "runs"),
                               scopes=[a.display(), b.display()], data_quality=False)

    def night(hours: int, **update):
        return params.model_copy(update={"as_of": NOW + timedelta(hours=hours), **update})

    def broken(scope: Scope, n: int, at: int) -> None:  # rows the quarantine sets aside
        insert(store, "memory_nodes", [node(scope, f"project: broken {at} {i}", NOW + timedelta(hours=at - 1),
                                            importance=float("nan")) for i in range(n)])

    first = run_nightly(params)
    assert first["applied"] == 2 and first["health"] == []  # the other scope's alert is not this night's
    broken(a, 12, 25)  # a dozen broken rows where none were before: a quarantine jump
    summary = run_nightly(night(25))  # the CLI's path: the summary, although the flow run failed
    assert [(x["scope_path"], x["check"]) for x in summary["health"]] == [(a.path, "quarantine_jump")]
    broken(b, 12, 50)
    state = deep_sleep_nightly(night(50), return_state=True)
    assert state.is_failed() and "run-health alert" in state.message
    failure = state.result(raise_on_failure=False)
    assert isinstance(failure, NightFailedHealth) and failure.summary["applied"] == 2
    assert [(x["scope_path"], x["check"]) for x in failure.summary["health"]] == [(b.path, "quarantine_jump")]
    broken(a, 30, 75)
    state = deep_sleep_nightly(night(75, config={"health": {"fail_nightly": False}}), return_state=True)
    assert state.is_completed() and [x["check"] for x in state.result()["health"]] == ["quarantine_jump"]


def test_a_stuck_prefect_tag_limit_does_not_stop_a_night(prefect_harness, store, tmp_path):
    """Issue 31: a kill -9 left Prefect's ``deep-sleep-apply`` slots taken and every later night hung.
    The store's apply slots are the cap (freed with a dead holder's connection); the Prefect tag limit
    is opt-in, so a limit whose every slot a dead run holds does not touch a default night."""
    from prefect.client.orchestration import get_client

    from deep_sleep.flows.nightly import APPLY_TAG, NightlyParameters, run_nightly

    scope = Scope.root("org", f"stuck{uuid.uuid4().hex[:8]}")
    small_graph(store, scope, NOW)
    with get_client(sync_client=True) as client:  # what two killed runs leave: both slots leased
        client.create_concurrency_limit(tag=APPLY_TAG, concurrency_limit=2)
        lease = client.increment_concurrency_slots_with_lease(names=[f"tag:{APPLY_TAG}"], slots=2, mode="concurrency",
                                                              lease_duration=600)
        assert lease.status_code == 200, lease.text
    try:
        summary = run_nightly(NightlyParameters(as_of=NOW, dsn=store.dsn, runs_dir=str(tmp_path / "runs"),
                                                scopes=[scope.display()], data_quality=False))
    finally:
        with get_client(sync_client=True) as client:
            client.delete_concurrency_limit_by_tag(tag=APPLY_TAG)
    assert summary["applied"] == 1, summary["rows"]
