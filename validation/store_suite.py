"""The store's data-quality suite: great-expectations 1.x over the PostgreSQL tables, after apply.

SPEC §4: "The store itself is checked after apply by a data-quality suite (set-based SQL
expectations over whole tables, so once per night rather than once per scope) whose results are
kept with the run."  :func:`run_store_suite` is that suite::

    >>> res = run_store_suite(store.dsn, run_dir / "store_suite", run_id=str(run_id))  # doctest: +SKIP
    >>> res.success, res.json_path, res.data_docs_path                                  # doctest: +SKIP
    (True, '.../store_suite/results.json', '.../store_suite/data_docs/index.html')

What is checked, and the semantics decided for it, is in :mod:`deep_sleep.validation.store_checks`
(the checks as values, from the catalog); this module runs them with great-expectations and keeps
the results.

How it runs with great-expectations 1.24 (what it checks and when: docs/semantics.md, "Data quality"):

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
from deep_sleep.validation.store_checks import StoreCheck, checks_for, discover

__all__ = ["SuiteResult", "run_store_suite", "sqlalchemy_url", "suite_connect_args"]

log = logging.getLogger(__name__)

MAX_EXAMPLES = 5
DOCS_SITE = "deep_sleep_store"
#: ``work_mem`` of the suite's connections (``DEEP_SLEEP_SUITE_WORK_MEM``).  The dangling-edge check
#: hash-joins every edge with its two nodes; at PostgreSQL's default 4MB those hashes spill to disk,
#: and great-expectations runs the query twice.  256MB took about a third off it on the 100k-scope
#: fleet, and more bought nothing (benchmarks/README.md).
DEFAULT_WORK_MEM = "256MB"


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


def suite_connect_args() -> dict[str, str]:
    """The psycopg connection arguments of the suite's engine: its ``application_name`` and
    ``work_mem`` (``DEEP_SLEEP_SUITE_WORK_MEM``, default :data:`DEFAULT_WORK_MEM`; a malformed
    value is a :class:`~deep_sleep.core.errors.ConfigError` naming the variable)."""
    from deep_sleep.core.config import work_mem_size

    work_mem = work_mem_size(os.environ.get("DEEP_SLEEP_SUITE_WORK_MEM"), "DEEP_SLEEP_SUITE_WORK_MEM", DEFAULT_WORK_MEM)
    return {"application_name": "deep_sleep_store_suite", "options": f"-c work_mem={work_mem.replace(' ', '')}"}


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


def _expectation(gx, check: StoreCheck):
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


def _row(check: StoreCheck, key_column: str | None, evr) -> dict:
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


def _error_row(check: StoreCheck, exc: BaseException) -> dict:
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
    database raises :class:`deep_sleep.store.errors.StoreError`; a malformed
    ``DEEP_SLEEP_SUITE_WORK_MEM`` a :class:`deep_sleep.core.errors.ConfigError`, before any query.
    """
    from deep_sleep.store.errors import StoreError

    connect_args = suite_connect_args()
    t0 = time.perf_counter()
    started = _dt.datetime.now(_dt.UTC)
    run_id = run_id or started.strftime("%Y%m%dT%H%M%S.%fZ")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    docs_dir = (out_dir / "data_docs").resolve() if data_docs else None
    if docs_dir is not None and docs_dir.exists():
        shutil.rmtree(docs_dir)  # a rerun into the same directory must not leave stale pages behind
    timings: dict[str, float] = {}

    try:
        tables = discover(dsn)
    except psycopg.Error as exc:
        raise StoreError(f"store suite: cannot read the catalog at {_redact(dsn)}: {_redact_text(str(exc), dsn)}") from None
    checks = checks_for(tables)
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
            kwargs={"connect_args": connect_args},
        )
        gx_run_id = RunIdentifier(run_name=run_id, run_time=started)
        by_table: dict[str, list[StoreCheck]] = {}
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
        "finished_at": _dt.datetime.now(_dt.UTC).isoformat(),
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
