"""The quick nap (SPEC §5): phases 1, 5 and 10 for one scope, between the nightly runs.

Every ``quick_nap_interval`` turns of a scope (counted in ``scope_turns``), phases 1, 5 and 10 run
for that scope through the nightly's own stages (:data:`deep_sleep.run.pipeline.NAP`: transform,
validate, apply with ``mode = "quick_nap"``) on a targeted snapshot (:func:`nap_snapshot`) — a
shard of one, without files and without holds (the nap keeps no run directory to hold rows in).  Windows: a nap
consolidates the access log from the latest applied run of *either* mode on, so it never
re-strengthens what a nap or a nightly already counted; the nightly in turn reads the access log
only after the latest applied nap (``deep_sleep/store/extract.py``; its other phases keep the
nightly-only window, since the nap does not run them).

    >>> report = quick_nap(store, scope)                                          # doctest: +SKIP
    >>> report.status, report.phases_run                                           # doctest: +SKIP
    ('applied', ['strengthen', 'soul_corrections', 'episodic_summary'])
"""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

import polars as pl
import psycopg

from deep_sleep.core import tables
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.scope import Scope
from deep_sleep.core.snapshot import Snapshot, utc
from deep_sleep.online.pg import connection, pipelined_transaction, store_of
from deep_sleep.store.db import Store
from deep_sleep.transforms.config import ConsolidationConfig
from deep_sleep.transforms.episodic_summary import summary_batches, summary_node_id

__all__ = ["default_config", "nap_snapshot", "quick_nap", "summary_candidates"]

_NAP_PREVIOUS_SQL = (
    "SELECT max(as_of) FROM consolidation_runs WHERE scope_path = %s AND status = 'applied' AND mode IN ('nightly', 'quick_nap')"
)


@lru_cache(maxsize=1)
def default_config() -> ConsolidationConfig:
    """The configuration the online calls use when given none (loaded once)."""
    from deep_sleep.transforms.config import load_config

    return load_config()


def _select(table: str) -> str:
    return ", ".join(c.select_sql for c in tables.TABLES[table])


def _frame(table: str, rows: list[tuple]) -> pl.DataFrame:
    schema = tables.schema(table)
    return tables.conform(table, pl.DataFrame(rows, schema=schema, orient="row"))


def summary_candidates(scope_path: str, events: pl.DataFrame, config: Any) -> list[str]:
    """Ids of the ``META:episodic_summary`` nodes phase 10 would write for ``events`` (the scope's
    oldest events, ordered by ``(created_at, id)``: all of them, or at least the oldest
    ``threshold + batch_size × max_batches``), by the phase's own rule
    (:func:`~deep_sleep.transforms.episodic_summary.summary_batches`, :func:`summary_node_id`)."""
    batches = summary_batches(events.height, config)
    ids = events.get_column("id").to_list() if batches else []
    return [summary_node_id(scope_path, ids[b[0]], ids[b[-1]]) for b in batches]


def nap_snapshot(conn: psycopg.Connection, scope: Scope | str, as_of: datetime, config: ConsolidationConfig) -> Snapshot:
    """The targeted snapshot of a quick nap: exactly what phases 1, 5 and 10 read, nothing else.

    In one ``REPEATABLE READ, READ ONLY`` transaction, for the exact ``scope_path``:

    - ``previous_run_as_of``: the latest applied run of either mode (nightly or quick nap);
      the window is ``(max(as_of − lookback_hours, previous_run_as_of), as_of]``;
    - ``memory_access_log``: the rows of the window (phase 1 counts them);
    - ``memory_nodes``: the nodes those rows touch (phase 1 updates them), the ``SOUL:`` nodes
      updated in the window (phase 5 reads them), and the summary nodes phase 10 would create
      if they already exist (it refreshes those instead);
    - ``soul_profiles``: all of the scope's (a handful of keys);
    - ``episodic_events``: the oldest ``N = threshold + batch_size × max_batches`` by
      ``(created_at, id)``.

    Why N events are exact for phase 10.  The phase reads the count ``C`` and the oldest
    ``take = min(max_batches, ⌈(C − threshold) / batch_size⌉) × batch_size`` events.  If
    ``C ≤ N`` the snapshot holds every event, so it sees what a whole-scope extract sees.  If
    ``C > N`` it sees ``C' = N``: then ``C' − threshold = batch_size × max_batches`` gives
    ``take' = max_batches × batch_size``, and the real ``C − threshold > batch_size × max_batches``
    gives ``⌈…⌉ > max_batches`` and so the same ``take``; both take the oldest ``take`` events,
    and the oldest ``take ≤ N`` of the scope are the oldest ``take`` of the N oldest.  The
    ordering is the same on both sides: ``uuid`` order in PostgreSQL is the order of the
    canonical lower-case text the phase sorts.
    """
    scope = Scope.coerce(scope)
    path = scope.path
    as_of = utc(as_of)
    es = config.episodic_summary
    fresh = conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
    # Two round trips (pipeline mode): BEGIN and what needs no window, then what does and COMMIT.
    with pipelined_transaction(conn):
        if fresh:  # inside a caller's transaction we read in its snapshot instead
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        conn.execute("SET LOCAL TimeZone = 'UTC'")
        head, ev_cur, soul_cur = conn.cursor(), conn.cursor(), conn.cursor()
        head.execute(f"SELECT now(), ({_NAP_PREVIOUS_SQL})", (path,))
        ev_cur.execute(
            f"SELECT {_select('episodic_events')} FROM episodic_events WHERE scope_path = %s ORDER BY created_at, id LIMIT %s",
            (path, es.threshold + es.batch_size * es.max_batches))
        soul_cur.execute(f"SELECT {_select('soul_profiles')} FROM soul_profiles WHERE scope_path = %s", (path,))
        taken_at, previous = head.fetchone()
        events = _frame("episodic_events", ev_cur.fetchall())
        souls = _frame("soul_profiles", soul_cur.fetchall())
        start = as_of - timedelta(hours=config.lookback_hours)
        if previous is not None:
            start = max(start, previous)
        window = (path, start, as_of)
        summary_ids = summary_candidates(path, events, es) if es.enabled else []
        cols = _select("memory_nodes")
        access_cur, node_cur = conn.cursor(), conn.cursor()
        access_cur.execute(
            f"SELECT {_select('memory_access_log')} FROM memory_access_log"
            " WHERE scope_path = %s AND accessed_at > %s AND accessed_at <= %s", window)
        node_cur.execute(
            f"SELECT {cols} FROM memory_nodes WHERE scope_path = %s AND id IN (SELECT node_id FROM memory_access_log"
            "  WHERE scope_path = %s AND accessed_at > %s AND accessed_at <= %s)"
            f" UNION SELECT {cols} FROM memory_nodes WHERE scope_path = %s AND label LIKE 'SOUL:%%'"
            "  AND updated_at > %s AND updated_at <= %s"
            f" UNION SELECT {cols} FROM memory_nodes WHERE scope_path = %s AND id = ANY(%s::uuid[])",
            (path, *window, *window, path, summary_ids))
    # fetched after the block: the second batch's results come back with its COMMIT (one round trip)
    access = _frame("memory_access_log", access_cur.fetchall())
    nodes = _frame("memory_nodes", node_cur.fetchall()).sort("id")
    return Snapshot(
        scope_path=path,
        taken_at=utc(taken_at),
        previous_run_as_of=utc(previous) if previous is not None else None,
        frames={"memory_access_log": access, "memory_nodes": nodes, "soul_profiles": souls, "episodic_events": events},
    )


def quick_nap(
    store_or_conn: Store | psycopg.Connection,
    scope: Scope | str,
    *,
    config: ConsolidationConfig | None = None,
    as_of: datetime | None = None,
) -> ConsolidationReport:
    """Phases 1, 5 and 10 for one scope, now: targeted snapshot → plan → validate → guarded apply.

    The same transforms, validation and version-guarded apply as the nightly run; the run is
    recorded in ``consolidation_runs`` with ``mode = 'quick_nap'`` (applied, or failed with the
    failing checks).  No snapshot directory is written: the nap's diff is small and its deleted
    events are archived whole by the apply.
    """
    from deep_sleep.core.shard import Shard
    from deep_sleep.run import pipeline
    from deep_sleep.transforms import QUICK_NAP

    scope = Scope.coerce(scope)
    config = config or default_config()
    ctx = pipeline.Context.of(as_of, config, scopes=scope, store=store_of(store_or_conn), mode="quick_nap",
                              phases=QUICK_NAP, holds=False)
    t0 = time.perf_counter()
    with connection(store_or_conn) as conn:
        snapshot = nap_snapshot(conn, scope, ctx.as_of, config)
    extract = round(time.perf_counter() - t0, 6)
    # The nightly's stages on a shard of one, without files (NAP: transform, validate, apply).
    report = pipeline.run(pipeline.NAP, ctx, pipeline.State(shard=Shard.of(snapshot))).report(scope.path)
    return report.with_(timings={**report.timings, "extract": extract})
