"""Apply slots: at most N applies at once across threads, processes, Dask workers and hosts.

A slot is a session advisory lock in the store (class :data:`APPLY_SLOT_CLASS`, key 0…N−1), so the
store itself keeps the cap, and a slot is a lease a killed process cannot keep: Postgres drops a
session's advisory locks with its connection, so a ``kill -9`` frees the slot at once.  Prefect's
tag concurrency limits keep a dead task run's slot until its lease is reaped — a temporary server
may never do that, and every later night then waits (issue 31) — so the flows use these slots, and
the Prefect tag limit is opt-in (``NightlyParameters.prefect_apply_limit``).
"""

from __future__ import annotations

import contextlib
import sys
import time
from dataclasses import dataclass
from typing import ClassVar

from deep_sleep.run import pipeline

APPLY_SLOT_CLASS = 0x0D5EE9 + 1  # pg advisory lock class of the apply slots


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

    with psycopg.connect(dsn, autocommit=True) as con:
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


@dataclass(frozen=True)
class ApplyInSlot:
    """The apply stage, holding one of the night's ``slots`` apply slots (:func:`apply_slot`) while it
    runs: the nightly's stage list puts this value where :data:`~deep_sleep.run.pipeline.NIGHT` has
    :class:`~deep_sleep.run.pipeline.Apply`.  A night that waits for a slot says so on stderr."""

    slots: int
    name: ClassVar[str] = "apply"
    writes_reports: ClassVar[bool] = True

    def run(self, ctx: pipeline.Context, state: pipeline.State) -> pipeline.State:
        with apply_slot(ctx.store.dsn, self.slots):
            return pipeline.Apply().run(ctx, state)

    def describe(self, ctx: pipeline.Context) -> str:
        return f"{pipeline.Apply().describe(ctx)}, holding one of {self.slots} apply slot(s)"


