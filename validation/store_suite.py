"""The store's data-quality suite: great-expectations 1.x over the PostgreSQL tables, after apply.

SPEC §4: "The store itself is checked after apply by a data-quality suite (set-based SQL
expectations over whole tables, so once per night rather than once per scope) whose results are
kept with the run."  :func:`run_store_suite` is that suite::

    >>> res = run_store_suite(store.dsn, run_dir / "store_suite", run_id=str(run_id))  # doctest: +SKIP
    >>> res.success, res.json_path, res.data_docs_path                                  # doctest: +SKIP
    (True, '.../store_suite/results.json', '.../store_suite/data_docs/index.html')

What is checked (every check is one expectation over a whole table, never per scope):

================================  ===========================  ==================================
check                             tables                       expectation
================================  ===========================  ==================================
``importance_in_range``           ``memory_nodes``             ``ExpectColumnValuesToBeBetween``
                                                               1..10 (PostgreSQL sorts NaN above
                                                               every number, so NaN fails it too)
``importance_finite``             ``memory_nodes``             SQL: importance is NaN or ±Infinity
``weight_non_negative``           ``memory_edges``             ``ExpectColumnValuesToBeBetween``
                                                               min 0
``weight_finite``                 ``memory_edges``             SQL: weight is NaN or ±Infinity
                                                               (``NaN >= 0`` is *true* in
                                                               PostgreSQL: the range check alone
                                                               would let it through)
``no_dangling_edges``             ``memory_edges``             SQL: source or target missing from
                                                               ``memory_nodes``, or in another
                                                               scope than the edge
``version_positive``              every table with            ``ExpectColumnValuesToBeBetween``
                                  ``version``                  min 1
``rows_scoped``                   every table with            SQL: neither ``scope_path`` nor
                                  ``scope_path``               (legacy) ``tenant_id`` set
``scope_path_consistent``         every table with            SQL: a ``scope_path`` that is not
                                  ``scope_path``               non-empty ``kind\\x1fid`` pairs, or
                                                               whose root id is not the row's
                                                               ``tenant_id``
``no_active_consolidation_skill`` ``procedural_skills``        SQL: ``source = 'consolidation'``
                                                               and ``status = 'active'``
``label_not_empty``               ``memory_nodes``             SQL: label null, empty or blank
``properties_is_object``,         tables with a jsonb          SQL: ``jsonb_typeof`` is not
``metadata_is_object``            ``properties`` / ``metadata`` ``'object'``
================================  ===========================  ==================================

Tables and columns are discovered from ``information_schema`` at run time, so a table added by a
later migration gets the generic checks (scope, version) without touching this file.

Semantics decided here (SPEC is silent):

* *Scoped* means a usable owner: ``scope_path`` non-null and non-empty, or — legacy rows — a
  non-empty ``tenant_id``.  An empty string counts as missing.
* The scope of a legacy row (``scope_path`` NULL) is ``tenant\\x1f<tenant_id>`` (SPEC §1); the
  dangling-edge check compares these *effective* scopes, so a legacy edge must point at legacy
  nodes of the same tenant, and an edge and its nodes half-way through the scope backfill still
  match.
* A blank label (only whitespace) is as empty as ``''``.
* Examples: at most 5 offending rows per expectation, each a dict whose ``id`` is the row's key
  (``id``; else the single-column primary key; else the composite key joined by ``/``; else
  the row as JSON, cut at 200 characters) plus the offending values (``scope_path`` raw, with
  its ``\x1f`` separators; a ``problem`` column where a check has several reasons).  For SQL
  checks the rows come ordered by key, so the examples are deterministic.  ``unexpected_count``
  is always the full count.
* A check that cannot run (SQL error, missing column) fails with ``error`` set; it never passes.

How it runs with great-expectations 1.24 (see also README and the report in the PR):

* An *ephemeral* context (nothing written but our out_dir) with in-memory stores, analytics and
  progress bars off, and one Data Docs site (``TupleFilesystemStoreBackend``) under
  ``out_dir/data_docs``.
* A ``sql`` datasource (``context.data_sources.add_sql``) on ``postgresql+psycopg://`` (psycopg
  3, the driver we already ship).  ``add_postgres`` is *not* used: its pydantic ``PostgresDsn``
  rejects the unix-socket form ``postgresql://user:@/db?host=/dir`` ("URL host invalid") that the
  embedded server hands out.  ``import pgvector.sqlalchemy`` registers the ``vector`` type with
  SQLAlchemy; without it GX's ``table.column_types`` metric fails on every table with an
  embedding ("Can't generate DDL for NullType()").
* Per table, one whole-table batch definition and up to two validation definitions: built-in
  column expectations run with ``SUMMARY`` + ``unexpected_index_column_names=[key]`` (5 example
  ids, bounded queries), ``UnexpectedRowsExpectation`` runs with ``COMPLETE`` (the only format
  that returns its rows).  One format for both would either drop the SQL checks' rows or fetch
  *every* unexpected value of the column checks.  Suites are named ``<table>.columns`` and
  ``<table>.sql``.  Each run is stored in the context's results store;
  ``context.build_data_docs()`` then renders them all once, and the 3.4 MB of tutorial GIFs GX
  copies into every site are deleted (the site is ~2 MB per run).
* ``UnexpectedRowsExpectation`` runs its query twice (``SELECT COUNT(*) FROM (q)``, then ``q``
  keeping the first 200 rows), so the queries select narrow rows and order them by key.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import logging
import math
import os
import re
import shutil
import time
import uuid
import warnings
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

__all__ = ["SuiteResult", "run_store_suite", "sqlalchemy_url"]

log = logging.getLogger(__name__)

MAX_EXAMPLES = 5
DOCS_SITE = "deep_sleep_store"
_SEP_SQL = "chr(31)"  # the scope separator \x1f, spelled in SQL
# Every SQL check reads its table as `r`: GX substitutes {batch} with an aliased subquery whose
# alias is its own business, so we wrap it once more under a name we control.
_ROWS = "(SELECT * FROM {batch}) AS r"


@dataclass(frozen=True)
class SuiteResult:
    """The outcome of one run of the store suite.

    ``results`` holds one dict per expectation: ``expectation`` (the check's name, e.g.
    ``"importance_in_range"``), ``table``, ``column`` (or None), ``success``,
    ``unexpected_count`` (None if the check could not run), ``examples`` (≤ 5 offending rows,
    each with ``id``), ``gx_expectation`` (the GX expectation type), ``description`` and
    ``error`` (None, or why the check could not run).
    """

    success: bool
    results: list[dict] = field(default_factory=list)
    data_docs_path: str | None = None
    json_path: str = ""

    @property
    def failures(self) -> list[dict]:
        return [r for r in self.results if not r["success"]]


# ---------------------------------------------------------------------------------------------
# What to check: discovered from the catalog, independent of GX.


@dataclass(frozen=True)
class _Table:
    name: str
    columns: dict[str, str]  # name -> information_schema data_type
    pk: tuple[str, ...]

    def has(self, *cols: str) -> bool:
        return all(c in self.columns for c in cols)

    @property
    def key_column(self) -> str | None:
        """A single real column identifying a row (for GX's unexpected_index_column_names)."""
        if "id" in self.columns:
            return "id"
        return self.pk[0] if len(self.pk) == 1 else None

    @property
    def key_sql(self) -> str:
        """An SQL expression giving a row's key as text (aliased ``id`` in the examples)."""
        if self.key_column:
            return f"r.{_q(self.key_column)}::text"
        if self.pk:
            return "concat_ws('/', " + ", ".join(f"r.{_q(c)}::text" for c in self.pk) + ")"
        return "left(row_to_json(r)::text, 200)"  # no key at all: the row itself names it


@dataclass(frozen=True)
class _Check:
    name: str
    table: str
    description: str
    column: str | None = None
    between: tuple[float | None, float | None] | None = None  # built-in column range check
    sql: str | None = None  # UnexpectedRowsExpectation query (uses {batch})

    @property
    def kind(self) -> str:
        return "column" if self.between is not None else "sql"

    def as_sql(self, t: _Table) -> _Check:
        """The same range check as an SQL check (for a table without a single key column)."""
        lo, hi = self.between  # type: ignore[misc]
        col = _q(self.column)  # type: ignore[arg-type]
        ok = " AND ".join(p for p in (f"{col} >= {lo}" if lo is not None else "",
                                       f"{col} <= {hi}" if hi is not None else "") if p)
        return _Check(self.name, self.table, self.description, column=self.column,
                      sql=f"SELECT {t.key_sql} AS id, {col}::text AS {col} FROM {_ROWS} "
                          f"WHERE {col} IS NOT NULL AND NOT ({ok}) ORDER BY 1")


def _q(ident: str) -> str:
    return '"' + ident.replace('"', '""') + '"'


def _discover(dsn: str) -> dict[str, _Table]:
    """Base tables of the current schema with their columns and primary keys (one round trip)."""
    sql = """
        SELECT c.table_name, c.column_name, c.data_type,
               coalesce((SELECT array_agg(a.attname::text ORDER BY array_position(i.indkey, a.attnum))
                           FROM pg_index i
                           JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
                          WHERE i.indisprimary
                            AND i.indrelid = (quote_ident(c.table_schema) || '.' || quote_ident(c.table_name))::regclass),
                        '{}') AS pk
          FROM information_schema.columns c
          JOIN information_schema.tables t USING (table_schema, table_name)
         WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'
         ORDER BY c.table_name, c.ordinal_position
    """
    tables: dict[str, dict] = {}
    with psycopg.connect(dsn, autocommit=True) as con:
        for table, column, dtype, pk in con.execute(sql):
            entry = tables.setdefault(table, {"columns": {}, "pk": tuple(pk)})
            entry["columns"][column] = dtype
    return {name: _Table(name, t["columns"], t["pk"]) for name, t in tables.items()}


def _checks(tables: dict[str, _Table]) -> list[_Check]:
    """Every check that applies to the discovered schema, in a stable order."""
    out: list[_Check] = []
    nodes, edges = tables.get("memory_nodes"), tables.get("memory_edges")

    def finite(t: _Table, col: str) -> _Check:
        return _Check(
            f"{col}_finite", t.name, f"{t.name}.{col} is a finite number (not NaN, not ±Infinity)", column=col,
            sql=f"SELECT {t.key_sql} AS id, {_q(col)}::text AS {_q(col)} FROM {_ROWS} "
                f"WHERE {_q(col)} IN ('NaN'::float8, 'Infinity'::float8, '-Infinity'::float8) ORDER BY 1",
        )

    if nodes and nodes.has("importance"):
        out.append(_Check("importance_in_range", nodes.name, "memory_nodes.importance is within [1, 10] (NaN fails)",
                          column="importance", between=(1.0, 10.0)))
        out.append(finite(nodes, "importance"))
    if nodes and nodes.has("label"):
        out.append(_Check(
            "label_not_empty", nodes.name, "memory_nodes.label is not null, empty or blank", column="label",
            sql=f"SELECT {nodes.key_sql} AS id, scope_path, label FROM {_ROWS} "
                "WHERE label IS NULL OR label = '' "
                # blank = only ASCII whitespace; ascii() (first character) spares btrim on most rows
                "OR (ascii(label) IN (9, 10, 11, 12, 13, 32) AND btrim(label, E' \\t\\n\\r\\f\\x0b') = '') "
                "ORDER BY 1",
        ))
    if edges and edges.has("weight"):
        out.append(_Check("weight_non_negative", edges.name, "memory_edges.weight is ≥ 0",
                          column="weight", between=(0.0, None)))
        out.append(finite(edges, "weight"))
    if nodes and edges and edges.has("source_id", "target_id") and nodes.has("id"):
        out.append(_Check(
            "no_dangling_edges", edges.name,
            "every edge's source and target exist in memory_nodes, in the edge's own scope "
            "(legacy rows: scope tenant\\x1f<tenant_id>)",
            sql=_dangling_sql(edges, nodes),
        ))
    if (skills := tables.get("procedural_skills")) and skills.has("source", "status"):
        out.append(_Check(
            "no_active_consolidation_skill", skills.name,
            "no procedural skill created by consolidation is active (drafts are never auto-activated)",
            sql=f"SELECT {skills.key_sql} AS id, scope_path, name, status, source FROM {_ROWS} "
                "WHERE source = 'consolidation' AND status = 'active' ORDER BY 1",
        ))
    for t in sorted(tables.values(), key=lambda t: t.name):
        for col in ("properties", "metadata"):
            if t.columns.get(col) == "jsonb":
                out.append(_Check(
                    f"{col}_is_object", t.name, f"{t.name}.{col} is a JSON object", column=col,
                    sql=f"SELECT {t.key_sql} AS id, jsonb_typeof({_q(col)}) AS json_type, "
                        f"left({_q(col)}::text, 200) AS {_q(col)} FROM {_ROWS} "
                        f"WHERE jsonb_typeof({_q(col)}) IS DISTINCT FROM 'object' ORDER BY 1",
                ))
        if t.has("scope_path"):
            out.extend(_scope_checks(t))
        if t.has("version") and t.columns["version"] in ("bigint", "integer", "smallint", "numeric"):
            out.append(_Check("version_positive", t.name, f"{t.name}.version is ≥ 1",
                              column="version", between=(1, None)))
    return out


def _effective_scope(alias: str, has_tenant: bool) -> str:
    if not has_tenant:
        return f"{alias}.scope_path"
    return f"coalesce({alias}.scope_path, 'tenant' || {_SEP_SQL} || {alias}.tenant_id)"


def _dangling_sql(edges: _Table, nodes: _Table) -> str:
    e_scope = _effective_scope("e", edges.has("tenant_id"))
    s_scope = _effective_scope("s", nodes.has("tenant_id"))
    t_scope = _effective_scope("t", nodes.has("tenant_id"))
    return f"""SELECT e.id::text AS id, e.scope_path, e.source_id::text AS source_id, e.target_id::text AS target_id,
       concat_ws('; ',
         CASE WHEN s.id IS NULL THEN 'source missing'
              WHEN {s_scope} IS DISTINCT FROM {e_scope} THEN 'source in scope ' || coalesce({s_scope}, 'NULL') END,
         CASE WHEN t.id IS NULL THEN 'target missing'
              WHEN {t_scope} IS DISTINCT FROM {e_scope} THEN 'target in scope ' || coalesce({t_scope}, 'NULL') END
       ) AS problem
  FROM {{batch}} e
  LEFT JOIN memory_nodes s ON s.id = e.source_id
  LEFT JOIN memory_nodes t ON t.id = e.target_id
 WHERE s.id IS NULL OR t.id IS NULL
    OR {s_scope} IS DISTINCT FROM {e_scope}
    OR {t_scope} IS DISTINCT FROM {e_scope}
 ORDER BY 1"""


def _scope_checks(t: _Table) -> list[_Check]:
    has_tenant = t.has("tenant_id")
    unscoped = "coalesce(scope_path, '') = ''"
    if has_tenant:
        unscoped += " AND coalesce(tenant_id, '') = ''"
    tenant_cols = ", tenant_id" if has_tenant else ""
    checks = [_Check(
        "rows_scoped", t.name,
        f"every {t.name} row has a scope_path" + (" or (legacy) a tenant_id" if has_tenant else ""),
        sql=f"SELECT {t.key_sql} AS id, scope_path{tenant_cols} FROM {_ROWS} WHERE {unscoped} ORDER BY 1",
    )]
    # Well formed: non-empty kind/id pairs joined by \x1f, i.e. an odd number of separators, none
    # leading, trailing or doubled.  Plain byte-string functions: string_to_array or a regex per
    # row made this the slowest check (3x and 6x slower at 100k rows).
    sep = _SEP_SQL
    malformed = (f"((octet_length(scope_path) - octet_length(replace(scope_path, {sep}, ''))) % 2 = 0"
                 f" OR strpos({sep} || scope_path || {sep}, {sep} || {sep}) > 0)")
    problem = f"CASE WHEN {malformed} THEN 'malformed scope_path'"
    where = f"scope_path <> '' AND ({malformed}"
    if has_tenant:
        root_id = f"split_part(scope_path, {_SEP_SQL}, 2)"
        problem += f" WHEN tenant_id IS DISTINCT FROM {root_id} THEN 'tenant_id is not the scope root id ' || {root_id}"
        where += f" OR tenant_id IS DISTINCT FROM {root_id}"
    problem += " END"
    where += ")"
    checks.append(_Check(
        "scope_path_consistent", t.name,
        f"every {t.name}.scope_path is kind\\x1fid pairs" + (" whose root id is the row's tenant_id" if has_tenant else ""),
        sql=f"SELECT {t.key_sql} AS id, scope_path{tenant_cols}, "
            f"{problem} AS problem FROM {_ROWS} WHERE {where} ORDER BY 1",
    ))
    return checks


# ---------------------------------------------------------------------------------------------
# Running it with great-expectations.


def sqlalchemy_url(dsn: str) -> str:
    """The SQLAlchemy URL for a libpq DSN, on the psycopg 3 driver (``postgresql+psycopg://``).

    Accepts URI DSNs (including the unix-socket form ``postgresql://user:@/db?host=/dir``) and
    keyword DSNs (``host=/dir dbname=db user=postgres``).
    """
    if "://" in dsn:
        parts = urlsplit(dsn)
        scheme = parts.scheme
        if scheme in ("postgres", "postgresql"):
            scheme = "postgresql+psycopg"
        return urlunsplit(parts._replace(scheme=scheme))
    from sqlalchemy.engine import URL

    info = psycopg.conninfo.conninfo_to_dict(dsn)
    query = {k: str(v) for k, v in info.items() if k not in ("user", "password", "dbname", "port")}
    url = URL.create("postgresql+psycopg", username=info.get("user"), password=info.get("password"),
                     port=int(info["port"]) if info.get("port") else None, database=info.get("dbname"), query=query)
    return url.render_as_string(hide_password=False)


def _redact_text(text: str, dsn: str) -> str:
    from deep_sleep.store.db import redact

    return redact(text, dsn)


def _redact(dsn: str) -> str:
    from deep_sleep.store.db import redact

    return redact(dsn, dsn)


@contextlib.contextmanager
def _quiet():
    """Silence GX's loggers for the duration (progress bars are off in the context config)."""
    loggers = [logging.getLogger(n) for n in ("great_expectations", "sqlalchemy.engine")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def _import_gx():
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    # Narrow, process-wide filters (catch_warnings is not thread-safe under Prefect's thread pool):
    # GX's own import-time deprecations, and its nudge towards add_postgres, which cannot take
    # the unix-socket DSN (see the module docstring).
    warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"great_expectations(\.|$)")
    warnings.filterwarnings("ignore", message=r"You are using a generic SQLDatasource")
    with _quiet():
        import great_expectations as gx
        import pgvector.sqlalchemy  # noqa: F401  registers the `vector` type with SQLAlchemy's PG dialect
    return gx


def _context(gx, docs_dir: Path | None):
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        analytics_enabled=False,
        progress_bars=ProgressBarsConfig(globally=False, metric_calculations=False),
    )
    if docs_dir is not None:
        config.data_docs_sites = {
            DOCS_SITE: {
                "class_name": "SiteBuilder",
                "show_how_to_buttons": False,
                "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(docs_dir)},
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            }
        }
    return gx.get_context(mode="ephemeral", project_config=config)


def _expectation(gx, check: _Check):
    meta = {"ds_check": check.name, "ds_table": check.table}
    if check.kind == "column":
        lo, hi = check.between  # type: ignore[misc]
        return gx.expectations.ExpectColumnValuesToBeBetween(
            column=check.column, min_value=lo, max_value=hi, meta=meta, description=check.description)
    return gx.expectations.UnexpectedRowsExpectation(
        unexpected_rows_query=check.sql, meta=meta, description=check.description)


def _jsonable(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value).replace("inf", "Infinity").replace("nan", "NaN")
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, uuid.UUID):
        return str(value)
    return str(value)


def _row(check: _Check, key_column: str | None, evr) -> dict:
    """One result dict from a GX ExpectationValidationResult."""
    res = evr.result or {}
    error = None
    info = evr.exception_info or {}
    if info.get("raised_exception"):
        error = info.get("exception_message")
    else:  # metric-resolution errors are keyed by metric id
        for v in info.values():
            if isinstance(v, dict) and v.get("raised_exception"):
                error = v.get("exception_message")
                break
    if check.kind == "column":
        count = res.get("unexpected_count")
        examples = []
        for item in (res.get("partial_unexpected_index_list") or [])[:MAX_EXAMPLES]:
            item = dict(item)
            if key_column and key_column != "id":
                item["id"] = item.pop(key_column, None)
            examples.append(item)
    else:
        count = res.get("observed_value")
        examples = list((res.get("details") or {}).get("unexpected_rows") or [])[:MAX_EXAMPLES]
    success = bool(evr.success) and error is None
    if count is None and success:
        count = 0  # GX omits the count on an empty table
    return {
        "expectation": check.name,
        "table": check.table,
        "column": check.column,
        "success": success,
        "unexpected_count": int(count) if count is not None else None,
        "examples": _jsonable(examples),
        "gx_expectation": evr.expectation_config.type if evr.expectation_config else None,
        "description": check.description,
        "error": error,
    }


def _error_row(check: _Check, exc: BaseException) -> dict:
    return {
        "expectation": check.name, "table": check.table, "column": check.column, "success": False,
        "unexpected_count": None, "examples": [],
        "gx_expectation": "expect_column_values_to_be_between" if check.kind == "column" else "unexpected_rows_expectation",
        "description": check.description, "error": f"{type(exc).__name__}: {exc}",
    }


def _drop_unused_static(docs_dir: Path) -> None:
    """Delete the images GX copies into every site but no page uses (3.4 MB of tutorial GIFs per run)."""
    images = docs_dir / "static" / "images"
    if not images.is_dir():
        return
    pages = "".join(p.read_text(errors="replace") for ext in ("*.html", "*.css", "*.js") for p in docs_dir.rglob(ext))
    for f in images.iterdir():
        if f.is_file() and f.name not in pages:
            f.unlink()


def run_store_suite(dsn: str, out_dir: Path, run_id: str | None = None, *, data_docs: bool = True) -> SuiteResult:
    """Run the store suite over every table at ``dsn``; write ``out_dir/results.json`` and Data Docs.

    ``out_dir/results.json`` holds ``run_id``, ``success``, timestamps and timings, the tables
    checked and ``results`` (as :class:`SuiteResult`).  Data Docs (HTML) go to
    ``out_dir/data_docs/`` (``data_docs_path`` = its ``index.html``; None with
    ``data_docs=False``).  A failed expectation is a result, not an exception; an unreachable
    database raises :class:`deep_sleep.store.errors.StoreError`.
    """
    from deep_sleep.store.errors import StoreError

    t0 = time.perf_counter()
    started = _dt.datetime.now(_dt.timezone.utc)
    run_id = run_id or started.strftime("%Y%m%dT%H%M%S.%fZ")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    docs_dir = (out_dir / "data_docs").resolve() if data_docs else None
    if docs_dir is not None and docs_dir.exists():
        shutil.rmtree(docs_dir)  # a rerun into the same directory must not leave stale pages behind
    timings: dict[str, float] = {}

    try:
        tables = _discover(dsn)
    except psycopg.Error as exc:
        raise StoreError(f"store suite: cannot read the catalog at {_redact(dsn)}: {_redact_text(str(exc), dsn)}") from None
    checks = _checks(tables)
    timings["discover"] = time.perf_counter() - t0

    t = time.perf_counter()
    gx = _import_gx()
    timings["import_gx"] = time.perf_counter() - t

    from great_expectations.core.run_identifier import RunIdentifier

    results: list[dict] = []
    data_docs_path = None
    with _quiet():
        t = time.perf_counter()
        ctx = _context(gx, docs_dir)
        ds = ctx.data_sources.add_sql(
            name="store", connection_string=sqlalchemy_url(dsn),
            kwargs={"connect_args": {"application_name": "deep_sleep_store_suite"}},
        )
        gx_run_id = RunIdentifier(run_name=run_id, run_time=started)
        by_table: dict[str, list[_Check]] = {}
        for c in checks:
            by_table.setdefault(c.table, []).append(c)
        timings["setup"] = time.perf_counter() - t
        t = time.perf_counter()
        try:
            for table, table_checks in by_table.items():
                t_table = time.perf_counter()
                key_column = tables[table].key_column
                asset = ds.add_table_asset(name=table, table_name=table)
                batch_def = asset.add_batch_definition_whole_table("whole table")
                if key_column is None:  # GX names unexpected rows by a column: run range checks as SQL
                    table_checks = [c.as_sql(tables[table]) if c.kind == "column" else c for c in table_checks]
                groups = {
                    "column": [c for c in table_checks if c.kind == "column"],
                    "sql": [c for c in table_checks if c.kind == "sql"],
                }
                for kind, group in groups.items():
                    if not group:
                        continue
                    suite = ctx.suites.add(gx.ExpectationSuite(
                        name=f"{table}.{'columns' if kind == 'column' else 'sql'}",
                        expectations=[_expectation(gx, c) for c in group],
                    ))
                    vd = ctx.validation_definitions.add(
                        gx.ValidationDefinition(name=f"{table}:{kind}", data=batch_def, suite=suite))
                    result_format = (
                        {"result_format": "SUMMARY", "unexpected_index_column_names": [key_column],
                         "partial_unexpected_count": MAX_EXAMPLES}
                        if kind == "column" else {"result_format": "COMPLETE"}
                    )
                    try:
                        svr = vd.run(result_format=result_format, run_id=gx_run_id)
                    except Exception as exc:  # e.g. the table vanished: its checks fail, the rest run
                        log.warning("store suite: %s checks of %s could not run: %s", kind, table, exc)
                        results.extend(_error_row(c, exc) for c in group)
                        continue
                    by_name = {c.name: c for c in group}
                    for evr in svr.results:
                        check = by_name[evr.expectation_config.meta["ds_check"]]
                        results.append(_row(check, key_column, evr))
                timings[f"validate:{table}"] = time.perf_counter() - t_table
            timings["validate"] = time.perf_counter() - t
            if docs_dir is not None:
                t = time.perf_counter()
                ctx.build_data_docs(site_names=[DOCS_SITE])
                _drop_unused_static(docs_dir)
                index = docs_dir / "index.html"
                data_docs_path = str(index) if index.exists() else None
                timings["data_docs"] = time.perf_counter() - t
        finally:
            with contextlib.suppress(Exception):
                ds.get_engine().dispose()

    order = {c.name + "\0" + c.table: i for i, c in enumerate(checks)}
    results.sort(key=lambda r: order.get(r["expectation"] + "\0" + r["table"], len(order)))
    success = all(r["success"] for r in results)
    timings["total"] = time.perf_counter() - t0
    json_path = out_dir / "results.json"
    payload = {
        "run_id": run_id,
        "success": success,
        "started_at": started.isoformat(),
        "finished_at": _dt.datetime.now(_dt.timezone.utc).isoformat(),
        "store": _redact(dsn),
        "tables": sorted(by_table),
        "expectations": len(results),
        "failed": [f"{r['table']}.{r['expectation']}" for r in results if not r["success"]],
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
        "data_docs_path": data_docs_path,
        "results": results,
    }
    tmp = json_path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(payload, indent=2, ensure_ascii=False, allow_nan=False) + "\n")
    tmp.replace(json_path)
    if not success:
        log.warning("store suite %s failed: %s", run_id, ", ".join(payload["failed"]))
    return SuiteResult(success=success, results=results, data_docs_path=data_docs_path, json_path=str(json_path))
