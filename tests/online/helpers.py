"""What the online path's tests share: a fixed clock, a query helper, a sibling scope."""

from __future__ import annotations

from datetime import UTC, datetime

from deep_sleep.core.scope import Scope

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


def rows(store, sql: str, *params) -> list[tuple]:
    with store.pg() as con:
        return con.execute(sql, params).fetchall()


def sibling(scope: Scope, id: str) -> Scope:
    return Scope.from_path([*scope.levels[:-1], (scope.levels[-1][0], id)])
