"""The shard: many scopes' snapshots in one set of frames, and its directory form (SPEC §8).

A fleet night reads, transforms and writes many small scopes at once: per table one frame (and
one Parquet file) holding every scope's rows, sorted by ``scope_path``, and a manifest listing
each scope with its own ``previous_run_as_of`` and row counts.  One scope's :class:`Snapshot` is a
zero-copy slice of it (:meth:`Shard.scope`) with exactly the rows, in the same order, that an
extract of that scope alone gives — so a phase sees the same input either way.  A single-scope
snapshot is a shard of one, and :meth:`Shard.read` reads both directory forms.

    >>> from datetime import UTC, datetime
    >>> t = datetime(2026, 1, 1, tzinfo=UTC)
    >>> shard = Shard.of(Snapshot.empty("org\\x1facme", taken_at=t))
    >>> shard.scope_paths, shard.scope("org\\x1facme").scope_path
    (('org\\x1facme',), 'org\\x1facme')
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from types import MappingProxyType

import numpy as np
import polars as pl

from deep_sleep.core import tables
from deep_sleep.core.errors import InputError, ScopeError, SnapshotError
from deep_sleep.core.files import write_atomic
from deep_sleep.core.scope import Scope
from deep_sleep.core.snapshot import MANIFEST, Snapshot, iso, manifest_time, schema_version, table_file, table_of, utc


@dataclass(frozen=True)
class Shard:
    """An immutable view of several scopes at one instant.

    scope_paths: the scopes, sorted (byte order of their UTF-8 text, as Polars sorts strings).
    previous_run_as_of: scope → ``as_of`` of its last applied nightly run, or None.
    taken_at: when the extract's transaction started (the store's clock).
    frames: table name → frame in the snapshot schema, rows sorted by ``scope_path`` (each scope's
        rows in the order of a single-scope extract).
    source: the directory it was read from or written to, if any.
    held_nodes: ids of nodes quarantined rows still touch (see :class:`Snapshot`), of every scope.

    Frames a phase's diff was folded into (:meth:`with_frames`) may hold the new rows at the end;
    :meth:`scope` then reads them through a copy sorted (stably) by ``scope_path``, so each scope
    sees its rows in the order a single-scope run's fold gives: its old rows, then its new ones.
    """

    scope_paths: tuple[str, ...]
    taken_at: datetime
    previous_run_as_of: Mapping[str, datetime | None] = field(default_factory=dict)
    frames: Mapping[str, pl.DataFrame] = field(default_factory=dict)
    source: Path | None = None
    schema_version: int = tables.SCHEMA_VERSION
    held_nodes: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if list(self.scope_paths) != sorted(set(self.scope_paths)):
            raise InputError("Shard.scope_paths must be sorted and distinct")
        object.__setattr__(self, "frames", MappingProxyType(dict(self.frames)))
        object.__setattr__(self, "previous_run_as_of",
                           MappingProxyType({s: self.previous_run_as_of.get(s) for s in self.scope_paths}))
        object.__setattr__(self, "_bounds", {})
        object.__setattr__(self, "_sorted", {})
        object.__setattr__(self, "_position", {s: i for i, s in enumerate(self.scope_paths)})

    # -- building ----------------------------------------------------------------------------
    @classmethod
    def of(cls, snapshot: Snapshot) -> Shard:
        """A shard of one scope."""
        return cls((snapshot.scope_path,), snapshot.taken_at, {snapshot.scope_path: snapshot.previous_run_as_of},
                   dict(snapshot.frames), snapshot.source, snapshot.schema_version)

    @classmethod
    def from_snapshots(cls, snapshots: Iterable[Snapshot]) -> Shard:
        """The shard of several single-scope snapshots (the same ``taken_at``; distinct scopes)."""
        snaps = sorted(snapshots, key=lambda s: s.scope_path.encode())
        if not snaps:
            raise InputError("a shard needs at least one scope")
        if len({s.taken_at for s in snaps}) > 1:
            raise InputError("the snapshots of a shard must share one taken_at (one extract)")
        frames = {}
        for name in tables.TABLES:
            parts = [s.frames[name] for s in snaps if name in s.frames]
            if parts:
                frames[name] = pl.concat([tables.conform(name, p) for p in parts], how="diagonal_relaxed")
        return cls(tuple(s.scope_path for s in snaps), snaps[0].taken_at,
                   {s.scope_path: s.previous_run_as_of for s in snaps}, frames)

    @classmethod
    def from_frames(cls, scopes: Mapping[str, datetime | None], taken_at: datetime,
                    frames: Mapping[str, pl.DataFrame]) -> Shard:
        """A shard of frames in any row order (sorted here, stably, by ``scope_path``)."""
        sorted_frames = {name: f if _is_sorted(f) else f.sort("scope_path", maintain_order=True)
                         for name, f in frames.items()}
        paths = tuple(sorted(scopes, key=str.encode))
        return cls(paths, utc(taken_at), dict(scopes), sorted_frames)

    def with_frames(self, frames: Mapping[str, pl.DataFrame]) -> Shard:
        """The shard with some frames replaced (rows of its scopes only, in any order)."""
        return replace(self, frames={**self.frames, **frames})

    # -- reading one scope -------------------------------------------------------------------
    def table(self, name: str) -> pl.DataFrame:
        """The rows of ``name`` for every scope (an empty frame of the right schema when absent)."""
        return table_of(self.frames, name)

    def _by_scope(self, name: str) -> pl.DataFrame:
        """``table(name)`` with its rows sorted by ``scope_path`` (stably; the frame itself when it is)."""
        frame = self._sorted.get(name)  # type: ignore[attr-defined]
        if frame is None:
            frame = self.table(name)
            if not _is_sorted(frame):
                frame = frame.sort("scope_path", maintain_order=True)
            self._sorted[name] = frame  # type: ignore[attr-defined]
        return frame

    def _offsets(self, name: str) -> np.ndarray:
        """Row offsets of each scope's run in ``name`` (len(scope_paths) + 1 values)."""
        cached = self._bounds.get(name)  # type: ignore[attr-defined]
        if cached is None:
            frame = self._by_scope(name) if name in self.frames else None
            if frame is None or not frame.height:
                cached = np.zeros(len(self.scope_paths) + 1, dtype=np.int64)
            else:
                col = frame.get_column("scope_path")
                keys = pl.Series(self.scope_paths, dtype=pl.String)
                lo = col.search_sorted(keys, side="left").to_numpy()
                hi = col.search_sorted(keys, side="right").to_numpy()
                if int((hi - lo).sum()) != frame.height:
                    outside = frame.filter(~pl.col("scope_path").is_in(keys.implode()))["scope_path"].unique().head(3)
                    raise SnapshotError(f"{name}: rows of scopes not in the shard: {outside.to_list()}")
                cached = np.append(lo, hi[-1]).astype(np.int64)
            self._bounds[name] = cached  # type: ignore[attr-defined]
        return cached

    def rows_of(self, name: str, scope_path: str) -> pl.DataFrame:
        """The rows of one scope in ``name`` (a zero-copy slice)."""
        i = self._index(scope_path)
        bounds = self._offsets(name)
        return self._by_scope(name).slice(int(bounds[i]), int(bounds[i + 1] - bounds[i]))

    def scope(self, scope_path: str) -> Snapshot:
        """One scope's snapshot, as an extract of that scope alone gives it."""
        frames = {name: self.rows_of(name, scope_path) for name in self.frames}
        held = self.held_nodes
        if held:
            ids = set(self.rows_of("memory_nodes", scope_path).get_column("id").to_list()) if "memory_nodes" in self.frames else set()
            held = frozenset(held & ids)
        return Snapshot(scope_path, self.taken_at, self.previous_run_as_of[scope_path], frames,
                        schema_version=self.schema_version, held_nodes=held)

    def snapshots(self) -> Iterator[Snapshot]:
        for s in self.scope_paths:
            yield self.scope(s)

    def row_counts(self, scope_path: str | None = None) -> dict[str, int]:
        if scope_path is None:
            return {name: self.table(name).height for name in tables.TABLES}
        i = self._index(scope_path)
        return {name: int(self._offsets(name)[i + 1] - self._offsets(name)[i]) for name in tables.TABLES}

    def _index(self, scope_path: str) -> int:
        i = self._position.get(scope_path)  # type: ignore[attr-defined]
        if i is None:
            held = ", ".join(str(Scope.parse(s)) for s in self.scope_paths[:5])
            raise ScopeError(f"scope {Scope.parse(scope_path)} is not in this shard; it holds "
                             f"{len(self.scope_paths)} scope(s): {held}{'…' if len(self.scope_paths) > 5 else ''}")
        return i

    # -- files -------------------------------------------------------------------------------
    def write(self, directory: str | Path) -> Path:
        """Write the shard directory (SPEC §8): one Parquet file per table, a manifest listing every scope."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        manifest_tables = {}
        for name in tables.TABLES:
            frame = self._by_scope(name)
            frame.write_parquet(out / f"{name}.parquet", **tables.PARQUET_OPTIONS)
            manifest_tables[name] = {"file": f"{name}.parquet", "rows": frame.height}
        counts = {name: np.diff(self._offsets(name)) for name in tables.TABLES}
        manifest = {
            "taken_at": iso(self.taken_at),
            "schema_version": self.schema_version,
            "tables": manifest_tables,
            "scopes": [
                {"scope_path": s, "previous_run_as_of": iso(self.previous_run_as_of[s]),
                 "rows": {name: int(counts[name][i]) for name in tables.TABLES}}
                for i, s in enumerate(self.scope_paths)
            ],
        }
        if len(self.scope_paths) == 1:  # also a valid single-scope manifest
            manifest["scope_path"] = self.scope_paths[0]
            manifest["previous_run_as_of"] = iso(self.previous_run_as_of[self.scope_paths[0]])
        write_atomic(out / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
        return out

    @classmethod
    def read(cls, directory: str | Path) -> Shard:
        """Read a shard directory, or a single-scope snapshot directory as a shard of one.  Table files
        must resolve inside the directory (:func:`~deep_sleep.core.snapshot.table_file`)."""
        src = Path(directory)
        mpath = src / MANIFEST
        try:
            manifest = json.loads(mpath.read_text())
        except (OSError, ValueError, RecursionError):  # unreadable, not UTF-8, not JSON, too deep: the single-scope reader names it
            manifest = None
        if not isinstance(manifest, dict) or "scopes" not in manifest:
            return cls.of(Snapshot.read(src))  # its errors name the problem
        version = schema_version(mpath, manifest)
        scopes = manifest["scopes"]
        if not isinstance(scopes, list) or not scopes:
            raise SnapshotError(f"{mpath}: 'scopes' must be a non-empty list of {{scope_path, previous_run_as_of}}")
        previous: dict[str, datetime | None] = {}
        for i, entry in enumerate(scopes):
            path = entry.get("scope_path") if isinstance(entry, dict) else None
            if not path:
                raise SnapshotError(f"{mpath}: scopes[{i}] has no scope_path")
            try:
                Scope.parse(path)
            except ScopeError as exc:
                raise SnapshotError(f"{mpath}: scopes[{i}].scope_path is invalid: {exc}") from exc
            prev = entry.get("previous_run_as_of")
            previous[path] = manifest_time(mpath, f"scopes[{i}].previous_run_as_of", prev) if prev else None
        if not manifest.get("taken_at"):
            raise SnapshotError(f"{mpath}: field 'taken_at' is required (see README, 'Snapshot format')")
        taken_at = manifest_time(mpath, "taken_at", manifest["taken_at"])
        if not isinstance(manifest.get("tables") or {}, dict):
            raise SnapshotError(f"{mpath}: 'tables' must be an object of table name → {{file, rows}}")
        frames = {}
        for name, entry in (manifest.get("tables") or {}).items():
            if name not in tables.TABLES:
                raise SnapshotError(f"{mpath}: unknown table {name!r}; known tables: {', '.join(tables.TABLES)}")
            file = table_file(src, mpath, name, entry)
            try:
                frame = tables.conform(name, pl.read_parquet(file))
            except (ValueError, OSError, pl.exceptions.PolarsError) as exc:
                raise SnapshotError(f"{file}: {exc}") from exc
            if entry.get("rows") is not None and entry["rows"] != frame.height:
                raise SnapshotError(f"{file}: manifest says {entry['rows']} rows, file has {frame.height}; "
                                    "the snapshot is incomplete")
            frames[name] = frame
        shard = cls.from_frames(previous, taken_at, frames)
        return Shard(shard.scope_paths, shard.taken_at, shard.previous_run_as_of, shard.frames, src, version)


def _is_sorted(frame: pl.DataFrame) -> bool:
    if frame.height < 2:
        return True
    col = frame.get_column("scope_path")
    return bool((col.slice(1) >= col.slice(0, frame.height - 1)).all())


__all__ = ["Shard"]
