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


# -- run directories on an object store (fsspec: s3://…, gs://…, file://…) --------------------------
def is_remote(location: str | Path) -> bool:
    """True for a URL whose scheme is not ``file`` (``s3://bucket/runs``); a plain path is local."""
    text = str(location)
    return "://" in text and not text.startswith("file://")


def local_path(location: str | Path) -> Path:
    """A local path for ``location`` as given: a plain path, or a ``file://`` URL's path."""
    text = str(location)
    return Path(text[len("file://"):]) if text.startswith("file://") else Path(text)


def join(base: str | Path, *parts: str) -> str:
    """``base/part/…`` for a URL or a path (a URL keeps its ``scheme://``)."""
    text = str(base).rstrip("/")
    return "/".join([text, *parts]) if is_remote(text) else str(Path(text, *parts))


def parent(location: str | Path) -> str:
    """The folder holding ``location`` (a URL keeps its ``scheme://``; a local path is resolved first)."""
    text = str(location).rstrip("/")
    return text.rsplit("/", 1)[0] if is_remote(text) else str(local_path(text).resolve().parent)


def publish_file(local: Path, location: str) -> None:
    """Copy one local file to ``location`` (a URL, or a local path: copied unless it is ``local`` itself)."""
    if not is_remote(location):
        target = local_path(location)
        if target.resolve() != Path(local).resolve():
            import shutil

            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(local, target)
        return
    import fsspec

    fs, path = fsspec.core.url_to_fs(location)
    fs.put_file(str(local), path)


def publish_dir(local: Path, location: str) -> None:
    """Copy the directory ``local`` to ``location`` (a URL; a local path or ``file://`` is left alone
    when it is ``local`` itself), overwriting files of the same name."""
    import fsspec

    if not is_remote(location):
        target = local_path(location)
        if target.resolve() != Path(local).resolve():
            import shutil

            shutil.copytree(local, target, dirs_exist_ok=True)
        return
    fs, path = fsspec.core.url_to_fs(location)
    for file in sorted(p for p in Path(local).rglob("*") if p.is_file() and not p.name.startswith(".")):
        remote = f"{path}/{file.relative_to(local).as_posix()}"
        fs.put_file(str(file), remote)


def published_name(file: str | Path | None, local: Path, location: str) -> str | None:
    """Where :func:`publish_dir` put ``file`` (a file under ``local``): ``location/<its relative path>``;
    None stays None."""
    if file is None:
        return None
    return join(location, *Path(os.path.relpath(file, local)).parts)


def fetch_dir(location: str | Path, cache: Path | None = None) -> Path:
    """A local directory holding ``location``'s files: the path itself when local, else a copy under
    ``cache`` (default ``$DEEP_SLEEP_CACHE_DIR`` or the temp dir's ``deep-sleep-cache``), fetched again
    on every call so a rewritten report is seen."""
    if not is_remote(location):
        return local_path(location)
    import hashlib
    import tempfile

    import fsspec

    fs, path = fsspec.core.url_to_fs(str(location))
    fs.invalidate_cache(path)  # another process may have written here since this one last listed it
    if not fs.isdir(path):
        from deep_sleep.core.errors import InputError

        raise InputError(f"{location}: no such directory on its object store")
    root = cache or Path(os.environ.get("DEEP_SLEEP_CACHE_DIR") or Path(tempfile.gettempdir()) / "deep-sleep-cache")
    local = root / hashlib.sha256(str(location).encode()).hexdigest()[:24]
    local.mkdir(parents=True, exist_ok=True)
    for remote in fs.find(path):
        rel = remote[len(path.rstrip("/")) + 1:]
        target = local / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        fs.get_file(remote, str(target))
    return local
