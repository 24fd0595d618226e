"""The statements that apply a diff, as values (dlt's ``sql_jobs`` shape; SPEC §2 step 4).

:func:`statements` turns a batch of a shard's diff (every frame with ``scope_path``; a single scope
is a shard of one) into the whole ordered list of :class:`Statement` values one transaction runs —
including how each table's rows reach Postgres — with no connection, clock or environment.
:func:`deep_sleep.run.apply.apply` only executes the list; ``deep-sleep replay … --explain`` prints
it (:func:`explain`); the golden files under ``tests/run/golden_sql/`` pin it.  The order:

1. ``DISCARD TEMP`` (staging tables of an earlier apply on this pooled connection) when anything is
   staged; ``SET LOCAL work_mem`` for a batch of :data:`BIG_DIFF_ROWS` rows or more.
2. ``pg_advisory_xact_lock`` on every scope of the batch, in byte order of their paths (two batches
   never wait on each other in a cycle): one apply per scope at a time.
3. Staging, when the rows are not inline (below): every (table, kind) into a temporary table; then
   :data:`PLANNER_SQL` (index probes, never a hash of a whole store table).
4. Deletes, guarded by ``version = expected_version`` and matched on id AND scope_path; before-images
   go to ``consolidation_archive`` under each scope's run id in the same statement.  Edge deletes run
   first (those listed with a node a live write changed stay with it); a node is deleted only when no
   edge of the store touches it any more: no sequence of writes leaves an edge without its node
   (:func:`delete_sql`).
5. Updates, one write per row (all phases' changes folded), guarded the same way; only the changed
   columns are set, ``updated_at`` is left alone.
6. Inserts with ``ON CONFLICT DO NOTHING``, one per column signature (the columns a scope's rows give
   values for; the rest take the store's defaults, as a scope alone would); nodes before edges, and
   an edge only while both of its nodes are in the store, each taken ``FOR KEY SHARE`` as a foreign
   key's check does (:func:`_endpoints`; a staged batch locks the distinct nodes its edges name in one
   scan and checks the edges against them as a set, :func:`_endpoints_set`), so no write of the apply
   leaves an edge without its node.
7. The quarantined rows, if any, into ``consolidation_quarantine``; the ledger rows in
   ``consolidation_runs`` — with what each run held for approval, so the holds are in the ledger the
   moment the apply commits (a kill after the commit cannot lose them).

Every write returns ``(scope_path, n)`` rows, so rows applied and conflicts are counted per scope.

Data sources (:data:`SOURCES`): a batch of at most :data:`SMALL_STAGE_ROWS` rows (a quick nap's, a
small scope's) is read by each write from a JSON parameter (``inline_json``: no staging tables to
create, none to discard).  A bigger one is staged first: a table of at most ``SMALL_STAGE_ROWS`` rows
from one JSON parameter (``json_temp_table``, one round trip), a bigger one by ADBC's Arrow → COPY
ingest (``adbc_copy``); the writes then read the staged tables (``staged_table``), and each insert
offers a fast path (:attr:`Statement.fast_sql`, :func:`fast_insert_sql`).

A row a live writer changed after the snapshot fails the guard, is left as the writer left it, and
is counted in ``conflicts``; the next run sees it again.

    >>> from deep_sleep.core.diff import Diff
    >>> [s.step for s in statements(Diff.empty(), {"org\\x1fa": "run-id"}).statements]
    ['lock', 'ledger']
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

import polars as pl

from deep_sleep.core import tables
from deep_sleep.core.config import work_mem_size
from deep_sleep.core.diff import Diff
from deep_sleep.core.errors import InputError
from deep_sleep.transforms.episodic_summary import FOLD_REASON

KEY_COLUMNS = ("id", "expected_version", "phase")
SMALL_STAGE_ROWS = 2_000  # up to this many rows a batch travels inline, or a staged table as one JSON parameter
BIG_DIFF_ROWS = 10_000  # below this the default work_mem does (and a quick nap saves the round trip)
DEFAULT_WORK_MEM = "256MB"
RUN_ID_COLUMN = "_ds_run_id"  # each staged delete / quarantined row's own scope's run id
CLUSTER_RANK = "_ds_k"  # a new CLUSTERS edge's place among its META node's new ones (see _cluster_room)
SIGNATURE_COLUMN = "_ds_sig"  # which columns an inserted row's scope gives values for (see bodies)

#: How a statement's rows reach Postgres (``{staged}``: the temporary table).
SOURCES = {
    "inline_json": "inline JSON parameter",
    "json_temp_table": "JSON parameter into temporary table {staged}",
    "adbc_copy": "ADBC COPY of an Arrow table into temporary table {staged}",
    "staged_table": "read from temporary table {staged} (staged above)",
    "": "no rows",
}
WRITES = ("delete", "update", "insert")  # the steps whose result is the rows applied per scope

LOCK_SQL = (
    "SELECT count(pg_advisory_xact_lock(hashtextextended(_s.p, 0)))"
    " FROM jsonb_array_elements_text($1::jsonb) WITH ORDINALITY AS _s(p, i)"
)
#: One ledger row per scope of the batch from one JSON array parameter ($1) of the rows.
LEDGER_FIELDS = (("run_id", "uuid"), ("scope_path", "text"), ("mode", "text"), ("as_of", "timestamptz"),
                 ("started_at", "timestamptz"), ("status", "text"), ("counters", "jsonb"), ("phases_run", "jsonb"),
                 ("phases_skipped", "jsonb"), ("timings", "jsonb"), ("rows_changed", "jsonb"), ("conflicts", "bigint"),
                 ("diff_hash", "text"), ("snapshot_uri", "text"), ("diff_uri", "text"), ("errors", "jsonb"),
                 ("quarantined", "jsonb"), ("recall_before", "float8"), ("recall_after", "float8"), ("held", "jsonb"),
                 ("hold_status", "text"), ("approval_of", "uuid"))
LEDGER_SQL = (
    "INSERT INTO consolidation_runs (" + ", ".join(name for name, _ in LEDGER_FIELDS) + ", finished_at)"
    " SELECT " + ", ".join(f"x.{name}::uuid" if kind == "uuid" else f"x.{name}" for name, kind in LEDGER_FIELDS)
    + ", now() FROM jsonb_to_recordset($1::jsonb) AS x("
    + ", ".join(f"{name} {'text' if kind == 'uuid' else kind}" for name, kind in LEDGER_FIELDS) + ")"
)
QUARANTINE_SQL = (
    "WITH done AS (INSERT INTO consolidation_quarantine (run_id, scope_path, table_name, row_id, reason, row)"
    f" SELECT s.{RUN_ID_COLUMN}::uuid, s.scope_path, s.table, s.id, s.reason, s.row::jsonb FROM {{source}} s"
    " RETURNING 1) SELECT count(*) FROM done"
)

#: Set before a staged batch's writes (to the end of its transaction): every join of a staged table
#: against a store table is a nested loop probing the store table's index, once per staged row.  A
#: batch's rows are a small part of a store table that holds every scope of the fleet, yet at a few
#: thousand scopes the planner's costs favour hashing the whole store table (a sequential scan of it
#: per write per batch); probing took ~40 % less CPU on the 2,000-scope fleet, with no ANALYZE of the
#: staged tables.  The cost of a write is then bounded by its batch's rows, whatever the store's size.
PLANNER_SQL = ("SET LOCAL enable_hashjoin = off", "SET LOCAL enable_mergejoin = off")
#: Around a staged batch's edge inserts, whose endpoint check is one set (:func:`_endpoints_set`): its
#: two semi-joins of the staged rows against the locked nodes are hashed (the planner, which sees a
#: CTE of ten rows, would loop over it once per staged row), then probing is restored.
SET_JOIN_SQL = ("SET LOCAL enable_hashjoin = on", "SET LOCAL enable_nestloop = off")
PROBE_JOIN_SQL = ("SET LOCAL enable_nestloop = on", "SET LOCAL enable_hashjoin = off")
LIVE_ENDS = "_ds_live_ends"  # the CTE of the nodes an edge insert's rows name, taken FOR KEY SHARE
#: Where :func:`fast_insert_sql` leaves its per-scope counts; :data:`LANDED_SQL` takes them.
LANDED = "_ds_shard_landed"
LANDED_SQL = f"DELETE FROM {LANDED} RETURNING scope_path, n, guarded"
# A null expected_version comes from a hand-written snapshot of a table without `version` (SPEC §8):
# the row is then guarded on existence only (the join on its identity).
VERSION_GUARD = "(s.expected_version IS NULL OR t.version = s.expected_version)"


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
        each; an ingest sends them as Arrow).  The ledger's parameter is the runs' outcome, so the
        executor binds it from the reports after the writes (``params`` is empty there).
    table: the store table the rows belong to (``consolidation_quarantine``, ``consolidation_runs``
        for the last two steps); None for the session statements.
    kind: ``inserts`` | ``updates`` | ``deletes`` for stage and write steps, else None.
    source: how the rows reach Postgres, a key of :data:`SOURCES` (``""``: no rows).
    staged: the temporary table a ``stage`` creates or a write reads, else None.
    rows: the rows fed; for a write, rows applied + rows skipped as conflicts.
    fast_sql: for a staged insert, its fast path (:func:`fast_insert_sql`), which an executor may run
        instead of ``sql`` and then read the counts with :data:`LANDED_SQL`; ``sql`` is the statement
        whose result is the contract, and any executor may run it alone.
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


@dataclass(frozen=True)
class Statements:
    """What :func:`statements` gives: the statements of one batch's transaction, in order, the rows
    fed per scope (scope_path, table, kind, rows: for each write, rows applied + conflicts) and the
    batch's scopes (byte order)."""

    statements: tuple[Statement, ...]
    fed: pl.DataFrame
    scopes: tuple[str, ...]


def stage_name(table: str, kind: str) -> str:
    return f"_ds_shard_{table}_{kind}"


def check_work_mem(value: str | None) -> str:
    """``value`` (``DEEP_SLEEP_APPLY_WORK_MEM``) as a ``work_mem`` size, :data:`DEFAULT_WORK_MEM` when unset."""
    return work_mem_size(value, "DEEP_SLEEP_APPLY_WORK_MEM", DEFAULT_WORK_MEM)


# -- one write's SQL -----------------------------------------------------------------------------
def _per_scope_counts(returning: str) -> str:
    return f" SELECT {returning} AS scope_path, count(*) AS n FROM done GROUP BY 1"


def delete_sql(table: str, source: str, node_source: str | None = None) -> str:
    """Guarded delete of the rows of ``source`` (a staged table or an inline subquery: each row's
    id, expected_version, reason, scope_path and its scope's run id), matched on id AND scope_path,
    with each before-image archived under its own scope's run id.  Returns ``(scope_path, n)`` rows.

    The graph stays whole whatever happened since the snapshot (issue 31): edge deletes run before
    node deletes, and

    - ``node_source`` (edges, when nodes are deleted too): an edge listed with a node that a live
      write changed since the snapshot (so the node's own delete will be skipped as a conflict) stays
      with it — one primary-key probe per listed node;
    - a node is deleted only when no edge of the store touches it any more (two index probes): not
      one a writer added since the snapshot, not one whose own delete was skipped as a conflict.  Such
      a node stays, counted as a conflict, and the next night sees it again."""
    kept, keep_incident, no_edges = "", "", ""
    if table == "memory_edges" and node_source is not None:
        kept = (f"kept AS (SELECT nd.id::uuid AS id, nd.scope_path FROM {node_source} nd"
                f" JOIN memory_nodes n ON n.id = nd.id::uuid AND n.scope_path = nd.scope_path"
                f" WHERE nd.expected_version IS NOT NULL AND n.version <> nd.expected_version), ")
        keep_incident = (" AND NOT EXISTS (SELECT 1 FROM kept k WHERE k.id = t.source_id AND k.scope_path = t.scope_path)"
                         " AND NOT EXISTS (SELECT 1 FROM kept k WHERE k.id = t.target_id AND k.scope_path = t.scope_path)")
    if table == "memory_nodes":
        # Two index probes per node: (scope_path, source_id, …) of the natural key, (scope_path, target_id).
        no_edges = (" AND NOT EXISTS (SELECT 1 FROM memory_edges e WHERE e.scope_path = t.scope_path AND e.source_id = t.id)"
                    " AND NOT EXISTS (SELECT 1 FROM memory_edges e WHERE e.scope_path = t.scope_path AND e.target_id = t.id)")
    return (
        f"WITH {kept}done AS (DELETE FROM {table} t USING {source} s"
        f" WHERE t.id = s.id::uuid AND t.scope_path = s.scope_path AND {VERSION_GUARD}{keep_incident}{no_edges}"
        f" RETURNING t.*, s.reason AS _ds_reason, s.{RUN_ID_COLUMN} AS {RUN_ID_COLUMN}),"
        f" archived AS (INSERT INTO consolidation_archive (run_id, table_name, row_id, op, reason, row)"
        f" SELECT done.{RUN_ID_COLUMN}::uuid, '{table}', done.id::text, 'delete', done._ds_reason,"
        f" to_jsonb(done) - '_ds_reason' - '{RUN_ID_COLUMN}' FROM done RETURNING 1)"
        + (FOLD_SQL if table == "episodic_events" else "")
        + _per_scope_counts("done.scope_path")
    )


#: An event deleted with a phase-10 reason (``summarised into META:episodic_summary <node id>``) is
#: folded: the same statement moves it whole into ``episodic_folded`` under that summary node, where
#: recall reads it through its summary (SPEC §3 phase 10 and §5 as amended 2026-12-06).  Only rows
#: the version guard let through are folded; a conflict leaves the event hot, still findable.
FOLD_SQL = (
    ", folded AS (INSERT INTO episodic_folded (id, summary_id, run_id, scope_path, tenant_id, session_id, content,"
    " metadata, embedding, embedding_model, created_at, search)"
    f" SELECT done.id, substr(done._ds_reason, {len(FOLD_REASON) + 1})::uuid, done.{RUN_ID_COLUMN}::uuid,"
    " done.scope_path, done.tenant_id, done.session_id, done.content, done.metadata, done.embedding,"
    " done.embedding_model, done.created_at, done.search FROM done"
    f" WHERE left(done._ds_reason, {len(FOLD_REASON)}) = '{FOLD_REASON}' ON CONFLICT (id) DO NOTHING RETURNING 1)"
)


def _update_parts(table: str, changed: list[str]) -> tuple[str, str]:
    """The SET list (a null leaves the stored value) and the row match of a guarded update:
    ``soul_profiles`` rows that carry ``key`` match by it, other rows by id."""
    cols = tables.diff_columns(table)
    by_key = table == "soul_profiles" and "key" in changed
    changed = [c for c in changed if not (by_key and c == "key")]
    sets = ", ".join(f"{c} = COALESCE({cols[c].cast_sql('s.' + c)}, t.{c})" for c in changed)
    match = "(CASE WHEN s.key IS NOT NULL THEN t.key = s.key ELSE t.id = s.id::uuid END)" if by_key else "t.id = s.id::uuid"
    return sets, match


def update_sql(table: str, changed: list[str], source: str) -> str:
    """Guarded update of the changed columns (match on id — or a profile's key, SPEC §1: soul_profiles
    is identified by (scope_path, key) — AND scope_path).  A null in a changed column leaves the
    stored value.  Returns ``(scope_path, n)`` rows."""
    sets, match = _update_parts(table, changed)
    return (
        f"WITH done AS (UPDATE {table} t SET {sets} FROM {source} s"
        f" WHERE {match} AND t.scope_path = s.scope_path AND {VERSION_GUARD} RETURNING t.scope_path)"
        + _per_scope_counts("scope_path")
    )


def insert_sql(table: str, present: list[str], signature: int, source: str, cluster_cap: int | None = None,
               set_ends: bool = False) -> str:
    """Insert the rows of one column signature (the scopes whose rows give values for exactly
    ``present``), skipping any that collide with a live write.  Returns ``(scope_path, n)`` rows.
    ``cluster_cap`` (edges): see :func:`_cluster_room`.  ``set_ends`` (edges from a staged table):
    the endpoint check as one set (:func:`_endpoints_set`) instead of two probes per row
    (:func:`_endpoints`)."""
    return (_insert(table, present, signature, source, " ON CONFLICT DO NOTHING", cluster_cap, set_ends)
            + _per_scope_counts("scope_path"))


def _cluster_room(table: str, present: list[str], cluster_cap: int | None) -> str:
    """The condition that keeps a META node within its cap (SPEC §3, ``meta_nodes.max_members``): a
    ``CLUSTERS`` edge is inserted only while its META node has room for it in the store as it is now —
    after this apply's deletes, so a stale member's edge whose delete lost to a live write, or that a
    later run already replaced (an approval), keeps its place and the new member waits (a conflict;
    the next night plans the group again).  Empty for other tables or without a cap."""
    if table != "memory_edges" or cluster_cap is None or not {"relation", "source_id"} <= set(present):
        return ""
    cols = tables.diff_columns(table)
    source = cols["source_id"].cast_sql("s.source_id")
    return (f" AND (s.relation IS DISTINCT FROM 'CLUSTERS' OR s.{CLUSTER_RANK} + (SELECT count(*) FROM memory_edges e"
            f" WHERE e.scope_path = s.scope_path AND e.source_id = {source} AND e.relation = 'CLUSTERS') <= {int(cluster_cap)})")


def _endpoints(table: str, present: list[str]) -> str:
    """The condition that keeps the graph whole at apply time (issue 37): an edge is inserted only
    while both of its nodes are in the store, in its scope — not one a live writer deleted since the
    snapshot (the row is then a conflict).  Each probe is one primary-key lookup that takes the node
    ``FOR KEY SHARE``, as a foreign key's check does: a delete of the node that has not committed when
    the probe runs is waited for (and, once committed, makes the probe find nothing), and one that
    starts later waits until this transaction ends — so no delete can commit between the probe and
    the insert.  The lock conflicts only with a delete (or a key update) of the node, never with a live
    writer's update of its other columns.  Empty for other tables."""
    if table != "memory_edges" or not {"source_id", "target_id"} <= set(present):
        return ""
    cols = tables.diff_columns(table)
    return "".join(f" AND EXISTS (SELECT 1 FROM memory_nodes n WHERE n.id = {cols[c].cast_sql('s.' + c)}"
                   " AND n.scope_path = s.scope_path FOR KEY SHARE)" for c in ("source_id", "target_id"))


def _endpoints_set(table: str, present: list[str], signature: int, source: str) -> tuple[str, str]:
    """:func:`_endpoints` as one set (the fast path of a staged batch): ``(CTE, condition)``.  The CTE
    takes ``FOR KEY SHARE`` every node one of the signature's rows names as an end — each distinct id
    once, in index order, through one ``= ANY`` scan of the primary key — and keeps those found; the
    condition wants both of a row's ends among them, in its scope (two hash semi-joins: the statement
    runs under :data:`SET_JOIN_SQL`).  The locks and their waits are those of the per-row probes, taken
    before any row is inserted: a node a delete removed (committed, or committing while the lock
    waits) is not found and its edges are conflicts; one found cannot be deleted until the apply
    commits.  A million-node night's 218k edge inserts name 150k distinct nodes: 150k probes in id
    order instead of 436k (benchmarks/README.md, 2026-12-06).  Empty for other tables."""
    if table != "memory_edges" or not {"source_id", "target_id"} <= set(present):
        return "", ""
    cols = tables.diff_columns(table)
    ends = " UNION ".join(f"SELECT {cols[c].cast_sql('r.' + c)} FROM {source} r WHERE r.{SIGNATURE_COLUMN} = {int(signature)}"
                          for c in ("source_id", "target_id"))
    cte = (f"{LIVE_ENDS} AS MATERIALIZED (SELECT n.id, n.scope_path FROM memory_nodes n"
           f" WHERE n.id = ANY (ARRAY({ends})) FOR KEY SHARE), ")
    condition = "".join(f" AND ({cols[c].cast_sql('s.' + c)}, s.scope_path) IN (SELECT l.id, l.scope_path FROM {LIVE_ENDS} l)"
                        for c in ("source_id", "target_id"))
    return cte, condition


def _insert(table: str, present: list[str], signature: int, source: str, guard: str, cluster_cap: int | None = None,
            set_ends: bool = False) -> str:
    cols = tables.diff_columns(table)
    names = ", ".join(present)
    values = ", ".join(cols[c].cast_sql("s." + c) for c in present)
    live, ends = _endpoints_set(table, present, signature, source) if set_ends else ("", _endpoints(table, present))
    room = _cluster_room(table, present, cluster_cap)
    if room:  # each new CLUSTERS edge of a META node counted with those before it in this statement
        source = (f"(SELECT r.*, row_number() OVER (PARTITION BY r.scope_path, r.source_id, r.relation ORDER BY r.id)"
                  f" AS {CLUSTER_RANK} FROM {source} r)")
    return (
        f"WITH {live}done AS (INSERT INTO {table} ({names}) SELECT {values} FROM {source} s"
        f" WHERE s.{SIGNATURE_COLUMN} = {int(signature)}{room}{ends}{guard} RETURNING scope_path)"
    )


def fast_insert_sql(table: str, present: list[str], signature: int, cluster_cap: int | None = None,
                    set_ends: bool = False) -> str:
    """The fast path of :func:`insert_sql` over a staged table: one ``DO`` block that runs the same
    INSERT without ``ON CONFLICT DO NOTHING`` and, only if that raises a unique violation, the
    guarded insert.

    The plain INSERT inserts exactly the rows the guarded one does when none of them collides with a
    stored row (or another staged row) on any unique index, and raises a unique violation otherwise —
    after waiting, as the guarded insert's own check waits, for a live writer still inserting the
    same key.  The block's exception handler rolls the plain attempt back (a subtransaction) and runs
    the guarded insert: the same rows, the same counts, the same waits.  What it saves when nothing
    collides is ``ON CONFLICT``'s speculative insertion: a probe of every unique index before each row
    and a confirmation record after it (measured: ~25 % of an edge insert's server CPU).

    The per-scope counts go to the temporary table :data:`LANDED` (scope_path, n, guarded: the
    guarded insert ran; when it did, also a row with a null scope_path), read and emptied by
    :data:`LANDED_SQL`.  No parameters (a ``DO`` block takes none: inline rows run the guarded insert).
    """
    source = stage_name(table, "inserts")
    counts = f" INSERT INTO {LANDED} (scope_path, n, guarded) SELECT scope_path, count(*), {{}} FROM done GROUP BY 1;"
    return (
        f"DO $ds$ BEGIN"
        f" CREATE TEMP TABLE IF NOT EXISTS {LANDED} (scope_path text, n bigint, guarded boolean);"
        f" BEGIN {_insert(table, present, signature, source, '', cluster_cap, set_ends)}{counts.format('false')}"
        f" EXCEPTION WHEN unique_violation THEN"
        f" {_insert(table, present, signature, source, ' ON CONFLICT DO NOTHING', cluster_cap, set_ends)}{counts.format('true')}"
        f" INSERT INTO {LANDED} (scope_path, n, guarded) VALUES (NULL, 0, true);"  # even when no row landed
        f" END; END $ds$"
    )


# -- rows ----------------------------------------------------------------------------------------
# Postgres types of staged columns — the types ADBC's ingest gives the same Arrow columns.
_STAGE_TYPES: dict[pl.DataType, str] = {
    pl.String(): "text", pl.Int64(): "bigint", pl.Int32(): "integer", pl.Float64(): "double precision",
    pl.Float32(): "real", pl.Boolean(): "boolean", tables.TS: "timestamptz", pl.List(pl.Float64()): "double precision[]",
    pl.Array(pl.Float32(), tables.EMBEDDING_DIM): "real[]", pl.List(pl.Float32()): "real[]",
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


def _collapse_updates(updates: pl.DataFrame) -> pl.DataFrame:
    """One row per (scope_path, id): the first ``expected_version`` and the last non-null value of each
    column over the phases (FACTS: one write per row)."""
    data = [c for c in updates.columns if c not in (*KEY_COLUMNS, "scope_path")]
    return updates.group_by("scope_path", "id", maintain_order=True).agg(
        pl.col("expected_version").first(), *(pl.col(c).drop_nulls().last() for c in data))


def _signatures(table: str, inserts: pl.DataFrame) -> tuple[pl.DataFrame, dict[int, list[str]]]:
    """``inserts`` with :data:`SIGNATURE_COLUMN`: a number per set of the table's columns that a scope's
    rows give a value for (a scope alone inserts exactly those), and signature → columns.  The rows of
    one scope (a quick nap's) have one signature, 0: the columns with a value in any row."""
    paths = inserts.get_column("scope_path")
    if inserts.height and not paths.null_count() and (paths == paths[0]).all():
        known = [c for c in inserts.columns if c in tables.diff_columns(table)]
        present = [c for c, n in zip(known, inserts.select(known).null_count().row(0), strict=True) if n < inserts.height]
        return inserts.with_columns(pl.lit(0, pl.Int64).alias(SIGNATURE_COLUMN)), {0: present}
    return _signatures_plain(table, inserts)


def _signatures_plain(table: str, inserts: pl.DataFrame) -> tuple[pl.DataFrame, dict[int, list[str]]]:
    """:func:`_signatures` for any rows: the signature of each scope's set of columns with a value."""
    known = [c for c in inserts.columns if c in tables.diff_columns(table)]
    has = inserts.group_by("scope_path").agg(pl.col(c).is_not_null().any().alias(f"_has_{c}") for c in known)
    key = pl.concat_str([pl.col(f"_has_{c}").cast(pl.UInt8).cast(pl.String) for c in known])
    has = has.with_columns(key.alias("_key"))
    codes = has.select("_key").unique().sort("_key").with_row_index(SIGNATURE_COLUMN).with_columns(
        pl.col(SIGNATURE_COLUMN).cast(pl.Int64))
    present = {int(i): [c for c, bit in zip(known, k, strict=True) if bit == "1"] for i, k in codes.iter_rows()}
    sig = has.join(codes, on="_key").select("scope_path", SIGNATURE_COLUMN)
    return inserts.join(sig, on="scope_path", how="left", maintain_order="left"), present


def bodies(diff: Diff, run_ids: pl.DataFrame) -> tuple[dict[tuple[str, str], pl.DataFrame], dict[tuple[str, str], dict[int, list[str]]]]:
    """(table, kind) → the rows of a batch to feed, every one with its ``scope_path``: updates collapsed
    per (scope, id); deletes with their scope's run id (``run_ids``: scope_path, :data:`RUN_ID_COLUMN`);
    inserts with their column signature; no ``phase`` column, and no column without a value (a null
    says "not changed" or "the store's default").  Also (table, "inserts") → signature → columns."""
    out, signatures = {}, {}
    for table, td in diff.tables.items():
        for kind, frame in td.frames().items():
            if not frame.height:
                continue
            if "scope_path" not in frame.columns:
                raise InputError(f"{table}.{kind}: the apply needs a scope_path on every row (plan adds it; "
                                 "deep_sleep.run.transform.as_shard_diff gives a single scope's diff one)")
            frame = frame.drop("phase") if "phase" in frame.columns else frame
            if kind == "updates":
                frame = _collapse_updates(frame)
            keep = [c for c, n in zip(frame.columns, frame.null_count().row(0), strict=True)
                    if n < frame.height or c in ("id", "expected_version")]
            frame = frame.select(keep)
            if kind == "deletes":
                frame = frame.join(run_ids, on="scope_path", how="left", maintain_order="left")
            elif kind == "inserts":
                frame, signatures[(table, kind)] = _signatures(table, frame)
            out[(table, kind)] = frame
    return out, signatures


# -- the list ------------------------------------------------------------------------------------
def statements(
    diff: Diff,
    run_ids: dict[str, str],
    *,
    quarantined: pl.DataFrame | None = None,
    small_rows: int = SMALL_STAGE_ROWS,
    big_rows: int = BIG_DIFF_ROWS,
    work_mem: str | None = None,
    cluster_cap: int | None = None,
    set_endpoints: bool = True,
) -> Statements:
    """Every statement that applies a batch of a shard's diff (every frame with ``scope_path``) for the
    scopes of ``run_ids`` (scope_path → run id) in one transaction, in order — pure: same arguments,
    equal list (see the module docstring).

    ``quarantined``: rows set aside from the snapshot (table, id, reason, row JSON, scope_path),
    recorded with their scope's run.  ``small_rows`` / ``big_rows``: the thresholds of the inline and
    ``work_mem`` choices.  ``work_mem``: the ``DEEP_SLEEP_APPLY_WORK_MEM`` value; checked only when a
    batch is big enough to use it (:class:`~deep_sleep.core.errors.ConfigError` if malformed).  Rows
    of a scope not in ``run_ids`` raise :class:`~deep_sleep.core.errors.InputError`.  ``cluster_cap``:
    ``meta_nodes.max_members``, which no META node's CLUSTERS edges exceed after the inserts
    (:func:`_cluster_room`); None: unchecked.  ``set_endpoints``: a staged batch's edge inserts check
    their nodes as one set (:func:`_endpoints_set`, between :data:`SET_JOIN_SQL` and
    :data:`PROBE_JOIN_SQL`); False: two probes per row (:func:`_endpoints`), as inline rows always are —
    the same rows land.
    """
    scopes = tuple(sorted(run_ids, key=str.encode))
    ids = pl.DataFrame({"scope_path": list(scopes), RUN_ID_COLUMN: [run_ids[s] for s in scopes]},
                       schema={"scope_path": pl.String, RUN_ID_COLUMN: pl.String})
    fed_bodies, signatures = bodies(diff, ids)
    listed = ids.get_column("scope_path").implode()
    for (table, kind), body in fed_bodies.items():
        stray = body.filter(~pl.col("scope_path").is_in(listed) | pl.col("scope_path").is_null())
        if stray.height:
            raise InputError(f"{table}.{kind}: rows of scopes this batch does not apply: "
                             f"{sorted(set(stray.get_column('scope_path').head(3).to_list()), key=str)}")
    q = None
    if quarantined is not None and quarantined.height:
        q = quarantined.join(ids, on="scope_path", how="left", maintain_order="left")
        if q.get_column(RUN_ID_COLUMN).null_count():
            raise InputError("quarantined rows of scopes this batch does not apply")
    rows = sum(b.height for b in fed_bodies.values())
    inline = rows <= small_rows and all(json_source(b.schema, 1) is not None for b in fed_bodies.values())
    out: list[Statement] = []
    if not inline or q is not None:
        out.append(Statement("discard_temp", "DISCARD TEMP"))
    if rows >= big_rows:
        # Joins of many staged rows against a big store table spill to disk at the default 4 MB.
        out.append(Statement("work_mem", f"SET LOCAL work_mem = '{check_work_mem(work_mem)}'"))
    out.append(Statement("lock", LOCK_SQL, (json.dumps(list(scopes)),)))
    if not inline:  # stage everything first, then mutate: the mutations then run back to back
        out += [stage_statement(stage_name(t, k), body, small_rows, t, k) for (t, k), body in fed_bodies.items()]
        if fed_bodies:
            out += [Statement("planner", sql) for sql in PLANNER_SQL]
    # edge deletes before node deletes (a node goes only once no edge touches it), node inserts before
    # edge inserts (an edge lands only while both of its nodes are in the store); then the rest
    graph = {"deletes": ("memory_edges", "memory_nodes"), "updates": ("memory_edges", "memory_nodes"),
             "inserts": ("memory_nodes", "memory_edges")}
    order = sorted(fed_bodies, key=lambda tk: (("deletes", "updates", "inserts").index(tk[1]),
                                               graph[tk[1]].index(tk[0]) if tk[0] in graph[tk[1]] else 2, tk[0]))
    node_deletes = fed_bodies.get(("memory_nodes", "deletes"))
    fed = []
    for table, kind in order:
        body = fed_bodies[(table, kind)]
        fed.append(body.group_by("scope_path", maintain_order=True).len("rows")
                   .with_columns(pl.lit(table).alias("table"), pl.lit(kind).alias("kind")))
        set_ends = set_endpoints and not inline and (table, kind) == ("memory_edges", "inserts")
        writes = _writes(table, kind, body, inline, node_deletes, signatures.get((table, kind)), cluster_cap, set_ends)
        if set_ends and writes:
            writes = [*(Statement("planner", sql) for sql in SET_JOIN_SQL), *writes,
                      *(Statement("planner", sql) for sql in PROBE_JOIN_SQL)]
        out += writes
    if q is not None:
        if q.height <= small_rows:
            out.append(Statement("quarantine", QUARANTINE_SQL.format(source=json_source(q.schema, 1)), (Rows(q),),
                                 table="consolidation_quarantine", source="inline_json", rows=q.height))
        else:
            staged = "_ds_shard_quarantine"
            out.append(Statement("quarantine", None, (Rows(q),), table="consolidation_quarantine",
                                 source="adbc_copy", staged=staged, rows=q.height))
            out.append(Statement("quarantine", QUARANTINE_SQL.format(source=staged), table="consolidation_quarantine",
                                 source="staged_table", staged=staged, rows=q.height))
    out.append(Statement("ledger", LEDGER_SQL, table="consolidation_runs", rows=len(scopes)))
    schema = {"scope_path": pl.String, "rows": pl.Int64, "table": pl.String, "kind": pl.String}
    fed_frame = pl.concat([f.cast(schema) for f in fed]) if fed else pl.DataFrame(schema=schema)
    return Statements(tuple(out), fed_frame.select("scope_path", "table", "kind", "rows"), scopes)


def _writes(table: str, kind: str, body: pl.DataFrame, inline: bool, node_deletes: pl.DataFrame | None,
            signatures: dict[int, list[str]] | None, cluster_cap: int | None = None, set_ends: bool = False) -> list[Statement]:
    """The guarded write(s) of one (table, kind), reading its rows inline or from its staged table."""
    staged = None if inline else stage_name(table, kind)
    source_kind = "inline_json" if inline else "staged_table"
    src = json_source(body.schema, 1) if inline else staged
    if kind == "deletes":
        params: tuple = (Rows(body),) if inline else ()
        node_src = None
        if table == "memory_edges" and node_deletes is not None:
            node_src = json_source(node_deletes.schema, 2) if inline else stage_name("memory_nodes", "deletes")
            params = (*params, Rows(node_deletes)) if inline else params
        return [Statement("delete", delete_sql(table, src, node_src), params, table=table, kind=kind,
                          source=source_kind, staged=staged, rows=body.height)]
    if kind == "updates":
        changed = [c for c in body.columns if c not in (*KEY_COLUMNS, "scope_path")]
        return [Statement("update", update_sql(table, changed, src), (Rows(body),) if inline else (), table=table,
                          kind=kind, source=source_kind, staged=staged, rows=body.height)]
    counts = dict(body.group_by(SIGNATURE_COLUMN).len().iter_rows())
    out = []
    for sig, present in sorted((signatures or {}).items()):
        if not counts.get(sig):
            continue
        if inline:  # one statement per signature, each fed only its own rows
            mine = body.filter(pl.col(SIGNATURE_COLUMN) == sig)
            out.append(Statement("insert", insert_sql(table, present, sig, json_source(mine.schema, 1), cluster_cap), (Rows(mine),),
                                 table=table, kind=kind, source=source_kind, rows=counts[sig]))
        else:
            out.append(Statement("insert", insert_sql(table, present, sig, staged, cluster_cap, set_ends), table=table,
                                 kind=kind, source=source_kind, staged=staged, rows=counts[sig],
                                 fast_sql=fast_insert_sql(table, present, sig, cluster_cap, set_ends)))
    return out


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
            lines.append("-- params: $1 = the ledger rows (JSON), bound from the reports after the writes "
                         "(rows_changed, conflicts, held)")
        elif s.params:
            lines += [f"-- ${n} = {_param(p, s.sql is None)}" for n, p in enumerate(s.params, 1)]
        if s.sql is None:
            lines.append(f"-- (no SQL: ADBC ingest of $1 into TEMPORARY TABLE {s.staged})")
        else:
            lines.append(s.sql + ";")
        if s.fast_sql is not None:
            lines.append("-- fast path (the same rows and counts; the guarded insert above on a unique violation):")
            lines.append(s.fast_sql + ";")
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"


__all__ = ["Statement", "Statements", "Rows", "statements", "explain", "stage_statement", "stage_sql", "json_source",
           "delete_sql", "update_sql", "insert_sql", "fast_insert_sql", "check_work_mem", "bodies", "SOURCES",
           "LEDGER_SQL", "LANDED_SQL", "SET_JOIN_SQL", "PROBE_JOIN_SQL", "SMALL_STAGE_ROWS", "BIG_DIFF_ROWS", "WRITES", "KEY_COLUMNS"]
