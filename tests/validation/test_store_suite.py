"""The store's data-quality suite (great-expectations over PostgreSQL, SPEC §4) on a real database.

The suite checks whole tables, so it runs on a database of its own (created from ``admin_dsn``):
rows other tests leave in the shared ``store`` — some deliberately broken — cannot make it flaky.
The suite runs twice: on a clean store (must pass), then after one bad row per invariant has
been added (each must fail its own expectation, and only those may fail, with the row's id
among the examples).  GX is imported once; both runs together take a few seconds.
"""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import psycopg
import pytest

from deep_sleep.store.db import ensure_database, migrate, with_database

SEP = "\x1f"


def _scope(tenant: str) -> tuple[str, str]:
    return SEP.join(["org", tenant, "brand", "b1"]), tenant


def _uid() -> str:
    return str(uuid.uuid4())


def _node(con, scope: tuple[str | None, str], *, label: str = "topic: x", importance: float | str = 5.0,
          properties: str = '{"k": 1}', version: int = 1) -> str:
    nid = _uid()
    con.execute(
        "INSERT INTO memory_nodes (id, scope_path, tenant_id, label, properties, importance, version) "
        "VALUES (%s, %s, %s, %s, %s::jsonb, %s::float8, %s)",
        (nid, scope[0], scope[1], label, properties, str(importance), version),
    )
    return nid


def _edge(con, scope: tuple[str | None, str], source: str, target: str, *, weight: float | str = 1.0,
          relation: str = "RELATED_TO") -> str:
    eid = _uid()
    con.execute(
        "INSERT INTO memory_edges (id, scope_path, tenant_id, source_id, target_id, relation, weight) "
        "VALUES (%s, %s, %s, %s, %s, %s, %s::float8)",
        (eid, scope[0], scope[1], source, target, relation, str(weight)),
    )
    return eid


def _skill(con, scope: tuple[str, str], *, status: str, source: str) -> str:
    sid = _uid()
    con.execute(
        "INSERT INTO procedural_skills (id, scope_path, tenant_id, name, status, source) VALUES (%s, %s, %s, %s, %s, %s)",
        (sid, scope[0], scope[1], f"skill {sid[:8]}", status, source),
    )
    return sid


def _event(con, scope: tuple[str | None, str], *, metadata: str = "{}") -> str:
    eid = _uid()
    con.execute(
        "INSERT INTO episodic_events (id, scope_path, tenant_id, content, metadata) VALUES (%s, %s, %s, 'said hi', %s::jsonb)",
        (eid, scope[0], scope[1], metadata),
    )
    return eid


@pytest.fixture(scope="module")
def suite_db(admin_dsn: str):
    """A migrated database of our own holding a small, clean store; dropped afterwards."""
    name = f"ds_gxsuite_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    ensure_database(admin_dsn, name)
    dsn = with_database(admin_dsn, name)
    migrate(dsn)
    a, b, legacy = _scope("ta"), _scope("tb"), (None, "tlegacy")
    with psycopg.connect(dsn, autocommit=True) as con:
        n1 = _node(con, a, label="project: one", importance=1.0)
        n2 = _node(con, a, label="project: two", importance=10.0, properties="{}")
        n3 = _node(con, a, label="SOUL:name", importance=5.5, properties='{"value": "Ada", "nested": [1, 2]}')
        _node(con, b, label="project: other tenant")
        l1 = _node(con, legacy, label="legacy one")
        l2 = _node(con, legacy, label="legacy two")
        _edge(con, a, n1, n2, weight=0.0)
        _edge(con, a, n2, n3, weight=2.5, relation="is")
        _edge(con, legacy, l1, l2)
        _event(con, a, metadata='{"action_type": "deploy"}')
        _event(con, legacy)
        _skill(con, a, status="active", source="agent")
        _skill(con, a, status="draft", source="consolidation")
        _skill(con, a, status="archived", source="consolidation")
        con.execute("INSERT INTO memory_access_log (scope_path, tenant_id, node_id) VALUES (%s, %s, %s)", (a[0], a[1], n1))
        con.execute("INSERT INTO soul_profiles (id, scope_path, tenant_id, key, value) VALUES (%s, %s, %s, 'name', 'Ada')",
                    (_uid(), a[0], a[1]))
        con.execute("INSERT INTO prospective_triggers (id, scope_path, tenant_id, condition, action) "
                    "VALUES (%s, %s, %s, 'tomorrow', 'remind')", (_uid(), a[0], a[1]))
        con.execute("INSERT INTO consolidation_runs (run_id, scope_path, mode, as_of, started_at, status) "
                    "VALUES (%s, %s, 'nightly', now(), now(), 'applied')", (_uid(), a[0]))
    yield dsn
    with psycopg.connect(admin_dsn, autocommit=True) as con:
        con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def clean_run(suite_db, tmp_path_factory):
    from deep_sleep.validation.store_suite import run_store_suite

    return run_store_suite(suite_db, tmp_path_factory.mktemp("suite_clean"), run_id="clean")


@pytest.fixture(scope="module")
def broken(suite_db, clean_run):
    """Add one offending row per invariant (after the clean run); return case -> (table, check, id)."""
    c, a = _scope("tc"), _scope("ta")
    cases: dict[str, tuple[str, str, str]] = {}
    with psycopg.connect(suite_db, autocommit=True) as con:
        x, y = _node(con, c, label="ok x"), _node(con, c, label="ok y")
        foreign = con.execute("SELECT id::text FROM memory_nodes WHERE scope_path = %s LIMIT 1", (a[0],)).fetchone()[0]
        cases["importance 11"] = ("memory_nodes", "importance_in_range", _node(con, c, importance=11.0))
        nan = _node(con, c, importance="NaN")
        cases["NaN importance (range)"] = ("memory_nodes", "importance_in_range", nan)
        cases["NaN importance (finite)"] = ("memory_nodes", "importance_finite", nan)
        cases["negative weight"] = ("memory_edges", "weight_non_negative", _edge(con, c, x, y, weight=-0.5))
        # NaN >= 0 is true in PostgreSQL: only the finiteness check catches it.
        cases["NaN weight"] = ("memory_edges", "weight_finite", _edge(con, c, y, x, weight="NaN"))
        cases["dangling edge"] = ("memory_edges", "no_dangling_edges", _edge(con, c, x, _uid(), relation="is"))
        cases["edge into another scope"] = ("memory_edges", "no_dangling_edges", _edge(con, c, x, foreign, relation="prefers"))
        cases["version 0"] = ("memory_nodes", "version_positive", _node(con, c, version=0))
        cases["active consolidation skill"] = (
            "procedural_skills", "no_active_consolidation_skill", _skill(con, c, status="active", source="consolidation"))
        cases["empty label"] = ("memory_nodes", "label_not_empty", _node(con, c, label=""))
        cases["blank label"] = ("memory_nodes", "label_not_empty", _node(con, c, label=" \t "))
        cases["properties array"] = ("memory_nodes", "properties_is_object", _node(con, c, properties="[1, 2]"))
        cases["unscoped row"] = ("episodic_events", "rows_scoped", _event(con, (None, "")))
        cases["tenant not the scope root"] = ("memory_nodes", "scope_path_consistent", _node(con, (c[0], "ta")))
        cases["malformed scope_path"] = (
            "memory_nodes", "scope_path_consistent", _node(con, (SEP.join(["org", "tc", "brand"]), "tc")))
    return cases


@pytest.fixture(scope="module")
def broken_run(suite_db, broken, tmp_path_factory):
    from deep_sleep.validation.store_suite import run_store_suite

    return run_store_suite(suite_db, tmp_path_factory.mktemp("suite_broken"), run_id="broken")


def _result(run, table: str, check: str) -> dict:
    found = [r for r in run.results if r["table"] == table and r["expectation"] == check]
    assert len(found) == 1, f"{table}.{check}: {found}"
    return found[0]


def test_clean_store_passes(clean_run):
    failed = [(r["table"], r["expectation"], r["error"], r["examples"]) for r in clean_run.results if not r["success"]]
    assert clean_run.success, failed
    assert all(r["unexpected_count"] == 0 and r["examples"] == [] and r["error"] is None for r in clean_run.results)
    checks = {(r["table"], r["expectation"]) for r in clean_run.results}
    for expected in [
        ("memory_nodes", "importance_in_range"), ("memory_nodes", "importance_finite"),
        ("memory_nodes", "label_not_empty"), ("memory_nodes", "properties_is_object"),
        ("memory_edges", "weight_non_negative"), ("memory_edges", "weight_finite"),
        ("memory_edges", "no_dangling_edges"), ("memory_edges", "properties_is_object"),
        ("procedural_skills", "no_active_consolidation_skill"),
        # every table with the columns, whatever migrations added them
        *[(t, "rows_scoped") for t in ("memory_nodes", "memory_edges", "episodic_events", "memory_access_log",
                                       "procedural_skills", "soul_profiles", "consolidation_runs")],
        *[(t, "version_positive") for t in ("memory_nodes", "memory_edges", "episodic_events",
                                            "procedural_skills", "prospective_triggers", "recall_events")],
    ]:
        assert expected in checks, expected


def test_results_json_and_data_docs(clean_run, broken_run):
    for run in (clean_run, broken_run):
        payload = json.loads(Path(run.json_path).read_text())
        assert Path(run.json_path).name == "results.json"
        assert payload["success"] is run.success
        assert payload["results"] == run.results
        assert run.data_docs_path and Path(run.data_docs_path).name == "index.html"
        index = Path(run.data_docs_path)
        assert index.is_file() and index.parent.name == "data_docs"
        assert "memory_nodes.sql" in index.read_text()
        assert payload["data_docs_path"] == run.data_docs_path
    pages = list(Path(broken_run.data_docs_path).parent.glob("validations/**/*.html"))
    assert pages, "no validation result pages"
    assert any("importance" in p.read_text() for p in pages)


def test_each_broken_invariant_fails_its_expectation(broken_run, broken):
    expected = {(table, check) for table, check, _ in broken.values()}
    failed = {(r["table"], r["expectation"]) for r in broken_run.results if not r["success"]}
    assert not broken_run.success
    assert failed == expected  # and nothing else: every other check still passes
    assert all(r["error"] is None for r in broken_run.results), [r["error"] for r in broken_run.results if r["error"]]
    for case, (table, check, row_id) in broken.items():
        r = _result(broken_run, table, check)
        ids = [e["id"] for e in r["examples"]]
        assert row_id in ids, f"{case}: {row_id} not in {r['examples']}"
        assert 1 <= len(r["examples"]) <= 5
    counts = {}
    for table, check, _ in broken.values():
        counts[(table, check)] = counts.get((table, check), 0) + 1
    for (table, check), n in counts.items():
        assert _result(broken_run, table, check)["unexpected_count"] == n, (table, check)


def test_examples_say_what_is_wrong(broken_run, broken):
    nan = _result(broken_run, "memory_nodes", "importance_finite")["examples"]
    assert nan == [{"id": broken["NaN importance (finite)"][2], "importance": "NaN"}]
    in_range = {e["id"]: e["importance"] for e in _result(broken_run, "memory_nodes", "importance_in_range")["examples"]}
    assert in_range[broken["importance 11"][2]] == 11.0
    dangling = {e["id"]: e["problem"] for e in _result(broken_run, "memory_edges", "no_dangling_edges")["examples"]}
    assert dangling[broken["dangling edge"][2]] == "target missing"
    assert dangling[broken["edge into another scope"][2]].startswith("target in scope org\x1fta")
    json_types = {e["id"]: e["json_type"] for e in _result(broken_run, "memory_nodes", "properties_is_object")["examples"]}
    assert json_types == {broken["properties array"][2]: "array"}
    problems = {e["id"]: e["problem"] for e in _result(broken_run, "memory_nodes", "scope_path_consistent")["examples"]}
    assert problems[broken["malformed scope_path"][2]] == "malformed scope_path"
    assert problems[broken["tenant not the scope root"][2]].startswith("tenant_id is not the scope root id")


def test_sqlalchemy_url_keeps_the_unix_socket():
    from deep_sleep.validation.store_suite import sqlalchemy_url

    assert sqlalchemy_url("postgresql://postgres:@/db?host=/abs/sock") == "postgresql+psycopg://postgres:@/db?host=/abs/sock"
    assert sqlalchemy_url("postgres://u:p@h:5433/db") == "postgresql+psycopg://u:p@h:5433/db"
    assert sqlalchemy_url("postgresql+psycopg://u@h/db") == "postgresql+psycopg://u@h/db"
    url = sqlalchemy_url("host=/abs/sock dbname=db user=postgres")
    assert url.startswith("postgresql+psycopg://postgres@/db?") and "host=%2Fabs%2Fsock" in url


def test_suite_connections_get_their_work_mem(suite_db, monkeypatch, tmp_path):
    """The suite's engine connects with ``work_mem`` 256MB (its dangling-edge hash join spills at
    4MB) or ``DEEP_SLEEP_SUITE_WORK_MEM``; a malformed value stops the suite before any query."""
    from deep_sleep.core.errors import ConfigError
    from deep_sleep.validation.store_suite import run_store_suite, suite_connect_args

    def shown() -> str:
        with psycopg.connect(suite_db, **suite_connect_args()) as con:
            return con.execute("SHOW work_mem").fetchone()[0]

    monkeypatch.delenv("DEEP_SLEEP_SUITE_WORK_MEM", raising=False)
    assert shown() == "256MB"
    monkeypatch.setenv("DEEP_SLEEP_SUITE_WORK_MEM", "64 MB")
    assert shown() == "64MB"
    monkeypatch.setenv("DEEP_SLEEP_SUITE_WORK_MEM", "lots")
    with pytest.raises(ConfigError, match="DEEP_SLEEP_SUITE_WORK_MEM='lots'"):
        run_store_suite(suite_db, tmp_path / "never")
    assert not (tmp_path / "never").exists()


def test_great_expectations_is_imported_only_when_the_suite_runs():
    """Importing the suite's module or the nightly flow costs nothing of great-expectations (~3.6 s):
    only running the suite imports it."""
    import subprocess
    import sys

    probe = ("import sys, deep_sleep.flows.nightly, deep_sleep.validation.store_suite; "
             "print('great_expectations' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.split() == ["False"], done.stderr
