"""The snapshot: one scope's rows at one instant, as Polars frames, and its on-disk form (SPEC §8).

A snapshot directory holds ``manifest.json`` and one ``<table>.parquet`` per extracted table,
columns named as in Postgres.  Any subset of tables may be present; missing tables read as
empty, missing columns as null (``scope_path`` and ``tenant_id`` as the manifest's scope), so a
snapshot written by hand replays.

    >>> snap = Snapshot.empty("org\\x1facme", taken_at=datetime(2026, 1, 1, tzinfo=UTC))
    >>> snap.table("memory_nodes").height
    0
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType

import polars as pl

from deep_sleep.core import tables
from deep_sleep.core.errors import InputError, SnapshotError, TimeRangeError
from deep_sleep.core.scope import Scope, ScopeError

MANIFEST = "manifest.json"

# The columns a hand-written table file must have (SPEC §8: "any subset of columns beyond the key
# columns"): what identifies its rows and what every phase reading the table needs.
REQUIRED_COLUMNS: dict[str, tuple[str, ...]] = {
    "memory_nodes": ("id", "layer", "label"),
    "memory_edges": ("id", "source_id", "target_id", "relation"),
    "episodic_events": ("id", "content"),
    "memory_access_log": ("node_id", "accessed_at"),
    "procedural_skills": ("id", "name"),
    "prospective_triggers": ("id",),
    "soul_profiles": ("key", "value"),
    "pending_connections": ("id", "source_label", "target_label", "relation"),
    "recall_events": ("id", "node_id"),
    "reranker_models": (),
}
_EXPECTED = {  # column kind → (what SPEC §8 says, test of a Parquet column's type)
    "uuid": ("canonical lowercase UUID text (string)", lambda t: t == pl.String),
    "text": ("string", lambda t: t == pl.String),
    "json": ("UTF-8 JSON text (string)", lambda t: t == pl.String),
    "ts": ("timestamp (UTC microseconds)", lambda t: isinstance(t, pl.Datetime)),
    "float": ("floating-point number", lambda t: t.is_numeric()),
    "int": ("integer", lambda t: t.is_integer()),
    "floats": ("list of floats", lambda t: isinstance(t, (pl.List, pl.Array)) and t.inner.is_numeric()),
    "vector": ("fixed-size list of float32", lambda t: isinstance(t, (pl.List, pl.Array)) and t.inner.is_numeric()),
}


def check_columns(file: Path, table: str, schema: Mapping[str, pl.DataType]) -> None:
    """A clear SnapshotError naming file, column, expected and found type — never a silent cast
    (an int64 ``updated_at`` would read as 1970, an int64 ``id`` would make every edge dangle)."""
    missing = [c for c in REQUIRED_COLUMNS.get(table, ()) if c not in schema]
    if missing:
        raise SnapshotError(f"{file}: column(s) {', '.join(missing)} missing; a {table} file needs at least "
                            f"{', '.join(REQUIRED_COLUMNS[table])} (see README, 'Snapshot format')")
    for name, col in tables.columns(table).items():
        found = schema.get(name)
        if found is None or found == pl.Null:
            continue
        what, ok = _EXPECTED[col.kind]
        if not ok(found):
            raise SnapshotError(f"{file}: column {name} holds {found}, expected {what} (SPEC §8)")


def utc(ts: datetime | str) -> datetime:
    """Parse/normalise to an aware UTC datetime with microsecond precision (naive means UTC).  A text
    that is no ISO 8601 time is an InputError, a time outside years 1–9999 in UTC a
    :class:`~deep_sleep.core.errors.TimeRangeError` (also an OverflowError), each naming the value."""
    if isinstance(ts, str):
        try:
            ts = datetime.fromisoformat(ts.replace("Z", "+00:00"))
        except ValueError:
            raise InputError(f"{ts!r} is not an ISO 8601 timestamp (e.g. 2026-11-29T03:00:00Z)") from None
    if ts.tzinfo is None:
        ts = ts.replace(tzinfo=UTC)
    try:
        return ts.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:59:59-12:00 is year 10000 in UTC, 0001-01-01T00:00:00+01:00 year 0
        raise TimeRangeError(f"{shown_time(ts)} is outside years 1–9999 once converted to UTC; give a time within "
                             "them (e.g. 2026-11-29T03:00:00Z)") from None


def shown_time(ts: datetime | str) -> str:
    return repr(ts[:40]) if isinstance(ts, str) else repr(ts.isoformat())


def schema_version(mpath: Path, manifest: dict) -> int:
    """The manifest's ``schema_version`` (absent: this build's), or a SnapshotError naming it when it is
    not this build's :data:`~deep_sleep.core.tables.SCHEMA_VERSION` (a later one, an unknown one, not
    an integer): a snapshot of another layout is never read as if it were this one."""
    version = manifest.get("schema_version", tables.SCHEMA_VERSION)
    if type(version) is not int or version != tables.SCHEMA_VERSION:
        shown = (f"{str(version)[:20]}… ({len(str(version))} digits)" if type(version) is int and len(str(version)) > 20
                 else json.dumps(version)[:40])
        raise SnapshotError(f"{mpath}: schema_version {shown} is not supported; this build reads schema_version "
                            f"{tables.SCHEMA_VERSION} only (a snapshot written by another version of Deep Sleep)")
    return version


def iso(ts: datetime | None) -> str | None:
    return None if ts is None else utc(ts).isoformat().replace("+00:00", "Z")


def _as_stored(name: str, raw: pl.DataFrame, scope_path: str, columns: Collection[str] | None = None) -> pl.DataFrame:
    """A table's frame in the snapshot schema.  A snapshot holds one scope: the scope columns a
    table leaves out for that reason (the access log's tenant_id) take the snapshot's scope."""
    fill = {"scope_path": scope_path, "tenant_id": Scope.parse(scope_path).tenant_id}
    raw = raw.with_columns(pl.lit(v).alias(k) for k, v in fill.items()
                           if k not in raw.columns and (columns is None or k in columns))
    frame = tables.conform(name, raw, only=columns)
    if name == "soul_profiles" and "id" in frame.columns and "key" in frame.columns and frame.get_column("id").null_count():
        frame = frame.with_columns(pl.coalesce(pl.col("id"), soul_profile_ids(scope_path, frame.get_column("key"))).alias("id"))
    return frame


# soul_profiles is identified by (scope_path, key) and its surrogate id is optional (SPEC §1): a row
# without one gets a stand-in id, UUIDv5 of (scope_path, "soul_profiles", key), so diffs can name it;
# the apply matches profiles by key, never by this id.
_SOUL_ID_NAMESPACE = uuid.UUID("5d1e3c2a-8f4b-5b7e-9a61-0d5ee9000002")


def soul_profile_ids(scope_path: str, keys: pl.Series) -> pl.Series:
    """The stand-in id of each profile key (null for a null key)."""
    return pl.Series("id", [None if k is None else str(uuid.uuid5(_SOUL_ID_NAMESPACE, f"{scope_path}|soul_profiles|{k}"))
                            for k in keys.to_list()], dtype=pl.String)


def table_file(src: Path, mpath: Path, name: str, entry: object) -> Path:
    """The file the manifest ``mpath`` names for table ``name`` (its ``tables`` entry ``entry``), which
    must resolve inside the snapshot directory ``src``: a relative path without ``..``, and no link
    out of the directory either (the manifest is data from outside, and a replay must never read
    ``/etc/passwd`` or another snapshot's files on its say-so).  A SnapshotError names the table,
    the file and the fix otherwise; also when the file does not exist."""
    if not isinstance(entry, dict):
        raise SnapshotError(f"{mpath}: tables.{name} must be an object {{\"file\": …, \"rows\": …}}")
    given = entry.get("file") or f"{name}.parquet"
    if not isinstance(given, str):
        raise SnapshotError(f"{mpath}: tables.{name}.file must be a file name, got a JSON {type(given).__name__}")
    fix = f'table files are read from the snapshot directory only: name it like "{name}.parquet"'
    if "\x00" in given or Path(given).is_absolute() or ".." in Path(given).parts:
        raise SnapshotError(f"{mpath}: tables.{name}.file {given!r} is outside the snapshot directory {src}; {fix}")
    file = src / given
    try:
        inside = file.resolve().is_relative_to(src.resolve())
    except (OSError, RuntimeError) as exc:  # a link loop, an unreadable directory
        raise SnapshotError(f"{mpath}: tables.{name}.file {given!r} cannot be resolved ({exc})") from None
    if not inside:
        raise SnapshotError(f"{mpath}: tables.{name}.file {given!r} is a link to {file.resolve()}, outside the snapshot "
                            f"directory {src}; {fix}")
    if not file.is_file():
        raise SnapshotError(f"{mpath}: table {name} names {given}, which does not exist")
    return file


def manifest_time(mpath: Path, key: str, value: object) -> datetime:
    """A manifest's timestamp field, or a SnapshotError naming the field (a timestamp that is not a
    string, not ISO 8601, or outside years 1–9999 once in UTC)."""
    if not isinstance(value, str):
        raise SnapshotError(f"{mpath}: {key} must be an ISO 8601 timestamp string, got a JSON {type(value).__name__}")
    try:
        return utc(value)
    except (InputError, OverflowError):
        raise SnapshotError(f"{mpath}: {key} {value[:40]!r} is not an ISO 8601 timestamp within years 1–9999 "
                            "(e.g. 2026-11-29T03:00:00Z)") from None


def table_of(frames: Mapping[str, pl.DataFrame], name: str) -> pl.DataFrame:
    """``frames[name]``, or an empty frame of the table's schema when absent; an unknown table is an error."""
    frame = frames.get(name)
    if frame is None:
        if name not in tables.TABLES:
            raise InputError(f"unknown table {name!r}; Deep Sleep knows {', '.join(tables.TABLES)}")
        return tables.empty(name)
    return frame


@dataclass(frozen=True)
class Snapshot:
    """An immutable view of one scope.

    scope_path: the exact scope every row belongs to.
    taken_at: when the extract's transaction started (the store's clock).
    previous_run_as_of: ``as_of`` of the scope's last applied run, or None.
    frames: table name → frame in the snapshot schema of :mod:`deep_sleep.core.tables`.
    source: the directory it was read from or written to, if any.
    held_nodes: ids of live nodes that rows set aside by quarantine still touch (an edge of NaN
        weight, say).  Phases must not delete them: their degree here ignores those rows, and a
        delete would leave the quarantined rows pointing at nothing.  Empty unless quarantined.
    """

    scope_path: str
    taken_at: datetime
    previous_run_as_of: datetime | None = None
    frames: Mapping[str, pl.DataFrame] = field(default_factory=dict)
    source: Path | None = None
    schema_version: int = tables.SCHEMA_VERSION
    held_nodes: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        object.__setattr__(self, "frames", MappingProxyType(dict(self.frames)))

    @classmethod
    def empty(cls, scope_path: str, taken_at: datetime, previous_run_as_of: datetime | None = None) -> Snapshot:
        return cls(scope_path, utc(taken_at), previous_run_as_of)

    @property
    def scope(self) -> Scope:
        return Scope.parse(self.scope_path)

    def table(self, name: str) -> pl.DataFrame:
        """The rows of ``name`` (an empty frame of the right schema when absent)."""
        return table_of(self.frames, name)

    def with_frames(self, frames: Mapping[str, pl.DataFrame]) -> Snapshot:
        return replace(self, frames={**self.frames, **frames})

    def as_read(self, directory: str | Path) -> Snapshot:
        """This snapshot as :meth:`read` gives it back after :meth:`write` to ``directory``."""
        frames = {name: _as_stored(name, frame, self.scope_path) for name, frame in self.frames.items()}
        return replace(self, frames=frames, source=Path(directory))

    def row_counts(self) -> dict[str, int]:
        return {name: self.table(name).height for name in tables.TABLES}

    # -- files -----------------------------------------------------------------------------
    def write(self, directory: str | Path) -> Path:
        """Write the snapshot directory (SPEC §8) and return it: a shard of one's
        (:meth:`deep_sleep.core.shard.Shard.write`), whose manifest is also a single-scope manifest."""
        from deep_sleep.core.shard import Shard

        return Shard.of(self).write(directory)

    @classmethod
    def read(cls, directory: str | Path, columns: Collection[str] | None = None) -> Snapshot:
        """Read a snapshot directory; tables not in the manifest are empty.  Table files must resolve
        inside the directory (:func:`table_file`).

        ``columns``: read only these columns of every table (those a table has), e.g. for the
        validate stage, which needs keys and versions, not whole rows.
        """
        src = Path(directory)
        mpath = src / MANIFEST
        if not mpath.is_file():
            raise SnapshotError(
                f"{src} is not a snapshot directory: {MANIFEST} is missing. "
                "Create one with `deep-sleep snapshot SCOPE --out DIR` or see README, 'Snapshot format'."
            )
        try:
            manifest = json.loads(mpath.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise SnapshotError(f"{mpath}: not valid UTF-8 JSON ({exc})") from None
        except RecursionError:
            raise SnapshotError(f"{mpath}: nested far too deeply to read; a manifest is an object of a few levels "
                                "(scope_path, taken_at, tables, …): see README, 'Snapshot format'") from None
        if not isinstance(manifest, dict):
            raise SnapshotError(f"{mpath}: must hold a JSON object (scope_path, taken_at, tables, …), "
                                f"found a JSON {type(manifest).__name__}; see README, 'Snapshot format'")
        if not isinstance(manifest.get("tables") or {}, dict):
            raise SnapshotError(f"{mpath}: 'tables' must be an object of table name → {{file, rows}}")
        for key in ("scope_path", "taken_at"):
            if not manifest.get(key):
                raise SnapshotError(f"{mpath}: field {key!r} is required (see README, 'Snapshot format')")
        version = schema_version(mpath, manifest)
        try:
            Scope.parse(manifest["scope_path"])
        except ScopeError as exc:
            raise SnapshotError(f"{mpath}: scope_path is invalid: {exc}") from exc
        frames = {}
        for name, entry in (manifest.get("tables") or {}).items():
            if name not in tables.TABLES:
                raise SnapshotError(f"{mpath}: unknown table {name!r}; known tables: {', '.join(tables.TABLES)}")
            file = table_file(src, mpath, name, entry)
            try:
                schema = pl.read_parquet_schema(file)
            except Exception as exc:  # polars raises several types for a file that is not Parquet
                raise SnapshotError(f"{file}: not a readable Parquet file ({type(exc).__name__}: {exc})") from None
            check_columns(file, name, schema)
            try:
                if columns is None:
                    raw = pl.read_parquet(file)
                else:
                    wanted = [c for c in schema if c in columns]
                    if not wanted:  # the reader needs nothing from this table (a hand-written one may lack ids)
                        continue
                    raw = pl.read_parquet(file, columns=wanted)
                frame = _as_stored(name, raw, manifest["scope_path"], columns)
            except SnapshotError:
                raise
            except Exception as exc:  # a truncated file, a value that cannot be cast
                raise SnapshotError(f"{file}: {type(exc).__name__}: {exc}") from None
            rows = entry.get("rows")
            if rows is not None and rows != frame.height:
                raise SnapshotError(f"{file}: manifest says {rows} rows, file has {frame.height}; the snapshot is incomplete")
            frames[name] = frame
        taken_at = manifest_time(mpath, "taken_at", manifest["taken_at"])
        prev = manifest.get("previous_run_as_of")
        return cls(
            scope_path=manifest["scope_path"],
            taken_at=taken_at,
            previous_run_as_of=manifest_time(mpath, "previous_run_as_of", prev) if prev else None,
            frames=frames,
            source=src,
            schema_version=version,
        )
