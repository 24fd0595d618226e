"""The apply on the real store: a shard's diff applied in batches of scopes gives every scope exactly
the store rows, archive, quarantine and ledger row that the apply of that scope alone (a batch of one)
gives; the inline and staged data sources give the same rows; a scope whose apply raises is recorded
failed and the others apply; a live write survives and is counted as its own scope's conflict; a row
naming another scope's id changes nothing of that scope."""

from __future__ import annotations

import json
import os
import re
import uuid
from datetime import UTC, datetime, timedelta

import polars as pl
import pytest

from deep_sleep.core import tables
from deep_sleep.core.diff import Diff, TableDiff
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.dev.seed import SeedSpec, generate, load
from deep_sleep.core.errors import InputError
from deep_sleep.run.apply import apply
from deep_sleep.run.transform import as_shard_diff, transform
from deep_sleep.run.statements import statements
from deep_sleep.store.db import create_database, drop_database
from deep_sleep.store.extract import extract_shard
from deep_sleep.transforms.config import ConsolidationConfig
from tests.transforms.shard_cases import _rename
from tests.storeutil import insert, node, scalar

AS_OF = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
STARTED = datetime(2026, 11, 30, 3, 1, tzinfo=UTC)
# Columns the server fills with now(): they differ between two applies of the same diff.
CLOCK = {"finished_at", "archived_at", "quarantined_at"}


def _fleet_frames() -> dict[str, pl.DataFrame]:
    """Nested scopes (org/acme, org/acme/…, org/globex, …), the string-prefix sibling org/ac of org/acme,
    and in org/globex a node the quarantine sets aside (importance 42)."""
    now = AS_OF - timedelta(minutes=5)
    first = {t: f for t, f in generate(SeedSpec(tenants=2, scopes_per_tenant=2, nodes_per_scope=60, seed=31, now=now)).items()}
    second = generate(SeedSpec(tenants=1, scopes_per_tenant=0, nodes_per_scope=50, seed=32, now=now))
    second = _rename(second, "org\x1facme", "org\x1fac")
    frames = {t: pl.concat([first[t], second[t]], how="diagonal_relaxed") for t in first}
    bad = frames["memory_nodes"].filter(pl.col("scope_path") == "org\x1fglobex").head(1).with_columns(
        pl.lit(str(uuid.uuid4())).alias("id"), pl.lit(42.0).alias("importance"))
    frames["memory_nodes"] = pl.concat([frames["memory_nodes"], bad])
    assert frames["memory_nodes"].get_column("id").is_unique().all()
    return frames


def _scopes(frames) -> list[str]:
    return sorted(p for p in frames["memory_nodes"].get_column("scope_path").unique().to_list() if p is not None)


def _plan(store, scopes):
    planned = transform(extract_shard(store, scopes), ConsolidationConfig(), AS_OF)
    reports = {s: r.with_(run_id=str(uuid.uuid4())) for s, r in planned.reports.items()}
    return planned, reports


def _store_rows(store) -> dict[str, list[str]]:
    """Every row of every table of the store (consolidation tables without their clock columns), sorted."""
    out = {}
    with store.pg() as con:
        for table in (*tables.TABLES, "consolidation_archive", "consolidation_quarantine", "consolidation_runs"):
            drop = " - ".join(f"'{c}'" for c in sorted(CLOCK))
            out[table] = sorted(r[0] for r in con.execute(f"SELECT (to_jsonb(t) - {drop})::text FROM {table} t"))
    return out


@pytest.fixture
def twin_stores(admin_dsn):
    """Two databases holding the same fleet (the second cloned from the first), dropped afterwards."""
    names = [f"ds_shard_{os.getpid()}_{uuid.uuid4().hex[:6]}_{k}" for k in ("a", "b")]
    a = create_database(admin_dsn, names[0])
    frames = _fleet_frames()
    load(a, frames)
    b = create_database(admin_dsn, names[1], template=names[0])
    yield a, b, _scopes(frames)
    for name in names:
        drop_database(admin_dsn, name)


@pytest.mark.parametrize("batch_scopes", [500, 2], ids=["one-batch", "batches-of-two"])
def test_a_shard_applies_exactly_as_each_scope_alone(twin_stores, batch_scopes):
    alone_store, shard_store, scopes = twin_stores
    assert "org\x1fac" in scopes and "org\x1facme" in scopes and any(s.startswith("org\x1facme\x1f") for s in scopes)
    planned, reports = _plan(alone_store, scopes)
    # one scope carries the recall-quality gate's verdict: its ledger row records the recall figures
    gated = scopes[1]
    reports[gated] = reports[gated].with_(gate={"queries": 3, "recall_before": 0.75, "recall_after": 0.5,
                                                "drop_pp": 25.0, "failed": True})
    assert planned.diff.has_changes and planned.quarantined.height == 1
    assert _store_rows(alone_store) == _store_rows(shard_store)  # the twins start equal
    for s in scopes:  # each scope alone: a batch of one, its own diff as a run of it alone hands it over
        q = planned.quarantined.filter(pl.col("scope_path") == s)
        one = apply(alone_store, as_shard_diff(planned.scope_diff(s), s), {s: reports[s]}, started_at=STARTED,
                    quarantined=q if q.height else None)
        assert one[s].status == "applied" and one[s].batch == 0
    got = apply(shard_store, planned.diff, reports, started_at=STARTED, quarantined=planned.quarantined,
                      batch_scopes=batch_scopes)
    assert {s: g.status for s, g in got.items()} == dict.fromkeys(scopes, "applied")
    assert not any(g.retried for g in got.values())
    assert len({g.batch for g in got.values()}) == -(-len(scopes) // batch_scopes)
    alone, shard = _store_rows(alone_store), _store_rows(shard_store)
    archived = {json.loads(r)["table_name"] for r in alone["consolidation_archive"]}
    assert {"memory_nodes", "memory_edges"} <= archived  # the before-images of both kinds of delete are compared
    for table in alone:
        assert shard[table] == alone[table], table
    # the per-scope counts are each scope's (and the ledger says the same)
    ledger = {r[0]: (r[1], r[2]) for r in shard_store.pg().execute(
        "SELECT scope_path, rows_changed, conflicts FROM consolidation_runs WHERE status = 'applied'").fetchall()}
    assert {s: (g.applied, g.conflicts) for s, g in got.items()} == ledger
    recall = {r[0]: (r[1], r[2]) for r in shard_store.pg().execute(
        "SELECT scope_path, recall_before, recall_after FROM consolidation_runs").fetchall()}
    assert recall == {s: (0.75, 0.5) if s == gated else (None, None) for s in scopes}
    assert sum(n for g in got.values() for kinds in g.applied.values() for n in kinds.values()) > 100
    assert all(g.conflicts == 0 for g in got.values())  # no live writer: every row landed


def test_inline_and_staged_rows_give_the_same_store(twin_stores, monkeypatch):
    """A batch of at most SMALL_STAGE_ROWS rows feeds each write inline (a JSON parameter), a bigger one
    stages every table first; scope by scope on twin stores, both give the same store rows, archive,
    quarantine, ledger (a gate verdict included) and counts — with a live write the plan did not see
    counted as a conflict alike."""
    import deep_sleep.run.apply as apply_mod
    from deep_sleep.run.apply import batch_statements

    inline_store, staged_store, scopes = twin_stores
    planned, reports = _plan(inline_store, scopes)
    gated = "org\x1facme"
    reports[gated] = reports[gated].with_(gate={"queries": 2, "recall_before": 1.0, "recall_after": 0.5,
                                                "drop_pp": 50.0, "failed": True})
    target = planned.diff.table("memory_nodes").updates.filter(pl.col("scope_path") == gated).get_column("id")[0]
    for st in (inline_store, staged_store):
        with st.pg() as live:
            live.execute("UPDATE memory_nodes SET label = 'project: edited live' WHERE id = %s", (target,))
            live.commit()
    results = {}
    for s in scopes:
        d = as_shard_diff(planned.scope_diff(s), s)
        q = planned.quarantined.filter(pl.col("scope_path") == s)
        q = q if q.height else None
        assert {x.source for x in batch_statements(d, {s: reports[s]}, q).statements if x.is_write} <= {"inline_json"}
        inline = apply(inline_store, d, {s: reports[s]}, started_at=STARTED, quarantined=q)[s]
        monkeypatch.setattr(apply_mod, "SMALL_STAGE_ROWS", 0)
        assert {x.source for x in batch_statements(d, {s: reports[s]}, q).statements if x.is_write} <= {"staged_table"}
        staged = apply(staged_store, d, {s: reports[s]}, started_at=STARTED, quarantined=q)[s]
        monkeypatch.undo()
        assert (staged.status, staged.applied, staged.conflicts) == (inline.status, inline.applied, inline.conflicts), s
        results[s] = inline
    assert results[gated].conflicts >= 1  # the live write, counted alike
    inline_rows, staged_rows = _store_rows(inline_store), _store_rows(staged_store)
    for table in inline_rows:
        assert staged_rows[table] == inline_rows[table], table
    recall = inline_store.pg().execute("SELECT recall_before, recall_after FROM consolidation_runs WHERE scope_path = %s",
                                       (gated,)).fetchone()
    assert recall == (1.0, 0.5)
    assert scalar(staged_store, "SELECT count(*) FROM consolidation_quarantine") == 1
    assert scalar(staged_store, "SELECT count(*) FROM consolidation_archive") > 0


def test_a_row_of_a_scope_without_a_report_is_refused(store):
    """A row keeps the scope it names (``as_shard_diff`` adds the scope only where a row has none), and a
    batch refuses a row of a scope it does not apply: nothing is written."""
    row = pl.DataFrame({"id": [str(uuid.uuid4())], "scope_path": ["org\x1fother"], "label": ["x"], "phase": ["p"]})
    mine = pl.DataFrame({"id": [str(uuid.uuid4())], "expected_version": [1], "importance": [1.0], "phase": ["p"]})
    diff = as_shard_diff(Diff({"memory_nodes": TableDiff(inserts=row, updates=mine)}), "org\x1facme")
    assert diff.table("memory_nodes").inserts.get_column("scope_path").to_list() == ["org\x1fother"]
    assert diff.table("memory_nodes").updates.get_column("scope_path").to_list() == ["org\x1facme"]
    report = ConsolidationReport(scope_path="org\x1facme", as_of="2026-11-30T03:00:00Z", run_id=str(uuid.uuid4()))
    with pytest.raises(InputError, match="rows of scopes without a report"):
        apply(store, diff, {"org\x1facme": report})
    assert scalar(store, "SELECT count(*) FROM consolidation_runs WHERE run_id = %s", report.run_id) == 0


def _with_row(diff: Diff, table: str, kind: str, row: pl.DataFrame) -> Diff:
    td = diff.table(table)
    frames = td.frames()
    frames[kind] = pl.concat([frames[kind], row], how="diagonal_relaxed") if frames[kind].height else row
    return Diff({**diff.tables, table: TableDiff(**frames)})


def _poison(diff: Diff, scope: str) -> pl.DataFrame:
    """A copy of one of ``scope``'s node inserts, under a new id, whose layer breaks the CHECK."""
    mine = diff.table("memory_nodes").inserts.filter(pl.col("scope_path") == scope)
    assert mine.height
    return mine.head(1).with_columns(pl.lit(str(uuid.uuid4())).alias("id"), pl.lit("bogus").alias("layer"))


def test_a_failing_scope_is_recorded_failed_a_live_write_is_its_scopes_conflict_and_the_rest_apply(twin_stores):
    store, _, scopes = twin_stores
    planned, reports = _plan(store, scopes)
    bad_scope, live_scope = "org\x1fac", "org\x1facme"
    # the live write: a node the plan updates in org/acme, edited after the snapshot
    updates = planned.diff.table("memory_nodes").updates
    target = updates.filter(pl.col("scope_path") == live_scope).get_column("id")[0]
    with store.pg() as live:
        live.execute("UPDATE memory_nodes SET label = 'project: edited live' WHERE id = %s", (target,))
        live.commit()
    # a node insert in org/ac that breaks the layer CHECK: that scope's transaction raises
    diff = _with_row(planned.diff, "memory_nodes", "inserts", _poison(planned.diff, bad_scope))
    # a scope whose validation failed: its report is marked failed, its rows must not land
    invalid = next(s for s in scopes if s.startswith("org\x1fglobex\x1f"))
    reports[invalid] = reports[invalid].with_(status="failed", errors=["validation failed: test"])
    before = _store_rows(store)
    mine_of = lambda rows, scope: [r for r in rows if json.loads(r).get("scope_path") == scope]  # noqa: E731
    got = apply(store, diff, reports, started_at=STARTED, quarantined=planned.quarantined)
    assert got[bad_scope].status == "failed" and "memory_nodes_layer_check" in got[bad_scope].error
    assert got[bad_scope].retried and "memory_nodes_layer_check" in got[bad_scope].batch_error
    assert {s: g.status for s, g in got.items() if s not in (bad_scope, invalid)} == dict.fromkeys(
        set(scopes) - {bad_scope, invalid}, "applied")
    assert got[invalid].status == "failed" and got[invalid].error == "validation failed: test"
    assert got[live_scope].conflicts >= 1
    assert all(got[s].conflicts == 0 for s in scopes if s != live_scope)
    assert got[live_scope].applied["memory_nodes"]["updates"] == (
        updates.filter(pl.col("scope_path") == live_scope).get_column("id").n_unique() - got[live_scope].conflicts)
    assert scalar(store, "SELECT label FROM memory_nodes WHERE id = %s", target) == "project: edited live"
    status, errors, rows_changed = store.pg().execute(
        "SELECT status, errors, rows_changed FROM consolidation_runs WHERE run_id = %s", (reports[bad_scope].run_id,)).fetchone()
    assert status == "failed" and any("memory_nodes_layer_check" in e for e in errors)
    assert scalar(store, "SELECT errors FROM consolidation_runs WHERE run_id = %s", reports[invalid].run_id) == [
        "validation failed: test"]
    after = _store_rows(store)
    for t in tables.TABLES:  # nothing of the failed scopes changed
        for failed in (bad_scope, invalid):
            assert mine_of(after[t], failed) == mine_of(before[t], failed), (t, failed)
            assert scalar(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s", reports[failed].run_id) == 0
    for s in set(scopes) - {bad_scope, invalid}:  # every other scope applied as planned, conflicts aside
        assert scalar(store, "SELECT status FROM consolidation_runs WHERE run_id = %s", reports[s].run_id) == "applied"
        assert got[s].applied.keys() == planned.reports[s].rows_changed.keys()
    held = scalar(store, "SELECT count(*) FROM consolidation_quarantine WHERE run_id = %s", reports["org\x1fglobex"].run_id)
    assert held == 1


def test_a_failing_batch_retries_only_its_own_scopes(twin_stores):
    store, _, scopes = twin_stores
    planned, reports = _plan(store, scopes)
    bad_scope = "org\x1fac"  # the first scope in byte order: batch 0
    invalid = sorted(scopes, key=str.encode)[-1]  # in the last batch, which applies in one transaction
    reports[invalid] = reports[invalid].with_(status="failed", errors=["validation failed: test"])
    got = apply(store, _with_row(planned.diff, "memory_nodes", "inserts", _poison(planned.diff, bad_scope)), reports,
                      started_at=STARTED, quarantined=planned.quarantined, batch_scopes=2)
    assert got[bad_scope].batch == 0 and got[bad_scope].status == "failed"
    assert {s for s, g in got.items() if g.retried} == {s for s, g in got.items() if g.batch == 0}
    assert all(g.status == "applied" for s, g in got.items() if s not in (bad_scope, invalid))
    assert got[invalid].status == "failed" and not got[invalid].retried and got[invalid].batch > 0
    assert scalar(store, "SELECT status FROM consolidation_runs WHERE run_id = %s", reports[invalid].run_id) == "failed"
    assert scalar(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s", reports[invalid].run_id) == 0
    assert scalar(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s", reports[scopes[1]].run_id) > 0


def test_a_row_naming_another_scopes_id_changes_nothing_of_that_scope(store):
    t = f"t{uuid.uuid4().hex[:8]}"
    mine, theirs = f"org\x1f{t}", f"org\x1f{t}x"  # string-prefix siblings
    from deep_sleep.core.scope import Scope

    a, b = Scope.root("org", t), Scope.root("org", f"{t}x")
    now = AS_OF - timedelta(hours=1)
    own = node(a, "project: mine", now)
    victim = node(b, "project: theirs", now)
    insert(store, "memory_nodes", [own, victim])
    insert(store, "memory_edges", [{"id": (victim_edge := str(uuid.uuid4())), "scope_path": theirs, "tenant_id": b.tenant_id,
                                    "source_id": victim["id"], "target_id": victim["id"], "relation": "RELATED_TO"}])
    dump = lambda: store.pg().execute(  # noqa: E731
        "SELECT jsonb_agg(to_jsonb(t) ORDER BY id) FROM (SELECT * FROM memory_nodes WHERE scope_path = %s UNION ALL"
        " SELECT n.* FROM memory_nodes n WHERE false) t", (theirs,)).fetchone()[0]
    edges = lambda: scalar(store, "SELECT count(*) FROM memory_edges WHERE id = %s", victim_edge)  # noqa: E731
    before = dump()
    # rows of `mine` that name `theirs`' ids: an update, a delete of a node and an edge, an insert reusing the id
    diff = Diff({
        "memory_nodes": TableDiff(
            updates=pl.DataFrame({"id": [victim["id"], own["id"]], "expected_version": [1, 1], "importance": [9.0, 7.0],
                                  "phase": ["strengthen"] * 2, "scope_path": [mine, mine]}),
            deletes=pl.DataFrame({"id": [victim["id"]], "expected_version": [1], "reason": ["x"], "phase": ["p"],
                                  "scope_path": [mine]}),
            inserts=pl.DataFrame({"id": [victim["id"]], "scope_path": [mine], "tenant_id": [a.tenant_id],
                                  "label": ["project: hijack"], "phase": ["p"]})),
        "memory_edges": TableDiff(deletes=pl.DataFrame({"id": [victim_edge], "expected_version": [1], "reason": ["x"],
                                                        "phase": ["p"], "scope_path": [mine]})),
    })
    reports = {s: ConsolidationReport(scope_path=s, as_of="2026-11-30T03:00:00Z", run_id=str(uuid.uuid4()))
               for s in (mine, theirs)}
    got = apply(store, diff, reports)
    assert got[mine].status == "applied" and got[theirs].status == "applied"
    assert dump() == before and edges() == 1
    assert got[mine].applied == {"memory_nodes": {"deletes": 0, "updates": 1, "inserts": 0}, "memory_edges": {"deletes": 0}}
    assert got[mine].conflicts == 4 and got[theirs].applied == {} and got[theirs].conflicts == 0
    assert scalar(store, "SELECT importance FROM memory_nodes WHERE id = %s", own["id"]) == 7.0
    assert scalar(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s", reports[mine].run_id) == 0


def test_statements_are_pure_and_keep_every_write_scoped():
    diff = Diff({"memory_nodes": TableDiff(
        updates=pl.DataFrame({"id": ["a", "a", "b"], "expected_version": [1, 1, 2], "importance": [5.0, None, 6.0],
                              "label": [None, "x", None], "phase": ["p", "q", "p"], "scope_path": ["s1", "s1", "s2"]}),
        inserts=pl.DataFrame({"id": ["c", "d"], "scope_path": ["s1", "s2"], "tenant_id": ["t", "t"],
                              "label": ["l", "m"], "importance": [None, 3.0], "phase": ["p", "p"]}))})
    run_ids = {"s1": str(uuid.uuid4()), "s2": str(uuid.uuid4())}
    one, two = statements(diff, run_ids), statements(diff, run_ids)
    assert one.statements == two.statements and one.fed.equals(two.fed)
    writes = [s for s in one.statements if s.is_write]
    assert all("t.scope_path = s.scope_path" in s.sql for s in writes if s.kind != "inserts")
    # s1's inserts take importance's default, s2's give it: two inserts, by column signature
    inserts = [s.sql for s in writes if s.kind == "inserts"]
    columns = [re.search(r"INSERT INTO memory_nodes \(([^)]*)\)", sql).group(1) for sql in inserts]
    assert sorted(columns) == ["id, scope_path, tenant_id, label", "id, scope_path, tenant_id, label, importance"]
    assert sorted(one.fed.rows()) == [("s1", "memory_nodes", "inserts", 1), ("s1", "memory_nodes", "updates", 1),
                                      ("s2", "memory_nodes", "inserts", 1), ("s2", "memory_nodes", "updates", 1)]
    with pytest.raises(InputError):
        statements(diff, {"s1": run_ids["s1"]})


def test_each_scopes_inserts_take_the_defaults_of_the_columns_it_gives_no_value(store):
    """A column one scope's rows give values for and another's do not: the other scope's rows take the
    store's default (as its run alone, whose diff has no such column, gives), not NULL."""
    t = f"t{uuid.uuid4().hex[:8]}"
    plain, rich = f"org\x1f{t}", f"org\x1f{t}\x1fagent\x1fa1"
    ids = [str(uuid.uuid4()) for _ in range(3)]
    inserts = pl.DataFrame({"id": ids, "scope_path": [plain, rich, rich], "tenant_id": [t] * 3,
                            "label": ["project: a", "project: b", "project: c"], "importance": [None, 3.0, 4.0],
                            "properties": [None, '{"k": 1}', '{"k": 2}'], "phase": ["p"] * 3})
    reports = {s: ConsolidationReport(scope_path=s, as_of="2026-11-30T03:00:00Z", run_id=str(uuid.uuid4()))
               for s in (plain, rich)}
    got = apply(store, Diff({"memory_nodes": TableDiff(inserts=inserts)}), reports)
    assert {s: (g.status, g.retried, g.conflicts, g.applied) for s, g in got.items()} == {
        plain: ("applied", False, 0, {"memory_nodes": {"inserts": 1}}),
        rich: ("applied", False, 0, {"memory_nodes": {"inserts": 2}})}
    rows = store.pg().execute("SELECT id::text, importance, properties FROM memory_nodes WHERE id = ANY(%s::uuid[]) ORDER BY label",
                              (ids,)).fetchall()
    # the plain scope gave neither column: both defaults (a NULL would break NOT NULL); the rich one its values
    assert [(r[1], r[2]) for r in rows] == [(5.0, {}), (3.0, {"k": 1}), (4.0, {"k": 2})]


def test_a_batchs_updates_and_deletes_probe_each_store_table_by_index_never_scan_it(admin_dsn, monkeypatch):
    """Every update and delete of a batch reaches the store rows through the table's index, one probe per
    staged row (a nested loop), never by reading the whole table: the write costs in proportion to the
    batch's rows, not to the store's (at a hundred thousand scopes, every batch would read every node)."""
    import deep_sleep.run.apply as apply_mod
    from deep_sleep.run.apply import _run, batch_statements

    monkeypatch.setattr(apply_mod, "SMALL_STAGE_ROWS", 0)  # the staged path (a big batch's)
    name = f"ds_plans_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    store = create_database(admin_dsn, name)
    try:
        frames = _fleet_frames()
        load(store, frames)
        with store.pg(autocommit=True) as con:  # the statistics autovacuum keeps (a scope holds many edges)
            con.execute("ANALYZE memory_edges")
        planned, reports = _plan(store, _scopes(frames))
        plans = {}
        with store.adbc() as con:
            cur = con.cursor()
            try:
                for s in batch_statements(planned.diff, reports).statements:
                    if s.is_write:
                        cur.adbc_statement.set_options(**{"adbc.postgresql.use_copy": "false"})  # EXPLAIN is no COPY source
                        cur.execute("EXPLAIN " + s.sql)
                        plans[(s.table, s.kind)] = "\n".join(r[0] for r in cur.fetchall())
                    elif s.step == "lock":
                        cur.execute(s.sql, parameters=(s.params[0],))
                        cur.fetch_arrow_table()
                    elif s.step != "ledger":
                        _run(cur, s)
            finally:
                con.rollback()
        probed = {tk: plan for tk, plan in plans.items() if tk[1] in ("updates", "deletes")}
        assert {("memory_nodes", "updates"), ("memory_nodes", "deletes"), ("memory_edges", "deletes")} <= set(probed)
        for (table, kind), plan in probed.items():
            assert f"Seq Scan on {table} " not in plan, f"{table}.{kind}:\n{plan}"
            assert not re.search(r"(Hash|Merge)( \w+)* Join", plan), f"{table}.{kind}:\n{plan}"
            assert "Nested Loop" in plan and f"Index Scan using {table}_" in plan, f"{table}.{kind}:\n{plan}"
        # the edge delete keeps the edges of a listed node a live write changed: one primary-key probe of
        # memory_nodes per staged node (never the batch's archive, never the scope's nodes)
        kept = probed[("memory_edges", "deletes")]
        assert re.search(r"Index Scan using memory_nodes_pkey on memory_nodes n\s.*\n\s+Index Cond: \(id = \(nd\.id\)::uuid\)",
                         kept), kept
        # a node goes only when no edge touches it: two index probes of memory_edges per staged node
        nodes = probed[("memory_nodes", "deletes")]
        assert re.search(r"Index (Only )?Scan using memory_edges_natural_key on memory_edges e\s.*\n\s+Index Cond: "
                         r"\(\(scope_path = t\.scope_path\) AND \(source_id = t\.id\)\)", nodes), nodes
        assert re.search(r"Index (Only )?Scan using memory_edges_scope_target on memory_edges e_1\s.*\n\s+Index Cond: "
                         r"\(\(scope_path = t\.scope_path\) AND \(target_id = t\.id\)\)", nodes), nodes
    finally:
        drop_database(admin_dsn, name)


def test_a_batch_of_every_scope_is_the_diff_as_it_is_and_strays_are_still_refused():
    """One batch holding every scope (a quick nap's) takes the diff's frames as they are; it is what
    the cut by batch gives (forced here by naming a scope that is not applied), and a row of a scope
    without a report is still refused."""
    from deep_sleep.run.apply import _batches

    scope, other = "org\x1fa\x1fb", "org\x1fa\x1fc"
    nodes = pl.DataFrame({"id": [str(uuid.UUID(int=i)) for i in range(3)], "scope_path": [scope] * 3,
                          "label": ["x", "y", "z"], "phase": ["p"] * 3})
    gone = pl.DataFrame({"id": [str(uuid.UUID(int=9))], "scope_path": [scope], "expected_version": [1],
                         "reason": ["r"], "phase": ["p"]})
    diff = Diff({"memory_nodes": TableDiff(inserts=nodes), "episodic_events": TableDiff(deletes=gone)})
    q = pl.DataFrame({"table": ["memory_nodes"], "id": ["q"], "reason": ["r"], "row": ["{}"], "scope_path": [scope]})
    whole, held = _batches(diff, q, [scope], 500, set())
    cut, cut_held = _batches(diff, q, [scope], 500, {"org\x1fnot\x1fapplied"})
    assert list(whole) == list(cut) == [0] and list(held) == list(cut_held) == [0]
    for name in ("memory_nodes", "episodic_events"):
        for kind, frame in whole[0].table(name).frames().items():
            assert frame.equals(cut[0].table(name).frames()[kind]), (name, kind)
    assert held[0].equals(cut_held[0])
    with pytest.raises(InputError, match="rows of scopes without a report"):
        _batches(as_shard_diff(Diff({"memory_nodes": TableDiff(inserts=nodes.drop("scope_path"))}), other), None, [scope], 500, set())
