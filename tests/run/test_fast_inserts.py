"""The shard apply's fast inserts (a plain INSERT under a savepoint, the guarded ``ON CONFLICT DO NOTHING``
only when a row collides): the same store rows, archive, ledger and per-scope counts as every insert run
guarded, whether nothing collides, a live writer's row collides (committed before the apply, or still
being inserted while the apply runs and then committed or rolled back), or a row reuses a stored id."""

from __future__ import annotations

import threading
import uuid

import polars as pl
import pytest

from deep_sleep.core.diff import Diff, TableDiff
from deep_sleep.run import apply as apply_mod
from deep_sleep.run.apply import apply as apply_shard
from deep_sleep.run.statements import statements as shard_statements
from tests.run import test_apply_shard as shard_tests
from tests.run.test_apply_shard import STARTED, _plan, _store_rows
from tests.storeutil import scalar

twin_stores = shard_tests.twin_stores  # the fixture: two databases holding the same small fleet


def _planned_edge(planned, scope: str) -> dict:
    """One edge the plan inserts in ``scope``."""
    mine = planned.diff.table("memory_edges").inserts.filter(pl.col("scope_path") == scope)
    assert mine.height, f"the plan inserts no edge in {scope!r}"
    return mine.row(0, named=True)


LIVE_ID = "0d5e1ec7-0000-4000-8000-000000000001"  # the live writer's edge (the same in both twins)


def _live_edge(con, edge: dict) -> None:
    """A live writer's edge with ``edge``'s natural key under :data:`LIVE_ID` (not committed here)."""
    con.execute("INSERT INTO memory_edges (id, scope_path, tenant_id, source_id, target_id, relation, weight,"
                " created_at, updated_at) VALUES (%s, %s, %s, %s, %s, %s, 0.125, %s, %s)",
                (LIVE_ID, edge["scope_path"], edge["tenant_id"], edge["source_id"], edge["target_id"], edge["relation"],
                 STARTED, STARTED))


@pytest.fixture(autouse=True)
def staged(monkeypatch):
    """Fast inserts are the staged path's (a DO block takes no parameters; inline rows run guarded):
    every batch here is staged, whatever its size."""
    monkeypatch.setattr(apply_mod, "SMALL_STAGE_ROWS", 0)


def _outcome(got) -> dict:
    return {s: (g.status, g.retried, g.applied, g.conflicts) for s, g in got.items()}


def test_every_shard_insert_has_a_plain_fast_path_beside_its_guarded_sql():
    diff = pl.DataFrame({"id": ["c", "d"], "scope_path": ["s1", "s2"], "tenant_id": ["t", "t"], "label": ["l", "m"]})
    run_ids = {"s1": str(uuid.uuid4()), "s2": str(uuid.uuid4())}
    inline = shard_statements(Diff({"memory_nodes": TableDiff(inserts=diff)}), run_ids)
    assert all(s.fast_sql is None for s in inline.statements)  # inline rows: the guarded insert alone
    planned = shard_statements(Diff({"memory_nodes": TableDiff(inserts=diff)}), run_ids, small_rows=0)
    inserts = [s for s in planned.statements if s.step == "insert"]
    assert inserts and all(s.sql.count("ON CONFLICT DO NOTHING") == 1 for s in inserts)
    for s in inserts:  # the same INSERT, plain first, guarded in the unique_violation handler only
        plain, guarded = s.fast_sql.split("EXCEPTION WHEN unique_violation THEN")
        insert = s.sql.split(" SELECT scope_path AS scope_path")[0]
        assert insert.replace(" ON CONFLICT DO NOTHING", "") in plain and "ON CONFLICT" not in plain
        assert insert in guarded
    assert all(s.fast_sql is None for s in planned.statements if s.step != "insert")


def test_fast_inserts_give_what_guarded_inserts_give_when_rows_collide(twin_stores):
    """A committed live edge with a planned edge's natural key, and a planned edge reusing a stored id:
    the fast path falls back for that batch's insert, and both stores end exactly alike."""
    fast_store, guarded_store, scopes = twin_stores
    planned, reports = _plan(fast_store, scopes)
    live_scope, id_scope = "org\x1facme", "org\x1fac"
    edge = _planned_edge(planned, live_scope)
    reused = scalar(fast_store, "SELECT id::text FROM memory_edges WHERE scope_path = %s LIMIT 1", id_scope)
    frames = planned.diff.table("memory_edges").frames()
    stolen = (pl.col("scope_path") == id_scope) & (pl.col("id") == _planned_edge(planned, id_scope)["id"])
    frames["inserts"] = frames["inserts"].with_columns(pl.when(stolen).then(pl.lit(reused)).otherwise(pl.col("id")).alias("id"))
    diff = Diff({**planned.diff.tables, "memory_edges": TableDiff(**frames)})
    for store in (fast_store, guarded_store):
        with store.pg() as live:
            _live_edge(live, edge)
            live.commit()
    assert _store_rows(fast_store) == _store_rows(guarded_store)
    fast = apply_shard(fast_store, diff, reports, started_at=STARTED, quarantined=planned.quarantined, batch_scopes=2)
    guarded = apply_shard(guarded_store, diff, reports, started_at=STARTED, quarantined=planned.quarantined,
                          batch_scopes=2, fast_inserts=False)
    assert not any(g.batch_error for g in fast.values()), [g.batch_error for g in fast.values()]
    assert _outcome(fast) == _outcome(guarded)
    assert fast[live_scope].conflicts >= 1 and fast[id_scope].conflicts >= 1
    assert all(g.status == "applied" and not g.retried for g in fast.values())
    assert sum(n for g in fast.values() for kinds in g.applied.values() for n in kinds.values()) > 100
    a, b = _store_rows(fast_store), _store_rows(guarded_store)
    for table in a:
        assert a[table] == b[table], table


@pytest.mark.parametrize("live_outcome", ["commit", "rollback"])
def test_an_apply_waits_for_a_live_insert_of_the_same_natural_key_and_respects_its_outcome(twin_stores, live_outcome):
    """A live writer inserts a planned edge's natural key and has not committed when the apply reaches it:
    the apply's insert waits for it; committed, the live edge stays and the planned one is its scope's
    conflict; rolled back, the planned edge lands.  Every other row applies, as with guarded inserts."""
    store, guarded_store, scopes = twin_stores
    planned, reports = _plan(store, scopes)
    live_scope = "org\x1facme"
    edge = _planned_edge(planned, live_scope)
    live = store.pg()
    _live_edge(live, edge)
    xid = live.execute("SELECT pg_current_xact_id()::text").fetchone()[0]
    result: dict = {}

    def run() -> None:
        try:
            result["got"] = apply_shard(store, planned.diff, reports, started_at=STARTED, quarantined=planned.quarantined)
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            result["error"] = e

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    with store.pg(autocommit=True) as watch:  # the apply is blocked on the live writer's transaction
        waiting = 0
        for _ in range(600):
            waiting = watch.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'transactionid' AND NOT granted"
                                    " AND transactionid::text = %s", (xid,)).fetchone()[0]
            if waiting or not worker.is_alive():
                break
            threading.Event().wait(0.1)
    assert waiting == 1, result.get("error") or "the apply never waited for the live insert"
    live.commit() if live_outcome == "commit" else live.rollback()
    live.close()
    worker.join(120)
    assert not worker.is_alive() and "error" not in result, result.get("error")
    got = result["got"]
    assert all(g.status == "applied" and not g.retried for g in got.values())
    key = (edge["scope_path"], edge["source_id"], edge["target_id"], edge["relation"])
    stored = store.pg().execute("SELECT id::text, weight FROM memory_edges WHERE scope_path = %s AND source_id = %s"
                                " AND target_id = %s AND relation = %s", key).fetchall()
    if live_outcome == "commit":
        assert stored == [(LIVE_ID, 0.125)] and got[live_scope].conflicts == 1
        with guarded_store.pg() as other:  # the same live edge, committed before a guarded apply: same counts
            _live_edge(other, edge)
            other.commit()
    else:
        assert stored == [(edge["id"], edge["weight"] if edge.get("weight") is not None else 1.0)]
        assert got[live_scope].conflicts == 0
    guarded = apply_shard(guarded_store, planned.diff, reports, started_at=STARTED, quarantined=planned.quarantined,
                          fast_inserts=False)
    assert _outcome(got) == _outcome(guarded)
    assert all(g.conflicts == 0 for s, g in got.items() if s != live_scope)
    a, b = _store_rows(store), _store_rows(guarded_store)
    for table in a:
        assert a[table] == b[table], table


def test_a_collision_sends_the_later_batches_of_that_table_straight_to_the_guarded_insert(twin_stores, monkeypatch):
    store, _, scopes = twin_stores
    planned, reports = _plan(store, scopes)
    first = min(scopes, key=str.encode)
    with store.pg() as live:
        _live_edge(live, _planned_edge(planned, first))
        live.commit()
    ran: list[tuple[str, bool]] = []
    real = apply_mod._write

    def spy(cur, s, guarded, fast):
        if s.step == "insert":
            ran.append((s.table, not fast))
        return real(cur, s, guarded, fast)

    monkeypatch.setattr(apply_mod, "_write", spy)
    got = apply_shard(store, planned.diff, reports, started_at=STARTED, quarantined=planned.quarantined, batch_scopes=1)
    assert got[first].conflicts == 1 and all(g.status == "applied" for g in got.values())
    edges = [guarded for table, guarded in ran if table == "memory_edges"]
    assert edges[0] is False and len(edges) > 1 and all(edges[1:])  # tried fast once, then guarded
    assert not any(guarded for table, guarded in ran if table != "memory_edges")


def test_past_the_cap_a_batchs_inserts_run_guarded_and_give_the_same(twin_stores, monkeypatch):
    """More inserts in a batch than FAST_INSERTS_PER_BATCH (each fast one is a subtransaction): the
    rest run guarded; the store ends as with every insert guarded."""
    fast_store, guarded_store, scopes = twin_stores
    planned, reports = _plan(fast_store, scopes)
    monkeypatch.setattr(apply_mod, "FAST_INSERTS_PER_BATCH", 1)
    ran: list[bool] = []
    real = apply_mod._write

    def spy(cur, s, guarded, fast):
        if s.step == "insert":
            ran.append(fast)
        return real(cur, s, guarded, fast)

    monkeypatch.setattr(apply_mod, "_write", spy)
    fast = apply_shard(fast_store, planned.diff, reports, started_at=STARTED, quarantined=planned.quarantined)
    assert ran[0] is True and len(ran) > 1 and not any(ran[1:])
    guarded = apply_shard(guarded_store, planned.diff, reports, started_at=STARTED, quarantined=planned.quarantined,
                          fast_inserts=False)
    assert _outcome(fast) == _outcome(guarded)
    a, b = _store_rows(fast_store), _store_rows(guarded_store)
    for table in a:
        assert a[table] == b[table], table
