"""Issue 16 item 2 on the real store: a run that would delete 40 % of a scope's nodes applies all but the
held deletions; approve applies them through the version guard (a live write since is never
overwritten); reject discards them; SOUL changes and used-node deletes are held; both decisions are
in the ledger."""

from __future__ import annotations

import uuid
from pathlib import Path
from datetime import UTC, datetime, timedelta

import pytest

from deep_sleep.core.errors import InputError
from deep_sleep.jobs.approve import approve, decision_text, holds_markdown, read_holds, reject
from deep_sleep.jobs.errors import HoldError
from deep_sleep.jobs.ledger import get_run
from deep_sleep.jobs.undo import undo
from deep_sleep.run.holds import HELD_DIR, read_held
from deep_sleep.run.pipeline import consolidate
from deep_sleep.transforms.config import load_config
from tests.storeutil import access, edge, insert, node, scalar

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


def seed_40_percent(store, scope) -> dict[str, list[str]]:
    """10 semantic nodes: 6 strong and connected (3 read twice in the last hour: strengthen), 4 weak old
    orphans (importance 2, 30 days untouched: prune_orphans deletes them — 40 % of the scope)."""
    strong = [node(scope, f"project: strong {i}", NOW - timedelta(hours=3), importance=8.0) for i in range(6)]
    weak = [node(scope, f"trivia: weak {i}", NOW - timedelta(days=30), importance=2.0) for i in range(4)]
    insert(store, "memory_nodes", [*strong, *weak])
    insert(store, "memory_edges", [edge(scope, strong[i]["id"], strong[i + 1]["id"], at=NOW - timedelta(hours=3))
                                   for i in range(5)])
    insert(store, "memory_access_log", [access(scope, n["id"], NOW - timedelta(minutes=m)) for n in strong[:3] for m in (5, 30)])
    return {"strong": [n["id"] for n in strong], "weak": [n["id"] for n in weak]}


def live_ids(store, scope) -> set[str]:
    with store.pg() as con:
        return {r[0] for r in con.execute("SELECT id::text FROM memory_nodes WHERE scope_path = %s", (scope.path,))}


def ledger(store, run_id: str) -> tuple[str, dict]:
    with store.pg() as con:
        return con.execute("SELECT hold_status, held FROM consolidation_runs WHERE run_id = %s::uuid", (run_id,)).fetchone()


def decisions(store, run_id: str) -> list[tuple]:
    """(phase, decision, conflicts, rows applied, approval run id, decided by) per decided phase: what an
    approval applied and its conflicts are its own ledger row's (migration 026), named by approval_run_id."""
    with store.pg() as con:
        return con.execute("SELECT d.phase, d.decision, a.conflicts, a.rows_changed, d.approval_run_id::text, d.decided_by"
                           " FROM consolidation_decisions d LEFT JOIN consolidation_runs a ON a.run_id = d.approval_run_id"
                           " WHERE d.run_id = %s::uuid ORDER BY d.phase", (run_id,)).fetchall()


def test_the_run_holds_the_40_percent_delete_and_approve_applies_it_without_overwriting_a_live_write(store, scope, runs_dir):
    ids = seed_40_percent(store, scope)
    run = consolidate(store, scope, NOW, runs_dir=runs_dir).report()
    assert run.status == "applied", run.errors
    # the gate ran: no used recall to replay, but its probes see 4 of the scope's 10 facts go (40 pp of its
    # memory): it fails too; the share rule comes first and names the held rows
    assert run.gate["status"] == "measured" and run.gate["failed"] is True and run.gate["probes"]["found_after"] == 0
    # everything but the held deletions applied: strengthen's updates landed, the weak nodes are still there
    assert run.held["rows"] == {"memory_nodes": {"deletes": 4}}
    assert run.held["reasons"] == {"delete_share": 4} and run.held["status"] == "pending"
    assert "4 of 10 semantic nodes" in run.held["why"][0]
    assert run.rows_changed.get("memory_nodes", {}).get("deletes", 0) == 0
    assert run.rows_changed["memory_nodes"]["updates"] >= 3
    assert set(ids["weak"]) <= live_ids(store, scope)
    held, reasons = read_held(run.diff_uri, scope.path)  # a shard diff: every row names its scope
    assert sorted(held.table("memory_nodes").deletes["id"]) == sorted(ids["weak"]) and reasons.height == 4
    assert set(held.table("memory_nodes").deletes["scope_path"]) == {scope.path} == set(reasons["scope_path"])
    status, in_ledger = ledger(store, run.run_id)
    assert status == "pending" and in_ledger["rows"] == {"memory_nodes": {"deletes": 4}}
    h = read_holds(store, run.run_id)
    assert h.pending == ["prune_orphans"] and "prune_orphans" in holds_markdown(h)

    # a live turn edits one held node after the snapshot: its version moves
    edited = ids["weak"][0]
    with store.pg() as con:
        con.execute("UPDATE memory_nodes SET label = 'trivia: weak 0 (edited live)' WHERE id = %s::uuid", (edited,))
        con.commit()

    d = approve(store, run.run_id[:8], decided_by="test")
    assert d.decision == "approved" and d.phases == ["prune_orphans"]
    assert d.applied == {"memory_nodes": {"deletes": 3}} and d.conflicts == 1
    assert "applied 3, 1 conflict" in decision_text(d)
    left = live_ids(store, scope)
    assert edited in left and not (set(ids["weak"][1:]) & left) and set(ids["strong"]) <= left
    assert scalar(store, "SELECT label FROM memory_nodes WHERE id = %s::uuid", edited) == "trivia: weak 0 (edited live)"
    # recorded: the decision, the run's hold_status, an approval ledger row with the archive of what it deleted
    assert decisions(store, run.run_id) == [("prune_orphans", "approved", 1, {"memory_nodes": {"deletes": 3}},
                                             d.approval_run_id, "test")]
    assert ledger(store, run.run_id)[0] == "approved"
    approval = get_run(store, d.approval_run_id)
    assert (approval.mode, approval.status, approval.conflicts) == ("approve", "applied", 1)
    assert approval.rows_changed == {"memory_nodes": {"deletes": 3}}
    assert scalar(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s::uuid", d.approval_run_id) == 3
    assert scalar(store, "SELECT approval_of::text FROM consolidation_runs WHERE run_id = %s::uuid", d.approval_run_id) == run.run_id

    with pytest.raises(HoldError, match="already decided"):
        approve(store, run.run_id)
    with pytest.raises(HoldError, match="already approved"):
        reject(store, run.run_id, phase="prune_orphans")
    with pytest.raises(HoldError, match="only an applied run"):
        approve(store, d.approval_run_id)
    # the approval is a run of its own (its own directory beside the run's): undo puts its deletes back
    assert Path(approval.diff_uri).parent.parent == Path(run.diff_uri).parent.parent
    undone = undo(store, d.approval_run_id)
    assert undone.complete and set(ids["weak"]) <= live_ids(store, scope)


def test_racing_approvals_of_one_run_apply_once_and_the_loser_writes_nothing(store, scope, runs_dir):
    """Two approvals of the same run at once: one applies the held rows, the other raises HoldError —
    whether it lost the race on the decision rows' primary key or read them already decided — and writes
    nothing: no decision row, no ledger row of its own, no archive rows (SPEC §9, migration 026)."""
    import threading

    ids = seed_40_percent(store, scope)
    run = consolidate(store, scope, NOW, runs_dir=runs_dir).report()
    assert run.held["rows"] == {"memory_nodes": {"deletes": 4}}
    start, out = threading.Barrier(2), []

    def go():
        start.wait()
        try:
            out.append(approve(store, run.run_id, decided_by="race"))
        except Exception as exc:  # noqa: BLE001 - anything but a HoldError fails the assertion below, named
            out.append(exc)

    workers = [threading.Thread(target=go) for _ in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    won = [d for d in out if not isinstance(d, Exception)]
    lost = [e for e in out if isinstance(e, HoldError)]
    assert len(won) == 1 and len(lost) == 1, out
    d = won[0]
    assert d.applied == {"memory_nodes": {"deletes": 4}} and d.conflicts == 0
    assert not (set(ids["weak"]) & live_ids(store, scope))
    assert decisions(store, run.run_id) == [("prune_orphans", "approved", 0, {"memory_nodes": {"deletes": 4}},
                                             d.approval_run_id, "race")]
    approvals = [r[0] for r in _rows(store, "SELECT run_id::text FROM consolidation_runs WHERE approval_of = %s::uuid",
                                     run.run_id)]
    assert approvals == [d.approval_run_id]  # the loser left no ledger row
    # the held deletes archived once, by the winner
    assert _rows(store, "SELECT run_id::text, count(*) FROM consolidation_archive WHERE row_id = ANY(%s) GROUP BY 1",
                 ids["weak"]) == [(d.approval_run_id, 4)]
    assert ledger(store, run.run_id)[0] == "approved"


def _rows(store, sql: str, *params) -> list[tuple]:
    with store.pg() as con:
        return con.execute(sql, params).fetchall()


def test_reject_discards_the_held_rows_and_is_recorded(store, scope, runs_dir):
    ids = seed_40_percent(store, scope)
    run = consolidate(store, scope, NOW, runs_dir=runs_dir).report()
    d = reject(store, run.run_id)
    assert d.decision == "rejected" and d.held_rows == {"memory_nodes": {"deletes": 4}} and d.applied == {}
    assert set(ids["weak"]) <= live_ids(store, scope)
    assert decisions(store, run.run_id)[0][:2] == ("prune_orphans", "rejected")
    assert ledger(store, run.run_id)[0] == "rejected"
    assert scalar(store, "SELECT count(*) FROM consolidation_runs WHERE approval_of = %s::uuid", run.run_id) == 0
    with pytest.raises(HoldError, match="already decided"):
        approve(store, run.run_id)
    # the next night proposes the deletes again (and holds them again): a rejection is not a tombstone
    again = consolidate(store, scope, NOW + timedelta(days=1), runs_dir=runs_dir).report()
    assert again.held["rows"] == {"memory_nodes": {"deletes": 4}}


def test_a_soul_change_and_a_used_node_delete_are_held_and_approved_by_phase(store, scope, runs_dir):
    used = node(scope, "trivia: used once", NOW - timedelta(days=30), importance=2.0)
    soul = node(scope, "SOUL:name", NOW - timedelta(hours=2),
                properties={"_last_edited_by": "user_manual_edit", "value": "Ada"})
    others = [node(scope, f"project: other {i}", NOW - timedelta(hours=3), importance=8.0) for i in range(40)]
    insert(store, "memory_nodes", [used, soul, *others])
    insert(store, "memory_edges", [edge(scope, others[i]["id"], others[i + 1]["id"], at=NOW - timedelta(hours=3))
                                   for i in range(39)] + [edge(scope, soul["id"], others[0]["id"], at=NOW - timedelta(hours=3))])
    insert(store, "recall_events", [{"id": str(uuid.uuid4()), "scope_path": scope.path, "tenant_id": scope.tenant_id,
                                     "query": "trivia", "node_id": used["id"], "similarity": 0.8, "score": 0.7, "features": [0.0] * 12,
                                     "label": 1.0, "label_source": "explicit", "created_at": NOW - timedelta(days=2)}])
    run = consolidate(store, scope, NOW, runs_dir=runs_dir).report()
    assert run.status == "applied", run.errors
    # 1 of 42 semantic nodes deleted is under 5 %: only the used rule holds it
    assert run.held["reasons"] == {"soul_change": 1, "used_node": 1}, run.held
    assert run.held["rows"] == {"memory_nodes": {"deletes": 1}, "soul_profiles": {"inserts": 1}}
    assert used["id"] in live_ids(store, scope)
    assert scalar(store, "SELECT count(*) FROM soul_profiles WHERE scope_path = %s", scope.path) == 0

    with pytest.raises(HoldError, match="no rows of phase 'decay'"):
        approve(store, run.run_id, phase="decay")
    d = approve(store, run.run_id, phase="soul_corrections")
    assert d.applied == {"soul_profiles": {"inserts": 1}} and d.conflicts == 0
    assert scalar(store, "SELECT value FROM soul_profiles WHERE scope_path = %s AND key = 'name'", scope.path) == "Ada"
    assert ledger(store, run.run_id)[0] == "partial"
    assert used["id"] in live_ids(store, scope)
    r = reject(store, run.run_id)  # the rest: the used node's delete
    assert r.phases == ["prune_orphans"] and used["id"] in live_ids(store, scope)
    assert ledger(store, run.run_id)[0] == "decided"


def test_a_run_with_nothing_held_and_unknown_runs_are_refused(store, scope, runs_dir):
    insert(store, "memory_nodes", [node(scope, f"project: fine {i}", NOW - timedelta(hours=3)) for i in range(3)])
    run = consolidate(store, scope, NOW, runs_dir=runs_dir).report()
    assert run.held == {} and ledger(store, run.run_id) == ("none", {})
    assert not (runs_dir / HELD_DIR).exists()
    with pytest.raises(HoldError, match="holds nothing"):
        approve(store, run.run_id)
    with pytest.raises(InputError, match="not in the ledger"):
        reject(store, str(uuid.uuid4()))


def test_holds_off_applies_everything(store, scope, runs_dir):
    ids = seed_40_percent(store, scope)
    # no holds policy, and no gate probes (which would hold this 40 % delete: the test above)
    config = load_config(overrides={"holds": {"enabled": False}, "gate": {"probes": 0}})
    run = consolidate(store, scope, NOW, config, runs_dir=runs_dir).report()
    assert run.held == {} and run.rows_changed["memory_nodes"]["deletes"] == 4
    assert not (set(ids["weak"]) & live_ids(store, scope))


def test_plan_says_which_rows_would_be_held_and_the_cli_approves_them(store, scope, runs_dir, capsys):
    import polars as pl

    from deep_sleep.cli import main
    from deep_sleep.run.preview import PREVIEW_FILE

    ids = seed_40_percent(store, scope)
    code = main(["--dsn", store.dsn, "plan", scope.display(), "--as-of", NOW.isoformat(), "--runs-dir", str(runs_dir)])
    out = capsys.readouterr().out
    assert code == 0 and "Would be held for approval" in out and "4 of 10 semantic nodes" in out
    assert out.count("delete_share") == 4
    records = pl.read_parquet(next(runs_dir.rglob(PREVIEW_FILE)))
    held = records.filter(pl.col("held").is_not_null())
    assert sorted(held["id"]) == sorted(ids["weak"]) and set(held["held"]) == {"delete_share"}
    assert records.filter(pl.col("held").is_null() & (pl.col("phase") == "strengthen")).height >= 3
    assert set(ids["weak"]) <= live_ids(store, scope)  # the plan applied nothing

    run = consolidate(store, scope, NOW, runs_dir=runs_dir).report()
    assert main(["--dsn", store.dsn, "approve", run.run_id[:8], "--by", "ops"]) == 0
    assert "approved 4 held row(s) of prune_orphans; applied 4, 0 conflict(s)" in capsys.readouterr().out
    assert not (set(ids["weak"]) & live_ids(store, scope))
    assert main(["--dsn", store.dsn, "reject", run.run_id]) == 2
    assert "already decided" in capsys.readouterr().err


def test_a_shard_run_holds_per_scope_and_approve_reads_its_scope_out_of_the_shard(store, scope, runs_dir):
    from deep_sleep.core.scope import Scope
    from deep_sleep.run import pipeline

    calm = Scope.root("org", scope.tenant_id + "c").child("brand", "b1")
    ids = seed_40_percent(store, scope)
    insert(store, "memory_nodes", [node(calm, f"project: fine {i}", NOW - timedelta(hours=3)) for i in range(3)])
    applied = pipeline.run(pipeline.NIGHT, pipeline.Context.of(NOW, load_config(), scopes=[scope, calm], store=store,
                                                           base=runs_dir / "shard"))
    held, other = applied.reports[scope.path], applied.reports[calm.path]
    assert held.held["rows"] == {"memory_nodes": {"deletes": 4}} and other.held == {}
    assert (runs_dir / "shard" / "diff" / HELD_DIR).is_dir() and set(ids["weak"]) <= live_ids(store, scope)
    assert ledger(store, held.run_id)[0] == "pending" and ledger(store, other.run_id)[0] == "none"
    with pytest.raises(HoldError, match="holds nothing"):
        approve(store, other.run_id)
    d = approve(store, held.run_id)
    assert d.applied == {"memory_nodes": {"deletes": 4}} and not (set(ids["weak"]) & live_ids(store, scope))
