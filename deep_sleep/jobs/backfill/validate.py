"""The end-of-backfill check, set-based over whole tables: rows left without a path, rows whose
path's root id is not their tenant_id, and the conflicts that explain the rows left."""

from __future__ import annotations

from collections.abc import Sequence

import psycopg

from deep_sleep.jobs.backfill.catalog import discover_tables
from deep_sleep.jobs.backfill.sql import legacy_conflicts_sql, quote
from deep_sleep.jobs.backfill.values import (
    LEGACY_KIND,
    LIST_LIMIT,
    Conflict,
    Mismatch,
    ValidationOutcome,
    conflicts_of,
)


def validate_backfill(dsn: str, *, tables: Sequence[str] | None = None, limit: int = LIST_LIMIT) -> ValidationOutcome:
    """Check the whole store, set-based: rows without a path, rows whose path's tenant differs, conflicts."""
    without: dict[str, int] = {}
    without_ids: dict[str, tuple[str, ...]] = {}
    mismatches: dict[str, int] = {}
    mismatch_rows: list[Mismatch] = []
    conflicts: list[Conflict] = []
    with psycopg.connect(dsn) as con:
        con.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        for info in discover_tables(con, tables):
            t, pk = quote(info.name), quote(info.pk)
            moved = "scope_path IS NOT NULL AND split_part(scope_path, chr(31), 2) IS DISTINCT FROM tenant_id"
            n_null, n_moved = con.execute(f"SELECT count(*) FILTER (WHERE scope_path IS NULL), count(*) FILTER "
                                          f"(WHERE {moved}) FROM {t}").fetchone()
            without[info.name], mismatches[info.name] = n_null, n_moved
            found: list[Conflict] = []
            if n_null:
                found = conflicts_of(info.name, con.execute(legacy_conflicts_sql(info), {"kind": LEGACY_KIND}).fetchall())
                explained = [c.row_id for c in found]
                without_ids[info.name] = tuple(r[0] for r in con.execute(
                    f"SELECT {pk}::text FROM {t} WHERE scope_path IS NULL AND NOT ({pk}::text = ANY(%s)) "
                    f"ORDER BY {pk} LIMIT %s", (explained, limit)))
            conflicts += found
            if n_moved:
                mismatch_rows += [Mismatch(info.name, *r) for r in con.execute(
                    f"SELECT {pk}::text, scope_path, tenant_id FROM {t} WHERE {moved} ORDER BY {pk} LIMIT %s", (limit,))]
        con.rollback()
    ok = not any(without.values()) and not any(mismatches.values())
    return ValidationOutcome(ok, without, without_ids, tuple(conflicts), mismatches, tuple(mismatch_rows))
