"""Apply slots and the night lock: what keeps applies in line across threads, processes, Dask workers
and hosts — all of them session advisory locks in the store, so the store itself keeps them, and a
killed process cannot keep one: Postgres drops a session's advisory locks with its connection, so a
``kill -9`` frees them at once.

- **Apply slots** (class :data:`APPLY_SLOT_CLASS`, key 0…N−1): at most N applies at once.  Every
  apply holds one while it runs (issue 37): a nightly shard's (:class:`ApplyInSlot`, one of the
  night's ``apply_concurrency``), the ``deep_sleep`` flow's and ``deep-sleep run``'s (one of its
  ``apply_concurrency``, default :data:`DEFAULT_APPLY_SLOTS`), an approval's and an undo's (one of
  :data:`DEFAULT_APPLY_SLOTS`).  A slot is a cap on load, not a lock on a scope: what keeps one apply
  at a time *per scope* is the apply transaction's ``pg_advisory_xact_lock`` on each of its scopes,
  which every apply, approval, rejection and undo takes.  Prefect's tag concurrency limits keep a
  dead task run's slot until its lease is reaped — a temporary server may never do that, and every
  later night then waits (issue 31) — so the flows use these slots, and the Prefect tag limit is
  opt-in (``NightlyParameters.prefect_apply_limit``).
- **The night lock** (class :data:`NIGHT_LOCK_CLASS`, key 0): one nightly per store at a time
  (:func:`night_lock`).  A second one refuses at once, naming the session that holds it (issue 37: two
  nights at once both extracted every scope, the second applied only conflicts and held every row
  again).
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from deep_sleep.core.errors import DeepSleepError

if TYPE_CHECKING:  # imported where used: a quiet night checks the night lock without importing the pipeline
    from deep_sleep.run import pipeline

APPLY_SLOT_CLASS = 0x0D5EE9 + 1  # pg advisory lock class of the apply slots
NIGHT_LOCK_CLASS = 0x0D5EE9 + 2  # pg advisory lock class of the night lock (key 0)
DEFAULT_APPLY_SLOTS = 2  # an apply outside a night (run, approve, undo) holds one of the first this many slots


class NightRunning(DeepSleepError):
    """Another nightly holds the store's night lock (:func:`night_lock`); the message names it."""


@contextlib.contextmanager
def apply_slot(dsn: str, slots: int, poll_seconds: float = 0.05, say_after: float = 2.0, say_every: float = 30.0):
    """Hold one of ``slots`` apply slots: session advisory locks (class, 0…slots−1) in the store.

    The cap holds across threads, processes and Dask workers, because the store itself keeps it, and
    a slot is a lease a killed process cannot keep: Postgres drops a session's advisory locks with its
    connection, so a ``kill -9`` frees the slot at once (Prefect's tag limits, by contrast, keep a
    dead task run's slot until its lease is reaped, which a temporary server may never do — so they
    are opt-in, ``prefect_apply_limit``).  A night that waits for a slot says so on stderr after
    ``say_after`` seconds, naming the sessions that hold the slots, and again every ``say_every``."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True, application_name=f"deep-sleep apply (pid {os.getpid()})") as con:
        start = time.monotonic()
        said = None
        while True:
            for slot in range(slots):
                if con.execute("SELECT pg_try_advisory_lock(%s, %s)", (APPLY_SLOT_CLASS, slot)).fetchone()[0]:
                    if said is not None:
                        sys.stderr.write(f"deep-sleep: got apply slot {slot} after {time.monotonic() - start:.1f} s\n")
                    try:
                        yield slot
                    finally:
                        con.execute("SELECT pg_advisory_unlock(%s, %s)", (APPLY_SLOT_CLASS, slot))
                    return
            waited = time.monotonic() - start
            if waited >= say_after and (said is None or waited - said >= say_every):
                said = waited
                sys.stderr.write(f"deep-sleep: waiting {waited:.0f} s for one of {slots} apply slot(s); held by "
                                 f"{slot_holders(con, slots)} (a night or approval applying; a dead holder's slot is "
                                 "freed with its connection)\n")
                sys.stderr.flush()
            time.sleep(poll_seconds)


def slot_holders(con, slots: int) -> str:
    """Who holds the apply slots: ``pid (application, state for N s)`` per holding session."""
    rows = con.execute(
        "SELECT l.pid, coalesce(nullif(a.application_name, ''), '?'), a.state,"
        " round(extract(epoch FROM now() - a.backend_start)) FROM pg_locks l"
        " JOIN pg_stat_activity a ON a.pid = l.pid"
        " WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s AND l.objid < %s AND l.objsubid = 2"
        " ORDER BY l.objid", ((APPLY_SLOT_CLASS) & 0xFFFFFFFF, slots)).fetchall()
    return ", ".join(f"pid {pid} ({app}, connected {int(age)} s)" for pid, app, _state, age in rows) or "nobody any more"


def _holder(con, classid: int, objid: int) -> str | None:
    """The session holding the session advisory lock (classid, objid), as ``application name (server
    backend pid, client address, since …)``, or None when nobody holds it any more."""
    row = con.execute(
        "SELECT l.pid, coalesce(nullif(a.application_name, ''), '?'), coalesce(host(a.client_addr), 'local socket'),"
        " to_char(a.backend_start AT TIME ZONE 'UTC', 'YYYY-MM-DD HH24:MI:SS') || ' UTC' FROM pg_locks l"
        " JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted AND l.classid = %s"
        " AND l.objid = %s AND l.objsubid = 2 AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " LIMIT 1", (classid & 0xFFFFFFFF, objid)).fetchone()
    return f"{row[1]} (server backend {row[0]}, client {row[2]}, connected since {row[3]})" if row else None


@contextlib.contextmanager
def night_lock(dsn: str, name: str):
    """Hold the store's night lock for the length of the ``with`` block: one nightly per store at a time.

    A session advisory lock (:data:`NIGHT_LOCK_CLASS`, 0) on a connection of its own, whose
    ``application_name`` is ``name`` (:func:`night_name`), so a second
    night can say which night runs.  That second night refuses at once with :class:`NightRunning`
    (exit 2 on the command line), naming the holder; it does not wait: the night that runs applies
    every due scope, so one that waited for it would find nothing due.  A killed night's lock is
    freed with its connection."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True, application_name=name[:63]) as con:
        if not con.execute("SELECT pg_try_advisory_lock(%s, 0)", (NIGHT_LOCK_CLASS,)).fetchone()[0]:
            holder = _holder(con, NIGHT_LOCK_CLASS, 0) or "a session that has just ended"
            raise NightRunning(f"another night is running on this store: {holder}; wait for it to end (or end it: "
                               "a killed night's lock goes with its connection), then run the night again")
        try:
            yield
        finally:
            con.execute("SELECT pg_advisory_unlock(%s, 0)", (NIGHT_LOCK_CLASS,))


def night_name(night_id: str) -> str:
    """The night lock's ``application_name`` for night ``night_id``: ``deep-sleep nightly 1a2b3c4d pid 4242
    on host`` (at most 63 characters, PostgreSQL's limit)."""
    return f"deep-sleep nightly {night_id[:8]} pid {os.getpid()} on {socket.gethostname()}"[:63]


def check_no_night(dsn: str) -> None:
    """Refuse (:class:`NightRunning`, naming it) when a nightly holds the store's night lock now — the
    command line's early check, before it starts a Prefect server; the flow takes the lock itself."""
    with night_lock(dsn, f"deep-sleep nightly check pid {os.getpid()}"):
        pass


def in_slots(stages: tuple, slots: int) -> tuple:
    """``stages`` with the apply holding one of ``slots`` apply slots (:class:`ApplyInSlot` in place of
    :class:`~deep_sleep.run.pipeline.Apply`)."""
    from deep_sleep.run import pipeline

    return tuple(ApplyInSlot(slots) if isinstance(s, pipeline.Apply) else s for s in stages)


@dataclass(frozen=True)
class ApplyInSlot:
    """The apply stage, holding one of the night's ``slots`` apply slots (:func:`apply_slot`) while it
    runs: the nightly's stage list puts this value where :data:`~deep_sleep.run.pipeline.NIGHT` has
    :class:`~deep_sleep.run.pipeline.Apply`.  A night that waits for a slot says so on stderr."""

    slots: int
    name: ClassVar[str] = "apply"
    writes_reports: ClassVar[bool] = True

    def run(self, ctx: pipeline.Context, state: pipeline.State) -> pipeline.State:
        from deep_sleep.run import pipeline

        with apply_slot(ctx.store.dsn, self.slots):
            return pipeline.Apply().run(ctx, state)

    def describe(self, ctx: pipeline.Context) -> str:
        from deep_sleep.run import pipeline

        return f"{pipeline.Apply().describe(ctx)}, holding one of {self.slots} apply slot(s)"


