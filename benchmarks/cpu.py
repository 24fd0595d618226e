"""CPU seconds from Linux ``/proc``: of one process, and of a local PostgreSQL server as a whole.

On a 2-core machine a night is CPU-bound: wall time says how long, CPU seconds say who spent them
(the Python client or the database server) -- a measure other load on a shared machine disturbs far
less than wall time.  Only meaningful when the server runs on this machine (the embedded one).
"""

from __future__ import annotations

import os
from pathlib import Path

_TICK = os.sysconf("SC_CLK_TCK")


def _stat(pid: int | str) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (field 3 onwards)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def proc_cpu(pid: int) -> float:
    """CPU seconds (user + system) the process ``pid`` used so far."""
    f = _stat(pid)
    return (int(f[11]) + int(f[12])) / _TICK


def postmaster_pid(store) -> int | None:
    """The pid of ``store``'s server when it runs on this machine (its ``postmaster.pid``), else None."""
    with store.pg() as con:
        data_dir = con.execute("SHOW data_directory").fetchone()[0]
    try:
        pid = int(Path(data_dir, "postmaster.pid").read_text().split()[0])
        return pid if Path(f"/proc/{pid}").exists() else None
    except (OSError, ValueError, IndexError):
        return None


def server_cpu(postmaster: int | None) -> float | None:
    """CPU seconds the server of ``postmaster`` (see :func:`postmaster_pid`) used so far: its live
    processes (backends, autovacuum, WAL writer, checkpointer, ...) plus, through the postmaster's
    children counters, the ones that have exited.  None without a local server."""
    if postmaster is None:
        return None
    try:
        f = _stat(postmaster)
    except OSError:
        return None
    total = (int(f[11]) + int(f[12]) + int(f[13]) + int(f[14])) / _TICK
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or entry.name == str(postmaster):
            continue
        try:
            f = _stat(entry.name)
        except OSError:  # exited meanwhile
            continue
        if f[1] == str(postmaster):
            total += (int(f[11]) + int(f[12])) / _TICK
    return round(total, 2)


def server_counters(store) -> dict[str, float]:
    """Cumulative counters of ``store``'s server that explain a write-heavy stage: WAL bytes and
    full-page images (every first change of a page after a checkpoint logs the whole 8 KB page),
    checkpoints, and the database's shared-buffer hits and reads (a read is a page that had to come
    from the OS).  Subtract two readings (:func:`counters_delta`)."""
    with store.pg() as con:
        wal_bytes, wal_fpi = con.execute("SELECT wal_bytes, wal_fpi FROM pg_stat_wal").fetchone()
        checkpoints = con.execute("SELECT num_timed + num_requested FROM pg_stat_checkpointer").fetchone()[0]
        hit, read = con.execute("SELECT blks_hit, blks_read FROM pg_stat_database WHERE datname = current_database()"
                                ).fetchone()
    return {"wal_mb": float(wal_bytes) / 2**20, "wal_fpi": float(wal_fpi), "checkpoints": float(checkpoints),
            "blks_hit": float(hit), "blks_read": float(read)}


def counters_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """``after − before`` of :func:`server_counters`, with the shared-buffer hit ratio of the interval."""
    out = {k: round(after[k] - before[k], 1) for k in before}
    seen = out["blks_hit"] + out["blks_read"]
    out["hit_ratio"] = round(out["blks_hit"] / seen, 4) if seen else None
    return out
