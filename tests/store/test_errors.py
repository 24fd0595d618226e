"""Transient vs terminal, decided on real errors of the real store (psycopg and ADBC).

Each error below is provoked for real: two connections racing a row, a lock held by another
connection, a connection closed or terminated under us, a duplicate primary key.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import psycopg.errors
import pytest

from deep_sleep.core.errors import ConfigError, DeepSleepError, InputError, ScopeError
from deep_sleep.core.scope import Scope
from deep_sleep.store.errors import StoreError, StoreUnavailable, is_transient, sqlstate


@pytest.fixture
def probe(store) -> Iterator[str]:
    """A one-row table of its own: ``id int primary key, v int``."""
    name = f"probe_{uuid.uuid4().hex[:10]}"
    with store.pg(autocommit=True) as con:
        con.execute(f"CREATE TABLE {name} (id int PRIMARY KEY, v int)")
        con.execute(f"INSERT INTO {name} VALUES (1, 0)")
    yield name
    with store.pg(autocommit=True) as con:
        con.execute(f"DROP TABLE {name}")


def _raised(fn) -> BaseException:
    try:
        fn()
    except BaseException as exc:  # noqa: BLE001 - the error is the result
        return exc
    raise AssertionError("expected an error")


def test_a_serialization_failure_is_transient(store, probe):
    with store.pg() as a, store.pg(autocommit=True) as b:
        a.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        a.execute(f"SELECT v FROM {probe} WHERE id = 1").fetchone()  # a's snapshot is taken
        b.execute(f"UPDATE {probe} SET v = v + 1 WHERE id = 1")
        exc = _raised(lambda: a.execute(f"UPDATE {probe} SET v = v + 10 WHERE id = 1"))
        a.rollback()
    assert isinstance(exc, psycopg.errors.SerializationFailure) and sqlstate(exc) == "40001"
    assert is_transient(exc)


def test_a_lock_timeout_is_transient(store, probe):
    with store.pg() as holder, store.pg() as waiter:
        holder.execute(f"SELECT v FROM {probe} WHERE id = 1 FOR UPDATE")  # holds the row lock, transaction open
        waiter.execute("SET lock_timeout = '50ms'")
        exc = _raised(lambda: waiter.execute(f"UPDATE {probe} SET v = 1 WHERE id = 1"))
        waiter.rollback()
        holder.rollback()
    assert isinstance(exc, psycopg.errors.LockNotAvailable) and sqlstate(exc) == "55P03"
    assert is_transient(exc)


def test_a_closed_connection_is_transient(store):
    con = store.pg()
    con.close()
    exc = _raised(lambda: con.execute("SELECT 1"))
    assert isinstance(exc, psycopg.OperationalError) and sqlstate(exc) is None
    assert is_transient(exc)


def test_a_connection_terminated_by_the_server_is_transient(store):
    with store.pg(autocommit=True) as victim, store.pg(autocommit=True) as admin:
        pid = victim.execute("SELECT pg_backend_pid()").fetchone()[0]
        admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
        exc = _raised(lambda: victim.execute("SELECT 1"))
    assert isinstance(exc, psycopg.OperationalError)  # AdminShutdown (57P01), or a lost connection without SQLSTATE
    assert is_transient(exc)


def test_a_unique_violation_is_terminal(store, probe):
    with store.pg() as con:
        exc = _raised(lambda: con.execute(f"INSERT INTO {probe} VALUES (1, 1)"))
        con.rollback()
    assert isinstance(exc, psycopg.errors.UniqueViolation) and sqlstate(exc) == "23505"
    assert not is_transient(exc)


def test_our_input_errors_and_plain_errors_are_terminal():
    scope_error = _raised(lambda: Scope.parse("org"))
    assert isinstance(scope_error, ScopeError) and isinstance(scope_error, DeepSleepError)
    for exc in (scope_error, InputError("bad"), ConfigError("bad"), StoreError("not migrated"), ValueError("bad"),
                RuntimeError("bug"), None):
        assert not is_transient(exc), exc
    assert is_transient(StoreUnavailable("try later"))


def test_an_error_raised_from_a_transient_one_is_transient(store):
    con = store.pg()
    con.close()
    try:
        try:
            con.execute("SELECT 1")
        except psycopg.OperationalError as exc:
            raise StoreError("lost the store while extracting") from exc
    except StoreError as wrapped:
        assert is_transient(wrapped)


def test_adbc_errors_carry_a_sqlstate_and_are_classified_by_it(store, probe):
    import adbc_driver_postgresql.dbapi as adbc

    with store.pg() as holder, adbc.connect(store.dsn) as con:
        holder.execute(f"SELECT v FROM {probe} WHERE id = 1 FOR UPDATE")
        with con.cursor() as cur:
            cur.execute("SET lock_timeout = '50ms'")
            timeout = _raised(lambda: cur.execute(f"UPDATE {probe} SET v = 2 WHERE id = 1"))
        con.rollback()
        holder.rollback()
        with con.cursor() as cur:
            duplicate = _raised(lambda: cur.execute(f"INSERT INTO {probe} VALUES (1, 1)"))
        con.rollback()
    assert not isinstance(timeout, psycopg.Error) and sqlstate(timeout) == "55P03"
    assert is_transient(timeout)
    assert sqlstate(duplicate) == "23505"
    assert not is_transient(duplicate)
