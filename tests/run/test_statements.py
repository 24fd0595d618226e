"""The apply's statement list, read without a database: golden SQL files, purity, ``replay --explain``.

``tests/run/golden_sql/<case>.sql`` holds :func:`deep_sleep.run.statements.explain` of one
representative diff.  When the generated SQL changes on purpose, regenerate them and review the
change in the diff::

    DEEP_SLEEP_REGEN_GOLDEN=1 .venv/bin/python -m pytest -q tests/run/test_statements.py
"""

from __future__ import annotations

import os
import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from deep_sleep.cli import main
from deep_sleep.core import tables
from deep_sleep.core.diff import Diff
from deep_sleep.core.errors import ConfigError, InputError
from deep_sleep.run.transform import as_shard_diff
from deep_sleep.run.statements import SOURCES, Rows, Statement, explain
from deep_sleep.run.statements import statements as build
from tests.flows.test_replay import _hand_written_snapshot

GOLDEN = Path(__file__).parent / "golden_sql"
REGEN = os.environ.get("DEEP_SLEEP_REGEN_GOLDEN") == "1"
SCOPE = "org\x1fgolden\x1fbrand\x1fb1"
RUN_ID = "00000000-0000-4000-8000-000000000001"
AT = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


def statements(diff: Diff, scope: str, run_id: str, **kw) -> tuple[Statement, ...]:
    """The statement list of one scope's diff (a batch of one scope)."""
    return build(as_shard_diff(diff, scope), {scope: run_id}, **kw).statements


def _id(*key: object) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, "/".join(map(str, key))))


def _ids(table: str, n: int, start: int = 0, scope: str = SCOPE) -> list[str]:
    """Ids fixed per scope (the golden files) and distinct between scopes (tests on the store)."""
    return [_id(scope, table, i) for i in range(start, start + n)]


def _updates(table: str, ids: list[str], **values: list) -> pl.DataFrame:
    cols = tables.columns(table)
    return pl.DataFrame({"id": ids, "version": [1] * len(ids), **values},
                        schema_overrides={c: cols[c].dtype for c in values})


def _deletes(ids: list[str]) -> pl.DataFrame:
    return pl.DataFrame({"id": ids, "version": [1] * len(ids)})


def _inserts(table: str, ids: list[str], scope: str = SCOPE, **values) -> pl.DataFrame:
    """Whole new rows: every column of the table, ``values`` over the defaults below."""
    n = len(ids)
    base = {"id": ids, "scope_path": [scope] * n, "tenant_id": ["golden"] * n, "created_at": [AT] * n,
            "updated_at": [AT] * n, "version": [1] * n}
    cols = tables.columns(table)
    data = {c: values.get(c, base.get(c, [None] * n)) for c in cols}
    return pl.DataFrame(data, schema={c: cols[c].dtype for c in cols})


def small_diff(scope: str = SCOPE) -> Diff:
    """A quick nap's size: every kind over nodes, edges, events, soul and pending connections.
    (``tests/run/test_apply.py`` seeds the rows it names and applies it to the store.)"""
    nodes, edges = _ids("node", 4, scope=scope), _ids("edge", 3, scope=scope)
    return Diff.combine([
        Diff.of("memory_nodes", "working_ttl", deletes=_deletes(nodes[:1]), reason="working memory expired"),
        Diff.of("memory_edges", "working_ttl", deletes=_deletes(edges[:1]), reason="node expired"),
        Diff.of("memory_nodes", "strengthen", updates=_updates("memory_nodes", nodes[1:3], importance=[5.5, 6.0])),
        Diff.of("memory_nodes", "decay_importance",
                updates=_updates("memory_nodes", nodes[2:4], importance=[5.4, 4.2], last_decayed_at=[AT, AT])),
        Diff.of("memory_edges", "cooccurrence", inserts=_inserts(
            "memory_edges", edges[1:], scope, source_id=nodes[1:3], target_id=nodes[2:4], relation=["CO_OCCURS"] * 2,
            weight=[1.0, 2.0], properties=["{}"] * 2)),
        Diff.of("episodic_events", "episodic_summary", updates=_updates(
            "episodic_events", _ids("event", 2, scope=scope), metadata=['{"summarised": true}'] * 2)),
        Diff.of("soul_profiles", "soul_corrections", inserts=_inserts(
            "soul_profiles", _ids("soul", 1, scope=scope), scope, key=["tone"], value=["brief"])),
        Diff.of("soul_profiles", "soul_corrections",
                updates=_updates("soul_profiles", _ids("soul", 1, start=1, scope=scope), value=["formal"])),
        Diff.of("pending_connections", "pending_edges", updates=_updates(
            "pending_connections", _ids("pending", 2, scope=scope), consumed_by_run=[RUN_ID] * 2,
            outcome=["created", "rejected"])),
        Diff.of("pending_connections", "pending_edges", deletes=_deletes(_ids("pending", 1, start=2, scope=scope)),
                reason="stale pending connection"),
    ])


def staged_diff() -> Diff:
    """Past the inline limit, below the work_mem one: a table > 2,000 rows by COPY, the rest by JSON."""
    nodes = _ids("node", 2_100)
    return Diff.combine([
        Diff.of("memory_nodes", "prune_orphans", deletes=_deletes(_ids("orphan", 2)), reason="orphan below importance 4"),
        Diff.of("memory_edges", "prune_orphans", deletes=_deletes(_ids("edge", 3)), reason="incident to a pruned node"),
        Diff.of("memory_nodes", "decay_importance", updates=_updates(
            "memory_nodes", nodes, importance=[4.5] * len(nodes), last_decayed_at=[AT] * len(nodes))),
        Diff.of("prospective_triggers", "working_ttl", updates=_updates(
            "prospective_triggers", _ids("trigger", 2), status=["expired"] * 2)),
        Diff.of("pending_connections", "pending_edges", inserts=_inserts(
            "pending_connections", _ids("pending", 2), source_label=["a", "b"], target_label=["c", "d"],
            relation=["RELATED_TO"] * 2, weight=[0.5, 0.7])),
    ])


def big_diff() -> Diff:
    """A nightly's size (≥ 10,000 rows): ``work_mem`` raised, edge deletes kept with skipped node deletes."""
    nodes = _ids("node", 10_000)
    at = [AT - timedelta(days=1)] * len(nodes)
    return Diff.combine([
        Diff.of("memory_nodes", "decay_importance", updates=_updates(
            "memory_nodes", nodes, importance=[4.5] * len(nodes), last_decayed_at=at)),
        Diff.of("memory_nodes", "working_ttl", deletes=_deletes(_ids("expired", 5)), reason="working memory expired"),
        Diff.of("memory_edges", "working_ttl", deletes=_deletes(_ids("edge", 5)), reason="node expired"),
        Diff.of("episodic_events", "episodic_summary", inserts=_inserts(
            "episodic_events", _ids("summary", 3), session_id=["s1"] * 3, content=["summary"] * 3,
            metadata=["{}"] * 3)),
    ])


def quarantine() -> pl.DataFrame:
    return pl.DataFrame({"table": ["memory_nodes"], "id": [_id("bad", 0)], "reason": ["importance is NaN"],
                         "row": ['{"importance": "NaN"}'], "scope_path": [SCOPE]})


CASES = {
    "empty": lambda: statements(Diff.empty(), SCOPE, RUN_ID),
    "small_inline": lambda: statements(small_diff(), SCOPE, RUN_ID),
    "small_inline_quarantine": lambda: statements(small_diff(), SCOPE, RUN_ID, quarantined=quarantine()),
    "staged": lambda: statements(staged_diff(), SCOPE, RUN_ID),
    "big_staged_work_mem": lambda: statements(big_diff(), SCOPE, RUN_ID, work_mem="1GB"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_golden_sql(case: str):
    got = f"-- golden case {case}: tests/run/test_statements.py (regenerate: DEEP_SLEEP_REGEN_GOLDEN=1)\n\n"
    got += explain(CASES[case]())
    path = GOLDEN / f"{case}.sql"
    if REGEN:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(got)
    assert path.exists(), f"{path} is missing: run with DEEP_SLEEP_REGEN_GOLDEN=1 and review the new file"
    assert got == path.read_text(), (
        f"the SQL of case {case} changed; if on purpose, regenerate with DEEP_SLEEP_REGEN_GOLDEN=1 and review the diff")


def test_no_golden_file_without_a_case():
    assert sorted(p.stem for p in GOLDEN.glob("*.sql")) == sorted(CASES)


def test_data_sources_follow_the_row_counts():
    def shape(stmts):
        return [(s.step, s.table, s.kind, s.source, s.rows) for s in stmts]

    small = statements(small_diff(), SCOPE, RUN_ID)
    assert {s.source for s in small if s.is_write} == {"inline_json"}
    assert [s.step for s in small][:1] == ["lock"] and not any(s.step == "stage" for s in small)
    staged = statements(staged_diff(), SCOPE, RUN_ID)
    stages = {(s.table, s.kind): s.source for s in staged if s.step == "stage"}
    assert stages == {("memory_nodes", "updates"): "adbc_copy", ("memory_nodes", "deletes"): "json_temp_table",
                      ("memory_edges", "deletes"): "json_temp_table",
                      ("prospective_triggers", "updates"): "json_temp_table",
                      ("pending_connections", "inserts"): "json_temp_table"}
    assert {s.source for s in staged if s.is_write} == {"staged_table"}
    assert not any(s.step == "work_mem" for s in staged)
    big = statements(big_diff(), SCOPE, RUN_ID)
    assert [s.step for s in big][:3] == ["discard_temp", "work_mem", "lock"]
    assert "'256MB'" in big[1].sql
    # forcing the staged path (small_rows=0) stages every table by COPY
    forced = statements(small_diff(), SCOPE, RUN_ID, small_rows=0)
    assert {s.source for s in forced if s.step == "stage"} == {"adbc_copy"}
    assert shape(w for w in forced if w.is_write) == [
        (s.step, s.table, s.kind, "staged_table", s.rows) for s in small if s.is_write]


def test_writes_run_deletes_then_updates_then_inserts_edges_before_nodes_and_fold_updates():
    """Edge deletes before node deletes: a node goes only once no edge touches it (issue 31)."""
    stmts = statements(small_diff(), SCOPE, RUN_ID)
    writes = [(s.step, s.table) for s in stmts if s.is_write]
    assert writes == [
        ("delete", "memory_edges"), ("delete", "memory_nodes"), ("delete", "pending_connections"),
        ("update", "memory_nodes"), ("update", "episodic_events"), ("update", "pending_connections"),
        ("update", "soul_profiles"), ("insert", "memory_edges"), ("insert", "soul_profiles")]
    node_updates = next(s for s in stmts if s.step == "update" and s.table == "memory_nodes")
    assert node_updates.rows == 3  # four phase rows over three ids: one write per row
    folded = node_updates.params[0].frame.sort("id")
    assert folded.columns == ["scope_path", "id", "expected_version", "importance", "last_decayed_at"]
    nodes = _ids("node", 4)  # the last non-null value of each column over the phases, the first version
    assert folded.filter(pl.col("id") == nodes[2]).select("importance", "expected_version").row(0) == (5.4, 1)
    assert folded.filter(pl.col("id") == nodes[1]).get_column("last_decayed_at").to_list() == [None]
    assert stmts[-1].step == "ledger" and stmts[-1].table == "consolidation_runs"


def test_every_parameter_a_statement_names_is_given():
    for case in CASES.values():
        for s in case():
            if s.sql is None or s.step == "ledger":
                continue
            named = {int(n) for n in re.findall(r"\$(\d+)", s.sql)}
            assert named == set(range(1, len(s.params) + 1)), (s.step, s.table, s.kind, s.sql)


def test_statements_are_pure_values():
    """Same input → an equal list, built with no connection; a changed value or scope changes it."""
    first, again = statements(small_diff(), SCOPE, RUN_ID), statements(small_diff(), SCOPE, RUN_ID)
    assert first == again
    assert all(isinstance(s, Statement) for s in first)
    with pytest.raises(AttributeError):
        first[0].sql = "DROP TABLE memory_nodes"  # frozen
    other = small_diff()
    changed = Diff.combine([other, Diff.of("memory_nodes", "strengthen",
                                           updates=_updates("memory_nodes", _ids("node", 1, start=1), importance=[9.0]))])
    assert statements(changed, SCOPE, RUN_ID) != first
    assert statements(small_diff(SCOPE + "\x1fother"), SCOPE + "\x1fother", RUN_ID) != first
    with pytest.raises(InputError, match="rows of scopes this batch does not apply"):  # a row never crosses scopes
        build(as_shard_diff(small_diff(), SCOPE), {SCOPE + "\x1fother": RUN_ID})
    assert Rows(pl.DataFrame({"a": [1]})) != Rows(pl.DataFrame({"a": [2]}))
    assert all(s.source in SOURCES for case in CASES.values() for s in case())


def test_a_bad_work_mem_fails_only_a_diff_big_enough_to_use_it():
    assert statements(small_diff(), SCOPE, RUN_ID, work_mem="lots")  # not read below 10k rows
    with pytest.raises(ConfigError, match="DEEP_SLEEP_APPLY_WORK_MEM='lots'"):
        statements(big_diff(), SCOPE, RUN_ID, work_mem="lots")


def test_replay_explain_prints_the_statements_and_touches_no_database(tmp_path, capsys):
    snap_dir = tmp_path / "snap"
    _hand_written_snapshot(snap_dir)
    out = tmp_path / "diff"
    # a DSN nothing listens on: any connection attempt would fail the command
    argv = ["--dsn", "postgresql://nobody@127.0.0.1:9/none", "replay", str(snap_dir),
            "--as-of", "2026-03-01T12:00:00Z", "--out", str(out), "--explain"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("-- the stages of a replay:\n--   1. transform")
    explained = printed[printed.index("-- the apply would run"):]
    assert "-- the apply would run 4 statement(s) in one transaction:" in explained
    assert "-- 1. lock\n" in explained
    assert "-- 2. delete memory_nodes.deletes: 1 row(s), inline JSON parameter\n" in explained
    assert "-- 3. update memory_nodes.updates: 1 row(s), inline JSON parameter\n" in explained
    assert "WITH done AS (UPDATE memory_nodes t SET importance = COALESCE(s.importance, t.importance)" in explained
    assert "-- 4. ledger consolidation_runs" in explained
    # the same statements as built from the diff directory directly
    from deep_sleep.core.report import ConsolidationReport

    report = ConsolidationReport.read(out)
    assert explained.endswith(explain(statements(Diff.read(out), report.scope_path, "<run id of the apply>")))


def test_replay_explain_with_compare_config_is_bad_input(tmp_path, capsys):
    argv = ["replay", str(tmp_path), "--as-of", "2026-03-01T12:00:00Z", "--out", str(tmp_path / "o"),
            "--explain", "--compare-config", "b.toml"]
    assert main(argv) == 2
    assert "--explain prints the statements of one diff" in capsys.readouterr().err


def test_one_scope_and_many_get_the_same_statements_but_for_the_scopes():
    """A single scope is a batch of one: its statements are those of a batch of many, with every row
    keyed by its own scope and one ledger row per scope; the ledger row carries the holds."""
    from deep_sleep.run.statements import LEDGER_SQL

    other = SCOPE.replace("golden", "golden2")
    one = statements(small_diff(), SCOPE, RUN_ID)
    both = build(Diff.combine([as_shard_diff(small_diff(), SCOPE), as_shard_diff(small_diff(other), other)]),
                 {SCOPE: RUN_ID, other: RUN_ID.replace("1", "2")})
    assert [(s.step, s.table, s.kind) for s in one] == [(s.step, s.table, s.kind) for s in both.statements]
    assert [s.rows * 2 for s in one if s.is_write] == [s.rows for s in both.statements if s.is_write]
    assert both.scopes == (SCOPE, other) and both.fed.get_column("scope_path").unique().sort().to_list() == [SCOPE, other]
    ledger = [s for s in one if s.step == "ledger"]
    assert [s.sql for s in ledger] == [LEDGER_SQL]
    assert all(f"x.{c}" in LEDGER_SQL for c in ("held", "hold_status", "approval_of"))


@pytest.mark.parametrize("paths", [["s1"] * 4, ["s1"], ["s1", "s2", "s1", "s2"], ["s1", "s2"]])
def test_one_scopes_inserts_have_the_signature_the_general_rule_gives(paths):
    """The rows of one scope take a shortcut to their one signature; it is the general rule's answer."""
    from deep_sleep.run.statements import _signatures, _signatures_plain

    n = len(paths)
    frame = pl.DataFrame({"id": [str(uuid.UUID(int=i)) for i in range(n)], "scope_path": paths,
                          "label": [f"l{i}" for i in range(n)], "importance": [None] * n,
                          "properties": [None if i % 2 else "{}" for i in range(n)]},
                         schema={"id": pl.String, "scope_path": pl.String, "label": pl.String, "importance": pl.Float64,
                                 "properties": pl.String})
    fast, fast_present = _signatures("memory_nodes", frame)
    plain, plain_present = _signatures_plain("memory_nodes", frame)
    assert fast.equals(plain) and fast.schema == plain.schema
    assert fast_present == plain_present
