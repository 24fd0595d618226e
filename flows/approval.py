"""The ``deep_sleep_approval`` Prefect flow: decide a run's held rows through a paused flow run's input form.

For a run with pending holds (SPEC §9; :mod:`deep_sleep.jobs.approve`) the flow publishes the held
rows as a Markdown artifact and pauses with ``pause_flow_run(wait_for_input=Approval)``: Prefect's UI
shows the form (the description lists the held rows per phase and why), and
``resume_flow_run(flow_run_id, run_input={"approve": true, "phase": null})`` from any client does the
same.  On resume the flow approves (applies through the version guard) or rejects — ``phase``: only
that phase, else every pending one — and returns the decision.  ``decided_by`` in the ledger is
``prefect:<flow run id>``.  A run that holds nothing, or whose holds are already decided, fails the
flow before it pauses (:class:`~deep_sleep.jobs.errors.HoldError`); a pause not resumed within
``timeout_seconds`` fails the flow run and decides nothing.

Without a ``run_id`` the flow decides a selection of the held queue (``reason``, ``phase``, ``scope``
and below, ``older_than_days``; :mod:`deep_sleep.jobs.queue`, what ``deep-sleep held`` lists and
``deep-sleep approve --reason …`` decides): the form shows the queue grouped by reason, phase and
scope, counts first, then the runs (the current run per scope and phase: superseded rows expired);
on resume every selected run is decided run by run (each its own transaction, version-guarded, taking
the selected rows and the rows their closure under the graph needs; ``include_superseded``, reject
only: the expired rows too), and the result lists what was decided, the rows the closure added
(``closure``), and what was refused and why.  A selection with nothing pending fails the flow before
it pauses.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from prefect import flow, get_run_logger, pause_flow_run
from prefect.artifacts import create_markdown_artifact
from prefect.context import get_run_context
from prefect.input import RunInput
from pydantic import BaseModel, Field

from deep_sleep.jobs.approve import approve, decision_text, holds_markdown, read_holds, reject
from deep_sleep.jobs.errors import HoldError
from deep_sleep.jobs.queue import Selection, decide, pending, queue_markdown
from deep_sleep.store.db import connect_store


class Approval(RunInput):
    """The form of a paused approval: approve (true) or reject (false) the held rows; phase: only this phase."""

    approve: bool = Field(description="apply the held rows (true) or discard them (false)")
    phase: str | None = Field(None, description="only this phase's held rows (empty: every pending phase)")


class ApprovalParameters(BaseModel):
    run_id: str | None = Field(None, description="the run whose held rows to decide (a UUID or an unambiguous prefix); "
                                                 "empty: the selection of the held queue below")
    reason: str | None = Field(None, description="without run_id: runs holding rows for this reason")
    phase: str | None = Field(None, description="without run_id: only this phase's held rows")
    scope: str | None = Field(None, description="without run_id: this scope and its descendants")
    older_than_days: float | None = Field(None, ge=0, description="without run_id: runs of an as_of at least this old")
    include_superseded: bool = Field(False, description="without run_id, reject only: also the expired rows of runs a "
                                                        "newer run of their scope and phase supersedes")
    dsn: str | None = Field(None, description="PostgreSQL DSN; default DEEP_SLEEP_DSN or the embedded server")
    timeout_seconds: int = Field(3600, ge=1, description="how long the flow run waits paused for the decision")
    poll_seconds: int = Field(10, ge=1, description="how often the paused flow run checks for the decision")


@flow(name="deep_sleep_approval", log_prints=True)
def deep_sleep_approval(params: ApprovalParameters) -> dict[str, Any]:
    """Pause for an :class:`Approval` of the run's pending holds, then apply or reject them; returns the decision."""
    store = connect_store(params.dsn)
    if params.run_id is None:
        return _decide_queue(store, params)
    h = read_holds(store, params.run_id)
    if not h.phases:
        raise HoldError(f"run {h.run.run_id} holds nothing; there is nothing to approve")
    if not h.pending:
        raise HoldError(f"every held phase of run {h.run.run_id} is already decided")
    text = holds_markdown(h)
    create_markdown_artifact(markdown=text, key=f"deep-sleep-holds-{h.run.run_id[:8]}",
                             description=f"held rows of run {h.run.run_id}")
    form = Approval.with_initial_data(description=text + "\nApprove (apply) or reject (discard) the held rows.",
                                      approve=False)
    answer = pause_flow_run(wait_for_input=form, timeout=params.timeout_seconds, poll_interval=params.poll_seconds)
    by = f"prefect:{get_run_context().flow_run.id}"
    decide = approve if answer.approve else reject
    decision = decide(store, h.run.run_id, answer.phase or None, decided_by=by)
    get_run_logger().info(decision_text(decision))
    return decision.to_dict()


def _decide_queue(store, params: ApprovalParameters) -> dict[str, Any]:
    """The queue mode (module docstring): show the selection grouped, pause, decide it run by run."""
    selection = Selection(reason=params.reason, phase=params.phase, scope=params.scope,
                          older_than=timedelta(days=params.older_than_days) if params.older_than_days is not None else None,
                          now=datetime.now(UTC))
    queue = pending(store, selection)
    if not queue.height:
        raise HoldError(f"nothing is pending for {selection.describe()}; see `deep-sleep held`")
    text = queue_markdown(queue, selection, runs=True)
    create_markdown_artifact(markdown=text, key="deep-sleep-held-queue", description=f"held queue: {selection.describe()}")
    form = Approval.with_initial_data(
        description=text + "\n\nApprove (apply) or reject (discard) the held rows of every run above"
        + ("" if params.include_superseded else " (expired rows of superseded runs are left alone)") + "; phase: only that phase.",
        approve=False)
    answer = pause_flow_run(wait_for_input=form, timeout=params.timeout_seconds, poll_interval=params.poll_seconds)
    if answer.phase:
        selection = replace(selection, phase=answer.phase)
    by = f"prefect:{get_run_context().flow_run.id}"
    outcome = decide(store, "approve" if answer.approve else "reject", selection, decided_by=by,
                     include_superseded=params.include_superseded)
    logger = get_run_logger()
    logger.info("%s %d run(s) of %s; %d refused; %d superseded (run, phase) pair(s) left alone", outcome.decision,
                len({d.run_id for d in outcome.decided}), selection.describe(), len(outcome.refused),
                outcome.skipped_superseded)
    for run_id, why in outcome.refused:
        logger.warning("run %s refused: %s", run_id, why)
    return {"decision": "approved" if answer.approve else "rejected", "selection": selection.describe(),
            "runs": sorted({d.run_id for d in outcome.decided}), "decisions": [d.to_dict() for d in outcome.decided],
            "closure": outcome.closure, "refused": [{"run_id": r, "why": w} for r, w in outcome.refused],
            "skipped_superseded": outcome.skipped_superseded}
