"""Which tables the backfill covers, read from the catalog: every table of the current schema with a
nullable ``scope_path``, a ``tenant_id`` and a one-column primary key, with its unique keys that
involve ``scope_path`` (the ones a backfilled row could collide under)."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from deep_sleep.jobs.backfill.values import TableInfo, UniqueKey
from deep_sleep.jobs.errors import BackfillError

_TABLES_SQL = """
SELECT c.oid, c.relname, a.attname, format_type(a.atttypid, a.atttypmod)
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = current_schema()
LEFT JOIN pg_index x ON x.indrelid = c.oid AND x.indisprimary
LEFT JOIN pg_attribute a ON a.attrelid = c.oid AND x.indnkeyatts = 1 AND a.attnum = x.indkey[0]
WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND EXISTS (SELECT 1 FROM pg_attribute s WHERE s.attrelid = c.oid AND s.attname = 'scope_path'
              AND NOT s.attnotnull AND NOT s.attisdropped)
  AND EXISTS (SELECT 1 FROM pg_attribute s WHERE s.attrelid = c.oid AND s.attname = 'tenant_id' AND NOT s.attisdropped)
ORDER BY c.relname
"""

_UNIQUE_SQL = r"""
SELECT i.relname, x.indnullsnotdistinct, pg_get_expr(x.indpred, x.indrelid, true),
       array(SELECT pg_get_indexdef(x.indexrelid, k, true) FROM generate_series(1, x.indnkeyatts) k ORDER BY k),
       x.indkey::int2[]
FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid
WHERE x.indrelid = %s AND x.indisunique AND NOT x.indisprimary AND x.indisvalid
  AND pg_get_indexdef(x.indexrelid) ~ '\mscope_path\M'
ORDER BY i.relname
"""


def discover_tables(con: psycopg.Connection, only: Sequence[str] | None = None) -> tuple[TableInfo, ...]:
    """The tables that can hold legacy rows (all of them, or ``only`` those named), from the catalog."""
    found = {name: (oid, pk, pk_type) for oid, name, pk, pk_type in con.execute(_TABLES_SQL)}
    names = list(only) if only else list(found)
    unknown = [n for n in names if n not in found]
    if unknown:
        raise BackfillError(f"cannot backfill {', '.join(unknown)}: not a table with a nullable scope_path and a "
                            f"tenant_id; the tables that have legacy rows are {', '.join(found) or 'none'}")
    out = []
    for name in names:
        oid, pk, pk_type = found[name]
        if pk is None:
            raise BackfillError(f"table {name} has no one-column primary key, which the backfill pages by; "
                                f"add one, or leave the table out (tables=[…])")
        cols = con.execute("SELECT attname, attnotnull FROM pg_attribute WHERE attrelid = %s AND attnum > 0 "
                           "AND NOT attisdropped ORDER BY attnum", (oid,)).fetchall()
        notnull = {c: nn for c, nn in cols}
        by_num = dict(con.execute("SELECT attnum, attname FROM pg_attribute WHERE attrelid = %s AND attnum > 0",
                                  (oid,)).fetchall())
        keys = []
        for iname, nnd, pred, exprs, indkey in con.execute(_UNIQUE_SQL, (oid,)):
            # a plain column may be NOT NULL; an expression may always be NULL.  scope_path is
            # compared against a computed, never-NULL target.
            nullable = tuple(e != "scope_path" and (num == 0 or not notnull[by_num[num]])
                             for e, num in zip(exprs, indkey, strict=False))
            keys.append(UniqueKey(iname, tuple(exprs), nullable, pred, bool(nnd)))
        out.append(TableInfo(name, pk, pk_type, tuple(c for c, _ in cols), tuple(keys)))
    return tuple(out)
