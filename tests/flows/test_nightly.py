"""The nightly fan-out over a fleet: gating, bounded concurrency, isolated failures, second night idle."""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from deep_sleep.core.config import GatingConfig
from deep_sleep.core.scope import Scope
from deep_sleep.dev.seed import SeedSpec, scopes_of, seed_store
from deep_sleep.jobs.gating import gate
from tests.storeutil import create_database, drop_database

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


def test_gate_rule():
    cfg = GatingConfig()
    assert gate(None, 0, NOW, cfg) == (True, "never consolidated")
    assert gate(NOW - timedelta(hours=24), 0, NOW, cfg)[0]
    assert not gate(NOW - timedelta(hours=23, minutes=59), 19, NOW, cfg)[0]
    due, why = gate(NOW - timedelta(hours=1), 20, NOW, cfg)
    assert due and "20 new sessions" in why


@pytest.fixture(scope="module")
def fleet(admin_dsn):
    """200 scopes: 40 tenants × (an org scope + 4 conversations), 30 nodes each."""
    name = f"ds_fleet_{os.getpid()}"
    store = create_database(admin_dsn, name)
    spec = SeedSpec(tenants=40, scopes_per_tenant=4, nodes_per_scope=30, seed=3, now=NOW)
    seed_store(store, spec)
    yield store, scopes_of(spec)
    drop_database(admin_dsn, name)


@pytest.mark.flow
def test_nightly_over_200_scopes(prefect_harness, fleet, tmp_path):
    from deep_sleep.flows.nightly import NightlyParameters, run_nightly

    store, scopes = fleet
    assert len(scopes) == 200
    failing = [scopes[1], scopes[7], scopes[13]]
    recent = scopes[20:30]
    with store.pg() as con:
        # three scopes fail on purpose: their node updates raise inside the apply transaction
        con.execute(
            "CREATE FUNCTION fail_on_purpose() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.scope_path = ANY(%s) THEN RAISE EXCEPTION 'simulated fault in %%', NEW.scope_path; END IF; "
            "RETURN NEW; END $$" % ("ARRAY[" + ", ".join("'" + s.path.replace("\x1f", "' || chr(31) || '") + "'" for s in failing) + "]"))
        con.execute("CREATE TRIGGER fail_on_purpose BEFORE UPDATE ON memory_nodes FOR EACH ROW EXECUTE FUNCTION fail_on_purpose()")
        # ten scopes were consolidated an hour ago: gated
        for s in recent:
            con.execute("INSERT INTO consolidation_runs (run_id, scope_path, mode, as_of, started_at, status) "
                        "VALUES (gen_random_uuid(), %s, 'nightly', %s, %s, 'applied')", (s.path, NOW, NOW))
        con.commit()
    params = NightlyParameters(as_of=NOW, dsn=store.dsn, runs_dir=str(tmp_path / "runs"), max_workers=4,
                               apply_concurrency=2, data_quality=True)
    summary = run_nightly(params)
    assert summary["scopes"] == 200
    assert summary["due"] == 190 and summary["skipped"] == 10
    assert summary["failed"] == 3 and summary["applied"] == 187
    failed = {r["scope"] for r in summary["rows"] if r["status"] == "failed"}
    assert failed == {s.display() for s in failing}
    assert all("simulated fault" in r["reason"] for r in summary["rows"] if r["status"] == "failed")
    assert all(r["reason"].startswith("gated:") for r in summary["rows"] if r["status"] == "skipped")
    with store.pg() as con:
        applied = con.execute("SELECT count(DISTINCT scope_path) FROM consolidation_runs WHERE status = 'applied' "
                              "AND as_of = %s AND started_at > %s", (NOW, NOW)).fetchone()[0]
        assert applied == 187
        assert con.execute("SELECT count(*) FROM consolidation_runs WHERE scope_path = ANY(%s) AND status = 'applied'",
                           ([s.path for s in failing],)).fetchone()[0] == 0
    assert summary["data_quality"] is not None and os.path.exists(summary["data_quality"]["data_docs_path"])
    with store.pg() as con:  # the suite's results are kept with the night
        assert con.execute("SELECT success, results_path FROM data_quality_runs WHERE nightly_run_id = %s",
                           (summary["night_id"],)).fetchall() == [(True, summary["data_quality"]["results_path"])]

    # right after: nothing is due (the failed scopes are still due: they never applied); a night that
    # applied nothing does not run the data-quality suite
    again = run_nightly(params.model_copy(update={"as_of": NOW + timedelta(minutes=5)}))
    assert again["due"] == 3 and again["skipped"] == 197 and again["failed"] == 3
    assert again["data_quality"] is None
    with store.pg() as con:
        con.execute("DROP TRIGGER fail_on_purpose ON memory_nodes")
        con.commit()
    third = run_nightly(params.model_copy(update={"as_of": NOW + timedelta(minutes=10), "data_quality": False}))
    assert third["due"] == 3 and third["applied"] == 3
    fourth = run_nightly(params.model_copy(update={"as_of": NOW + timedelta(minutes=15), "data_quality": False}))
    assert fourth["due"] == 0 and fourth["skipped"] == 200


def _night_in_workers(store, tmp_path, prefix: str, call=None, **options) -> dict:
    """Four seeded scopes through run_nightly (or ``call``: the flow itself, as a deployment's run calls
    it) with ``options``; checks what every worker-process runner must give: all applied (and in the
    ledger), planned outside this process."""
    from deep_sleep.flows.nightly import NightlyParameters, run_nightly

    from tests.storeutil import small_graph

    tag = uuid.uuid4().hex[:8]
    scopes = [Scope.root("org", f"{prefix}{tag}").child("brand", f"b{i}") for i in range(4)]
    for s in scopes:
        small_graph(store, s, NOW)
    summary = (call or run_nightly)(NightlyParameters(
        as_of=NOW, dsn=store.dsn, runs_dir=str(tmp_path / "runs"), scopes=[s.display() for s in scopes],
        data_quality=False, **options))
    assert summary["due"] == 4 and summary["applied"] == 4 and summary["failed"] == 0, summary["rows"]
    assert all(r["counters"] for r in summary["rows"])
    pids = {r["worker_pid"] for r in summary["rows"]}
    assert os.getpid() not in pids  # planned (and applied) in the worker processes, not here
    with store.pg() as con:
        assert con.execute("SELECT count(*) FROM consolidation_runs WHERE scope_path = ANY(%s) AND status = 'applied'",
                           ([s.path for s in scopes],)).fetchone()[0] == 4
    return summary


@pytest.mark.flow
def test_nightly_on_a_local_dask_cluster_with_two_worker_processes(prefect_harness, store, tmp_path, monkeypatch):
    """The same flow, distributed: tasks run in two Dask worker processes."""
    monkeypatch.setenv("DASK_TEMPORARY_DIRECTORY", str(tmp_path / "dask"))
    _night_in_workers(store, tmp_path, "dask", task_runner="dask", dask_workers=2)


@pytest.mark.flow
def test_nightly_in_two_worker_processes(prefect_harness, store, tmp_path, monkeypatch):
    """task_runner="auto" on a night big enough (here: the threshold lowered to its 4 scopes): the
    shards run in Prefect's process pool (no shared GIL), and every scope of every shard is applied
    and in the ledger — with the flow called itself, as a deployment's run calls it (not through
    run_nightly), so the flow, not its caller, picks the runner.  (An explicit "processes" runs in
    test_deployments' served deployment.)"""
    from deep_sleep.flows import nightly

    monkeypatch.setattr(nightly, "AUTO_PROCESSES_ROWS", 1)
    summary = _night_in_workers(store, tmp_path, "proc", call=nightly.deep_sleep_nightly, max_workers=2, shard_scopes=2)
    assert summary["shards"] == 2 and summary["task_runner"] == "processes"


def test_auto_runs_processes_only_for_a_big_night_that_can_run_two_shards_at_once():
    from deep_sleep.flows.nightly import AUTO_PROCESSES_ROWS as BIG
    from deep_sleep.flows.nightly import NightlyParameters, runner_kind

    auto = NightlyParameters()
    assert auto.task_runner == "auto" and auto.max_workers == 2
    assert runner_kind(auto, shards=74, rows=37_000_000) == "processes"
    assert runner_kind(auto, shards=2, rows=BIG) == "processes"
    assert runner_kind(auto, shards=2, rows=BIG - 1) == "threads"  # small night: workers' start not worth it
    assert runner_kind(auto, shards=1, rows=BIG * 5) == "threads"  # one shard: nothing runs beside it
    assert runner_kind(auto.model_copy(update={"max_workers": 1}), shards=74, rows=BIG * 37) == "threads"
    for kind in ("threads", "processes", "dask"):  # an explicit choice is kept, whatever the night
        assert runner_kind(auto.model_copy(update={"task_runner": kind}), shards=1, rows=0) == kind
        assert runner_kind(auto.model_copy(update={"task_runner": kind}), shards=74, rows=BIG * 37) == kind


def _lock_timeout(store, table: str) -> None:
    """Raise a real lock timeout: another connection holds the row's lock."""
    with store.pg() as holder, store.pg() as waiter:
        holder.execute(f"SELECT v FROM {table} WHERE id = 1 FOR UPDATE")
        waiter.execute("SET lock_timeout = '50ms'")
        waiter.execute(f"UPDATE {table} SET v = 1 WHERE id = 1")


def _duplicate(store, table: str) -> None:
    with store.pg() as con:
        con.execute(f"INSERT INTO {table} VALUES (1, 1)")


@pytest.mark.flow
def test_tasks_retry_transient_errors_only(prefect_harness, store):
    """The nightly's retry condition on real task runs: a lock timeout is retried (and the retry
    succeeds), a unique violation, one of our input errors and a ValueError fail at once."""
    from deep_sleep.flows.nightly import _retry_transient
    from prefect import flow, task

    from deep_sleep.core.errors import InputError
    from deep_sleep.core.scope import Scope

    table = f"probe_{uuid.uuid4().hex[:10]}"
    with store.pg(autocommit=True) as con:
        con.execute(f"CREATE TABLE {table} (id int PRIMARY KEY, v int)")
        con.execute(f"INSERT INTO {table} VALUES (1, 0)")
    failures = {"lock timeout": lambda: _lock_timeout(store, table), "unique violation": lambda: _duplicate(store, table),
                "scope error": lambda: Scope.parse("org"), "input error": lambda: (_ for _ in ()).throw(InputError("bad")),
                "value error": lambda: int("x")}
    attempts: dict[str, int] = {}

    @task(retries=2, retry_delay_seconds=0, retry_condition_fn=_retry_transient)
    def flaky(kind: str) -> str:
        attempts[kind] = attempts.get(kind, 0) + 1
        if attempts[kind] == 1:
            failures[kind]()
        return "ok"

    @flow
    def night() -> dict[str, str]:
        out = {}
        for kind in failures:
            state = flaky(kind, return_state=True)
            out[kind] = "ok" if state.is_completed() else type(_error(state)).__name__
        return out

    try:
        outcome = night()
    finally:
        with store.pg(autocommit=True) as con:
            con.execute(f"DROP TABLE {table}")
    assert outcome == {"lock timeout": "ok", "unique violation": "UniqueViolation", "scope error": "ScopeError",
                       "input error": "InputError", "value error": "ValueError"}
    assert attempts == {"lock timeout": 2, "unique violation": 1, "scope error": 1, "input error": 1, "value error": 1}


def _error(state) -> BaseException:
    try:
        state.result()
    except BaseException as exc:  # noqa: BLE001 - the error is the result
        return exc
    raise AssertionError("the state holds no error")


@pytest.fixture
def gated_store(admin_dsn):
    """Three scopes consolidated an hour before NOW (nothing due), one of them with a conflict-rate alert."""
    import json

    from tests.storeutil import small_graph

    name = f"ds_gated_{uuid.uuid4().hex[:8]}"
    store = create_database(admin_dsn, name)
    scopes = [Scope.root("org", "gated").child("agent", str(i)) for i in range(3)]
    for i, s in enumerate(scopes):
        small_graph(store, s, NOW - timedelta(hours=3))
        with store.pg() as con:
            con.execute("INSERT INTO consolidation_runs (run_id, scope_path, mode, as_of, started_at, status, rows_changed, "
                        "conflicts) VALUES (gen_random_uuid(), %s, 'nightly', %s, %s, 'applied', %s, %s)",
                        (s.path, NOW - timedelta(hours=1), NOW - timedelta(hours=1),
                         json.dumps({"memory_nodes": {"updates": 5}}), 50 if i == 2 else 0))
            con.commit()
    yield store, scopes
    drop_database(admin_dsn, name)


@pytest.mark.flow
def test_a_quiet_night_reports_what_the_flow_reports(prefect_harness, gated_store, tmp_path, monkeypatch, capsys):
    """A night with no due scope: deep_sleep.jobs.night.quiet_night (no Prefect) gives the flow's very
    summary — rows, counts, health alerts — and the CLI runs the flow when a Prefect server is configured
    (here the test harness's): every night is on the server's UI then."""
    from deep_sleep.cli import main
    from deep_sleep.flows.nightly import NightlyParameters, run_nightly
    from deep_sleep.jobs import night
    from deep_sleep.transforms.config import load_config

    store, scopes = gated_store
    params = NightlyParameters(as_of=NOW, dsn=store.dsn, runs_dir=str(tmp_path / "runs"), data_quality=True)
    flow = run_nightly(params)
    quiet = night.quiet_night(params, load_config(), store, night.considered_scopes(store, NOW, load_config().gating))
    assert flow["due"] == 0 and flow["skipped"] == 3 and flow["data_quality"] is None
    assert [a["check"] for a in flow["health"]] == ["conflict_rate"]
    own = ("night_id", "table", "seconds")  # each night's own id, time, and per-scope table in its own directory
    assert {k: v for k, v in quiet.items() if k not in own} == {k: v for k, v in flow.items() if k not in own}
    assert quiet["table"] != flow["table"] and all(os.path.exists(s["table"]) for s in (quiet, flow))

    def no_quiet(*_a, **_k):
        raise AssertionError("a quiet night with a Prefect server configured")

    monkeypatch.setattr(night, "quiet_night", no_quiet)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)  # the harness sets it in Prefect's settings only
    monkeypatch.delenv("DEEP_SLEEP_DSN", raising=False)
    assert main(["--dsn", store.dsn, "nightly", "--as-of", NOW.isoformat(), "--runs-dir", str(tmp_path / "cli")]) == 1
    # (exit 1: the conflict-rate alert)
    out = capsys.readouterr().out
    assert "3 scopes: 0 due, 0 applied, 0 failed, 3 skipped" in out and "conflict_rate" in out
