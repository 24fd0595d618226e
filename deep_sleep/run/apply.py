"""Apply a validated diff to the store in one transaction (SPEC §2 step 4): run the statement list.
A shard's diff (many scopes) is applied by :func:`apply_shard`: one transaction per batch of scopes,
atomic per scope (see there).

:func:`deep_sleep.run.statements.statements` builds every statement — the SQL, its parameters
and how each table's rows are fed (inline JSON, a JSON temporary table, ADBC COPY) — as values;
:func:`apply_diff` only executes them in order in one transaction and counts what landed: a
write's one-count result is its rows applied, the rest of its rows are ``conflicts`` (a live
writer changed them after the snapshot; the next run sees them again).  On any error the
transaction rolls back: the store is as before.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime

import polars as pl
import pyarrow as pa

from deep_sleep.core import tables
from deep_sleep.core.diff import Diff, TableDiff
from deep_sleep.core.errors import InputError
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.run.statements import (  # noqa: F401 - re-exported: callers and tests name them here
    BIG_DIFF_ROWS,
    KEY_COLUMNS,
    LEDGER_SQL,
    QUARANTINE_SQL,
    SHARD_LANDED_SQL,
    SMALL_STAGE_ROWS,
    WRITES,
    Rows,
    ShardStatements,
    Statement,
    check_work_mem,
    delete_sql,
    insert_sql,
    json_source,
    shard_statements,
    stage_name,
    stage_sql,
    stage_statement,
    statements,
    update_sql,
)
from deep_sleep.store.db import Store
from deep_sleep.store.errors import is_transient


def apply_work_mem() -> str:
    """``work_mem`` for the apply transaction: ``DEEP_SLEEP_APPLY_WORK_MEM`` or 256MB."""
    return check_work_mem(os.environ.get("DEEP_SLEEP_APPLY_WORK_MEM"))


@dataclass(frozen=True)
class ApplyResult:
    """What landed: rows per table and kind, and the rows skipped because a live writer got there first."""

    applied: dict[str, dict[str, int]]
    conflicts: int
    seconds: dict[str, float] | None = None  # "stage" (ingest into temp tables), "<table>.<kind>", "ledger"


_TAIL = ("quarantine", "ledger")  # timed together with the commit


def _arrow(frame: pl.DataFrame) -> pa.Table:
    return frame.to_arrow()


def _bind(params: tuple) -> tuple:
    """Parameters as sent: staged rows as one JSON text each."""
    return tuple(p.frame.write_json() if isinstance(p, Rows) else p for p in params)


def stage(cur, name: str, body: pl.DataFrame) -> None:
    """Stage ``body`` as the temporary table ``name`` (see :func:`~deep_sleep.run.statements.stage_statement`)."""
    _run(cur, stage_statement(name, body, SMALL_STAGE_ROWS))


def _run(cur, s: Statement) -> None:
    """Execute one statement whose result is not read."""
    if s.sql is None:
        cur.adbc_ingest(s.staged, _arrow(s.params[0].frame), mode="create", temporary=True)
    elif s.params:
        cur.execute(s.sql, parameters=_bind(s.params))
    else:
        cur.execute(s.sql)


def _scalar(cur, sql: str, params: tuple) -> int:
    cur.execute(sql, parameters=params)
    return int(cur.fetch_arrow_table().column(0)[0].as_py())


def ledger_params(report: ConsolidationReport, mode: str, started_at: datetime, status: str) -> tuple:
    j = lambda v: json.dumps(v, sort_keys=True, default=str)  # noqa: E731
    return (
        report.run_id, report.scope_path, mode, datetime.fromisoformat(report.as_of.replace("Z", "+00:00")),
        started_at, status, j(report.counters), j(report.phases_run), j(report.phases_skipped), j(report.timings),
        j(report.rows_changed), report.conflicts, report.diff_hash, report.snapshot_uri, report.diff_uri, j(report.errors),
        j(report.quarantined), report.gate.get("recall_before"), report.gate.get("recall_after"),
    )


def record_run(store: Store, report: ConsolidationReport, mode: str, started_at: datetime, status: str) -> None:
    """Write a ledger row on its own (failed runs; applied runs are recorded inside :func:`apply_diff`)."""
    with store.transaction() as cur:
        cur.execute(LEDGER_SQL, parameters=ledger_params(report, mode, started_at, status))


def planned_statements(diff: Diff, scope_path: str, run_id: str,
                       quarantined: pl.DataFrame | None = None, as_shard: bool | None = None) -> tuple[Statement, ...]:
    """The statements :func:`apply_diff` runs for ``diff`` (``replay --explain`` prints them): a big
    diff's as a shard of one (``as_shard`` as there)."""
    one = _shard_of_one(diff, scope_path) if _takes_shard_path(diff, as_shard) else None
    if one is not None:
        return _one_batch_statements(one, scope_path, run_id, quarantined).statements
    # The thresholds are read at call time (tests set SMALL_STAGE_ROWS on this module to force the
    # staged path); the environment is read here, not by the pure builder.
    return statements(diff, scope_path, run_id, quarantined=quarantined, small_rows=SMALL_STAGE_ROWS,
                      big_rows=BIG_DIFF_ROWS, work_mem=os.environ.get("DEEP_SLEEP_APPLY_WORK_MEM"))


def apply_diff(
    store: Store,
    diff: Diff,
    report: ConsolidationReport,
    *,
    mode: str = "nightly",
    started_at: datetime | None = None,
    quarantined: pl.DataFrame | None = None,
    as_shard: bool | None = None,
) -> ApplyResult:
    """Apply ``diff`` for ``report.scope_path`` in one transaction and record the run as applied,
    with the rows it ``quarantined`` (table, id, reason, row JSON) if any.

    ``report.run_id`` must be set.  On any error the transaction rolls back: the store is as before.
    ``seconds``: ``stage`` (building the statements, session settings, the lock, staging), each
    write's ``<table>.<kind>``, then ``quarantine_and_ledger_and_commit``.

    ``as_shard``: run the diff as a shard of one — the one transaction of :func:`apply_shard`'s batch
    (:func:`_apply_batch`: index probes instead of hash joins, fast inserts) — which gives exactly the
    same store rows, archive, quarantine, ledger row and counts.  None (the default): a diff of
    :data:`SHARD_OF_ONE_ROWS` rows or more whose rows are all of the report's scope takes it (at 1M
    nodes ~13 % faster); a smaller one (a quick nap's, a small scope's) the plain statements below.
    """
    if not report.run_id:
        raise InputError("apply_diff needs report.run_id (a UUID) to archive and record the run")
    try:
        uuid.UUID(report.run_id)
    except ValueError:
        raise InputError(f"apply_diff: report.run_id {report.run_id!r} is not a UUID") from None
    started_at = started_at or datetime.now(UTC)
    one = _shard_of_one(diff, report.scope_path) if _takes_shard_path(diff, as_shard) else None
    if one is not None:
        return _apply_one_batch(store, one, report, mode, started_at, quarantined)
    applied: dict[str, dict[str, int]] = {}
    conflicts = 0
    seconds: dict[str, float] = {}
    clock = time.perf_counter()
    todo = planned_statements(diff, report.scope_path, report.run_id, quarantined, as_shard=False)
    tail: float | None = None
    with store.transaction() as cur:
        for s in todo:
            if "stage" not in seconds and (s.is_write or s.step in _TAIL):
                seconds["stage"] = round(time.perf_counter() - clock, 6)
            if s.is_write:
                clock = time.perf_counter()
                n = _scalar(cur, s.sql, _bind(s.params))
                applied.setdefault(s.table, {})[s.kind] = n
                conflicts += s.rows - n
                seconds[f"{s.table}.{s.kind}"] = round(time.perf_counter() - clock, 6)
                continue
            if s.step in _TAIL and tail is None:
                tail = time.perf_counter()
            if s.step == "lock":
                cur.execute(s.sql, parameters=_bind(s.params))
                cur.fetch_arrow_table()
            elif s.step == "quarantine" and s.sql is not None:
                _scalar(cur, s.sql, _bind(s.params))
            elif s.step == "ledger":
                final = report.with_(rows_changed=applied, conflicts=conflicts, status="applied")
                cur.execute(s.sql, parameters=ledger_params(final, mode, started_at, "applied"))
            else:
                _run(cur, s)
    seconds["quarantine_and_ledger_and_commit"] = round(time.perf_counter() - (tail or clock), 6)
    return ApplyResult(applied=applied, conflicts=conflicts, seconds=seconds)


#: A single scope's diff of at least this many rows is applied as a shard of one (see :func:`apply_diff`).
SHARD_OF_ONE_ROWS = BIG_DIFF_ROWS


def _takes_shard_path(diff: Diff, as_shard: bool | None) -> bool:
    if as_shard is not None:
        return as_shard
    return sum(n for kinds in diff.row_counts().values() for n in kinds.values()) >= SHARD_OF_ONE_ROWS


def _shard_of_one(diff: Diff, scope_path: str) -> Diff | None:
    """``diff`` as a shard diff of its one scope (a ``scope_path`` on every row), or None when a row
    names another scope (the plain statements skip such a row as a conflict; a batch refuses it)."""
    out = {}
    for name, td in diff.tables.items():
        frames = td.frames()
        for kind, frame in frames.items():
            if not frame.height:
                continue
            if "scope_path" not in frame.columns:
                frames[kind] = frame.with_columns(pl.lit(scope_path).alias("scope_path"))
            elif frame.get_column("scope_path").ne_missing(scope_path).any():
                return None
        out[name] = TableDiff(**frames)
    return Diff(out)


def _one_batch_statements(diff: Diff, scope_path: str, run_id: str, quarantined: pl.DataFrame | None) -> ShardStatements:
    """The batch statements of a shard diff of one scope (its quarantined rows given a ``scope_path``)."""
    q = (quarantined.with_columns(pl.lit(scope_path).alias("scope_path"))
         if quarantined is not None and quarantined.height else None)
    return _shard_statements(diff, {scope_path: run_id}, q)


def _apply_one_batch(store: Store, diff: Diff, report: ConsolidationReport, mode: str, started_at: datetime,
                     quarantined: pl.DataFrame | None) -> ApplyResult:
    """:func:`apply_diff` of a shard diff of one scope through :func:`_apply_batch`; its seconds under
    :func:`apply_diff`'s names."""
    s = report.scope_path
    steps: dict[str, float] = {}
    clock = time.perf_counter()
    planned = _one_batch_statements(diff, s, report.run_id, quarantined)
    steps["plan"] = time.perf_counter() - clock
    applied, conflicts = _apply_batch(store, planned, {s: report}, mode, started_at, steps, set())[s]
    seconds: dict[str, float] = {}
    for key, v in steps.items():
        step, _, rest = key.partition(".")
        name = (rest if step in WRITES else
                "quarantine_and_ledger_and_commit" if step in (*_TAIL, "commit") else "stage")
        seconds[name] = seconds.get(name, 0.0) + v
    return ApplyResult(applied=applied, conflicts=conflicts, seconds={k: round(v, 6) for k, v in seconds.items()})


# -- many scopes at once (SPEC §2 "Scale"; issue 12 item 6) -----------------------------------------
@dataclass(frozen=True)
class ShardApplied:
    """One scope's outcome of :func:`apply_shard`.

    status: ``applied`` or ``failed`` (recorded as a failed run, nothing of the scope changed).
    applied: rows applied per table and kind (as :attr:`ApplyResult.applied`; empty when failed).
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


TRANSIENT_ATTEMPTS = 3  # a scope's own transaction is tried this often when its error is transient


def _check_run_ids(reports: dict[str, ConsolidationReport]) -> None:
    for s, r in reports.items():
        if r.scope_path != s:
            raise InputError(f"apply_shard: the report under {s!r} is of scope {r.scope_path!r}")
        if not r.run_id:
            raise InputError(f"apply_shard: the report of {s!r} has no run_id (a UUID) to archive and record the run")
        try:
            uuid.UUID(r.run_id)
        except ValueError:
            raise InputError(f"apply_shard: report.run_id {r.run_id!r} of {s!r} is not a UUID") from None


def _batches(diff: Diff, quarantined: pl.DataFrame | None, scopes: list[str], batch_scopes: int,
             not_applied: set[str]) -> tuple[dict[int, Diff], dict[int, pl.DataFrame]]:
    """The shard's diff and quarantined rows split into batches of ``batch_scopes`` consecutive scopes
    (of ``scopes``) — one partition per frame, no filter per batch — without the rows of the scopes
    ``not_applied`` (reports marked failed).  A row of no listed scope (or without a ``scope_path``)
    raises :class:`InputError`."""

    batch_of = pl.DataFrame({"scope_path": scopes, "_ds_batch": [None if s in not_applied else i // batch_scopes
                                                                  for i, s in enumerate(scopes)]},
                            schema={"scope_path": pl.String, "_ds_batch": pl.Int64})
    listed = pl.Series(scopes, dtype=pl.String).implode()

    def split(what: str, frame: pl.DataFrame) -> dict[int, pl.DataFrame]:
        if "scope_path" not in frame.columns:
            raise InputError(f"apply_shard: {what} needs a scope_path on every row")
        stray = frame.filter(~pl.col("scope_path").is_in(listed) | pl.col("scope_path").is_null())
        if stray.height:
            raise InputError(f"apply_shard: {what} has rows of scopes without a report: "
                             f"{stray.get_column('scope_path').unique().head(3).to_list()}")
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


def _ledger_rows(reports: list[ConsolidationReport], mode: str, started_at: datetime) -> str:
    """The batch's ledger rows as one JSON array (the fields of :func:`ledger_params`; each report's status)."""
    rows = [{
        "run_id": r.run_id, "scope_path": r.scope_path, "mode": mode, "as_of": r.as_of, "started_at": started_at.isoformat(),
        "status": r.status, "counters": r.counters, "phases_run": r.phases_run, "phases_skipped": r.phases_skipped,
        "timings": r.timings, "rows_changed": r.rows_changed, "conflicts": r.conflicts, "diff_hash": r.diff_hash,
        "snapshot_uri": r.snapshot_uri, "diff_uri": r.diff_uri, "errors": r.errors, "quarantined": r.quarantined,
        "recall_before": r.gate.get("recall_before"), "recall_after": r.gate.get("recall_after"),
    } for r in reports]
    return json.dumps(rows, sort_keys=True, default=str)


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


def planned_shard_statements(diff: Diff, reports: dict[str, ConsolidationReport],
                             quarantined: pl.DataFrame | None = None) -> ShardStatements:
    """The statements :func:`apply_shard` runs for one batch (the thresholds read at call time, as
    :func:`planned_statements` does)."""
    return _shard_statements(diff, {s: r.run_id for s, r in reports.items()}, quarantined)


def _shard_statements(diff: Diff, run_ids: dict[str, str], quarantined: pl.DataFrame | None) -> ShardStatements:
    return shard_statements(diff, run_ids, quarantined=quarantined, small_rows=SMALL_STAGE_ROWS,
                            big_rows=BIG_DIFF_ROWS, work_mem=os.environ.get("DEEP_SLEEP_APPLY_WORK_MEM"))


def _step_key(s: Statement) -> str:
    """The name a statement's seconds are summed under: its step, and table and kind when it has them."""
    return ".".join(x for x in (s.step, s.table, s.kind) if x)


#: At most this many fast inserts per batch: each is a subtransaction that writes, and a transaction
#: with more than 64 of those (PGPROC_MAX_CACHED_SUBXIDS) makes every concurrent snapshot slower.
FAST_INSERTS_PER_BATCH = 32


def _write(cur, s: Statement, guarded: set[str], fast: bool) -> pa.Table:
    """Run one write of a batch; its ``(scope_path, n)`` rows.

    ``fast`` (an insert with a :attr:`~deep_sleep.run.statements.Statement.fast_sql`): run that — a
    plain INSERT, and the guarded ``INSERT … ON CONFLICT DO NOTHING`` only if a row collides on a
    unique index, a live writer's row say (see :func:`~deep_sleep.run.statements.shard_fast_insert_sql`):
    the rows and counts are exactly the guarded insert's either way.  A table whose insert collided is
    added to ``guarded``, and its later inserts (of this shard) run guarded straight away, so a store
    where collisions are common pays the wasted attempt once per table and shard.
    """
    if not fast:
        cur.execute(s.sql)
        return cur.fetch_arrow_table()
    cur.execute(s.fast_sql)
    cur.execute(SHARD_LANDED_SQL)
    got = pl.from_arrow(cur.fetch_arrow_table())
    if got.get_column("guarded").any():
        guarded.add(s.table)
    return got.filter(pl.col("scope_path").is_not_null()).select("scope_path", "n").to_arrow()


def _apply_batch(store: Store, planned: ShardStatements, reports: dict[str, ConsolidationReport],
                 mode: str, started_at: datetime, step_seconds: dict[str, float] | None = None,
                 guarded: set[str] | None = None) -> dict[str, tuple[dict, int]]:
    """One transaction: the batch's statements and one ledger INSERT of its scopes' rows.  Raises (the
    transaction rolled back) on any error.  ``step_seconds``: each statement's wall time is added under
    :func:`_step_key` (and the commit's under ``commit``) — what ``benchmarks.apply_shard`` prints.
    ``guarded``: the tables whose inserts skip the fast path (see :func:`_write`); updated in place.
    The first :data:`FAST_INSERTS_PER_BATCH` inserts of other tables take it, the rest run guarded."""
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
            elif s.step == "lock":
                cur.execute(s.sql, parameters=_bind(s.params))
                cur.fetch_arrow_table()
            elif s.step == "quarantine" and s.sql is not None:
                cur.execute(s.sql)
                cur.fetch_arrow_table()
            elif s.step == "ledger":
                outcome = _outcome(planned.fed, landed, planned.scopes)
                final = [reports[p] if reports[p].status == "failed" else
                         reports[p].with_(rows_changed=outcome[p][0], conflicts=outcome[p][1], status="applied")
                         for p in planned.scopes]
                cur.execute(s.sql, parameters=(_ledger_rows(final, mode, started_at),))
            else:
                _run(cur, s)
            tick(_step_key(s))
    tick("commit")
    return outcome


def _apply_alone(store: Store, diff: Diff, report: ConsolidationReport, mode: str, started_at: datetime,
                 quarantined: pl.DataFrame | None) -> tuple[str, dict, int, str | None]:
    """One scope in its own transaction (:func:`apply_diff`), a transient error tried again up to
    :data:`TRANSIENT_ATTEMPTS` times; any other error (or the last) is recorded as the scope's failed run."""
    for attempt in range(1, TRANSIENT_ATTEMPTS + 1):
        try:
            result = apply_diff(store, diff, report, mode=mode, started_at=started_at, quarantined=quarantined)
            return "applied", result.applied, result.conflicts, None
        except Exception as e:  # noqa: BLE001 - a bad scope never blocks the others: recorded, not raised
            if is_transient(e) and attempt < TRANSIENT_ATTEMPTS:
                time.sleep(0.05 * attempt)
                continue
            error = f"{type(e).__name__}: {e}".strip()
            break
    failed = report.with_(status="failed", errors=[*report.errors, f"apply failed: {error}"])
    try:
        record_run(store, failed, mode, started_at, "failed")
    except Exception as e:  # noqa: BLE001 - e.g. the run id is taken; the result still says why
        error += f" (and recording the failed run failed: {type(e).__name__}: {e})"
    return "failed", {}, 0, error


def _marked_error(report: ConsolidationReport) -> str:
    return "; ".join(report.errors[:3]) or "the report is marked failed"


def _record_failed(store: Store, report: ConsolidationReport, mode: str, started_at: datetime) -> tuple[str, dict, int, str | None]:
    """A scope whose report is marked failed (e.g. its validation failed): recorded on its own, not applied."""
    error = _marked_error(report)
    try:
        record_run(store, report, mode, started_at, "failed")
    except Exception as e:  # noqa: BLE001 - the result still says why
        error += f" (and recording the failed run failed: {type(e).__name__}: {e})"
    return "failed", {}, 0, error


def apply_shard(
    store: Store,
    diff: Diff,
    reports: dict[str, ConsolidationReport],
    *,
    mode: str = "nightly",
    started_at: datetime | None = None,
    quarantined: pl.DataFrame | None = None,
    batch_scopes: int = 500,
    step_seconds: dict[str, float] | None = None,
    fast_inserts: bool = True,
) -> dict[str, ShardApplied]:
    """Apply a shard's ``diff`` (every frame with a ``scope_path`` column) for the scopes of ``reports``
    (scope_path → report with its own ``run_id``), each scope atomically, and record one run per scope.

    The scopes (in byte order of their paths) go in batches of ``batch_scopes``; each batch is one
    transaction: its rows staged once per (table, kind), then set-based deletes (with before-images
    archived under each scope's run id), updates and inserts under the same version guard as
    :func:`apply_diff`, every row matched on id AND scope_path — a row never touches a store row of
    another scope — then the quarantined rows (table, id, reason, row, scope_path) and one ledger
    INSERT of the batch's runs (status ``applied``, rows_changed and conflicts per scope).  Every
    scope's store rows and ledger row come out as :func:`apply_diff` of that scope's diff
    (:meth:`Diff.by_scope`) gives them.

    If a batch's transaction raises, it is rolled back and the batch is retried scope by scope, each
    in its own :func:`apply_diff` transaction (a transient error tried again); a scope whose own
    transaction raises is recorded as a failed run (``errors`` says why) and the others apply.
    Scopes with no rows still get their ledger row.  A scope whose report is already marked failed
    (``status="failed"``, e.g. its validation failed) is recorded as that failed run in its batch's
    ledger INSERT and none of its rows are applied (as :func:`~deep_sleep.run.stages.apply_stage`
    does for one scope).  Returns scope_path → :class:`ShardApplied`.

    ``step_seconds`` (a dict, for benchmarks): the batches' wall time per statement kind is added to it
    (see :func:`_apply_batch`), plus ``plan`` (building the statements).

    ``fast_inserts``: each insert first runs as a plain INSERT under a savepoint, and only if a row
    collides on a unique index as the guarded ``INSERT … ON CONFLICT DO NOTHING`` (see :func:`_write`);
    False runs every insert guarded (the plain version the fast path is tested against).  The rows and
    counts are the same either way.
    """
    if batch_scopes < 1:
        raise InputError(f"apply_shard: batch_scopes must be >= 1, got {batch_scopes}")
    _check_run_ids(reports)
    started_at = started_at or datetime.now(UTC)
    scopes = sorted(reports, key=str.encode)
    marked = {s for s, r in reports.items() if r.status == "failed"}
    diffs, held = _batches(diff, quarantined, scopes, batch_scopes, marked)
    out: dict[str, ShardApplied] = {}
    # tables whose inserts run guarded: every one without the fast path, else those that collided before
    guarded: set[str] = set() if fast_inserts else set(tables.TABLES)
    for b, start in enumerate(range(0, len(scopes), batch_scopes)):
        mine = {s: reports[s] for s in scopes[start:start + batch_scopes]}
        part, q = diffs.get(b, Diff.empty()), held.get(b)
        clock = time.perf_counter()
        planned = planned_shard_statements(part, mine, q)  # pure: a bug here is raised, not retried
        if step_seconds is not None:
            step_seconds["plan"] = step_seconds.get("plan", 0.0) + time.perf_counter() - clock
        try:
            outcome = _apply_batch(store, planned, mine, mode, started_at, step_seconds, guarded)
        except Exception as e:  # noqa: BLE001 - retried scope by scope below; each scope's own error is recorded
            batch_error = f"{type(e).__name__}: {e}".strip()
            alone = part.by_scope()
            q_by = ({s: f.drop("scope_path") for (s,), f in q.partition_by("scope_path", as_dict=True).items()}
                    if q is not None and q.height else {})
            results = {s: _record_failed(store, r, mode, started_at) if s in marked else
                       _apply_alone(store, alone.get(s, Diff.empty()), r, mode, started_at, q_by.get(s))
                       for s, r in mine.items()}
            seconds = round(time.perf_counter() - clock, 6)
            for s, (status, applied, conflicts, error) in results.items():
                out[s] = ShardApplied(status, applied, conflicts, error, seconds, b, retried=True, batch_error=batch_error)
            continue
        seconds = round(time.perf_counter() - clock, 6)
        for s in mine:
            if s in marked:
                out[s] = ShardApplied("failed", {}, 0, _marked_error(reports[s]), seconds, b)
                continue
            applied, conflicts = outcome[s]
            out[s] = ShardApplied("applied", applied, conflicts, None, seconds, b)
    return out
