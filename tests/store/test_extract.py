"""Extracting a shard: one transaction, each scope exactly as an extract of it alone."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import polars as pl

from deep_sleep.core.scope import Scope
from deep_sleep.store.extract import extract, extract_shard, pg_array
from tests.storeutil import access, edge, insert, node

NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)


def _ledger(store, scope: Scope, as_of: datetime, mode: str) -> None:
    with store.pg() as con:
        con.execute("INSERT INTO consolidation_runs (run_id, scope_path, mode, as_of, status, started_at) VALUES (%s, %s, %s, %s, 'applied', now())",
                    (str(uuid.uuid4()), scope.path, mode, as_of))
        con.commit()


def _key(table: str) -> list[str]:
    return ["node_id", "accessed_at", "kind"] if table == "memory_access_log" else ["id"]


def test_each_scope_of_a_shard_is_its_own_extract(store):
    tag = uuid.uuid4().hex[:8]
    org = Scope.root("org", f"ac{tag}")
    scopes = [org, Scope.root("org", f"ac{tag}x"), org.child("brand", "b1"), org.child("brand", "b1").child("c", "z"),
              Scope.root("org", f"other{tag}")]
    for i, s in enumerate(scopes):
        nodes = [node(s, f"topic: n{j}", NOW - timedelta(hours=j + 1)) for j in range(3 + i)]
        insert(store, "memory_nodes", nodes)
        insert(store, "memory_edges", [edge(s, nodes[0]["id"], nodes[1]["id"])])
        insert(store, "memory_access_log", [access(s, nodes[0]["id"], NOW - timedelta(hours=h)) for h in (1, 5, 30)])
    _ledger(store, scopes[0], NOW - timedelta(hours=20), "nightly")
    _ledger(store, scopes[0], NOW - timedelta(hours=2), "quick_nap")  # its access log starts here
    _ledger(store, scopes[2], NOW - timedelta(days=2), "nightly")
    since = NOW - timedelta(hours=24)
    shard = extract_shard(store, [s.display() for s in reversed(scopes[:4])], log_since=since)
    assert shard.scope_paths == tuple(sorted(s.path for s in scopes[:4]))
    for s in scopes[:4]:
        alone = extract(store, s, log_since=since)
        got = shard.scope(s.path)
        assert got.previous_run_as_of == alone.previous_run_as_of
        for table in alone.frames:
            a = alone.table(table).sort(_key(table))
            b = got.table(table).sort(_key(table))
            assert a.equals(b), (s, table)
    assert shard.rows_of("memory_access_log", scopes[0].path).height == 1  # after the nap floor
    assert shard.rows_of("memory_access_log", scopes[1].path).height == 2  # after log_since
    assert shard.previous_run_as_of[scopes[2].path] == NOW - timedelta(days=2)
    assert not shard.table("memory_nodes").filter(pl.col("scope_path") == scopes[4].path).height


def test_array_literal_quotes_what_it_must():
    assert pg_array(['a"b', "c\\d", None, "e\x1ff"]) == '{"a\\"b","c\\\\d",NULL,"e\x1ff"}'


def test_every_extracted_table_has_a_full_index_leading_with_scope_path(store):
    # The extract reads each table by scope_path alone (`scope_path = $1`, or a join on the shard's
    # scope list): without a b-tree index that starts with scope_path and has no predicate, every
    # night scans the whole table once per shard -- cost growing with the fleet, not the shard
    # (pending_connections had only a partial index on open rows until migration 023).
    from deep_sleep.core import tables

    with store.pg() as con:
        rows = con.execute(
            """SELECT c.relname, a.attname, x.indpred IS NULL
               FROM pg_index x
               JOIN pg_class c ON c.oid = x.indrelid
               JOIN pg_class i ON i.oid = x.indexrelid
               JOIN pg_am am ON am.oid = i.relam AND am.amname = 'btree'
               JOIN pg_attribute a ON a.attrelid = x.indrelid AND a.attnum = x.indkey[0]
               WHERE c.relname = ANY(%s)""", (list(tables.TABLES),)).fetchall()
    served = {table for table, first, full in rows if first == "scope_path" and full}
    assert set(tables.TABLES) - served == set()
