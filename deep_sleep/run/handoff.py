"""Hand a stage's output to the next stage in memory when both run in one process.

The stages pass *directories* (the snapshot, the diff): that is what makes a night replayable and
every stage re-runnable by hand, and what the Prefect flow passes between tasks.  But when the
next stage runs in the same process right after (``consolidate_scope``, the flow on its
thread-pool runner, the benchmark), reading back the Parquet just written costs time for nothing
(≈ 0.4 s for a 1M-node snapshot, ≈ 0.5 s more for the validate stage's reads).  So a stage that
writes a directory also leaves the value here, and the next stage takes it instead of reading —
only if the directory still holds exactly what was written (every file's size, modification time
and inode as they were right after the write), else it reads the files as usual.

The files stay the source of truth: they are written in full either way; a value is taken at most
once; at most :data:`ENTRIES` values of at most :data:`ROWS` rows in all wait here (the oldest
goes first: a night of many scopes holds a few in memory, not all), and
``DEEP_SLEEP_HANDOFF=0`` turns the whole thing off (every stage then reads its input from disk).
Another process (a Dask worker, a replay, a re-run by hand) finds nothing here and reads the files.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

ENTRIES = 8
ROWS = 6_000_000  # ≈ two 1M-node snapshots with their diffs

_lock = threading.Lock()
_waiting: OrderedDict[tuple[str, str], tuple[frozenset[str], tuple, Any, int]] = OrderedDict()


def enabled() -> bool:
    return os.environ.get("DEEP_SLEEP_HANDOFF", "1").strip().lower() not in ("0", "false", "no", "off")


def _fingerprint(directory: Path, ignore: frozenset[str]) -> tuple:
    """Name, size, mtime and inode of every file in ``directory`` but ``ignore`` and dot files (a
    rewrite by rename changes the inode)."""
    out = []
    with os.scandir(directory) as entries:
        for entry in entries:
            if entry.is_file() and entry.name not in ignore and not entry.name.startswith("."):
                st = entry.stat()
                out.append((entry.name, st.st_size, st.st_mtime_ns, st.st_ino))
    return tuple(sorted(out))


def _key(kind: str, directory: str | Path) -> tuple[str, str]:
    return kind, str(Path(directory).resolve())


def put(kind: str, directory: str | Path, value: Any, rows: int, ignore: frozenset[str] = frozenset()) -> None:
    """Leave ``value`` (what was just written to ``directory``, ``rows`` rows in all) for the next
    stage; files named in ``ignore`` may change in between (a report a later stage rewrites)."""
    if not enabled() or rows > ROWS:
        return
    entry = (ignore, _fingerprint(Path(directory), ignore), value, rows)
    with _lock:
        _waiting[_key(kind, directory)] = entry
        _waiting.move_to_end(_key(kind, directory))
        while len(_waiting) > ENTRIES or sum(e[3] for e in _waiting.values()) > ROWS:
            _waiting.popitem(last=False)


def take(kind: str, directory: str | Path) -> Any | None:
    """The value left for ``directory`` if its files are unchanged since, else None (read the files)."""
    with _lock:
        entry = _waiting.pop(_key(kind, directory), None)
    if entry is None or not enabled():
        return None
    ignore, fingerprint, value, _ = entry
    try:
        return value if _fingerprint(Path(directory), ignore) == fingerprint else None
    except OSError:
        return None


def clear() -> None:
    with _lock:
        _waiting.clear()


__all__ = ["ENTRIES", "ROWS", "clear", "enabled", "put", "take"]
