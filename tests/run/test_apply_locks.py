"""Issue 37 item 5 (and item 7's "the nightly's apply without its slot"), against behaviour on the real
store: every apply holds an apply slot — the nightly's shards, ``deep-sleep run`` and an approval
wait while another session holds every slot; every entry point (run, approve, reject, undo) waits
for a scope's apply lock held elsewhere; a second nightly on a store where one runs refuses at once,
naming it (the flow, and the command line with exit 2), and writes nothing.

Each test holds the lock or slots from a connection of its own, starts the entry point in a thread,
and watches the server (``pg_stat_activity``, ``pg_blocking_pids``) until the entry point is seen
waiting — or, the bug, until it has written its ledger row; no timing is asserted."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta

import psycopg
import pytest

from deep_sleep.core.scope import Scope
from deep_sleep.jobs.approve import approve, reject
from deep_sleep.jobs.undo import undo
from deep_sleep.run.pipeline import consolidate
from deep_sleep.run.slots import APPLY_SLOT_CLASS, DEFAULT_APPLY_SLOTS, NightRunning
from tests.storeutil import access, edge, insert, node, scalar, small_graph

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
WAITER = "deep-sleep apply (pid %"  # the application_name of a session waiting for (or holding) an apply slot


class Holder:
    """A session of the test's own holding session advisory locks until :meth:`release`."""

    def __init__(self, dsn: str, *keys: tuple) -> None:
        self.con = psycopg.connect(dsn, autocommit=True, application_name="test lock holder")
        self.pid = self.con.info.backend_pid
        for key in keys:
            self.con.execute(f"SELECT pg_advisory_lock({', '.join(['%s'] * len(key))})", key)

    def release(self) -> None:
        self.con.execute("SELECT pg_advisory_unlock_all()")
        self.con.close()


def slots_held(dsn: str, n: int) -> Holder:
    return Holder(dsn, *((APPLY_SLOT_CLASS, i) for i in range(n)))


def scope_lock_held(dsn: str, scope: Scope) -> Holder:
    with psycopg.connect(dsn) as con:  # the key the apply transaction's lock takes (statements.LOCK_SQL)
        key = con.execute("SELECT hashtextextended(%s, 0)", (scope.path,)).fetchone()[0]
    return Holder(dsn, (key,))


def runs_of(store, scopes: list[Scope], mode: str | None = None) -> int:
    sql = "SELECT count(*) FROM consolidation_runs WHERE scope_path = ANY(%s)" + (" AND mode = %s" if mode else "")
    return scalar(store, sql, [s.path for s in scopes], *([mode] if mode else []))


def in_thread(fn) -> tuple[threading.Thread, list, list]:
    out: list = []
    errors: list = []

    def run():
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out, errors


def wait_until_waiting(store, thread: threading.Thread, errors: list, seen, wrote, what: str) -> None:
    """Poll until ``seen(con)`` (the entry point is waiting); fail if ``wrote()`` first (it applied
    without waiting) or the thread ended."""
    with psycopg.connect(store.dsn, autocommit=True) as con:
        deadline = time.monotonic() + 120
        while not seen(con):
            assert not errors, errors
            assert not wrote(), f"{what} wrote its ledger row while the lock or slots were held elsewhere"
            assert thread.is_alive(), f"{what} ended without waiting"
            assert time.monotonic() < deadline, f"{what} was never seen waiting"
            time.sleep(0.02)
    assert not wrote(), f"{what} wrote while the lock or slots were held elsewhere"


def slot_waiter(con) -> bool:
    return con.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE %s", (WAITER,)).fetchone()[0] > 0


def blocked_by(pid: int):
    return lambda con: con.execute("SELECT count(*) FROM pg_stat_activity WHERE %s = ANY(pg_blocking_pids(pid))",
                                   (pid,)).fetchone()[0] > 0


def finish(thread: threading.Thread, out: list, errors: list):
    thread.join(180)
    assert not thread.is_alive(), "the entry point did not finish once the lock was released"
    assert not errors, errors
    return out[0]


# -- the nightly: its apply holds its slot; one night per store ------------------------------------
def _fleet(store, prefix: str, n: int = 2) -> list[Scope]:
    scopes = [Scope.root("org", f"{prefix}{uuid.uuid4().hex[:8]}").child("brand", f"b{i}") for i in range(n)]
    for s in scopes:
        small_graph(store, s, NOW)
    return scopes


def _night_params(store, scopes, tmp_path, **kw):
    from deep_sleep.jobs.night import NightlyParameters

    kw = {"as_of": NOW, "apply_concurrency": 1, **kw}
    return NightlyParameters(dsn=store.dsn, runs_dir=str(tmp_path / "runs"), scopes=[s.display() for s in scopes],
                             data_quality=False, **kw)


@pytest.mark.flow
def test_the_nightly_applies_a_scope_only_holding_its_apply_slot(prefect_harness, store, tmp_path):
    """Issue 37 item 7: with the night's one apply slot held elsewhere, the night extracts and plans but
    applies nothing until the slot is free — a nightly whose apply ran without its slot fails here."""
    from deep_sleep.flows.nightly import run_nightly

    scopes = _fleet(store, "slot")
    holder = slots_held(store.dsn, 1)
    try:
        night, out, errors = in_thread(lambda: run_nightly(_night_params(store, scopes, tmp_path)))
        wait_until_waiting(store, night, errors, slot_waiter, lambda: runs_of(store, scopes) > 0, "the nightly")
    finally:
        holder.release()
    summary = finish(night, out, errors)
    assert summary["applied"] == 2 and runs_of(store, scopes, "nightly") == 2


@pytest.mark.flow
def test_a_second_nightly_refuses_naming_the_night_that_runs_and_writes_nothing(prefect_harness, store, tmp_path, capsys):
    """Issue 37 item 5: two nightlies at once on one store.  The first holds the night lock (it waits
    at its apply slot here, so it is surely running); the second — the flow, and ``deep-sleep nightly`` —
    refuses at once, naming the first's session, and writes no ledger row; the first then applies."""
    from deep_sleep.cli import main
    from deep_sleep.flows.nightly import run_nightly

    scopes = _fleet(store, "night")
    holder = slots_held(store.dsn, 1)
    try:
        first, out, errors = in_thread(lambda: run_nightly(_night_params(store, scopes, tmp_path)))
        wait_until_waiting(store, first, errors, slot_waiter, lambda: runs_of(store, scopes) > 0, "the first nightly")
        with pytest.raises(NightRunning, match=r"another night is running on this store: deep-sleep nightly [0-9a-f]{8} pid \d+ on .*\(server backend \d+"):
            # a slot of its own (2 slots), so a second night that did not refuse would apply, not wait
            run_nightly(_night_params(store, scopes, tmp_path, apply_concurrency=2))
        capsys.readouterr()
        code = main(["--dsn", store.dsn, "nightly", "--as-of", NOW.isoformat(), "--runs-dir", str(tmp_path / "cli"),
                     "--no-data-quality", "--force", "--apply-concurrency", "2"])
        err = capsys.readouterr().err
        assert code == 2, err
        assert "deep-sleep nightly: error: another night is running on this store: deep-sleep nightly " in err, err
        assert [line for line in err.splitlines() if "error" in line] == [err.splitlines()[-1]] and "Traceback" not in err, err
        assert runs_of(store, scopes) == 0  # neither the refused nights nor the waiting one wrote a run
    finally:
        holder.release()
    summary = finish(first, out, errors)
    assert summary["applied"] == 2 and runs_of(store, scopes, "nightly") == 2
    # the lock went with the night: the next one runs (nothing is due any more)
    assert run_nightly(_night_params(store, scopes, tmp_path, as_of=NOW + timedelta(minutes=5)))["applied"] == 0


# -- run, approve: an apply slot each ----------------------------------------------------------------
def test_deep_sleep_run_waits_while_every_apply_slot_is_held_elsewhere(store, scope, tmp_path, monkeypatch):
    """Issue 37 item 5: ``deep-sleep run`` (in process) applied while another process held every slot."""
    from deep_sleep.cli import main

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    small_graph(store, scope, NOW)
    holder = slots_held(store.dsn, DEFAULT_APPLY_SLOTS)
    try:
        run, out, errors = in_thread(lambda: main(["--dsn", store.dsn, "run", scope.display(), "--as-of", NOW.isoformat(),
                                                   "--runs-dir", str(tmp_path / "runs"), "--force"]))
        wait_until_waiting(store, run, errors, slot_waiter, lambda: runs_of(store, [scope]) > 0, "deep-sleep run")
    finally:
        holder.release()
    assert finish(run, out, errors) == 0 and runs_of(store, [scope], "nightly") == 1


def _held_run(store, scope, runs_dir) -> str:
    """A run holding 4 weak orphans' deletes (40 % of the scope: over the delete-share limit)."""
    strong = [node(scope, f"project: strong {i}", NOW - timedelta(hours=3), importance=8.0) for i in range(6)]
    weak = [node(scope, f"trivia: weak {i}", NOW - timedelta(days=30), importance=2.0) for i in range(4)]
    insert(store, "memory_nodes", [*strong, *weak])
    insert(store, "memory_edges", [edge(scope, a["id"], b["id"], at=NOW - timedelta(hours=3)) for a, b in zip(strong, strong[1:])])
    insert(store, "memory_access_log", [access(scope, n["id"], NOW - timedelta(minutes=5)) for n in strong[:2]])
    report = consolidate(store, scope, NOW, runs_dir=runs_dir).report()
    assert report.held, report
    return report.run_id


def test_an_approval_waits_while_every_apply_slot_is_held_elsewhere(store, scope, runs_dir):
    run_id = _held_run(store, scope, runs_dir)
    holder = slots_held(store.dsn, DEFAULT_APPLY_SLOTS)
    try:
        t, out, errors = in_thread(lambda: approve(store, run_id))
        wait_until_waiting(store, t, errors, slot_waiter, lambda: runs_of(store, [scope], "approve") > 0, "approve")
    finally:
        holder.release()
    assert finish(t, out, errors).applied["memory_nodes"]["deletes"] == 4


# -- every entry point waits for the scope's apply lock ---------------------------------------------
@pytest.mark.parametrize("entry", ["run", "approve", "reject", "undo"])
def test_every_entry_point_waits_for_the_scopes_apply_lock(store, scope, runs_dir, entry):
    """The scope's apply lock (the apply transaction's ``pg_advisory_xact_lock``) held by another session:
    a night of the scope, an approval, a rejection and an undo of its run each wait for it, then go."""
    run_id = _held_run(store, scope, runs_dir)
    before = runs_of(store, [scope])
    decided = lambda: scalar(store, "SELECT count(*) FROM consolidation_decisions WHERE run_id = %s", run_id) > 0  # noqa: E731
    call, wrote = {
        "run": (lambda: consolidate(store, scope, NOW + timedelta(hours=1), runs_dir=runs_dir).report(),
                lambda: runs_of(store, [scope]) > before),
        "approve": (lambda: approve(store, run_id), decided),
        "reject": (lambda: reject(store, run_id), decided),
        "undo": (lambda: undo(store, run_id), lambda: runs_of(store, [scope], "undo") > 0),
    }[entry]
    holder = scope_lock_held(store.dsn, scope)
    try:
        t, out, errors = in_thread(call)
        wait_until_waiting(store, t, errors, blocked_by(holder.pid), wrote, entry)
    finally:
        holder.release()
    finish(t, out, errors)
    assert wrote()
