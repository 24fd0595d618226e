"""memory_nodes keeps room on every page for consolidation's node updates to be HOT (migration 024).

A node with an embedding is ~1.2 KB (its vector(256) inline), so few fit on a page; an update whose new
row version does not fit on the page is not HOT and inserts into every index, the HNSW index on
``embedding`` above all.  At fillfactor 50 every node of a page can be updated once in one transaction
and stay HOT.  The tests run a real night (the decay phase, through the real pipeline and apply) on a
database of their own, so no other test's rows share the pages, and read the HOT count the server
itself keeps; the same night on a table at the old fillfactor 70 shows the test can fail.
"""

from __future__ import annotations

import os
import time
import uuid
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from deep_sleep.core.scope import Scope
from deep_sleep.run import pipeline
from deep_sleep.store.db import create_database, drop_database
from tests.storeutil import insert, node

NOW = datetime(2026, 6, 1, 12, tzinfo=UTC)
NODES = 60


@pytest.fixture
def own_store(admin_dsn):
    """A migrated store on a database of its own (its pages and its statistics are this test's alone)."""
    name = f"ds_test_hot_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    yield create_database(admin_dsn, name)
    drop_database(admin_dsn, name)


def _vector(rng: np.random.Generator) -> str:
    v = rng.standard_normal(256)
    return "[" + ",".join(f"{x:.6f}" for x in v / np.linalg.norm(v)) + "]"


def _seed_stale_nodes(store, scope: Scope) -> None:
    """NODES semantic nodes with embeddings, untouched for 60 days: the decay phase updates every one."""
    rng = np.random.default_rng(7)
    rows = [node(scope, f"fact {i}", NOW - timedelta(days=60), importance=5.0) | {"embedding": _vector(rng)}
            for i in range(NODES)]
    insert(store, "memory_nodes", rows)


def _table_stats(store) -> tuple[int, int]:
    """(n_tup_upd, n_tup_hot_upd) of memory_nodes, once the updates of the apply have been counted.

    A backend sends its counts to the shared statistics at most once a second, or when idle; the
    apply's pooled connection is asked to flush on its next transaction end, and the counts are read
    afresh until the updates appear (bounded)."""
    with store.transaction() as cur:
        cur.execute("SELECT pg_stat_force_next_flush()")
        cur.fetch_arrow_table()
    with store.pg(autocommit=True) as con:
        for _ in range(200):
            con.execute("SELECT pg_stat_clear_snapshot()")
            upd, hot = con.execute("SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables"
                                   " WHERE relname = 'memory_nodes'").fetchone()
            if upd >= NODES:
                return upd, hot
            time.sleep(0.1)
    raise AssertionError(f"memory_nodes shows {upd} updates after the night, expected {NODES}")


def _decay_night(store, scope: Scope) -> dict[str, tuple[int, int]]:
    """Run the decay phase over the scope; each node's page before and after (from its ctid)."""
    page_sql = "SELECT id::text, (ctid::text::point)[0]::int FROM memory_nodes WHERE scope_path = %s"
    with store.pg() as con:
        before = dict(con.execute(page_sql, (scope.path,)).fetchall())
    applied = pipeline.run(pipeline.NIGHT, pipeline.Context.of(NOW, scopes=scope, store=store, phases=("decay_importance",),
                                                              holds=False))  # no run directory: no holds
    assert applied.reports[scope.path].counters["nodes_decayed"] == NODES
    with store.pg() as con:
        after = dict(con.execute(page_sql, (scope.path,)).fetchall())
        versions = {v for (v,) in con.execute("SELECT version FROM memory_nodes WHERE scope_path = %s", (scope.path,))}
    assert versions == {2}, versions
    return {i: (before[i], after[i]) for i in before}


def test_the_store_keeps_half_of_every_node_page_free(own_store):
    with own_store.pg() as con:
        (options,) = con.execute("SELECT reloptions FROM pg_class WHERE relname = 'memory_nodes'").fetchone()
    assert "fillfactor=50" in options


def test_a_nights_update_of_every_node_with_an_embedding_is_hot(own_store):
    scope = Scope.root("org", "hot").child("brand", "b1")
    _seed_stale_nodes(own_store, scope)
    pages = _decay_night(own_store, scope)
    assert len({b for b, _ in pages.values()}) >= NODES // 4  # a few nodes a page: the pages are full
    assert all(b == a for b, a in pages.values()), "a node's new version left its page"
    upd, hot = _table_stats(own_store)
    assert (upd, hot) == (NODES, NODES)


def test_at_the_old_fillfactor_the_same_night_moves_nodes_off_their_pages(own_store):
    """The control: before migration 024 (fillfactor 70) a page of 4 nodes has room for 2 new versions,
    so this night's updates are not all HOT — what the test above would catch."""
    with own_store.pg() as con:
        con.execute("ALTER TABLE memory_nodes SET (fillfactor = 70)")
        con.commit()
    scope = Scope.root("org", "cold").child("brand", "b1")
    _seed_stale_nodes(own_store, scope)
    pages = _decay_night(own_store, scope)
    assert any(b != a for b, a in pages.values())
    upd, hot = _table_stats(own_store)
    assert upd == NODES and hot < NODES
