"""The held queue (issue 32 item 1, SPEC §9 as amended): pending rows counted by reason, phase and
scope across runs, and a bulk approve of one reason across 200 scopes — each scope atomic and
version-guarded — read back from the store."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import polars as pl
import pytest

from deep_sleep.cli import main
from deep_sleep.core.errors import InputError
from deep_sleep.core.scope import Scope
from deep_sleep.jobs.queue import Selection, decide, grouped, pending
from deep_sleep.run import pipeline
from deep_sleep.transforms.config import load_config
from tests.storeutil import insert, node, scalar

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
PHASES = ("soul_corrections", "working_ttl")



# The holds policy's rules alone: the gate's probes (deep_sleep/run/probes.py) would also fail these
# small scopes' 40 % deletes and name rows gate_failed first (tests/jobs/test_approve.py shows it).
RULES_ONLY = load_config(overrides={"gate": {"probes": 0}})

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
    state = pipeline.consolidate(store, scopes, as_of, RULES_ONLY, runs_dir=runs_dir, phases=PHASES)
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


# -- issue 37 items 2-4: a decision by reason decides its reason; supersession per scope and phase -------
def _mixed(store, scope: Scope, soul: bool = False) -> dict[str, list[str]]:
    """tests/jobs/test_approve.py's 40 % prune with the first weak orphan used by recall and tied to a
    hub by one edge: prune_orphans holds 4 node deletes — weak[0] as ``used_node``, the others as
    ``delete_share`` — and the edge's delete as ``with_held_node``; ``soul``: and a SOUL edit
    (``soul_change``, phase soul_corrections)."""
    from tests.jobs.test_approve import seed_40_percent
    from tests.storeutil import edge, used

    ids = seed_40_percent(store, scope)
    tie = edge(scope, ids["weak"][0], ids["strong"][0], at=NOW - timedelta(days=30))
    insert(store, "memory_edges", [tie])
    insert(store, "recall_events", [used(scope, ids["weak"][0], "trivia: weak 0", NOW - timedelta(hours=2))])
    if soul:
        insert(store, "memory_nodes", [node(scope, "SOUL:name", NOW - timedelta(hours=1),
                                            properties={"_last_edited_by": "user_manual_edit", "value": "Nova"})])
    return {**ids, "tie": [tie["id"]]}


def _by_reason(store, selection: Selection) -> dict[str, tuple[int, int]]:
    return {r: (n, m) for r, n, m in grouped(pending(store, selection))["reason"].iter_rows()}


def _live(store, scope: Scope, table: str = "memory_nodes") -> set[str]:
    with store.pg() as con:
        return {r[0] for r in con.execute(f"SELECT id::text FROM {table} WHERE scope_path = %s", (scope.path,))}


def test_a_decision_by_reason_takes_its_rows_and_only_the_closure_they_need(store, scope, runs_dir, capsys):
    """Item 2: ``approve --reason used_node`` applies the used node's delete and the edge delete that
    must go with it (listed as the closure's), not the ``delete_share`` deletes of the same phase;
    ``reject --reason delete_share`` then rejects exactly those.  The counts by reason before and after."""
    ids = _mixed(store, scope)
    run = pipeline.consolidate(store, scope, NOW, RULES_ONLY, runs_dir=runs_dir).report()
    assert run.status == "applied" and run.held["cells"] == {
        "prune_orphans": {"delete_share": 3, "used_node": 1, "with_held_node": 1}}, run.held
    sel = Selection(scope=scope)
    assert _by_reason(store, sel) == {"delete_share": (1, 3), "used_node": (1, 1), "with_held_node": (1, 1)}

    assert main(["--dsn", store.dsn, "approve", "--reason", "used_node", "--scope", scope.display(), "--by", "ops"]) == 0
    out = capsys.readouterr().out
    assert "approved 2 held row(s) in 1 run(s): 1 selected, 1 added by the closure" in out, out
    assert f"1 memory_edges deletes of prune_orphans held as with_held_node: {ids['tie'][0]}" in out
    live = _live(store, scope)
    assert ids["weak"][0] not in live and set(ids["weak"][1:]) <= live  # the used node went, the delete_share ones wait
    assert ids["tie"][0] not in _live(store, scope, "memory_edges")  # its edge went with it: the closure
    assert _by_reason(store, sel) == {"delete_share": (1, 3)}
    with store.pg() as con:
        rows = con.execute("SELECT table_name, row_id, reason, decision, closure FROM consolidation_decided_rows"
                           " WHERE run_id = %s::uuid ORDER BY table_name", (run.run_id,)).fetchall()
    assert rows == [("memory_edges", ids["tie"][0], "with_held_node", "approved", True),
                    ("memory_nodes", ids["weak"][0], "used_node", "approved", False)]
    assert scalar(store, "SELECT hold_status FROM consolidation_runs WHERE run_id = %s::uuid", run.run_id) == "partial"

    out = decide(store, "reject", Selection(scope=scope, reason="delete_share"), decided_by="ops")
    assert out.ok and [d.held_rows for d in out.decided] == [{"memory_nodes": {"deletes": 3}}] and out.closure == []
    assert set(ids["weak"][1:]) <= _live(store, scope) and pending(store, sel).height == 0
    assert scalar(store, "SELECT hold_status FROM consolidation_runs WHERE run_id = %s::uuid", run.run_id) == "decided"


def test_supersession_is_per_scope_and_phase_before_any_filter_and_remembers_decisions(store, scope, runs_dir):
    """Item 3 and 4: night 1 holds the prune (delete_share …) and a SOUL edit, night 2 the prune again
    (the SOUL edit is out of its window).  Night 1's prune expired; its SOUL row is current.  No filter
    (``--older-than``) brings the expired prune back, a by-reason decision never skips the SOUL row
    for the other phase's sake, and rejecting night 2's prune does not revive night 1's."""
    ids = _mixed(store, scope, soul=True)
    first = pipeline.consolidate(store, scope, NOW, RULES_ONLY, runs_dir=runs_dir).report()
    second = pipeline.consolidate(store, scope, NOW + timedelta(days=1), RULES_ONLY, runs_dir=runs_dir).report()
    assert set(first.held["phases"]) == {"prune_orphans", "soul_corrections"} and set(second.held["phases"]) == {"prune_orphans"}
    current = pending(store, Selection(scope=scope))
    assert sorted(current.select("run_id", "phase").iter_rows()) == sorted(
        [(first.run_id, "soul_corrections"), (second.run_id, "prune_orphans")])
    # the counts by reason are the current runs' rows: 5 of the prune (night 2), 1 SOUL row — not night 1's prune too
    assert _by_reason(store, Selection(scope=scope)) == {"delete_share": (1, 3), "soul_change": (1, 1),
                                                         "used_node": (1, 1), "with_held_node": (1, 1)}
    expired = pending(store, Selection(scope=scope), include_superseded=True).filter(pl.col("superseded_by").is_not_null())
    assert expired.select("run_id", "phase", "rows", "superseded_by").rows() == [(first.run_id, "prune_orphans", 5, second.run_id)]

    # a filter never makes a superseded row current: older than a day is night 1's SOUL row only
    later = NOW + timedelta(days=1, hours=1)
    old = Selection(scope=scope, older_than=timedelta(days=1), now=later)
    assert pending(store, old).select("run_id", "phase").rows() == [(first.run_id, "soul_corrections")]
    out = decide(store, "approve", old)
    assert out.ok and [(d.run_id, d.phases) for d in out.decided] == [(first.run_id, ["soul_corrections"])]
    assert out.skipped_superseded == 1 and set(ids["weak"]) <= _live(store, scope)  # the stale prune was not applied
    assert scalar(store, "SELECT value FROM soul_profiles WHERE scope_path = %s AND key = 'name'", scope.path) == "Nova"

    # the newest plan rejected: the older one stays expired, by reason too
    assert decide(store, "reject", Selection(scope=scope)).decided[0].run_id == second.run_id
    out = decide(store, "approve", Selection(reason="used_node", scope=scope))
    assert out.decided == [] and out.skipped_superseded == 1 and set(ids["weak"]) <= _live(store, scope)
    assert pending(store, Selection(scope=scope)).height == 0
    from deep_sleep.jobs.approve import approve
    from deep_sleep.jobs.errors import HoldError

    with pytest.raises(HoldError, match="superseded by run"):  # by run id too: an expired row is never approved
        approve(store, first.run_id, "prune_orphans")


def test_gc_keeps_what_the_queue_still_needs_and_a_run_whose_files_are_gone_can_still_be_rejected(store, scope, runs_dir,
                                                                                                    capsys):
    """Item 3: ``gc --force`` keeps the directory of a run whose held rows await a decision (approve needs
    them), removes the expired run's; a run whose files an earlier gc removed is listed and rejected by
    phase from the ledger (approve refuses it by name)."""
    from deep_sleep.jobs.approve import approve
    from deep_sleep.jobs.errors import HoldError
    from deep_sleep.jobs.gc import gc
    from deep_sleep.jobs.ledger import get_run

    _mixed(store, scope)
    first = pipeline.consolidate(store, scope, NOW, RULES_ONLY, runs_dir=runs_dir).report()
    second = pipeline.consolidate(store, scope, NOW + timedelta(days=1), RULES_ONLY, runs_dir=runs_dir).report()
    result = gc(store, runs_dir, 30, force=True, now=NOW + timedelta(days=40))
    kept = {a.run_id: a for a in result.actions}
    assert not kept[second.run_id].remove and "await a decision" in kept[second.run_id].reason
    assert kept[first.run_id].remove  # its held rows expired: nothing needs them
    assert get_run(store, second.run_id).files_removed_at is None
    assert approve(store, second.run_id, reason="used_node").held_rows == {"memory_edges": {"deletes": 1},
                                                                            "memory_nodes": {"deletes": 1}}

    # an earlier release's gc removed a pending run's files: listed, rejectable by phase, not approvable
    import shutil
    from pathlib import Path

    shutil.rmtree(Path(get_run(store, second.run_id).diff_uri).parent)
    with store.pg() as con:  # as that gc --force left the ledger
        con.execute("UPDATE consolidation_runs SET not_undoable = 'before-images removed by gc', files_removed_at = now()"
                    " WHERE run_id = %s::uuid", (second.run_id,))
        con.commit()
    assert pending(store, Selection(scope=scope)).get_column("rows").to_list() == [3]
    with pytest.raises(HoldError, match="removed by gc"):
        approve(store, second.run_id)
    assert main(["--dsn", store.dsn, "reject", second.run_id[:8]]) == 0
    assert "rejected" in capsys.readouterr().out
    assert pending(store, Selection(scope=scope)).height == 0
    assert scalar(store, "SELECT hold_status FROM consolidation_runs WHERE run_id = %s::uuid", second.run_id) == "decided"
