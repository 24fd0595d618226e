"""Issue 16 item 2 in Prefect: an approval given through a paused flow run's input form
(pause_flow_run(wait_for_input=Approval), resumed by a client with run_input) — local test harness."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from deep_sleep.run.pipeline import consolidate
from deep_sleep.core.scope import Scope
from tests.jobs.test_approve import NOW, decisions, ledger, live_ids, seed_40_percent


def _paused_run(run_id: str, deadline_seconds: float = 240.0):
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
            mine = [r for r in runs if r.parameters.get("params", {}).get("run_id") == run_id]
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
