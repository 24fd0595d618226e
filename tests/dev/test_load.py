"""The bulk loader (deep_sleep.dev.load) and seed_store on a database of its own: round trip, index rebuild, atomicity."""

from __future__ import annotations

import json
import os
import time
from datetime import UTC, datetime

import polars as pl
import psycopg
import pytest

from deep_sleep.core.tables import EMBEDDING_DIM
from deep_sleep.dev import load as loader
from deep_sleep.dev.errors import SeedError
from deep_sleep.dev.seed import SeedSpec, generate, load, seed_store

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
SPEC = SeedSpec(now=NOW, legacy_rows=30)


@pytest.fixture(scope="module")
def frames() -> dict[str, pl.DataFrame]:
    return generate(SPEC)


# A database of its own on the session's test server (conftest's `admin_dsn`), not the shared


# `store`: the load tests need empty tables (the index-rebuild path, exact row counts) and seed the
# fixed scopes org/acme, org/globex, ... whose per-scope unique keys another seeding would hit.
@pytest.fixture(scope="module")
def seed_db(admin_dsn):
    from deep_sleep.store.db import Store, migrate, with_database

    name = f"ds_seed_test_{os.getpid()}"
    with psycopg.connect(admin_dsn, autocommit=True) as con:
        con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        con.execute(f'CREATE DATABASE "{name}"')
    dsn = with_database(admin_dsn, name)
    migrate(dsn)
    yield Store(dsn)
    with psycopg.connect(admin_dsn, autocommit=True) as con:
        con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _catalog(store) -> list[tuple]:
    with store.pg() as con:
        return con.execute(
            """SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'
               UNION ALL
               SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint
               WHERE connamespace = 'public'::regnamespace
               ORDER BY 1, 2, 3"""
        ).fetchall()


def test_load_round_trip(seed_db, frames, monkeypatch):
    store = seed_db
    before = _catalog(store)
    monkeypatch.setattr(loader, "REBUILD_MIN_ROWS", 1000)  # exercise the drop/rebuild path on the empty tables
    start = time.perf_counter()
    counts = seed_store(store, SPEC)  # = load(store, generate(SPEC)), and generate is deterministic
    print(f"\nload {sum(counts.values())} rows: {time.perf_counter() - start:.2f}s")
    assert counts == {t: df.height for t, df in frames.items()}
    assert _catalog(store) == before  # indexes and constraints restored exactly
    with store.pg() as con:
        for table, df in frames.items():
            assert con.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == df.height, table
        node = frames["memory_nodes"].filter(pl.col("last_decayed_at").is_not_null()).row(3, named=True)
        row = con.execute(
            "SELECT id::text, scope_path, tenant_id, layer, label, properties, importance, access_count, "
            "created_at, updated_at, last_decayed_at, version, embedding IS NULL FROM memory_nodes WHERE id = %s",
            (node["id"],),
        ).fetchone()
        assert row[:5] == (node["id"], node["scope_path"], node["tenant_id"], node["layer"], node["label"])
        assert row[5] == json.loads(node["properties"])
        assert row[6:12] == (node["importance"], node["access_count"], node["created_at"], node["updated_at"],
                             node["last_decayed_at"], node["version"])
        assert row[12] is True
        edge = frames["memory_edges"].row(0, named=True)
        assert con.execute(
            "SELECT source_id::text, target_id::text, relation, weight FROM memory_edges WHERE id = %s", (edge["id"],)
        ).fetchone() == (edge["source_id"], edge["target_id"], edge["relation"], edge["weight"])
        recall = frames["recall_events"].row(0, named=True)
        features = con.execute("SELECT features FROM recall_events WHERE id = %s", (recall["id"],)).fetchone()[0]
        assert features == recall["features"]
        legacy = con.execute("SELECT count(*) FROM memory_nodes WHERE scope_path IS NULL").fetchone()[0]
        assert legacy == SPEC.legacy_rows


def test_load_rejects_an_unknown_table_and_writes_nothing(seed_db):
    frames = generate(SeedSpec(now=NOW, tenants=1, scopes_per_tenant=0, nodes_per_scope=40, seed=6))
    with seed_db.pg() as con:
        before = con.execute("SELECT count(*) FROM memory_nodes").fetchone()[0]
    with pytest.raises(SeedError, match="unknown table 'memory_nodez'"):
        load(seed_db, {"memory_nodes": frames["memory_nodes"], "memory_nodez": frames["memory_nodes"]})
    with seed_db.pg() as con:
        assert con.execute("SELECT count(*) FROM memory_nodes").fetchone()[0] == before


def test_load_appends_with_embeddings(seed_db):
    # the tables are no longer empty (plain insert path), plus the vector casts.  Another seed on
    # the same scopes collides on the per-scope unique keys of the small tables, so load the big ones.
    spec = SeedSpec(now=NOW, tenants=1, scopes_per_tenant=1, nodes_per_scope=80, seed=99, embeddings=True)
    frames = generate(spec)
    big = ("memory_nodes", "memory_edges", "episodic_events", "memory_access_log")
    counts = load(seed_db, {t: frames[t] for t in big})
    assert counts["memory_nodes"] == 80 + max(30, 80 // 10)
    with seed_db.pg() as con:
        n, dims = con.execute(
            "SELECT count(*), min(vector_dims(embedding)) FROM memory_nodes WHERE embedding IS NOT NULL"
        ).fetchone()
        assert n == counts["memory_nodes"] and dims == EMBEDDING_DIM
        assert con.execute("SELECT count(*) FROM episodic_events WHERE embedding IS NOT NULL").fetchone()[0] == counts[
            "episodic_events"
        ]


def test_load_is_atomic(seed_db):
    frames = generate(SeedSpec(now=NOW, tenants=1, scopes_per_tenant=0, nodes_per_scope=40, seed=5))
    bad = dict(frames)
    bad["memory_edges"] = frames["memory_edges"].with_columns(pl.lit("not-a-uuid").alias("source_id"))
    with seed_db.pg() as con:
        before = con.execute("SELECT count(*) FROM memory_nodes").fetchone()[0]
    with pytest.raises(Exception, match="uuid"):
        load(seed_db, bad)
    with seed_db.pg() as con:
        assert con.execute("SELECT count(*) FROM memory_nodes").fetchone()[0] == before
