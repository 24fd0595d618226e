"""The online path's psycopg plumbing (deep_sleep/online/pg.py) on the real store."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from deep_sleep.online.pg import pipelined_transaction
from deep_sleep.online.recall import recall
from deep_sleep.online.turn import record_turn
from tests.online.helpers import NOW
from tests.storeutil import scalar


def test_one_round_trip_transactions_commit_roll_back_and_leave_the_connection_as_it_was(store, scope):
    """record_turn / recall / nap_snapshot send BEGIN and COMMIT themselves in pipeline mode on an
    idle connection: committed for other sessions; an error rolls all of it back; the connection's
    autocommit setting is restored; inside a caller's transaction the work is the caller's to commit."""
    for autocommit in (False, True):
        with psycopg.connect(store.dsn, autocommit=autocommit) as con:
            receipt = record_turn(con, scope, [{"op": "upsert_node", "label": f"project: rt {autocommit}"}], now=NOW, nap=False)
            assert con.autocommit is autocommit
            assert con.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE id = %s", receipt.ids("upsert_node")[0]) == 1
            assert recall(con, scope, f"project rt {autocommit}", k=1)
            assert con.autocommit is autocommit

            label = f"project: rolled back {autocommit}"
            with pytest.raises(psycopg.errors.DivisionByZero):
                with pipelined_transaction(con):
                    con.execute("INSERT INTO memory_nodes (id, scope_path, tenant_id, layer, label) VALUES (%s, %s, %s, 'semantic', %s)",
                                (str(uuid.uuid4()), scope.path, scope.tenant_id, label))
                    con.execute("SELECT 1 / 0")
            assert con.autocommit is autocommit and con.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            with pytest.raises(RuntimeError):
                with pipelined_transaction(con):
                    con.execute("INSERT INTO memory_nodes (id, scope_path, tenant_id, layer, label) VALUES (%s, %s, %s, 'semantic', %s)",
                                (str(uuid.uuid4()), scope.path, scope.tenant_id, label))
                    raise RuntimeError("the block failed")
            assert con.autocommit is autocommit and con.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
            assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE label = %s", label) == 0
            assert record_turn(con, scope, [{"op": "create_event", "content": "still usable"}], now=NOW, nap=False).landed

    with psycopg.connect(store.dsn) as con:  # inside the caller's transaction: a savepoint, the caller decides
        con.execute("SELECT 1")
        receipt = record_turn(con, scope, [{"op": "upsert_node", "label": "project: callers"}], now=NOW, nap=False)
        assert con.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        con.rollback()
    assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE id = %s", receipt.ids("upsert_node")[0]) == 0
