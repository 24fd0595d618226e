"""Issue 16 item 2 in Prefect: an approval given through a paused flow run's input form
(pause_flow_run(wait_for_input=Approval), resumed by a client with run_input) — local test harness."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta

import pytest

from deep_sleep.run.pipeline import consolidate
from deep_sleep.core.scope import Scope
from tests.jobs.test_approve import NOW, decisions, ledger, live_ids, seed_40_percent


def _paused_run(run_id: str | None, deadline_seconds: float = 240.0, **selection):
    """The paused deep_sleep_approval flow run deciding ``run_id`` (waits for it to pause)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowFilter, FlowFilterName, FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType

    end = time.monotonic() + deadline_seconds
    with get_client(sync_client=True) as client:
        while time.monotonic() < end:
            runs = client.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=["deep_sleep_approval"])),
                flow_run_filter=FlowRunFilter(state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.PAUSED]))))
            mine = [r for r in runs if r.parameters.get("params", {}).get("run_id") == run_id
                    and all(r.parameters.get("params", {}).get(k) == v for k, v in selection.items())]
            if mine:
                return mine[0]
            time.sleep(0.5)
    raise AssertionError(f"no paused approval flow run for {run_id}")


def _decide_through_the_form(store, run_id: str, run_input: dict) -> dict:
    from prefect.flow_runs import resume_flow_run
    from prefect.client.orchestration import get_client

    from deep_sleep.flows.approval import ApprovalParameters, deep_sleep_approval

    out: dict = {}

    def go():
        try:
            out["result"] = deep_sleep_approval(ApprovalParameters(run_id=run_id, dsn=store.dsn, timeout_seconds=600, poll_seconds=1))
        except BaseException as exc:  # surfaced below
            out["error"] = exc

    worker = threading.Thread(target=go, daemon=True)
    worker.start()
    paused = _paused_run(run_id)
    # nothing decided while paused; the form (schema + description) is saved for the UI
    assert decisions(store, run_id) == []
    with get_client(sync_client=True) as client:
        keys = {i.key for i in client.filter_flow_run_input(flow_run_id=paused.id, key_prefix="paused", limit=50, exclude_keys=set())}
        description = client.read_flow_run_input(flow_run_id=paused.id, key=next(k for k in keys if k.endswith("-description")))
    assert any(k.endswith("-schema") for k in keys) and "prune_orphans" in description
    resume_flow_run(paused.id, run_input=run_input)
    worker.join(timeout=600)
    assert not worker.is_alive()
    if "error" in out:
        raise out["error"]
    out["flow_run_id"] = str(paused.id)
    return out


@pytest.mark.flow
def test_approval_through_the_paused_flow_runs_input_form(prefect_harness, store, scope, runs_dir):
    ids = seed_40_percent(store, scope)
    run = consolidate(store, scope, NOW, runs_dir=runs_dir).report()
    assert run.held["rows"] == {"memory_nodes": {"deletes": 4}}
    out = _decide_through_the_form(store, run.run_id, {"approve": True, "phase": None})
    assert out["result"]["decision"] == "approved" and out["result"]["applied"] == {"memory_nodes": {"deletes": 4}}
    assert not (set(ids["weak"]) & live_ids(store, scope))
    assert decisions(store, run.run_id)[0][5] == f"prefect:{out['flow_run_id']}"
    assert ledger(store, run.run_id)[0] == "approved"

    # another scope: rejected through the form; nothing applied
    other = Scope.root("org", scope.tenant_id + "r").child("brand", "b1")
    kept = seed_40_percent(store, other)
    run2 = consolidate(store, other, NOW + timedelta(seconds=1), runs_dir=runs_dir).report()
    out2 = _decide_through_the_form(store, run2.run_id, {"approve": False})
    assert out2["result"]["decision"] == "rejected" and set(kept["weak"]) <= live_ids(store, other)
    assert ledger(store, run2.run_id)[0] == "rejected"


@pytest.mark.flow
def test_the_form_shows_the_held_queue_grouped_and_approves_one_reason_across_scopes(prefect_harness, store, runs_dir):
    """Issue 32 item 1: without a run id the approval form shows the same grouped view as
    ``deep-sleep held`` (counts by reason, phase and scope, then the runs) and decides the selection."""
    from prefect.client.orchestration import get_client
    from prefect.flow_runs import resume_flow_run

    from deep_sleep.flows.approval import ApprovalParameters, deep_sleep_approval

    top = Scope.root("org", f"queue{uuid.uuid4().hex[:8]}")
    scopes = [top.child("brand", f"b{i}") for i in range(3)]
    runs = []
    weak = set()
    for sc in scopes:
        weak |= set(seed_40_percent(store, sc)["weak"])
        runs.append(consolidate(store, sc, NOW, runs_dir=runs_dir).report())
    assert all(r.held for r in runs)
    reason = next(iter(runs[0].held["reasons"]))
    out: dict = {}

    def go():
        try:
            out["result"] = deep_sleep_approval(ApprovalParameters(dsn=store.dsn, reason=reason, scope=top.display(),
                                                                   timeout_seconds=600, poll_seconds=1))
        except BaseException as exc:  # surfaced below
            out["error"] = exc

    worker = threading.Thread(target=go, daemon=True)
    worker.start()
    paused = _paused_run(None, scope=top.display())
    assert all(decisions(store, r.run_id) == [] for r in runs)  # nothing decided while paused
    with get_client(sync_client=True) as client:
        keys = {i.key for i in client.filter_flow_run_input(flow_run_id=paused.id, key_prefix="paused", limit=50, exclude_keys=set())}
        description = client.read_flow_run_input(flow_run_id=paused.id, key=next(k for k in keys if k.endswith("-description")))
    assert "3 run(s) in 3 scope(s) hold 12 row(s)" in description, description
    assert "## By reason" in description and f"| {reason} | 3 | 12 |" in description
    assert "## By phase" in description and "| prune_orphans | 3 | 12 |" in description
    assert all(f"| {sc.display()} | 1 | 4 |" in description for sc in scopes)
    assert all(r.run_id[:8] in description for r in runs)
    resume_flow_run(paused.id, run_input={"approve": True})
    worker.join(timeout=600)
    assert not worker.is_alive()
    if "error" in out:
        raise out["error"]
    assert out["result"]["decision"] == "approved" and out["result"]["refused"] == []
    assert sorted(out["result"]["runs"]) == sorted(r.run_id for r in runs)
    for r, sc in zip(runs, scopes):
        assert ledger(store, r.run_id)[0] == "approved"
        assert not (weak & live_ids(store, sc))  # the 4 weak orphans went

    with pytest.raises(Exception, match="nothing is pending"):
        deep_sleep_approval(ApprovalParameters(dsn=store.dsn, scope=top.display(), timeout_seconds=5, poll_seconds=1))
