"""The held queue (issue 32 item 1, SPEC §9 as amended): pending rows counted by reason, phase and
scope across runs, and a bulk approve of one reason across 200 scopes — each scope atomic and
version-guarded — read back from the store."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from deep_sleep.cli import main
from deep_sleep.core.errors import InputError
from deep_sleep.core.scope import Scope
from deep_sleep.jobs.queue import Selection, decide, grouped, pending
from deep_sleep.run import pipeline
from tests.storeutil import insert, node, scalar

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
PHASES = ("soul_corrections", "working_ttl")


def _fleet(store, n: int) -> tuple[Scope, list[Scope]]:
    """``n`` scopes under one root, each with a manual SOUL edit (held: ``soul_change``) and, in every
    tenth, an expired working note (applied tonight: nothing holds it)."""
    root = Scope.root("org", f"q{uuid.uuid4().hex[:8]}")
    scopes = [root.child("brand", f"b{i:03d}") for i in range(n)]
    rows = []
    for i, s in enumerate(scopes):
        rows.append(node(s, "SOUL:name", NOW - timedelta(hours=1), properties={"_last_edited_by": "user_manual_edit",
                                                                               "value": f"Nova {i}"}))
        if i % 10 == 0:
            rows.append(node(s, "note: scratch", NOW - timedelta(hours=3), layer="working", properties={"ttl_hours": 1}))
    insert(store, "memory_nodes", rows)
    return root, scopes


def _night(store, scopes, as_of, runs_dir):
    state = pipeline.consolidate(store, scopes, as_of, runs_dir=runs_dir, phases=PHASES)
    assert {r.status for r in state.reports.values()} == {"applied"}
    return state


def test_the_queue_counts_by_reason_phase_and_scope_and_one_reason_is_approved_across_200_scopes(store, runs_dir, capsys):
    root, scopes = _fleet(store, 200)
    _night(store, scopes, NOW, runs_dir)
    assert scalar(store, "SELECT count(*) FROM soul_profiles WHERE scope_path LIKE %s", root.path + "%") == 0

    queue = pending(store, Selection(scope=root))
    assert queue.height == 200 and queue.get_column("superseded_by").null_count() == 200
    g = grouped(queue)
    assert g["reason"].rows() == [("soul_change", 200, 200)]
    assert g["phase"].rows() == [("soul_corrections", 200, 200)]
    assert g["scope"].height == 200 and set(g["scope"].get_column("rows").to_list()) == {1}
    # a selection narrows it: by scope (a subtree, by path), by reason, by phase, by age
    assert pending(store, Selection(scope=scopes[7])).get_column("scope_path").to_list() == [scopes[7].path]
    assert pending(store, Selection(scope=root, reason="gate_failed")).height == 0
    assert pending(store, Selection(scope=root, phase="working_ttl")).height == 0
    assert pending(store, Selection(scope=root, older_than=timedelta(days=1), now=NOW + timedelta(hours=1))).height == 0
    assert pending(store, Selection(scope=root, older_than=timedelta(days=1), now=NOW + timedelta(days=2))).height == 200

    # the command line shows the same counts, first
    assert main(["--dsn", store.dsn, "held", "--scope", root.display(), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["reason"] == [{"reason": "soul_change", "runs": 200, "rows": 200}]

    # one bulk approve of the reason: 200 runs, each its own version-guarded transaction
    assert main(["--dsn", store.dsn, "approve", "--reason", "soul_change", "--scope", root.display(), "--by", "ops"]) == 0
    out = capsys.readouterr()
    assert "approved 200 held row(s) in 200 run(s): 200 selected, 0 added by the closure" in out.out
    assert scalar(store, "SELECT count(*) FROM soul_profiles WHERE scope_path LIKE %s AND key = 'name'", root.path + "%") == 200
    assert scalar(store, "SELECT value FROM soul_profiles WHERE scope_path = %s AND key = 'name'", scopes[42].path) == "Nova 42"
    assert scalar(store, "SELECT count(*) FROM consolidation_decisions d JOIN consolidation_runs r USING (run_id)"
                         " WHERE r.scope_path LIKE %s AND d.decided_by = 'ops' AND d.decision = 'approved'", root.path + "%") == 200
    assert pending(store, Selection(scope=root)).height == 0
    # nothing left to decide: a second bulk approve finds an empty selection and says so
    assert main(["--dsn", store.dsn, "approve", "--reason", "soul_change", "--scope", root.display()]) == 0
    assert "approved 0 held row(s) in 0 run(s)" in capsys.readouterr().out


def test_a_newer_run_supersedes_an_older_pending_one_and_bulk_decisions_take_the_newest(store, runs_dir):
    root, scopes = _fleet(store, 3)
    first = _night(store, scopes, NOW, runs_dir)
    insert(store, "memory_nodes", [node(scopes[0], "SOUL:name", NOW + timedelta(hours=23),
                                        properties={"_last_edited_by": "user_manual_edit", "value": "Vega"})])
    second = _night(store, scopes[:1], NOW + timedelta(days=1), runs_dir)
    old_run, new_run = first.reports[scopes[0].path].run_id, second.reports[scopes[0].path].run_id
    # the superseded run left the queue: one current run per scope and phase
    queue = pending(store, Selection(scope=root))
    assert sorted(queue.get_column("run_id").to_list()) == sorted([new_run, *(first.reports[s.path].run_id for s in scopes[1:])])
    every = pending(store, Selection(scope=root), include_superseded=True)
    assert dict(every.select("run_id", "superseded_by").iter_rows())[old_run] == new_run
    out = decide(store, "reject", Selection(scope=scopes[0]))
    assert [d.run_id for d in out.decided] == [new_run] and out.skipped_superseded == 1 and out.ok
    with pytest.raises(InputError, match="never approved"):
        decide(store, "approve", Selection(scope=scopes[0]), include_superseded=True)
    out = decide(store, "reject", Selection(scope=scopes[0]), include_superseded=True)
    assert [d.run_id for d in out.decided] == [old_run]
    assert pending(store, Selection(scope=scopes[0])).height == 0 and pending(store, Selection(scope=root)).height == 2


def test_a_bulk_decision_needs_a_run_or_a_selection_and_not_both(store, capsys):
    assert main(["--dsn", store.dsn, "approve"]) == 2
    assert "deep-sleep held" in capsys.readouterr().err
    assert main(["--dsn", store.dsn, "reject", "abcd1234", "--scope", "org/x"]) == 2
    assert "not both" in capsys.readouterr().err
    assert main(["--dsn", store.dsn, "held", "--reason", "gate_faild"]) == 2
    assert "no hold reason" in capsys.readouterr().err
    assert main(["--dsn", store.dsn, "held", "--older-than", "-1"]) == 2
    with pytest.raises(InputError, match="approve or reject"):
        decide(store, "delete", Selection())
