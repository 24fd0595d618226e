"""Small-file writes that a crash cannot tear."""

from __future__ import annotations

import os
import threading
from pathlib import Path


def write_atomic(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` so a reader sees the old file or the new one, never a part.

    The text goes to a temporary file beside ``path`` that is flushed to disk and then renamed over
    it (``os.replace`` is atomic on one file system).  A process killed between the two leaves at
    most a stray ``.<name>.<pid>.<thread>.tmp`` file (named per writer, so two threads writing the
    same file never share one).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
