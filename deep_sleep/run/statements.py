"""The statements that apply a diff, as values (dlt's ``sql_jobs`` shape; SPEC §2 step 4).

:func:`statements` turns a diff into the whole ordered list of :class:`Statement` values one
apply runs in one transaction — including how each table's rows reach Postgres — with no
connection, clock or environment.  :func:`deep_sleep.run.apply.apply_diff` only executes the
list; ``deep-sleep replay … --explain`` prints it (:func:`explain`); the golden files under
``tests/run/golden_sql/`` pin it.  The order:

1. ``DISCARD TEMP`` (staging tables of an earlier apply on this pooled connection) when anything
   is staged; ``SET LOCAL work_mem`` for a diff of :data:`BIG_DIFF_ROWS` rows or more.
2. ``pg_advisory_xact_lock`` on the scope: one apply per scope at a time.
3. Staging, when the diff is not inline (below): every (table, kind) into a temporary table.
4. Deletes, guarded by ``version = expected_version``; before-images go to
   ``consolidation_archive`` in the same statement.  Edges listed for deletion because a node
   went with them stay when that node's own delete was skipped.  Node deletes run first.
5. Updates, one write per row (all phases' changes folded), guarded the same way; only the
   changed columns are set, ``updated_at`` is left alone.
6. Inserts with ``ON CONFLICT DO NOTHING``.
7. The quarantined rows, if any, into ``consolidation_quarantine``; the ledger row in
   ``consolidation_runs``.

Data sources (:data:`SOURCES`): a diff of at most :data:`SMALL_STAGE_ROWS` rows (a quick nap's)
is read by each write from a JSON parameter (``inline_json``: no staging tables to create, none
to discard).  A bigger one is staged first; a table of at most ``SMALL_STAGE_ROWS`` rows from one
JSON parameter (``json_temp_table``, one round trip), a bigger one by ADBC's Arrow → COPY ingest
(``adbc_copy``, ~3 ms a table in round trips but streaming); the writes then read the staged
tables (``staged_table``).

A row a live writer changed after the snapshot fails the guard, is left as the writer left it,
and is counted in ``conflicts``; the next run sees it again.  Every write also filters on
``scope_path = $1``: a diff can never touch another scope's rows.

    >>> from deep_sleep.core.diff import Diff
    >>> [s.step for s in statements(Diff.empty(), "org\\x1fa", "run-id")]
    ['lock', 'ledger']
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

import polars as pl

from deep_sleep.core import tables
from deep_sleep.core.diff import Diff, _fold_updates
from deep_sleep.core.errors import ConfigError
from deep_sleep.core.scope import Scope

KEY_COLUMNS = ("id", "expected_version", "phase")
SMALL_STAGE_ROWS = 2_000  # up to this many rows a staged table travels as one JSON parameter
BIG_DIFF_ROWS = 10_000  # below this the default work_mem does (and a quick nap saves the round trip)
DEFAULT_WORK_MEM = "256MB"

#: How a statement's rows reach Postgres (``{staged}``: the temporary table).
SOURCES = {
    "inline_json": "inline JSON parameter",
    "json_temp_table": "JSON parameter into temporary table {staged}",
    "adbc_copy": "ADBC COPY of an Arrow table into temporary table {staged}",
    "staged_table": "read from temporary table {staged} (staged above)",
    "": "no rows",
}
WRITES = ("delete", "update", "insert")  # the steps whose one-count result is the rows applied
_WRITE_OF_KIND = {"deletes": "delete", "updates": "update", "inserts": "insert"}

LEDGER_SQL = (
    "INSERT INTO consolidation_runs (run_id, scope_path, mode, as_of, started_at, finished_at, status, counters,"
    " phases_run, phases_skipped, timings, rows_changed, conflicts, diff_hash, snapshot_uri, diff_uri, errors,"
    " quarantined, recall_before, recall_after)"
    " VALUES ($1::uuid, $2, $3, $4, $5, now(), $6, $7::jsonb, $8::jsonb, $9::jsonb, $10::jsonb, $11::jsonb, $12,"
    " $13, $14, $15, $16::jsonb, $17::jsonb, $18::float8, $19::float8)"
)

QUARANTINE_SQL = (
    "WITH done AS (INSERT INTO consolidation_quarantine (run_id, scope_path, table_name, row_id, reason, row)"
    " SELECT $1::uuid, $2, s.table, s.id, s.reason, s.row::jsonb FROM _ds_quarantine s RETURNING 1)"
    " SELECT count(*) FROM done"
)
LOCK_SQL = "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))"


@dataclass(frozen=True, eq=False)
class Rows:
    """Rows a statement is fed, kept as a frame until the executor sends them (one JSON text, or Arrow).

    Compared by value (:meth:`polars.DataFrame.equals`), so equal diffs give equal statement lists."""

    frame: pl.DataFrame

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Rows) and self.frame.equals(other.frame)

    __hash__ = None  # type: ignore[assignment]  # frames are not hashable

    def __repr__(self) -> str:
        return f"Rows({self.frame.height} × {', '.join(self.frame.columns)})"

    def describe(self, as_arrow: bool = False) -> str:
        what = "Arrow table" if as_arrow else "JSON array"
        return f"{what} of {self.frame.height} row(s): {', '.join(self.frame.columns)}"


@dataclass(frozen=True)
class Statement:
    """One statement of an apply, in execution order.

    step: ``discard_temp`` | ``work_mem`` | ``lock`` | ``stage`` | ``delete`` | ``update`` |
        ``insert`` | ``quarantine`` | ``ledger``.
    sql: the SQL text, or None for an ADBC ingest of ``params[0]`` into the temporary table ``staged``.
    params: positional parameters ``$1, $2, …``: strings, and :class:`Rows` (sent as one JSON text
        each; an ingest sends them as Arrow).  The ledger's parameters are the run's outcome, so the
        executor binds them from the report after the writes (``params`` is empty there).
    table: the store table the rows belong to (``consolidation_quarantine``, ``consolidation_runs``
        for the last two steps); None for the session statements.
    kind: ``inserts`` | ``updates`` | ``deletes`` for stage and write steps, else None.
    source: how the rows reach Postgres, a key of :data:`SOURCES` (``""``: no rows).
    staged: the temporary table a ``stage`` creates or a write reads, else None.
    rows: the rows fed; for a write, rows applied + rows skipped as conflicts.
    """

    step: str
    sql: str | None
    params: tuple = ()
    table: str | None = None
    kind: str | None = None
    source: str = ""
    staged: str | None = None
    rows: int = 0

    @property
    def is_write(self) -> bool:
        return self.step in WRITES


def stage_name(table: str, kind: str) -> str:
    return f"_ds_{table}_{kind}"


def check_work_mem(value: str | None) -> str:
    """``value`` (``DEEP_SLEEP_APPLY_WORK_MEM``) as a ``work_mem`` size, :data:`DEFAULT_WORK_MEM` when unset."""
    value = (DEFAULT_WORK_MEM if value is None else value).strip()
    if not re.fullmatch(r"\d+\s*(kB|MB|GB)", value):
        raise ConfigError(f"DEEP_SLEEP_APPLY_WORK_MEM={value!r}: expected a size such as 256MB or 1GB")
    return value


def delete_sql(table: str, nodes_deleted: bool = False, source: str | None = None, node_source: str | None = None) -> str:
    """Guarded delete with archive; parameters $1 scope_path, $2 run_id.  Returns one count.

    ``nodes_deleted``: node deletes are staged too, so edges listed with a node whose own delete
    was skipped (a conflict) are kept.  ``source`` / ``node_source``: where the staged rows are read
    from instead of the staging tables (see :func:`json_source`).
    """
    stage = source or stage_name(table, "deletes")
    kept, keep_incident = "", ""
    if table == "memory_edges" and nodes_deleted:
        # Node deletes ran first: a staged node this run did not archive was skipped as a conflict.
        # (Read from the run's own archive rows, not by probing memory_nodes: bounded by the diff.)
        kept = (f"kept AS (SELECT nd.id::uuid AS id FROM {node_source or stage_name('memory_nodes', 'deletes')} nd"
                f" WHERE NOT EXISTS (SELECT 1 FROM consolidation_archive a WHERE a.run_id = $2::uuid"
                f" AND a.table_name = 'memory_nodes' AND a.op = 'delete' AND a.row_id = nd.id::uuid::text)), ")
        keep_incident = (" AND NOT EXISTS (SELECT 1 FROM kept k WHERE k.id = t.source_id)"
                         " AND NOT EXISTS (SELECT 1 FROM kept k WHERE k.id = t.target_id)")
    return (
        f"WITH {kept}gone AS (DELETE FROM {table} t USING {stage} s"
        f" WHERE t.id = s.id::uuid AND t.scope_path = $1 AND {VERSION_GUARD}{keep_incident}"
        f" RETURNING t.*, s.reason AS _ds_reason),"
        f" archived AS (INSERT INTO consolidation_archive (run_id, table_name, row_id, op, reason, row)"
        f" SELECT $2::uuid, '{table}', gone.id::text, 'delete', gone._ds_reason, to_jsonb(gone) - '_ds_reason' FROM gone"
        f" RETURNING 1)"
        f" SELECT count(*) AS n FROM archived"
    )


# A null expected_version comes from a hand-written snapshot of a table without `version` (SPEC §8):
# the row is then guarded on existence only (the join on its identity).
VERSION_GUARD = "(s.expected_version IS NULL OR t.version = s.expected_version)"


def update_sql(table: str, changed: list[str], source: str | None = None) -> str:
    """Guarded update of the changed columns; parameters $1 scope_path.  Returns one count.

    ``soul_profiles`` is identified by (scope_path, key) (SPEC §1): rows that carry ``key`` are
    matched by it (the id of a hand-written snapshot's profile may be a stand-in), others by id.
    """
    cols = tables.columns(table)
    by_key = table == "soul_profiles" and "key" in changed
    changed = [c for c in changed if not (by_key and c == "key")]
    sets = ", ".join(f"{c} = COALESCE({cols[c].cast_sql('s.' + c)}, t.{c})" for c in changed)
    match = "(CASE WHEN s.key IS NOT NULL THEN t.key = s.key ELSE t.id = s.id::uuid END)" if by_key else "t.id = s.id::uuid"
    return (
        f"WITH done AS (UPDATE {table} t SET {sets} FROM {source or stage_name(table, 'updates')} s"
        f" WHERE {match} AND t.scope_path = $1 AND {VERSION_GUARD} RETURNING 1)"
        f" SELECT count(*) AS n FROM done"
    )


def insert_sql(table: str, present: list[str], source: str | None = None) -> str:
    """Insert staged rows, skipping any that collide with a live write; returns one count."""
    cols = tables.columns(table)
    names = ", ".join(present)
    values = ", ".join(cols[c].cast_sql("s." + c) for c in present)
    return (
        f"WITH done AS (INSERT INTO {table} ({names}) SELECT {values} FROM {source or stage_name(table, 'inserts')} s"
        f" WHERE s.scope_path = $1 ON CONFLICT DO NOTHING RETURNING 1)"
        f" SELECT count(*) AS n FROM done"
    )


# Postgres types of staged columns — the types ADBC's ingest gives the same Arrow columns.
_STAGE_TYPES: dict[pl.DataType, str] = {
    pl.String(): "text", pl.Int64(): "bigint", pl.Int32(): "integer", pl.Float64(): "double precision",
    pl.Float32(): "real", pl.Boolean(): "boolean", tables.TS: "timestamptz", pl.List(pl.Float64()): "double precision[]",
    pl.Array(pl.Float32(), tables.EMBEDDING_DIM): "real[]",
}


def json_source(schema: pl.Schema, param: int) -> str | None:
    """A subquery over the rows of a JSON array parameter (``$param``), typed as ADBC's ingest types
    the same columns — or None when a column has a type this path does not know."""
    types = [_STAGE_TYPES.get(dtype) for dtype in schema.values()]
    if None in types:
        return None
    cols = ", ".join(f'"{c}" {t}' for c, t in zip(schema, types, strict=True))
    return f"(SELECT * FROM jsonb_to_recordset(${param}::jsonb) AS x({cols}))"


def stage_sql(name: str, schema: pl.Schema) -> str | None:
    """``CREATE TEMP TABLE name AS`` the rows of a JSON array parameter ($1), or None (see :func:`json_source`)."""
    source = json_source(schema, 1)
    return None if source is None else f"CREATE TEMP TABLE {name} AS SELECT * FROM {source} s"


def stage_statement(name: str, body: pl.DataFrame, small_rows: int = SMALL_STAGE_ROWS,
                    table: str | None = None, kind: str | None = None) -> Statement:
    """Stage ``body`` as the temporary table ``name``: a frame of at most ``small_rows`` rows as one
    statement with a JSON parameter (ADBC's ingest costs ~3 ms a table in round trips), a bigger one
    (or one with a type the JSON path does not know) through ADBC's COPY."""
    sql = stage_sql(name, body.schema) if body.height <= small_rows else None
    source = "adbc_copy" if sql is None else "json_temp_table"
    return Statement("stage", sql, (Rows(body),), table=table, kind=kind, source=source, staged=name, rows=body.height)


def _collapse_updates(table: str, updates: pl.DataFrame) -> pl.DataFrame:
    """One row per id: the last non-null value of each column over the phases (FACTS: one write per row)."""
    data = [c for c in updates.columns if c not in KEY_COLUMNS]
    keys = updates.group_by("id", maintain_order=True).agg(pl.col("expected_version").first())
    return _fold_updates(keys.with_columns(pl.lit(None, dtype=updates.schema[c]).alias(c) for c in data), updates.drop("expected_version"))


def _bodies(diff: Diff) -> dict[tuple[str, str], pl.DataFrame]:
    """(table, kind) → the rows to stage: updates collapsed to one row per id, no ``phase`` column."""
    out = {}
    for table, td in diff.tables.items():
        for kind, frame in td.frames().items():
            if frame.height:
                if kind == "updates":
                    frame = _collapse_updates(table, frame)
                out[(table, kind)] = frame.drop("phase") if "phase" in frame.columns else frame
    return out


def _write(table: str, kind: str, body: pl.DataFrame, scope_path: str, run_id: str, inline: bool,
           node_deletes: pl.DataFrame | None) -> Statement:
    """The guarded write of one (table, kind), reading its rows inline or from its staged table."""
    staged = None if inline else stage_name(table, kind)
    source = "inline_json" if inline else "staged_table"
    if kind == "deletes":
        params: tuple = (scope_path, run_id)
        src = node_src = None
        if inline:
            src, params = json_source(body.schema, 3), (*params, Rows(body))
            if table == "memory_edges" and node_deletes is not None:
                node_src, params = json_source(node_deletes.schema, 4), (*params, Rows(node_deletes))
        sql = delete_sql(table, node_deletes is not None, source=src, node_source=node_src)
    elif kind == "updates":
        changed = [c for c in body.columns if c not in KEY_COLUMNS]
        sql = update_sql(table, changed, json_source(body.schema, 2) if inline else None)
        params = (scope_path, Rows(body)) if inline else (scope_path,)
    else:
        present = [c for c in body.columns if c in tables.columns(table)]
        sql = insert_sql(table, present, json_source(body.schema, 2) if inline else None)
        params = (scope_path, Rows(body)) if inline else (scope_path,)
    return Statement(_WRITE_OF_KIND[kind], sql, params, table=table, kind=kind, source=source, staged=staged,
                     rows=body.height)


def statements(
    diff: Diff,
    scope: Scope | str,
    run_id: str,
    *,
    quarantined: pl.DataFrame | None = None,
    small_rows: int = SMALL_STAGE_ROWS,
    big_rows: int = BIG_DIFF_ROWS,
    work_mem: str | None = None,
) -> tuple[Statement, ...]:
    """Every statement that applies ``diff`` to ``scope`` (a :class:`Scope` or its stored
    ``scope_path``) as run ``run_id``, in order — pure: same arguments, equal list.

    ``quarantined``: rows set aside from the snapshot (table, id, reason, row JSON), recorded with
    the run.  ``small_rows`` / ``big_rows``: the thresholds of the inline and ``work_mem`` choices
    (module defaults).  ``work_mem``: the ``DEEP_SLEEP_APPLY_WORK_MEM`` value; checked only when a
    diff is big enough to use it (:class:`~deep_sleep.core.errors.ConfigError` if malformed).
    """
    scope_path = scope.path if isinstance(scope, Scope) else scope
    bodies = _bodies(diff)
    rows = sum(b.height for b in bodies.values())
    inline = rows <= small_rows and all(json_source(b.schema, 0) is not None for b in bodies.values())
    has_quarantine = quarantined is not None and quarantined.height > 0
    out: list[Statement] = []
    if not inline or has_quarantine:
        out.append(Statement("discard_temp", "DISCARD TEMP"))
    if rows >= big_rows:
        # Hash joins of many staged rows against a big scope spill to disk at the default 4 MB.
        out.append(Statement("work_mem", f"SET LOCAL work_mem = '{check_work_mem(work_mem)}'"))
    out.append(Statement("lock", LOCK_SQL, (scope_path,)))
    if not inline:  # stage everything first, then mutate: the mutations then run back to back
        out += [stage_statement(stage_name(table, kind), body, small_rows, table, kind) for (table, kind), body in bodies.items()]
    order = sorted(bodies, key=lambda tk: (("deletes", "updates", "inserts").index(tk[1]), tk[0] != "memory_nodes", tk[0]))
    node_deletes = bodies.get(("memory_nodes", "deletes"))
    out += [_write(table, kind, bodies[(table, kind)], scope_path, run_id, inline, node_deletes) for table, kind in order]
    if has_quarantine:
        out.append(Statement("quarantine", None, (Rows(quarantined),), table="consolidation_quarantine",
                             source="adbc_copy", staged="_ds_quarantine", rows=quarantined.height))
        out.append(Statement("quarantine", QUARANTINE_SQL, (run_id, scope_path), table="consolidation_quarantine",
                             source="staged_table", staged="_ds_quarantine", rows=quarantined.height))
    out.append(Statement("ledger", LEDGER_SQL, table="consolidation_runs"))
    return tuple(out)


def _param(value: object, as_arrow: bool) -> str:
    return value.describe(as_arrow) if isinstance(value, Rows) else repr(value)


def explain(stmts: Iterable[Statement]) -> str:
    """The statements as SQL text, each under a comment naming its step, table, kind, rows, data
    source and parameters — what ``replay --explain`` prints and the golden files hold."""
    parts = []
    for i, s in enumerate(stmts, 1):
        what = ".".join(x for x in (s.table, s.kind) if x)
        head = f"-- {i}. {s.step}" + (f" {what}" if what else "")
        if s.source:
            head += f": {s.rows} row(s), {SOURCES[s.source].format(staged=s.staged)}"
        lines = [head]
        if s.step == "ledger":
            lines.append("-- params: $1…$19 bound from the run's report after the writes (rows_changed, conflicts)")
        elif s.params:
            lines += [f"-- ${n} = {_param(p, s.sql is None)}" for n, p in enumerate(s.params, 1)]
        if s.sql is None:
            lines.append(f"-- (no SQL: ADBC ingest of $1 into TEMPORARY TABLE {s.staged})")
        else:
            lines.append(s.sql + ";")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"
