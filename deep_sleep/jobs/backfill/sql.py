"""The backfill's SQL: pure functions of a :class:`~deep_sleep.jobs.backfill.values.TableInfo`.

``%`` from the catalog is escaped for psycopg; parameters are psycopg's named ``%(name)s``.
"""

from __future__ import annotations

from deep_sleep.core.scope import MAX_PART
from deep_sleep.jobs.backfill.values import TableInfo

# What Scope accepts as an id (scope._check_part), as SQL: a row failing it is left alone.
VALID_TENANT_SQL = (f"coalesce(tenant_id <> '' AND char_length(tenant_id) <= {MAX_PART} "
                    r"AND tenant_id !~ '[\x01-\x1f\x7f-\x9f]', false)")


# Run in every batch transaction.  lock_timeout: a batch that cannot get a lock in time gives up
# and is retried.  No sequential or bitmap scans: the planner's statistics of legacy rows are stale
# while the backfill runs (by design), and a bitmap scan of "scope_path IS NULL" plus a sort -- or
# a hash join over a whole-table scan -- would cost O(rows left) per batch, O(n²) in all.
BATCH_SETTINGS = "SET LOCAL lock_timeout = {ms}; SET LOCAL enable_seqscan = off; SET LOCAL enable_bitmapscan = off"


def quote(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def _esc(fragment: str) -> str:
    return fragment.replace("%", "%%")


def _proposed_cols(info: TableInfo) -> list[str]:
    """Columns a proposed row needs: the key and tenant, and every column when unique keys are checked."""
    if info.unique_keys:
        return [c for c in info.columns if c != "scope_path"]
    return list(dict.fromkeys([info.pk, "tenant_id"]))


def _target(alias: str = "") -> str:
    return f"%(kind)s || chr(31) || {alias}tenant_id"


def clash_sql(info: TableInfo) -> str:
    """Rows of the CTE ``proposed`` (legacy rows with their target scope_path) that would break a
    unique key: against a row already in the table, or against a proposed row with a smaller
    key.  Columns: id, existing_id, index_name, target; at most one row per id."""
    pk, t = quote(info.pk), quote(info.name)
    parts = []
    for u in info.unique_keys:
        pred = _esc(u.predicate) if u.predicate else "true"
        keys = [_esc(k) for k in u.keys]
        sel = ", ".join(f"{k} AS k{i}" for i, k in enumerate(keys))
        conds = []
        for i, (k, nullable) in enumerate(zip(keys, u.nullable, strict=True)):
            eq = f"{k} = p.k{i}"
            conds.append(f"({eq} OR ({k} IS NULL AND p.k{i} IS NULL))" if nullable and u.nulls_not_distinct else eq)
        name = _esc(u.name).replace("'", "''")
        parts.append(f"""
    SELECT p.id, o.id AS existing_id, '{name}'::text AS index_name, p.scope_path AS target
    FROM (SELECT {pk} AS id, scope_path, {sel} FROM proposed WHERE {pred}) p
    JOIN LATERAL (SELECT {pk} AS id FROM {t} WHERE ({pred}) AND {' AND '.join(conds)} LIMIT 1) o ON true""")
        distinct_nulls = "" if u.nulls_not_distinct else "".join(
            f" AND {k} IS NOT NULL" for k, n in zip(keys, u.nullable, strict=True) if n)
        groups = ", ".join(f"k{i}" for i in range(len(keys)))
        parts.append(f"""
    SELECT id, existing_id, '{name}'::text, target FROM (
        SELECT id, scope_path AS target, first_value(id) OVER (PARTITION BY {groups} ORDER BY id) AS existing_id
        FROM (SELECT {pk} AS id, scope_path, {sel} FROM proposed WHERE ({pred}){distinct_nulls}) q) w
    WHERE id <> existing_id""")
    if not parts:
        return f"SELECT NULL::{info.pk_type} AS id, NULL::{info.pk_type} AS existing_id, NULL::text AS index_name, " \
               f"NULL::text AS target WHERE false"
    return "SELECT DISTINCT ON (id) * FROM (" + "\n    UNION ALL".join(parts) + "\n) u ORDER BY id, index_name"


def batch_sql(info: TableInfo, *, first: bool) -> str:
    """One batch as one statement: lock the next free legacy rows in key order, write the paths of
    those that neither collide nor have an invalid tenant, record those that do, advance the
    checkpoint.  Parameters: kind, job, table, limit, and after (unless ``first``).  Returns one
    row: locked, done, clashes (json), invalid (json), last_key, finished, rows_done of the job.

    Every access is by key for at most ``limit`` rows: the partial index in key order, the primary
    key, the unique indexes.  The rows were locked while still without a path, so the UPDATE
    needs no second look at scope_path.  (:data:`BATCH_SETTINGS` keep the planner on that path.)
    """
    pk, t = quote(info.pk), quote(info.name)
    cols = _proposed_cols(info)
    after = "" if first else f" AND x.{pk} > %(after)s::{info.pk_type}"
    lock_cols = ", ".join(f"x.{quote(c)}" for c in cols)
    prop_cols = ", ".join(quote(c) for c in cols)
    return f"""
WITH locked AS (
    SELECT {lock_cols} FROM {t} x
    WHERE x.scope_path IS NULL{after}
    ORDER BY x.{pk} LIMIT %(limit)s
    FOR UPDATE OF x SKIP LOCKED
), proposed AS (
    SELECT {prop_cols}, {_target()} AS scope_path FROM locked WHERE {VALID_TENANT_SQL}
), clash AS (
    {clash_sql(info)}
), invalid AS (
    SELECT {pk} AS id FROM locked WHERE NOT {VALID_TENANT_SQL}
), done AS (
    UPDATE {t} x SET scope_path = {_target("x.")}
    WHERE x.{pk} = ANY(ARRAY(SELECT {pk} FROM proposed p WHERE NOT EXISTS (SELECT 1 FROM clash c WHERE c.id = p.{pk})))
    RETURNING 1
), noted AS (
    INSERT INTO scope_backfill_conflicts (job, table_name, row_id, reason, existing_id, target_path, index_name)
    SELECT %(job)s, %(table)s, id::text, 'collision', existing_id::text, target, index_name FROM clash
    UNION ALL
    SELECT %(job)s, %(table)s, id::text, 'invalid_tenant_id', NULL, NULL, NULL FROM invalid
    ON CONFLICT DO NOTHING
), cp AS (
    UPDATE scope_backfill_checkpoints SET
        last_key = coalesce((SELECT l.{pk} FROM locked l ORDER BY l.{pk} DESC LIMIT 1)::text, last_key),
        rows_done = rows_done + (SELECT count(*) FROM done),
        batches = batches + 1,
        updated_at = now(),
        finished_at = CASE WHEN (SELECT count(*) FROM locked) < %(limit)s THEN now() END
    WHERE job = %(job)s AND table_name = %(table)s
    RETURNING last_key, finished_at IS NOT NULL AS finished, rows_done
)
SELECT (SELECT count(*) FROM locked), (SELECT count(*) FROM done),
       (SELECT coalesce(json_agg(json_build_array(id::text, existing_id::text, target, index_name)), '[]') FROM clash),
       (SELECT coalesce(json_agg(id::text), '[]') FROM invalid),
       cp.last_key, cp.finished, cp.rows_done
FROM cp
"""


def legacy_conflicts_sql(info: TableInfo) -> str:
    """Every row still without a path that the backfill cannot give one (set-based; read only).
    Columns: row_id, reason, existing_id, target_path, index_name."""
    pk, t = quote(info.pk), quote(info.name)
    prop_cols = ", ".join(quote(c) for c in _proposed_cols(info))
    return f"""
WITH proposed AS (
    SELECT {prop_cols}, {_target()} AS scope_path FROM {t} WHERE scope_path IS NULL AND {VALID_TENANT_SQL}
), clash AS (
    {clash_sql(info)}
)
SELECT id::text, 'collision', existing_id::text, target, index_name FROM clash
UNION ALL
SELECT {pk}::text, 'invalid_tenant_id', NULL, NULL, NULL FROM {t} WHERE scope_path IS NULL AND NOT {VALID_TENANT_SQL}
ORDER BY 1
"""
