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

import json
from collections.abc import Iterable
from dataclasses import dataclass

import polars as pl

from deep_sleep.core import tables
from deep_sleep.core.config import work_mem_size
from deep_sleep.core.diff import Diff, _fold_updates
from deep_sleep.core.errors import InputError
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

    step: ``discard_temp`` | ``work_mem`` | ``lock`` | ``stage`` | ``planner`` | ``delete`` | ``update`` |
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
    fast_sql: for a shard's insert, its fast path (:func:`shard_fast_insert_sql`), which an executor
        may run instead of ``sql`` and then read the counts with :data:`SHARD_LANDED_SQL`; ``sql`` is
        the statement whose result is the contract, and any executor may run it alone.
    """

    step: str
    sql: str | None
    params: tuple = ()
    table: str | None = None
    kind: str | None = None
    source: str = ""
    staged: str | None = None
    rows: int = 0
    fast_sql: str | None = None

    @property
    def is_write(self) -> bool:
        return self.step in WRITES


def stage_name(table: str, kind: str) -> str:
    return f"_ds_{table}_{kind}"


def check_work_mem(value: str | None) -> str:
    """``value`` (``DEEP_SLEEP_APPLY_WORK_MEM``) as a ``work_mem`` size, :data:`DEFAULT_WORK_MEM` when unset."""
    return work_mem_size(value, "DEEP_SLEEP_APPLY_WORK_MEM", DEFAULT_WORK_MEM)


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


def _update_parts(table: str, changed: list[str]) -> tuple[str, str]:
    """The SET list (a null leaves the stored value) and the row match of a guarded update:
    ``soul_profiles`` rows that carry ``key`` match by it, other rows by id."""
    cols = tables.columns(table)
    by_key = table == "soul_profiles" and "key" in changed
    changed = [c for c in changed if not (by_key and c == "key")]
    sets = ", ".join(f"{c} = COALESCE({cols[c].cast_sql('s.' + c)}, t.{c})" for c in changed)
    match = "(CASE WHEN s.key IS NOT NULL THEN t.key = s.key ELSE t.id = s.id::uuid END)" if by_key else "t.id = s.id::uuid"
    return sets, match


def update_sql(table: str, changed: list[str], source: str | None = None) -> str:
    """Guarded update of the changed columns; parameters $1 scope_path.  Returns one count.

    ``soul_profiles`` is identified by (scope_path, key) (SPEC §1): rows that carry ``key`` are
    matched by it (the id of a hand-written snapshot's profile may be a stand-in), others by id.
    """
    sets, match = _update_parts(table, changed)
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
        if s.step == "ledger" and s.sql == SHARD_LEDGER_SQL:
            lines.append("-- params: $1 = the ledger rows (JSON), bound from the reports after the writes (rows_changed, conflicts)")
        elif s.step == "ledger":
            lines.append("-- params: $1…$19 bound from the run's report after the writes (rows_changed, conflicts)")
        elif s.params:
            lines += [f"-- ${n} = {_param(p, s.sql is None)}" for n, p in enumerate(s.params, 1)]
        if s.sql is None:
            lines.append(f"-- (no SQL: ADBC ingest of $1 into TEMPORARY TABLE {s.staged})")
        else:
            lines.append(s.sql + ";")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


# -- many scopes in one transaction (SPEC §2 "Scale"; issue 12 item 6) ------------------------------
#
# A batch of a shard's scopes is applied by one transaction whose statements mirror the single-scope
# ones above, with two differences: every row carries its own ``scope_path`` (and, where the archive or
# the quarantine needs it, its scope's run id in ``_ds_run_id``), and every write joins on it — a row
# only ever matches a store row of its own scope — and returns ``(scope_path, n)`` rows, so rows
# applied and conflicts are counted per scope.  The single-scope statements' SQL is left as it is.

RUN_ID_COLUMN = "_ds_run_id"  # each staged delete / quarantined row's own scope's run id
SIGNATURE_COLUMN = "_ds_sig"  # which columns an inserted row's scope gives values for (see shard_bodies)
SHARD_LOCK_SQL = (
    "SELECT count(pg_advisory_xact_lock(hashtextextended(_s.p, 0)))"
    " FROM jsonb_array_elements_text($1::jsonb) WITH ORDINALITY AS _s(p, i)"
)
SHARD_QUARANTINE_SQL = (
    "WITH done AS (INSERT INTO consolidation_quarantine (run_id, scope_path, table_name, row_id, reason, row)"
    f" SELECT s.{RUN_ID_COLUMN}::uuid, s.scope_path, s.table, s.id, s.reason, s.row::jsonb FROM _ds_shard_quarantine s"
    " RETURNING 1) SELECT count(*) FROM done"
)
#: One ledger row per scope of the batch from one JSON array parameter ($1) of the rows.
LEDGER_FIELDS = (("run_id", "uuid"), ("scope_path", "text"), ("mode", "text"), ("as_of", "timestamptz"),
                 ("started_at", "timestamptz"), ("status", "text"), ("counters", "jsonb"), ("phases_run", "jsonb"),
                 ("phases_skipped", "jsonb"), ("timings", "jsonb"), ("rows_changed", "jsonb"), ("conflicts", "bigint"),
                 ("diff_hash", "text"), ("snapshot_uri", "text"), ("diff_uri", "text"), ("errors", "jsonb"),
                 ("quarantined", "jsonb"), ("recall_before", "float8"), ("recall_after", "float8"))
SHARD_LEDGER_SQL = (
    "INSERT INTO consolidation_runs (run_id, scope_path, mode, as_of, started_at, finished_at, status, counters,"
    " phases_run, phases_skipped, timings, rows_changed, conflicts, diff_hash, snapshot_uri, diff_uri, errors,"
    " quarantined, recall_before, recall_after)"
    " SELECT x.run_id::uuid, x.scope_path, x.mode, x.as_of, x.started_at, now(), x.status, x.counters, x.phases_run,"
    " x.phases_skipped, x.timings, x.rows_changed, x.conflicts, x.diff_hash, x.snapshot_uri, x.diff_uri, x.errors,"
    " x.quarantined, x.recall_before, x.recall_after FROM jsonb_to_recordset($1::jsonb) AS x("
    + ", ".join(f"{name} {'text' if kind == 'uuid' else kind}" for name, kind in LEDGER_FIELDS) + ")"
)


#: Set before a batch's writes (to the end of its transaction): every join of a staged table against
#: a store table is a nested loop probing the store table's index, once per staged row.  A batch's rows
#: are a small part of a store table that holds every scope of the fleet, yet at a few thousand scopes
#: the planner's costs favour hashing the whole store table (a sequential scan of it per write per
#: batch — at 100,000 scopes, of 10M nodes): measured on the 2,000-scope fleet, the deletes and updates
#: of nodes and edges took ~40 % less CPU probing than hashing, with no ANALYZE of the staged tables
#: (it cost ~10 % of the apply and the plan then needs no statistics).  The cost of a write is then
#: bounded by its batch's rows, whatever the size of the store.
SHARD_PLANNER_SQL = ("SET LOCAL enable_hashjoin = off", "SET LOCAL enable_mergejoin = off")


def shard_stage_name(table: str, kind: str) -> str:
    return f"_ds_shard_{table}_{kind}"


def _per_scope_counts(returning: str) -> str:
    return f" SELECT {returning} AS scope_path, count(*) AS n FROM done GROUP BY 1"


def shard_delete_sql(table: str, nodes_deleted: bool = False) -> str:
    """:func:`delete_sql` for a batch of scopes: the staged rows (with ``scope_path`` and their
    scope's run id) are matched on id AND scope_path under the version guard; each before-image is
    archived under its own scope's run id.  Returns ``(scope_path, n)`` rows.  No parameters."""
    stage = shard_stage_name(table, "deletes")
    kept, keep_incident = "", ""
    if table == "memory_edges" and nodes_deleted:
        nodes = shard_stage_name("memory_nodes", "deletes")
        # OFFSET 0 keeps the NOT EXISTS a subplan probing the archive's (run_id, table_name) index once
        # per staged node: as an anti-join (hash joins off for the batch) the planner may read every
        # archived node of the batch once per staged node — it did on a first night, when the
        # archive's statistics say it is nearly empty: 3,779 × 1,890 rows, 8 s of a 10 s batch.
        kept = (f"kept AS (SELECT nd.id::uuid AS id, nd.scope_path FROM {nodes} nd"
                f" WHERE NOT EXISTS (SELECT 1 FROM consolidation_archive a WHERE a.run_id = nd.{RUN_ID_COLUMN}::uuid"
                f" AND a.table_name = 'memory_nodes' AND a.op = 'delete' AND a.row_id = nd.id::uuid::text OFFSET 0)), ")
        keep_incident = (" AND NOT EXISTS (SELECT 1 FROM kept k WHERE k.id = t.source_id AND k.scope_path = t.scope_path)"
                         " AND NOT EXISTS (SELECT 1 FROM kept k WHERE k.id = t.target_id AND k.scope_path = t.scope_path)")
    return (
        f"WITH {kept}done AS (DELETE FROM {table} t USING {stage} s"
        f" WHERE t.id = s.id::uuid AND t.scope_path = s.scope_path AND {VERSION_GUARD}{keep_incident}"
        f" RETURNING t.*, s.reason AS _ds_reason, s.{RUN_ID_COLUMN} AS {RUN_ID_COLUMN}),"
        f" archived AS (INSERT INTO consolidation_archive (run_id, table_name, row_id, op, reason, row)"
        f" SELECT done.{RUN_ID_COLUMN}::uuid, '{table}', done.id::text, 'delete', done._ds_reason,"
        f" to_jsonb(done) - '_ds_reason' - '{RUN_ID_COLUMN}' FROM done RETURNING 1)"
        + _per_scope_counts("done.scope_path")
    )


def shard_update_sql(table: str, changed: list[str]) -> str:
    """:func:`update_sql` for a batch of scopes (match on id — or a profile's key — AND scope_path).
    A null in a changed column leaves the stored value (as the single-scope write, where a column no
    row of the scope changes is not set at all).  Returns ``(scope_path, n)`` rows.  No parameters."""
    sets, match = _update_parts(table, changed)
    return (
        f"WITH done AS (UPDATE {table} t SET {sets} FROM {shard_stage_name(table, 'updates')} s"
        f" WHERE {match} AND t.scope_path = s.scope_path AND {VERSION_GUARD} RETURNING t.scope_path)"
        + _per_scope_counts("scope_path")
    )


def shard_insert_sql(table: str, present: list[str], signature: int) -> str:
    """:func:`insert_sql` for the staged rows of one column signature: the scopes whose rows give
    values for exactly ``present`` (the other columns take the store's defaults, as in a run of such
    a scope alone).  Returns ``(scope_path, n)`` rows.  No parameters."""
    return _shard_insert(table, present, signature, " ON CONFLICT DO NOTHING") + _per_scope_counts("scope_path")


def _shard_insert(table: str, present: list[str], signature: int, guard: str) -> str:
    cols = tables.columns(table)
    names = ", ".join(present)
    values = ", ".join(cols[c].cast_sql("s." + c) for c in present)
    return (
        f"WITH done AS (INSERT INTO {table} ({names}) SELECT {values} FROM {shard_stage_name(table, 'inserts')} s"
        f" WHERE s.{SIGNATURE_COLUMN} = {int(signature)}{guard} RETURNING scope_path)"
    )


#: Where :func:`shard_fast_insert_sql` leaves its per-scope counts; :data:`SHARD_LANDED_SQL` takes them.
SHARD_LANDED = "_ds_shard_landed"
SHARD_LANDED_SQL = f"DELETE FROM {SHARD_LANDED} RETURNING scope_path, n, guarded"


def shard_fast_insert_sql(table: str, present: list[str], signature: int) -> str:
    """The fast path of :func:`shard_insert_sql`: one ``DO`` block that runs the same INSERT without
    ``ON CONFLICT DO NOTHING`` and, only if that raises a unique violation, the guarded insert.

    The plain INSERT inserts exactly the rows the guarded one does when none of them collides with a
    stored row (or another staged row) on any unique index, and raises a unique violation otherwise —
    after waiting, as the guarded insert's own check waits, for a live writer still inserting the
    same key.  The block's exception handler rolls the plain attempt back (a subtransaction) and runs
    the guarded insert: the same rows, the same counts, the same waits.  What it saves when nothing
    collides is ``ON CONFLICT``'s speculative insertion: a probe of every unique index before each row
    and a confirmation record after it (measured: ~25 % of an edge insert's server CPU).

    The per-scope counts go to the temporary table :data:`SHARD_LANDED` (scope_path, n, guarded: the
    guarded insert ran; when it did, also a row with a null scope_path), read and emptied by
    :data:`SHARD_LANDED_SQL`.  No parameters.
    """
    counts = f" INSERT INTO {SHARD_LANDED} (scope_path, n, guarded) SELECT scope_path, count(*), {{}} FROM done GROUP BY 1;"
    return (
        f"DO $ds$ BEGIN"
        f" CREATE TEMP TABLE IF NOT EXISTS {SHARD_LANDED} (scope_path text, n bigint, guarded boolean);"
        f" BEGIN {_shard_insert(table, present, signature, '')}{counts.format('false')}"
        f" EXCEPTION WHEN unique_violation THEN"
        f" {_shard_insert(table, present, signature, ' ON CONFLICT DO NOTHING')}{counts.format('true')}"
        f" INSERT INTO {SHARD_LANDED} (scope_path, n, guarded) VALUES (NULL, 0, true);"  # even when no row landed
        f" END; END $ds$"
    )


def _collapse_shard_updates(updates: pl.DataFrame) -> pl.DataFrame:
    """One row per (scope_path, id): the first ``expected_version`` and the last non-null value of each
    column over the phases (what :func:`_collapse_updates` gives each scope alone)."""
    data = [c for c in updates.columns if c not in (*KEY_COLUMNS, "scope_path")]
    return updates.group_by("scope_path", "id", maintain_order=True).agg(
        pl.col("expected_version").first(), *(pl.col(c).drop_nulls().last() for c in data))


def _signatures(table: str, inserts: pl.DataFrame) -> tuple[pl.DataFrame, dict[int, list[str]]]:
    """``inserts`` with :data:`SIGNATURE_COLUMN`: a number per set of the table's columns that a scope's
    rows give a value for (a run of that scope alone inserts exactly those), and signature → columns."""
    known = [c for c in inserts.columns if c in tables.columns(table)]
    has = inserts.group_by("scope_path").agg(pl.col(c).is_not_null().any().alias(f"_has_{c}") for c in known)
    key = pl.concat_str([pl.col(f"_has_{c}").cast(pl.UInt8).cast(pl.String) for c in known])
    has = has.with_columns(key.alias("_key"))
    codes = has.select("_key").unique().sort("_key").with_row_index(SIGNATURE_COLUMN).with_columns(
        pl.col(SIGNATURE_COLUMN).cast(pl.Int64))
    present = {int(i): [c for c, bit in zip(known, k, strict=True) if bit == "1"] for i, k in codes.iter_rows()}
    sig = has.join(codes, on="_key").select("scope_path", SIGNATURE_COLUMN)
    return inserts.join(sig, on="scope_path", how="left", maintain_order="left"), present


def shard_bodies(diff: Diff, run_ids: pl.DataFrame) -> tuple[dict[tuple[str, str], pl.DataFrame], dict[tuple[str, str], dict[int, list[str]]]]:
    """(table, kind) → the rows of a batch to stage, every one with its ``scope_path``: updates collapsed
    per (scope, id); deletes with their scope's run id (``run_ids``: scope_path, :data:`RUN_ID_COLUMN`);
    inserts with their column signature; no ``phase`` column, and no column without a value (a null
    says "not changed" or "the store's default").  Also (table, "inserts") → signature → columns."""
    out, signatures = {}, {}
    for table, td in diff.tables.items():
        for kind, frame in td.frames().items():
            if not frame.height:
                continue
            if "scope_path" not in frame.columns:
                raise InputError(f"{table}.{kind}: a shard's diff needs a scope_path on every row")
            frame = frame.drop("phase") if "phase" in frame.columns else frame
            if kind == "updates":
                frame = _collapse_shard_updates(frame)
            keep = [c for c, n in zip(frame.columns, frame.null_count().row(0), strict=True)
                    if n < frame.height or c in ("id", "expected_version")]
            frame = frame.select(keep)
            if kind == "deletes":
                frame = frame.join(run_ids, on="scope_path", how="left", maintain_order="left")
            elif kind == "inserts":
                frame, signatures[(table, kind)] = _signatures(table, frame)
            out[(table, kind)] = frame
    return out, signatures


@dataclass(frozen=True)
class ShardStatements:
    """What :func:`shard_statements` gives: the statements of one batch's transaction, in order, and
    the rows fed per scope (scope_path, table, kind, rows: for each write, rows applied + conflicts)."""

    statements: tuple[Statement, ...]
    fed: pl.DataFrame
    scopes: tuple[str, ...]


def shard_statements(
    diff: Diff,
    run_ids: dict[str, str],
    *,
    quarantined: pl.DataFrame | None = None,
    small_rows: int = SMALL_STAGE_ROWS,
    big_rows: int = BIG_DIFF_ROWS,
    work_mem: str | None = None,
) -> ShardStatements:
    """Every statement that applies a batch of a shard's diff (every frame with ``scope_path``) for the
    scopes of ``run_ids`` (scope_path → run id) in one transaction — pure.

    Order: ``DISCARD TEMP``; ``SET LOCAL work_mem`` from ``big_rows`` rows; the scopes' advisory locks
    (in byte order of their paths, so two batches never wait on each other in a cycle); every (table,
    kind) staged once; the planner settings of :data:`SHARD_PLANNER_SQL` (index probes, no hashing of
    a store table); deletes (nodes first), updates, inserts (one per column signature), each
    returning rows per scope; the quarantined rows (table, id, reason, row, scope_path) with their
    scope's run id; the ledger rows (bound by the executor from the per-scope outcome).  Rows of a
    scope not in ``run_ids`` raise :class:`~deep_sleep.core.errors.InputError`.
    """
    scopes = tuple(sorted(run_ids, key=str.encode))
    ids = pl.DataFrame({"scope_path": list(scopes), RUN_ID_COLUMN: [run_ids[s] for s in scopes]},
                       schema={"scope_path": pl.String, RUN_ID_COLUMN: pl.String})
    bodies, signatures = shard_bodies(diff, ids)
    for (table, kind), body in bodies.items():
        stray = body.filter(~pl.col("scope_path").is_in(ids.get_column("scope_path").implode()) | pl.col("scope_path").is_null())
        if stray.height:
            raise InputError(f"{table}.{kind}: rows of scopes this batch does not apply: "
                             f"{sorted(set(stray.get_column('scope_path').head(3).to_list()), key=str)}")
    rows = sum(b.height for b in bodies.values())
    out: list[Statement] = [Statement("discard_temp", "DISCARD TEMP")]
    if rows >= big_rows:
        out.append(Statement("work_mem", f"SET LOCAL work_mem = '{check_work_mem(work_mem)}'"))
    out.append(Statement("lock", SHARD_LOCK_SQL, (json.dumps(list(scopes)),)))
    for (table, kind), body in bodies.items():
        out.append(stage_statement(shard_stage_name(table, kind), body, small_rows, table, kind))
    if bodies:
        out += [Statement("planner", sql) for sql in SHARD_PLANNER_SQL]
    order = sorted(bodies, key=lambda tk: (("deletes", "updates", "inserts").index(tk[1]), tk[0] != "memory_nodes", tk[0]))
    nodes_deleted = ("memory_nodes", "deletes") in bodies
    fed = []
    for table, kind in order:
        body = bodies[(table, kind)]
        fed.append(body.group_by("scope_path", maintain_order=True).len("rows").with_columns(pl.lit(table).alias("table"), pl.lit(kind).alias("kind")))
        staged = shard_stage_name(table, kind)
        if kind == "deletes":
            out.append(Statement("delete", shard_delete_sql(table, nodes_deleted), table=table, kind=kind,
                                 source="staged_table", staged=staged, rows=body.height))
        elif kind == "updates":
            changed = [c for c in body.columns if c not in (*KEY_COLUMNS, "scope_path")]
            out.append(Statement("update", shard_update_sql(table, changed), table=table, kind=kind,
                                 source="staged_table", staged=staged, rows=body.height))
        else:
            counts = dict(body.group_by(SIGNATURE_COLUMN).len().iter_rows())
            for sig, present in sorted(signatures[(table, kind)].items()):
                if counts.get(sig):
                    out.append(Statement("insert", shard_insert_sql(table, present, sig), table=table, kind=kind,
                                         source="staged_table", staged=staged, rows=counts[sig],
                                         fast_sql=shard_fast_insert_sql(table, present, sig)))
    if quarantined is not None and quarantined.height:
        q = quarantined.join(ids, on="scope_path", how="left", maintain_order="left")
        if q.get_column(RUN_ID_COLUMN).null_count():
            raise InputError("quarantined rows of scopes this batch does not apply")
        out.append(Statement("quarantine", None, (Rows(q),), table="consolidation_quarantine",
                             source="adbc_copy", staged="_ds_shard_quarantine", rows=q.height))
        out.append(Statement("quarantine", SHARD_QUARANTINE_SQL, table="consolidation_quarantine",
                             source="staged_table", staged="_ds_shard_quarantine", rows=q.height))
    out.append(Statement("ledger", SHARD_LEDGER_SQL, table="consolidation_runs", rows=len(scopes)))
    schema = {"scope_path": pl.String, "rows": pl.Int64, "table": pl.String, "kind": pl.String}
    fed_frame = pl.concat([f.cast(schema) for f in fed]) if fed else pl.DataFrame(schema=schema)
    return ShardStatements(tuple(out), fed_frame.select("scope_path", "table", "kind", "rows"), scopes)
