"""The scope backfill on a real PostgreSQL: paths, idempotence, dry run, validation, collisions,
resume after SIGKILL, and live writers that never wait longer than the lock timeout."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import psycopg
import pytest

from deep_sleep.core.scope import Scope
from deep_sleep.dev.seed import SeedSpec, seed_store
from deep_sleep.jobs.backfill import (
    VALID_TENANT_SQL,
    BackfillOptions,
    Progress,
    backfill,
    batch_sql,
    discover_tables,
    rich_progress,
    validate_backfill,
)
from deep_sleep.store.db import Store
from tests.storeutil import create_database, drop_database

TENANTS = ("acme", "globex", "initech")  # the seeded tenants: their scoped rows live under org/<tenant>
# legacy rows per table, spread over TENANTS by mod(g, 3)
LEGACY = {"memory_nodes": 16_000, "memory_edges": 5_000, "episodic_events": 4_000, "episodic_folded": 300, "memory_access_log": 4_000,
          "procedural_skills": 300, "prospective_triggers": 300, "pending_connections": 300, "recall_events": 300,
          "soul_profiles": 12, "reranker_models": 3}
TOTAL = sum(LEGACY.values())
TABLES = tuple(sorted(LEGACY))
TENANT = "(ARRAY['acme', 'globex', 'initech'])[mod(g, 3) + 1]"
LEGACY_PATH = "'tenant' || chr(31) || tenant_id"


def expected_by_tenant(n: int) -> dict[str, int]:
    return {t: len(range(i, n + 1, 3)) - (1 if i == 0 else 0) for i, t in enumerate(TENANTS)}


def seed_legacy(dsn: str) -> None:
    """LEGACY rows with scope_path NULL, by plain SQL (ids are md5 of a per-table tag and g)."""
    n = LEGACY
    with psycopg.connect(dsn) as con:
        con.execute(f"""INSERT INTO memory_nodes (id, tenant_id, label, importance)
            SELECT md5('n' || g)::uuid, {TENANT}, 'legacy topic: item ' || g, 1 + mod(g, 9)
            FROM generate_series(1, {n['memory_nodes']}) g""")
        con.execute(f"""INSERT INTO memory_edges (id, tenant_id, source_id, target_id, relation)
            SELECT md5('e' || g)::uuid, {TENANT}, md5('n' || g)::uuid, md5('n' || (g + 3))::uuid, 'RELATED_TO'
            FROM generate_series(1, {n['memory_edges']}) g""")
        con.execute(f"""INSERT INTO episodic_events (id, tenant_id, session_id, content)
            SELECT md5('v' || g)::uuid, {TENANT}, 's' || mod(g, 7), 'legacy event ' || g
            FROM generate_series(1, {n['episodic_events']}) g""")
        con.execute(f"""INSERT INTO episodic_folded (id, summary_id, run_id, tenant_id, session_id, content, created_at)
            SELECT md5('f' || g)::uuid, md5('fs' || mod(g, 5))::uuid, md5('fr')::uuid, {TENANT}, 's' || mod(g, 7),
                   'legacy folded event ' || g, now()
            FROM generate_series(1, {n['episodic_folded']}) g""")
        con.execute(f"""INSERT INTO memory_access_log (tenant_id, node_id)
            SELECT {TENANT}, md5('n' || g)::uuid FROM generate_series(1, {n['memory_access_log']}) g""")
        con.execute(f"""INSERT INTO procedural_skills (id, tenant_id, name, pattern_key)
            SELECT md5('k' || g)::uuid, {TENANT}, 'skill ' || g, CASE WHEN mod(g, 2) = 0 THEN 'pattern ' || g END
            FROM generate_series(1, {n['procedural_skills']}) g""")
        con.execute(f"""INSERT INTO prospective_triggers (id, tenant_id, condition, action)
            SELECT md5('p' || g)::uuid, {TENANT}, 'when ' || g, 'remind ' || g
            FROM generate_series(1, {n['prospective_triggers']}) g""")
        con.execute(f"""INSERT INTO pending_connections (id, tenant_id, source_label, target_label, relation)
            SELECT md5('c' || g)::uuid, {TENANT}, 'a ' || g, 'b ' || g, 'RELATED_TO'
            FROM generate_series(1, {n['pending_connections']}) g""")
        con.execute(f"""INSERT INTO recall_events (id, tenant_id, query, node_id, similarity, features, score)
            SELECT md5('r' || g)::uuid, {TENANT}, 'what about ' || g, md5('n' || g)::uuid, 0.5, array_fill(0.1::float8, ARRAY[12]), 0.5
            FROM generate_series(1, {n['recall_events']}) g""")
        con.execute(f"""INSERT INTO soul_profiles (id, tenant_id, key, value)
            SELECT md5('s' || g)::uuid, {TENANT}, (ARRAY['name', 'role', 'personality', 'language'])[(g - 1) / 3 + 1], 'v' || g
            FROM generate_series(1, {n['soul_profiles']}) g""")
        con.execute(f"""INSERT INTO reranker_models (id, tenant_id, weights)
            SELECT md5('m' || g)::uuid, {TENANT}, array_fill(0.0::float8, ARRAY[12])
            FROM generate_series(1, {n['reranker_models']}) g""")
        con.commit()


def _clone(admin_dsn: str, template: str, name: str) -> Store:
    return create_database(admin_dsn, name, template=template)


@pytest.fixture(scope="module")
def template(admin_dsn):
    """A database with a small seeded store of scoped rows and TOTAL legacy rows, cloned per test."""
    name = f"ds_backfill_tpl_{os.getpid()}"
    store = create_database(admin_dsn, name)
    seed_store(store, SeedSpec(tenants=3, scopes_per_tenant=1, nodes_per_scope=200, seed=5))
    seed_legacy(store.dsn)
    with psycopg.connect(store.dsn, autocommit=True) as con:
        con.execute("VACUUM ANALYZE")
    yield name
    drop_database(admin_dsn, name)


@pytest.fixture
def db(admin_dsn, template):
    name = f"ds_backfill_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    store = _clone(admin_dsn, template, name)
    yield store
    drop_database(admin_dsn, name)


BOOKKEEPING = ("scope_backfill_checkpoints", "scope_backfill_conflicts")


def fingerprint(dsn: str, where: str = "true", drop: tuple[str, ...] = (), tables: tuple[str, ...] = TABLES,
                ) -> dict[str, tuple]:
    """Per table: (order-independent hash of the rows matching ``where``, minus columns ``drop``; count)."""
    minus = "".join(f" - '{c}'" for c in drop)
    with psycopg.connect(dsn) as con:
        return {t: tuple(con.execute(
            f"SELECT coalesce(sum(hashtextextended((to_jsonb(x){minus})::text, 0)::numeric), 0), count(*) FROM {t} x "
            f"WHERE {where}").fetchone()) for t in tables}


SCOPED = f"scope_path IS NOT NULL AND scope_path <> {LEGACY_PATH}"  # rows that were never legacy
WAS_LEGACY = f"(scope_path IS NULL OR scope_path = {LEGACY_PATH})"


def counts(dsn: str, sql: str) -> dict[str, int]:
    with psycopg.connect(dsn) as con:
        return {t: con.execute(sql.format(t=t)).fetchone()[0] for t in TABLES}


def assert_every_legacy_row_backfilled_once(dsn: str) -> None:
    """Each legacy row reads Scope.legacy(tenant_id).path and was written once (version 1 → 2)."""
    assert counts(dsn, "SELECT count(*) FROM {t} WHERE scope_path IS NULL") == dict.fromkeys(TABLES, 0)
    assert counts(dsn, f"SELECT count(*) FROM {{t}} WHERE scope_path = {LEGACY_PATH}") == LEGACY
    with psycopg.connect(dsn) as con:
        pairs = con.execute(f"SELECT DISTINCT tenant_id, scope_path FROM memory_nodes WHERE scope_path = {LEGACY_PATH}").fetchall()
        assert sorted(pairs) == sorted((t, Scope.legacy(t).path) for t in TENANTS)
        for t in TABLES:
            if t != "memory_access_log":  # the only table without a version
                assert con.execute(f"SELECT count(*) FROM {t} WHERE scope_path = {LEGACY_PATH} AND version <> 2").fetchone()[0] == 0, t


def test_the_tables_come_from_the_catalog_with_their_unique_keys_and_legacy_indexes(db):
    with db.pg() as con:
        infos = {i.name: i for i in discover_tables(con)}
        assert tuple(infos) == TABLES  # memory_access_log included; scope_turns (scope_path NOT NULL) not
        assert {n: [u.name for u in i.unique_keys] for n, i in infos.items() if i.unique_keys} == {
            "memory_edges": ["memory_edges_natural_key"], "procedural_skills": ["procedural_skills_pattern"],
            "reranker_models": ["reranker_models_scope"], "soul_profiles": ["soul_profiles_key"]}
        assert infos["memory_access_log"].pk_type == "bigint"
        indexed = {r[0] for r in con.execute("SELECT tablename FROM pg_indexes WHERE indexname LIKE '%legacy_key' "
                                             "AND indexdef LIKE '%WHERE (scope_path IS NULL)'")}
        assert indexed == set(TABLES)
        # keyset, never OFFSET; the batch statement locks with SKIP LOCKED
        sql = batch_sql(infos["memory_edges"], first=False)
        assert "OFFSET" not in sql.upper() and "SKIP LOCKED" in sql and '"id" > %(after)s::uuid' in sql
        # the SQL test of a tenant id agrees with Scope: a row Scope would refuse is left alone
        for tenant in ("acme", "", "a\x1fb", "tab\there", "x" * 128, "x" * 129, "é", "\x85", "a b"):
            try:
                Scope.legacy(tenant)
                valid = True
            except ValueError:
                valid = False
            assert con.execute(f"SELECT {VALID_TENANT_SQL} FROM (SELECT %s::text AS tenant_id) t", (tenant,)).fetchone()[0] == valid, tenant
    with pytest.raises(ValueError, match="batch_size"):
        BackfillOptions(batch_size=0)


def test_dry_run_counts_per_table_and_tenant_and_writes_nothing(db):
    before = fingerprint(db.dsn, tables=TABLES + BOOKKEEPING)
    result = backfill(db.dsn, dry_run=True, job="dry")
    assert result.dry_run and result.validation is None and result.conflicts == ()
    assert {t.table: t.legacy_rows for t in result.tables} == LEGACY
    assert {t.table: t.by_tenant for t in result.tables} == {t: expected_by_tenant(n) for t, n in LEGACY.items()}
    assert result.legacy_rows == TOTAL and result.rows_backfilled == 0 and result.batches == 0
    assert fingerprint(db.dsn, tables=TABLES + BOOKKEEPING) == before  # nothing written, not even a checkpoint


def test_backfill_writes_each_tenant_path_once_reruns_change_nothing_and_validation_catches_strays(db):
    scoped = fingerprint(db.dsn, SCOPED)
    legacy = fingerprint(db.dsn, WAS_LEGACY, drop=("scope_path", "version"))
    events: list[Progress] = []
    result = backfill(db.dsn, batch_size=2_000, lock_timeout_ms=200, job="first", progress=events.append)

    assert {t.table: t.rows_backfilled for t in result.tables} == LEGACY
    assert {t.table: t.rows_backfilled_job for t in result.tables} == LEGACY
    assert result.conflicts == () and result.validation.ok and result.validation.messages() == []
    assert result.batches >= TOTAL // 2_000
    assert_every_legacy_row_backfilled_once(db.dsn)
    assert fingerprint(db.dsn, SCOPED) == scoped  # nothing else touched
    assert fingerprint(db.dsn, WAS_LEGACY, drop=("scope_path", "version")) == legacy
    # progress: per table, rows_done never goes back and ends at the table's legacy rows
    finals = {e.table: e for e in events if e.finished}
    assert {t: e.rows_done for t, e in finals.items()} == LEGACY
    for t in TABLES:
        done = [e.rows_done for e in events if e.table == t]
        assert done == sorted(done) and all(e.rows_total == LEGACY[t] for e in events if e.table == t)

    # idempotent: the same job (a finished pass: a new one finds nothing) or a new job
    everything = fingerprint(db.dsn)
    for job in ("first", "second"):
        again = backfill(db.dsn, batch_size=2_000, job=job)
        assert again.rows_backfilled == 0 and again.validation.ok
    assert fingerprint(db.dsn) == everything

    # validation: a row left without a path, and rows whose path's tenant differs from tenant_id
    stray, inserted = str(uuid.uuid4()), str(uuid.uuid4())
    with db.pg() as con:
        con.execute("INSERT INTO memory_nodes (id, tenant_id, label) VALUES (%s, 'acme', 'stray')", (stray,))
        moved_id = con.execute(f"SELECT id::text FROM memory_edges WHERE scope_path = {LEGACY_PATH} ORDER BY id LIMIT 1").fetchone()[0]
        con.execute("UPDATE memory_edges SET scope_path = %s WHERE id = %s", (Scope.legacy("globex").path, moved_id))
        con.execute("INSERT INTO memory_nodes (id, scope_path, tenant_id, label) VALUES (%s, %s, 'acme', 'x')",
                    (inserted, Scope.root("org", "globex").path))
        con.commit()
    report = validate_backfill(db.dsn)
    assert not report.ok
    assert {t: n for t, n in report.without_path.items() if n} == {"memory_nodes": 1}
    assert report.without_path_ids == {"memory_nodes": (stray,)} and report.conflicts == ()
    assert {t: n for t, n in report.mismatches.items() if n} == {"memory_nodes": 1, "memory_edges": 1}
    assert sorted((m.table, m.row_id) for m in report.mismatch_rows) == sorted(
        [("memory_nodes", inserted), ("memory_edges", moved_id)])
    assert any("without a scope_path" in m for m in report.messages())


def test_collisions_are_reported_by_id_and_no_row_is_lost(db):
    zeta = Scope.legacy("zeta").path
    ids = {k: str(uuid.uuid4()) for k in ("edge_old", "edge_new", "soul_old", "soul_new", "rr_old", "rr_new",
                                          "skill_old", "skill_new", "trig_a", "trig_b", "bad_tenant", "empty_tenant")}
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    trig_first, trig_second = sorted([ids["trig_a"], ids["trig_b"]])
    with db.pg() as con:
        # rows already at the target path, and legacy rows that would land on their unique keys
        con.execute("INSERT INTO memory_edges (id, scope_path, tenant_id, source_id, target_id, relation) VALUES "
                    "(%s, %s, 'zeta', %s, %s, 'is'), (%s, NULL, 'zeta', %s, %s, 'is')",
                    (ids["edge_old"], zeta, a, b, ids["edge_new"], a, b))
        con.execute("INSERT INTO soul_profiles (id, scope_path, tenant_id, key, value) VALUES "
                    "(%s, %s, 'zeta', 'name', 'Ada'), (%s, NULL, 'zeta', 'name', 'Legacy Ada')",
                    (ids["soul_old"], zeta, ids["soul_new"]))
        con.execute("INSERT INTO reranker_models (id, scope_path, tenant_id, weights) VALUES "
                    "(%s, %s, 'zeta', array_fill(0.0::float8, ARRAY[12])), (%s, NULL, 'zeta', array_fill(1.0::float8, ARRAY[12]))",
                    (ids["rr_old"], zeta, ids["rr_new"]))
        con.execute("INSERT INTO procedural_skills (id, scope_path, tenant_id, name, pattern_key) VALUES "
                    "(%s, %s, 'zeta', 'deploy', 'deploy'), (%s, NULL, 'zeta', 'deploy (legacy)', 'deploy')",
                    (ids["skill_old"], zeta, ids["skill_new"]))
        # a unique key the backfill was not written for: found in the catalog; two legacy rows that
        # would collide with each other -- the smaller id gets the path, the other is reported
        con.execute("CREATE UNIQUE INDEX prospective_triggers_condition ON prospective_triggers (scope_path, condition)")
        con.execute("INSERT INTO prospective_triggers (id, tenant_id, condition, action) VALUES "
                    "(%s, 'zeta', 'at dawn', 'a'), (%s, 'zeta', 'at dawn', 'b')", (ids["trig_a"], ids["trig_b"]))
        # tenant ids that are not valid scope ids
        con.execute("INSERT INTO memory_nodes (id, tenant_id, label) VALUES (%s, %s, 'x'), (%s, '', 'y')",
                    (ids["bad_tenant"], "bad\x07id", ids["empty_tenant"]))
        con.commit()
    expected = {
        ("memory_edges", ids["edge_new"], "collision", ids["edge_old"], zeta, "memory_edges_natural_key"),
        ("soul_profiles", ids["soul_new"], "collision", ids["soul_old"], zeta, "soul_profiles_key"),
        ("reranker_models", ids["rr_new"], "collision", ids["rr_old"], zeta, "reranker_models_scope"),
        ("procedural_skills", ids["skill_new"], "collision", ids["skill_old"], zeta, "procedural_skills_pattern"),
        ("prospective_triggers", trig_second, "collision", trig_first, zeta, "prospective_triggers_condition"),
        ("memory_nodes", ids["bad_tenant"], "invalid_tenant_id", None, None, None),
        ("memory_nodes", ids["empty_tenant"], "invalid_tenant_id", None, None, None),
    }
    as_set = lambda conflicts: {(c.table, c.row_id, c.reason, c.existing_id, c.target_path, c.index_name)  # noqa: E731
                                for c in conflicts}
    everything = fingerprint(db.dsn, f"id::text = ANY(ARRAY{sorted(ids.values())})")

    dry = backfill(db.dsn, dry_run=True, job="clash")
    assert as_set(dry.conflicts) == expected
    result = backfill(db.dsn, batch_size=1_000, job="clash")
    assert as_set(result.conflicts) == expected
    assert {t.table: t.left_without_path for t in result.tables if t.left_without_path} == {
        "memory_edges": 1, "soul_profiles": 1, "reranker_models": 1, "procedural_skills": 1, "prospective_triggers": 1,
        "memory_nodes": 2}
    assert result.rows_backfilled == TOTAL + 1  # every seeded legacy row, and the first of the two triggers
    # neither row of a collision was changed or dropped; the reported ones still have no path
    still = fingerprint(db.dsn, f"id::text = ANY(ARRAY{sorted(ids.values())})")
    assert {t: still[t] for t in TABLES if t != "prospective_triggers"} == {
        t: everything[t] for t in TABLES if t != "prospective_triggers"}
    with db.pg() as con:
        assert con.execute("SELECT scope_path FROM prospective_triggers WHERE id = %s", (trig_first,)).fetchone()[0] == zeta
        assert con.execute("SELECT count(*) FROM scope_backfill_conflicts WHERE job = 'clash'").fetchone()[0] == len(expected)
    report = result.validation
    assert not report.ok and as_set(report.conflicts) == expected
    assert sum(report.without_path.values()) == len(expected) and not any(report.without_path_ids.values())
    assert any(ids["soul_new"] in m and ids["soul_old"] in m for m in report.messages())

    # the operator resolves one (drops the old soul row); a rerun backfills the legacy one
    with db.pg() as con:
        con.execute("DELETE FROM soul_profiles WHERE id = %s", (ids["soul_old"],))
        con.commit()
    again = backfill(db.dsn, job="clash")
    assert again.rows_backfilled == 1 and as_set(again.conflicts) == expected - {
        c for c in expected if c[1] == ids["soul_new"]}


KILLED = textwrap.dedent(
    """
    import sys
    from deep_sleep.jobs.backfill import backfill

    backfill(sys.argv[1], job="resume", batch_size=400, lock_timeout_ms=200, pause_ms=10)
    """
)


def _rows_done(dsn: str) -> int:
    with psycopg.connect(dsn, autocommit=True) as con:
        return int(con.execute("SELECT coalesce(sum(rows_done), 0) FROM scope_backfill_checkpoints WHERE job = 'resume'")
                   .fetchone()[0])


def _wait_for_dead_backends(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as con:
        for _ in range(500):
            if not con.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                               "AND pid <> pg_backend_pid()").fetchone()[0]:
                return
            time.sleep(0.02)
    raise AssertionError("the killed backfill's sessions did not go away")


def test_sigkilled_twice_it_resumes_and_backfills_every_legacy_row_exactly_once(db, tmp_path):
    scoped = fingerprint(db.dsn, SCOPED)
    legacy = fingerprint(db.dsn, WAS_LEGACY, drop=("scope_path", "version"))
    script = tmp_path / "backfill.py"
    script.write_text(KILLED)
    env = {**os.environ, "PYTHONPATH": str(Path.cwd())}
    rng = random.Random(20261129)
    killed_at = []
    for lo, hi in ((0.15, 0.45), (0.55, 0.85)):
        target = int(TOTAL * rng.uniform(lo, hi))
        proc = subprocess.Popen([sys.executable, str(script), db.dsn], env=env)
        deadline = time.monotonic() + 60
        while _rows_done(db.dsn) < target:
            assert proc.poll() is None, f"the backfill ended (rc {proc.returncode}) before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
        _wait_for_dead_backends(db.dsn)
        killed_at.append(_rows_done(db.dsn))
    assert 0 < killed_at[0] < killed_at[1] < TOTAL  # both kills landed mid-way

    result = backfill(db.dsn, job="resume", batch_size=400)
    assert result.rows_backfilled == TOTAL - killed_at[1]  # the rest, and nothing twice
    assert {t.table: t.rows_backfilled_job for t in result.tables} == LEGACY
    assert _rows_done(db.dsn) == TOTAL
    assert result.validation.ok
    assert_every_legacy_row_backfilled_once(db.dsn)
    assert fingerprint(db.dsn, SCOPED) == scoped
    assert fingerprint(db.dsn, WAS_LEGACY, drop=("scope_path", "version")) == legacy


class Writer(threading.Thread):
    """A live agent: short autocommit UPDATEs of legacy and scoped rows of the tables being backfilled.

    Its session's lock_timeout is the backfill's lock timeout plus a margin, so a statement that
    waits on a lock longer than that fails with LockNotAvailable -- a measure of lock waits that a
    busy CPU cannot fake (plain latency is recorded too, for a look; benchmarks/backfill.py reports it)."""

    def __init__(self, dsn: str, ids: dict[str, list[str]], stop: threading.Event, lock_timeout_ms: int, seed: int):
        super().__init__(daemon=True)
        self.dsn, self.ids, self.stop, self.lock_timeout_ms, self.seed = dsn, ids, stop, lock_timeout_ms, seed
        self.latencies: list[float] = []
        self.timed_out: list[str] = []
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(self.seed)
        statements = {
            "memory_nodes": "UPDATE memory_nodes SET access_count = access_count + 1 WHERE id = %s",
            "memory_edges": "UPDATE memory_edges SET weight = weight + 1 WHERE id = %s",
            "episodic_events": "UPDATE episodic_events SET metadata = '{\"seen\": true}' WHERE id = %s",
        }
        try:
            with psycopg.connect(self.dsn, autocommit=True) as con:
                con.execute(f"SET lock_timeout = {self.lock_timeout_ms}")
                while not self.stop.is_set():
                    table = rng.choice(list(statements))
                    t = time.perf_counter()
                    try:
                        con.execute(statements[table], (rng.choice(self.ids[table]),))
                    except psycopg.errors.LockNotAvailable:
                        self.timed_out.append(table)
                    self.latencies.append(time.perf_counter() - t)
        except BaseException as exc:  # surfaced by the test
            self.error = exc


def test_live_writers_never_wait_longer_than_the_lock_timeout(db):
    lock_timeout_ms, margin_ms = 200, 1_000
    with db.pg() as con:  # legacy rows (what the backfill locks) and scoped rows of the same tables
        legacy = {t: [r[0] for r in con.execute(f"SELECT id::text FROM {t} WHERE scope_path IS NULL ORDER BY id")]
                  for t in ("memory_nodes", "memory_edges", "episodic_events")}
        scoped = {t: [r[0] for r in con.execute(f"SELECT id::text FROM {t} WHERE scope_path IS NOT NULL ORDER BY id")]
                  for t in legacy}
    stop = threading.Event()
    writers = [Writer(db.dsn, legacy, stop, lock_timeout_ms + margin_ms, 1),
               Writer(db.dsn, legacy, stop, lock_timeout_ms + margin_ms, 2),
               Writer(db.dsn, scoped, stop, lock_timeout_ms + margin_ms, 3)]
    for w in writers:
        w.start()
    time.sleep(0.2)
    before = sum(len(w.latencies) for w in writers)
    result = backfill(db.dsn, batch_size=5_000, lock_timeout_ms=lock_timeout_ms, job="live")
    during = sum(len(w.latencies) for w in writers) - before
    stop.set()
    for w in writers:
        w.join(timeout=30)
        assert w.error is None, w.error
    assert during >= 20  # the writers really wrote while the backfill ran
    assert [t for w in writers for t in w.timed_out] == []  # no lock wait beyond lock_timeout + margin
    # (how long a statement took is a measurement: benchmarks/backfill.py reports live_writer.max_ms)
    assert result.validation.ok and result.rows_backfilled == TOTAL
    assert counts(db.dsn, "SELECT count(*) FROM {t} WHERE scope_path IS NULL") == dict.fromkeys(TABLES, 0)


def _release_after_one_lock_timeout(dsn: str, holder: psycopg.Connection, table: str, wait_s: float = 120.0) -> None:
    """Roll ``holder`` back once another session has waited for a lock on ``table`` and stopped waiting."""
    waiting = f"SELECT count(*) FROM pg_locks WHERE relation = '{table}'::regclass AND NOT granted"
    deadline = time.monotonic() + wait_s
    try:
        with psycopg.connect(dsn, autocommit=True) as watcher:
            seen = False
            while time.monotonic() < deadline:
                n = watcher.execute(waiting).fetchone()[0]
                if n and not seen:
                    seen = True
                elif seen and not n:
                    return
                time.sleep(0.002)
    finally:
        holder.rollback()


def test_a_batch_that_cannot_get_its_locks_is_retried_not_failed(db):
    """A session holding a table lock (think ALTER TABLE) blocks the batch: lock_timeout, backoff, retry."""
    holder = psycopg.connect(db.dsn)
    holder.execute("LOCK TABLE memory_access_log IN SHARE MODE")  # conflicts with the UPDATE's ROW EXCLUSIVE
    # Release only after one batch has queued behind the lock and given up (its lock request gone
    # while the lock is still held: a lock timeout), so a retry happened however slow the machine.
    release = threading.Thread(target=_release_after_one_lock_timeout, args=(db.dsn, holder, "memory_access_log"))
    release.start()
    try:
        with rich_progress() as show:  # the CLI's progress bar, fed by the same callback
            result = backfill(db.dsn, tables=["memory_access_log"], lock_timeout_ms=50, job="retry", progress=show)
    finally:
        release.join()
        holder.close()
    assert result.retries >= 1 and result.rows_backfilled == LEGACY["memory_access_log"]
    assert result.validation.ok


@pytest.mark.flow
def test_the_prefect_flow_dry_runs_then_backfills(db, prefect_harness):
    from deep_sleep.flows.backfill import ScopeBackfillParameters, scope_backfill

    dry = scope_backfill(ScopeBackfillParameters(dsn=db.dsn, dry_run=True))
    assert dry["dry_run"] and dry["legacy_rows"] == TOTAL and dry["rows_backfilled"] == 0
    done = scope_backfill(ScopeBackfillParameters(dsn=db.dsn, job="flow", batch_size=3_000))
    assert done["rows_backfilled"] == TOTAL and done["validation"]["ok"]
    assert_every_legacy_row_backfilled_once(db.dsn)
