"""Apply a validated shard diff to the store (SPEC §2 step 4): run the statement list.

:func:`deep_sleep.run.statements.statements` builds every statement of a batch of scopes — the SQL,
its parameters and how each table's rows are fed (inline JSON, a JSON temporary table, ADBC COPY) —
as values; :func:`apply` only executes them, one transaction per batch, and counts what landed per
scope: a write's ``(scope_path, n)`` rows are its rows applied, the rest of a scope's rows are its
``conflicts`` (a live writer changed them after the snapshot; the next run sees them again).  A
single scope is a batch of one.  On any error a batch's transaction rolls back (the store is as
before for its scopes) and its scopes are retried one by one, so a bad scope never blocks the others.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import polars as pl
import pyarrow as pa

from deep_sleep.core import tables
from deep_sleep.core.diff import Diff, TableDiff
from deep_sleep.core.errors import InputError
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.run.statements import (
    BIG_DIFF_ROWS,
    LANDED_SQL,
    LEDGER_SQL,
    SMALL_STAGE_ROWS,
    Rows,
    Statement,
    Statements,
    check_work_mem,
    stage_statement,
    statements,
)
from deep_sleep.store.db import Store
from deep_sleep.store.errors import is_transient


def apply_work_mem() -> str:
    """``work_mem`` for the apply transaction: ``DEEP_SLEEP_APPLY_WORK_MEM`` or 256MB."""
    return check_work_mem(os.environ.get("DEEP_SLEEP_APPLY_WORK_MEM"))


@dataclass(frozen=True)
class ScopeApplied:
    """One scope's outcome of :func:`apply`.

    status: ``applied`` or ``failed`` (recorded as a failed run, nothing of the scope changed).
    applied: rows applied per table and kind (empty when failed).
    conflicts: rows a live writer changed after the snapshot (left as the writer left them).
    error: why the scope failed (``ExceptionType: message``), else None.
    seconds: the wall time of the scope's batch: its transaction, and when it failed, the scope-by-scope
        retry of the whole batch as well.
    batch: the batch's number (0, 1, …; scopes in byte order of their paths).
    retried: the scope was applied (or failed) in its own transaction after its batch's transaction failed.
    batch_error: then, the error of the batch's transaction (``ExceptionType: message``), else None.
    """

    status: str
    applied: dict[str, dict[str, int]]
    conflicts: int
    error: str | None
    seconds: float
    batch: int
    retried: bool = False
    batch_error: str | None = None


#: A staged batch's edge inserts check their nodes as one set (the fast path); False: two probes per
#: row, the plain version it is tested against (tests/run/test_insert_endpoints.py).
SET_ENDPOINTS = True
TRANSIENT_ATTEMPTS = 3  # a scope's own transaction is tried this often when its error is transient
#: At most this many fast inserts per batch: each is a subtransaction that writes, and a transaction
#: with more than 64 of those (PGPROC_MAX_CACHED_SUBXIDS) makes every concurrent snapshot slower.
FAST_INSERTS_PER_BATCH = 32


def _bind(params: tuple) -> tuple:
    """Parameters as sent: rows as one JSON text each."""
    return tuple(p.frame.write_json() if isinstance(p, Rows) else p for p in params)


def _run(cur, s: Statement) -> None:
    """Execute one statement whose result is not read."""
    if s.sql is None:
        cur.adbc_ingest(s.staged, s.params[0].frame.to_arrow(), mode="create", temporary=True)
    elif s.params:
        cur.execute(s.sql, parameters=_bind(s.params))
    else:
        cur.execute(s.sql)


def stage(cur, name: str, body: pl.DataFrame) -> None:
    """Stage ``body`` as the temporary table ``name`` (see :func:`~deep_sleep.run.statements.stage_statement`)."""
    _run(cur, stage_statement(name, body, SMALL_STAGE_ROWS))


def ledger_rows(reports: list[ConsolidationReport], mode: str, started_at: datetime) -> str:
    """The ledger rows of some runs as one JSON array (the fields of
    :data:`~deep_sleep.run.statements.LEDGER_FIELDS`; each report's status, and its holds:
    ``hold_status`` is ``pending`` when the report holds rows)."""
    rows = [{
        "run_id": r.run_id, "scope_path": r.scope_path, "mode": mode, "as_of": r.as_of, "started_at": started_at.isoformat(),
        "status": r.status, "counters": r.counters, "phases_run": r.phases_run, "phases_skipped": r.phases_skipped,
        "timings": r.timings, "rows_changed": r.rows_changed, "conflicts": r.conflicts, "diff_hash": r.diff_hash,
        "snapshot_uri": r.snapshot_uri, "diff_uri": r.diff_uri, "errors": r.errors, "quarantined": r.quarantined,
        "recall_before": r.gate.get("recall_before"), "recall_after": r.gate.get("recall_after"),
        "held": r.held or {}, "hold_status": "pending" if r.held and r.status == "applied" else "none",
        "approval_of": r.approval_of,
    } for r in reports]
    return json.dumps(rows, sort_keys=True, default=str)


def record_run(store: Store, report: ConsolidationReport, mode: str, started_at: datetime, status: str) -> None:
    """Write one ledger row on its own (a failed run, which applies nothing)."""
    with store.transaction() as cur:
        cur.execute(LEDGER_SQL, parameters=(ledger_rows([report.with_(status=status)], mode, started_at),))


def batch_statements(diff: Diff, reports: Mapping[str, ConsolidationReport],
                       quarantined: pl.DataFrame | None = None, cluster_cap: int | None = None) -> Statements:
    """The statements :func:`apply` runs for one batch (``replay --explain`` prints them).  The
    thresholds and :data:`SET_ENDPOINTS` are read at call time (tests set them on this module); the
    environment here, not by the pure builder.  ``cluster_cap``: ``meta_nodes.max_members`` (see :func:`~deep_sleep.run.statements.statements`)."""
    return statements(diff, {s: r.run_id or "" for s, r in reports.items()}, quarantined=quarantined,
                      small_rows=SMALL_STAGE_ROWS, big_rows=BIG_DIFF_ROWS,
                      work_mem=os.environ.get("DEEP_SLEEP_APPLY_WORK_MEM"), cluster_cap=cluster_cap,
                      set_endpoints=SET_ENDPOINTS)


def _check_run_ids(reports: Mapping[str, ConsolidationReport]) -> None:
    for s, r in reports.items():
        if r.scope_path != s:
            raise InputError(f"apply: the report under {s!r} is of scope {r.scope_path!r}")
        if not r.run_id:
            raise InputError(f"apply: the report of {s!r} has no run_id (a UUID) to archive and record the run")
        try:
            uuid.UUID(r.run_id)
        except ValueError:
            raise InputError(f"apply: report.run_id {r.run_id!r} of {s!r} is not a UUID") from None


def _batches(diff: Diff, quarantined: pl.DataFrame | None, scopes: list[str], batch_scopes: int,
             not_applied: set[str]) -> tuple[dict[int, Diff], dict[int, pl.DataFrame]]:
    """The diff and quarantined rows split into batches of ``batch_scopes`` consecutive scopes (of
    ``scopes``) — one partition per frame, no filter per batch — without the rows of the scopes
    ``not_applied`` (reports marked failed).  A row of no listed scope (or without a ``scope_path``)
    raises :class:`InputError`."""
    batch_of = pl.DataFrame({"scope_path": scopes, "_ds_batch": [None if s in not_applied else i // batch_scopes
                                                                  for i, s in enumerate(scopes)]},
                            schema={"scope_path": pl.String, "_ds_batch": pl.Int64})
    listed = pl.Series(scopes, dtype=pl.String).implode()
    whole = len(scopes) <= batch_scopes and not not_applied  # one batch of every row (a quick nap's): nothing to cut

    def split(what: str, frame: pl.DataFrame) -> dict[int, pl.DataFrame]:
        if "scope_path" not in frame.columns:
            raise InputError(f"apply: {what} needs a scope_path on every row")
        stray = frame.filter(~pl.col("scope_path").is_in(listed) | pl.col("scope_path").is_null())
        if stray.height:
            raise InputError(f"apply: {what} has rows of scopes without a report: "
                             f"{stray.get_column('scope_path').unique().head(3).to_list()}")
        if whole:
            return {0: frame}
        got = frame.join(batch_of, on="scope_path", how="left", maintain_order="left").filter(pl.col("_ds_batch").is_not_null())
        return {b: part.drop("_ds_batch") for (b,), part in got.partition_by("_ds_batch", as_dict=True).items()}

    parts: dict[int, dict[str, dict[str, pl.DataFrame]]] = {}
    for name, td in diff.tables.items():
        for kind, frame in td.frames().items():
            if frame.height:
                for b, part in split(f"{name}.{kind}", frame).items():
                    parts.setdefault(b, {}).setdefault(name, {})[kind] = part
    diffs = {b: Diff({name: TableDiff(**kinds) for name, kinds in by_table.items()}) for b, by_table in parts.items()}
    held = split("quarantined", quarantined) if quarantined is not None and quarantined.height else {}
    return diffs, held


def _outcome(fed: pl.DataFrame, landed: list[pl.DataFrame], scopes: tuple[str, ...]) -> dict[str, tuple[dict, int]]:
    """scope → (rows applied per table and kind, conflicts): every (table, kind) the scope fed rows to,
    with the rows its writes returned (0 when none landed); conflicts are the rest."""
    schema = {"scope_path": pl.String, "table": pl.String, "kind": pl.String, "n": pl.Int64}
    got = pl.concat([f.cast(schema) for f in landed]) if landed else pl.DataFrame(schema=schema)
    got = got.group_by("scope_path", "table", "kind").agg(pl.col("n").sum())
    per = fed.join(got, on=["scope_path", "table", "kind"], how="left").with_columns(pl.col("n").fill_null(0))
    out: dict[str, tuple[dict, int]] = {s: ({}, 0) for s in scopes}
    for s, table, kind, rows, n in per.select("scope_path", "table", "kind", "rows", "n").iter_rows():
        applied, conflicts = out[s]
        applied.setdefault(table, {})[kind] = n
        out[s] = (applied, conflicts + rows - n)
    return out


def _step_key(s: Statement) -> str:
    """The name a statement's seconds are summed under: its step, and table and kind when it has them."""
    return ".".join(x for x in (s.step, s.table, s.kind) if x)


def _write(cur, s: Statement, guarded: set[str], fast: bool) -> pa.Table:
    """Run one write of a batch; its ``(scope_path, n)`` rows.

    ``fast`` (a staged insert with a :attr:`~deep_sleep.run.statements.Statement.fast_sql`): run that —
    a plain INSERT, and the guarded ``INSERT … ON CONFLICT DO NOTHING`` only if a row collides on a
    unique index, a live writer's row say (see :func:`~deep_sleep.run.statements.fast_insert_sql`):
    the rows and counts are exactly the guarded insert's either way.  A table whose insert collided is
    added to ``guarded``, and its later inserts (of this apply) run guarded straight away, so a store
    where collisions are common pays the wasted attempt once per table.
    """
    if not fast:
        cur.execute(s.sql, parameters=_bind(s.params)) if s.params else cur.execute(s.sql)
        return cur.fetch_arrow_table()
    cur.execute(s.fast_sql)
    cur.execute(LANDED_SQL)
    got = pl.from_arrow(cur.fetch_arrow_table())
    if got.get_column("guarded").any():
        guarded.add(s.table)
    return got.filter(pl.col("scope_path").is_not_null()).select("scope_path", "n").to_arrow()


def apply_batch(store: Store, planned: Statements, reports: Mapping[str, ConsolidationReport], mode: str,
                 started_at: datetime, step_seconds: dict[str, float] | None = None,
                 guarded: set[str] | None = None) -> dict[str, tuple[dict, int]]:
    """One transaction: the batch's statements and one ledger INSERT of its scopes' rows.  Raises (the
    transaction rolled back) on any error.  ``step_seconds``: each statement's wall time is added under
    :func:`_step_key` (and the commit's under ``commit``).  ``guarded``: the tables whose inserts skip
    the fast path (see :func:`_write`); updated in place.  The first :data:`FAST_INSERTS_PER_BATCH`
    inserts of other tables take it, the rest run guarded."""
    guarded = set() if guarded is None else guarded
    fast_left = FAST_INSERTS_PER_BATCH
    landed: list[pl.DataFrame] = []
    outcome: dict[str, tuple[dict, int]] = {}
    clock = time.perf_counter()

    def tick(key: str) -> None:
        nonlocal clock
        if step_seconds is not None:
            now = time.perf_counter()
            step_seconds[key] = step_seconds.get(key, 0.0) + now - clock
            clock = now

    with store.transaction() as cur:
        tick("connect")
        for s in planned.statements:
            if s.is_write:
                fast = s.fast_sql is not None and s.table not in guarded and fast_left > 0
                fast_left -= fast
                landed.append(pl.from_arrow(_write(cur, s, guarded, fast)).with_columns(
                    pl.lit(s.table).alias("table"), pl.lit(s.kind).alias("kind")))
            elif s.step in ("lock", "quarantine") and s.sql is not None:
                cur.execute(s.sql, parameters=_bind(s.params)) if s.params else cur.execute(s.sql)
                cur.fetch_arrow_table()
            elif s.step == "ledger":
                outcome = _outcome(planned.fed, landed, planned.scopes)
                final = [reports[p] if reports[p].status == "failed" else
                         reports[p].with_(rows_changed=outcome[p][0], conflicts=outcome[p][1], status="applied")
                         for p in planned.scopes]
                cur.execute(s.sql, parameters=(ledger_rows(final, mode, started_at),))
            else:
                _run(cur, s)
            tick(_step_key(s))
    tick("commit")
    return outcome


def _alone(store: Store, diff: Diff, report: ConsolidationReport, mode: str, started_at: datetime,
           quarantined: pl.DataFrame | None, guarded: set[str],
           step_seconds: dict[str, float] | None, cluster_cap: int | None = None) -> tuple[str, dict, int, str | None]:
    """One scope in its own transaction, a transient error tried again up to :data:`TRANSIENT_ATTEMPTS`
    times; any other error (or the last) is recorded as the scope's failed run."""
    s = report.scope_path
    for attempt in range(1, TRANSIENT_ATTEMPTS + 1):
        try:
            planned = batch_statements(diff, {s: report}, quarantined, cluster_cap)
            applied, conflicts = apply_batch(store, planned, {s: report}, mode, started_at, step_seconds, guarded)[s]
            return "applied", applied, conflicts, None
        except InputError:
            raise  # a bug in what we were given: not the store's fault, not to be recorded as a failed run
        except Exception as e:  # noqa: BLE001 - a bad scope never blocks the others: recorded, not raised
            if is_transient(e) and attempt < TRANSIENT_ATTEMPTS:
                time.sleep(0.05 * attempt)
                continue
            error = f"{type(e).__name__}: {e}".strip()
            break
    return "failed", {}, 0, _record_failed(store, report.with_(errors=[*report.errors, f"apply failed: {error}"]),
                                           mode, started_at, error)


def _record_failed(store: Store, report: ConsolidationReport, mode: str, started_at: datetime, error: str) -> str:
    try:
        record_run(store, report, mode, started_at, "failed")
    except Exception as e:  # noqa: BLE001 - e.g. the run id is taken; the result still says why
        error += f" (and recording the failed run failed: {type(e).__name__}: {e})"
    return error


def _marked_error(report: ConsolidationReport) -> str:
    return "; ".join(report.errors[:3]) or "the report is marked failed"


def apply(
    store: Store,
    diff: Diff,
    reports: Mapping[str, ConsolidationReport],
    *,
    mode: str = "nightly",
    started_at: datetime | None = None,
    quarantined: pl.DataFrame | None = None,
    batch_scopes: int = 500,
    step_seconds: dict[str, float] | None = None,
    fast_inserts: bool = True,
    cluster_cap: int | None = None,
) -> dict[str, ScopeApplied]:
    """Apply a shard's ``diff`` (every frame with a ``scope_path`` column) for the scopes of ``reports``
    (scope_path → report with its own ``run_id``), each scope atomically, and record one run per scope.

    The scopes (in byte order of their paths) go in batches of ``batch_scopes``; each batch is one
    transaction: its rows fed once per (table, kind), then set-based deletes (with before-images
    archived under each scope's run id), updates and inserts under the version guard, every row
    matched on id AND scope_path — a row never touches a store row of another scope — then the
    quarantined rows (table, id, reason, row, scope_path) and one ledger INSERT of the batch's runs
    (status ``applied``, rows_changed and conflicts per scope, and ``held`` / ``hold_status`` from each
    report: the holds are recorded in the apply's own transaction).

    If a batch's transaction raises, it is rolled back and its scopes are applied one by one, each in
    its own transaction (a transient error tried again); a scope whose own transaction raises is
    recorded as a failed run (``errors`` says why) and the others apply.  Scopes with no rows still
    get their ledger row.  A scope whose report is already marked failed (``status="failed"``, e.g.
    its validation failed) is recorded as that failed run in its batch's ledger INSERT and none of its
    rows are applied.  Returns scope_path → :class:`ScopeApplied`.

    ``step_seconds`` (a dict, for benchmarks and reports): the batches' wall time per statement kind
    is added to it (see :func:`apply_batch`), plus ``plan`` (building the statements).

    ``fast_inserts``: each staged insert first runs as a plain INSERT under a savepoint, and only if a
    row collides on a unique index as the guarded ``INSERT … ON CONFLICT DO NOTHING`` (see
    :func:`_write`); False runs every insert guarded (the plain version the fast path is tested
    against).  The rows and counts are the same either way.

    ``cluster_cap`` (``meta_nodes.max_members``): a new ``CLUSTERS`` edge lands only while its META node
    has room for it in the store after the batch's deletes (a stale member's edge whose delete lost to a
    live write keeps its place; the new member's edge is then a conflict).  None: unchecked.
    """
    if batch_scopes < 1:
        raise InputError(f"apply: batch_scopes must be >= 1, got {batch_scopes}")
    _check_run_ids(reports)
    started_at = started_at or datetime.now(UTC)
    scopes = sorted(reports, key=str.encode)
    reports = dict(reports)
    for s, error in vector_conflicts(store, diff, [s for s in scopes if reports[s].status != "failed"]).items():
        reports[s] = reports[s].with_(status="failed", errors=[*reports[s].errors, error])
    marked = {s for s, r in reports.items() if r.status == "failed"}
    diffs, held = _batches(diff, quarantined, scopes, batch_scopes, marked)
    out: dict[str, ScopeApplied] = {}
    # tables whose inserts run guarded: every one without the fast path, else those that collided before
    guarded: set[str] = set() if fast_inserts else set(tables.TABLES)
    for b, start in enumerate(range(0, len(scopes), batch_scopes)):
        mine = {s: reports[s] for s in scopes[start:start + batch_scopes]}
        part, q = diffs.get(b, Diff.empty()), held.get(b)
        clock = time.perf_counter()
        planned = batch_statements(part, mine, q, cluster_cap)  # pure: a bug here is raised, not retried
        if step_seconds is not None:
            step_seconds["plan"] = step_seconds.get("plan", 0.0) + time.perf_counter() - clock
        try:
            outcome = apply_batch(store, planned, mine, mode, started_at, step_seconds, guarded)
        except Exception as e:  # noqa: BLE001 - retried scope by scope below; each scope's own error is recorded
            batch_error = f"{type(e).__name__}: {e}".strip()
            alone = part.by_scope() if len(mine) > 1 else {s: part for s in mine}
            q_by = ({s: f for (s,), f in q.partition_by("scope_path", as_dict=True).items()}
                    if q is not None and q.height else {})
            results = {s: ("failed", {}, 0, _record_failed(store, r, mode, started_at, _marked_error(r))) if s in marked
                       else _alone(store, _with_scope(alone.get(s, Diff.empty()), s), r, mode, started_at, q_by.get(s),
                                   guarded, step_seconds, cluster_cap)
                       for s, r in mine.items()}
            seconds = round(time.perf_counter() - clock, 6)
            for s, (status, applied, conflicts, error) in results.items():
                out[s] = ScopeApplied(status, applied, conflicts, error, seconds, b, retried=True, batch_error=batch_error)
            continue
        seconds = round(time.perf_counter() - clock, 6)
        for s in mine:
            if s in marked:
                out[s] = ScopeApplied("failed", {}, 0, _marked_error(reports[s]), seconds, b)
                continue
            applied, conflicts = outcome[s]
            out[s] = ScopeApplied("applied", applied, conflicts, None, seconds, b)
    return out


def vector_conflicts(store: Store, diff: Diff, scopes: list[str] | None = None) -> dict[str, str]:
    """Scope path → why its rows may not be applied, for the scopes (of ``scopes``, default all) whose
    rows write vectors of another model than the one the store records for their tenant
    (``embedding_models``; the first writer of a tenant's vectors claims it).  Empty when the diff
    writes no vector — then nothing is read."""
    td = diff.tables.get("memory_nodes")
    frames = [f for f in (td.inserts, td.updates) if "embedding_model" in f.columns and "scope_path" in f.columns
              and f.get_column("embedding_model").null_count() < f.height] if td is not None else []
    if not frames:
        return {}
    written = (pl.concat([f.select("scope_path", "embedding_model") for f in frames]).drop_nulls()
               .unique().sort("scope_path", "embedding_model"))
    if scopes is not None:
        written = written.filter(pl.col("scope_path").is_in(pl.Series(scopes, dtype=pl.String).implode()))
    if not written.height:
        return {}
    from deep_sleep.core.scope import Scope
    from deep_sleep.store.vectors import claim_models, model_conflict

    tenant = {s: Scope.parse(s).tenant_id for s in written.get_column("scope_path").unique().to_list()}
    wanted = {tenant[s]: m for s, m in written.iter_rows()}
    stored = claim_models(store, wanted)
    out = {}
    for s, m in written.iter_rows():
        if s not in out and stored.get(tenant[s], m) != m:
            out[s] = f"{model_conflict(stored[tenant[s]], m, 'this run', tenant[s])}; none of this scope's rows were applied"
    return out


def _with_scope(diff: Diff, scope_path: str) -> Diff:
    """One scope's part (as :meth:`Diff.by_scope` gives it) with its ``scope_path`` back on every row."""
    from deep_sleep.run.transform import as_shard_diff

    return as_shard_diff(diff, scope_path)


__all__ = ["apply", "apply_batch", "vector_conflicts", "ScopeApplied", "record_run", "batch_statements", "ledger_rows", "apply_work_mem", "stage",
           "TRANSIENT_ATTEMPTS", "FAST_INSERTS_PER_BATCH", "SET_ENDPOINTS"]
