"""Shared vocabulary of the phases (SPEC §3 "Terms"); every helper is a pure function."""

from __future__ import annotations

import functools
import os
import uuid
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import pyarrow as pa
from deep_sleep.transforms.errors import PhaseError

from deep_sleep.core import tables
from deep_sleep.core.diff import Diff
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot

PROTECTED_PREFIXES = ("SOUL:", "AGENT_IDENTITY:")
# Namespace of the UUIDv5 ids of rows a phase creates: uuid5(NS, "scope_path|phase|natural key").
ID_NAMESPACE = uuid.UUID("5d1e3c2a-8f4b-5b7e-9a61-0d5ee9000001")


@dataclass(frozen=True)
class PhaseResult:
    """What a phase returns: its diff, its counters, and why it did not run (if it did not).

    A phase runs on a :class:`~deep_sleep.core.shard.Shard` (many scopes at once; a single scope is
    a shard of one), every group, join, rank, cap and threshold partitioned by ``scope_path``, and
    reports per scope as well: ``by_scope`` has a ``scope_path`` column and one
    column per counter (a scope without a row counted 0), ``skipped_scopes`` maps each scope the phase
    did not run for to the reason (``skipped`` then means "skipped for every scope"), and
    ``scope_notes`` the scopes' notes.  ``counters`` stays the total.
    """

    diff: Diff = field(default_factory=Diff.empty)
    counters: dict[str, int] = field(default_factory=dict)
    skipped: str | None = None
    notes: tuple[str, ...] = ()
    by_scope: pl.DataFrame | None = None
    skipped_scopes: Mapping[str, str] = field(default_factory=dict)
    scope_notes: Mapping[str, tuple[str, ...]] = field(default_factory=dict)


def skip(reason: str) -> PhaseResult:
    return PhaseResult(skipped=reason)


# -- many scopes at once (a Shard; a Snapshot is a shard of one) --------------------------------
def scope_paths(snapshot: Snapshot | Shard) -> tuple[str, ...]:
    return snapshot.scope_paths if isinstance(snapshot, Shard) else (snapshot.scope_path,)


def scopes(snapshot: Snapshot | Shard) -> pl.DataFrame:
    """One row per scope of the snapshot or shard: ``scope_path``, ``tenant_id``, ``previous_run_as_of``."""
    paths = scope_paths(snapshot)
    prev = snapshot.previous_run_as_of if isinstance(snapshot, Shard) else {snapshot.scope_path: snapshot.previous_run_as_of}
    return pl.DataFrame(
        {"scope_path": list(paths), "tenant_id": [p.split("\x1f", 2)[1] if "\x1f" in p else None for p in paths],
         "previous_run_as_of": [prev[p] for p in paths]},
        schema={"scope_path": pl.String, "tenant_id": pl.String, "previous_run_as_of": tables.TS},
    )


def window_starts(snapshot: Snapshot | Shard, as_of: datetime, lookback_hours: float) -> pl.DataFrame:
    """``scope_path``, ``window_start``: :func:`window_start` of every scope (its own previous run)."""
    start = as_of - timedelta(hours=lookback_hours)
    return scopes(snapshot).select(
        "scope_path",
        pl.max_horizontal(pl.col("previous_run_as_of"), pl.lit(start).dt.cast_time_unit("us")).alias("window_start"),
    )


def _one_window_start(snapshot: Snapshot | Shard, as_of: datetime, lookback_hours: float) -> datetime | None:
    """The window start of a snapshot or shard of one scope, as :func:`window_starts` gives it (a UTC
    datetime), computed without a frame; None for several scopes, or times not in UTC (the frame decides)."""
    paths = scope_paths(snapshot)
    if len(paths) != 1 or as_of.utcoffset() != timedelta(0):
        return None
    prev = snapshot.previous_run_as_of if isinstance(snapshot, Snapshot) else snapshot.previous_run_as_of[paths[0]]
    if prev is not None and prev.utcoffset() != timedelta(0):
        return None
    start = (as_of - timedelta(hours=lookback_hours)).astimezone(UTC)
    return start if prev is None else max(start, prev.astimezone(UTC))


def with_window(frame: pl.DataFrame | pl.LazyFrame, snapshot: Snapshot | Shard, as_of: datetime,
                lookback_hours: float) -> pl.DataFrame | pl.LazyFrame:
    """``frame`` with its scope's ``window_start`` column (rows keep their order)."""
    one = _one_window_start(snapshot, as_of, lookback_hours)
    if one is not None:
        return frame.with_columns(pl.lit(one).alias("window_start"))
    starts = window_starts(snapshot, as_of, lookback_hours)
    if starts.height == 1:  # one scope: a literal, no join
        return frame.with_columns(pl.lit(starts.item(0, "window_start")).alias("window_start"))
    if isinstance(frame, pl.LazyFrame):
        starts = starts.lazy()
    return frame.join(starts, on="scope_path", how="left", maintain_order="left")


def in_scope_window(column: str, as_of: datetime) -> pl.Expr:
    """``column ∈ (window_start, as_of]`` on a frame from :func:`with_window`."""
    return (pl.col(column) > pl.col("window_start")) & (pl.col(column) <= as_of)


def in_own_window(snapshot: Snapshot | Shard, column: str, as_of: datetime, lookback_hours: float) -> pl.Expr:
    """``column ∈ (its row's scope's window start, as_of]`` as one expression (no ``window_start``
    column to join in): when every scope of the snapshot or shard has the same window start (always
    for a single scope) the bound is a literal — as fast as :func:`in_window` — else each row's bound
    is looked up from its ``scope_path``."""
    one = _one_window_start(snapshot, as_of, lookback_hours)
    if one is not None:
        return in_window(column, one, as_of)
    starts = window_starts(snapshot, as_of, lookback_hours)
    distinct = starts.get_column("window_start").unique()
    if distinct.len() == 1:
        return in_window(column, distinct.item(0), as_of)
    bound = pl.col("scope_path").replace_strict(starts.get_column("scope_path"), starts.get_column("window_start"),
                                                return_dtype=tables.TS)
    return (pl.col(column) > bound) & (pl.col(column) <= as_of)


def tenant_of(scope_path: str = "scope_path") -> pl.Expr:
    """The tenant id (the first level's id) of each ``scope_path``."""
    return pl.col(scope_path).str.split_exact("\x1f", 2).struct.field("field_1")


def scoped_created_ids(paths: pl.Series, phase: str, keys: pl.Series) -> pl.Series:
    """:func:`created_ids` of each (scope_path, key) pair: UUIDv5 of (scope_path, phase, key)."""
    if paths.n_unique() <= 1:
        return created_ids(paths[0] if paths.len() else "", phase, keys)
    full = pl.select(pl.concat_str(paths, pl.lit(f"|{phase}|"), keys)).to_series().alias(keys.name)
    return created_ids("", "", full, prefix="")


def scoped_result(diff: Diff, counts: pl.DataFrame | None, counters: tuple[str, ...],
                  skipped_scopes: Mapping[str, str] | None = None,
                  scope_notes: Mapping[str, tuple[str, ...]] | None = None) -> PhaseResult:
    """A shard-native phase's result: ``counts`` has ``scope_path`` and (some of) ``counters`` as
    columns (missing ones are 0); totals are summed from it."""
    if counts is None or not counts.height:
        counts = pl.DataFrame(schema={"scope_path": pl.String, **dict.fromkeys(counters, pl.Int64)})
    counts = counts.select("scope_path", *(pl.col(c).cast(pl.Int64).fill_null(0) if c in counts.columns
                                           else pl.lit(0, dtype=pl.Int64).alias(c) for c in counters))
    totals = {c: int(counts.get_column(c).sum()) for c in counters}
    notes = dict(scope_notes or {})
    # A single-scope run reads ``notes``: with the notes of one scope, they are that scope's.
    single = next(iter(notes.values())) if len(notes) == 1 else ()
    return PhaseResult(diff=diff, counters=totals, notes=tuple(single), by_scope=counts,
                       skipped_scopes=dict(skipped_scopes or {}), scope_notes=notes)


def scopes_without(snapshot: Snapshot | Shard, table: str, reason: str, rows: pl.DataFrame | None = None) -> dict[str, str]:
    """``{scope: reason}`` for every scope with no row in ``rows`` (default: the snapshot's ``table``)."""
    frame = snapshot.table(table) if rows is None else rows
    present = set(frame.get_column("scope_path").unique().to_list()) if frame.height else set()
    return {s: reason for s in scope_paths(snapshot) if s not in present}


def window_start(snapshot: Snapshot, as_of: datetime, lookback_hours: float) -> datetime:
    """``max(as_of − lookback_hours, previous applied run's as_of)``: activity is consolidated once."""
    start = as_of - timedelta(hours=lookback_hours)
    prev = snapshot.previous_run_as_of
    return max(start, prev) if prev is not None else start


def in_window(column: str, start: datetime, as_of: datetime) -> pl.Expr:
    """``column ∈ (start, as_of]``."""
    return (pl.col(column) > start) & (pl.col(column) <= as_of)


def is_protected(label: str = "label") -> pl.Expr:
    return pl.any_horizontal(pl.col(label).str.starts_with(p) for p in PROTECTED_PREFIXES)


def semantic(nodes: pl.DataFrame) -> pl.DataFrame:
    return nodes.filter(pl.col("layer") == "semantic")


def label_prefix(label: str = "label") -> pl.Expr:
    """Casefolded text before the first ':' if any, else the first whitespace-delimited token."""
    col = pl.col(label)
    return (
        pl.when(col.str.contains(":", literal=True))
        .then(col.str.split_exact(":", 1).struct.field("field_0"))
        .otherwise(col.str.strip_chars().str.extract(r"^(\S+)", 1))
        .str.strip_chars()
        .str.to_lowercase()
    )


def json_number(column: str, key: str) -> pl.Expr:
    """A numeric top-level JSON property, null when absent or not a number."""
    return pl.col(column).str.json_path_match(f"$.{key}").cast(pl.Float64, strict=False)


def created_id(scope_path: str, phase: str, key: str) -> str:
    return str(uuid.uuid5(ID_NAMESPACE, f"{scope_path}|{phase}|{key}"))


def created_ids(scope_path: str, phase: str, keys: pl.Series, prefix: str | None = None) -> pl.Series:
    """UUIDv5 of (scope_path, phase, natural key) for each key, in order — identical to :func:`created_id`.
    (``prefix``: the text before each key instead of ``scope_path|phase|``; :func:`scoped_created_ids`.)

    Vectorized: SHA-1 in DuckDB, then the UUID text cut out of the hex digests with numpy (RFC 4122 §4.3).
    """
    prefix = f"{scope_path}|{phase}|" if prefix is None else prefix
    if keys.len() < 256:  # a short Python loop beats the round trip
        return pl.Series(keys.name, [str(uuid.uuid5(ID_NAMESPACE, prefix + k)) for k in keys.to_list()], dtype=pl.String)
    # SHA-1 is the cost (~0.4 µs a key): large batches are hashed in parts on worker threads, each
    # with its own DuckDB connection (DuckDB runs one such query on one core).
    step = max(_PART_MIN_KEYS, -(-keys.len() // _PARTS))
    parts = [keys.slice(at, step) for at in range(0, keys.len(), step)]
    hashed = list(_pool().map(functools.partial(_sha1_hex, prefix), parts)) if len(parts) > 1 else [_sha1_hex(prefix, keys)]
    ids = pl.Series(keys.name, _uuid_text(pa.chunked_array(hashed, type=pa.string()).combine_chunks()))
    return ids if not keys.null_count() else pl.select(pl.when(keys.is_not_null()).then(ids)).to_series().alias(keys.name)


_PARTS = min(os.cpu_count() or 1, 4)
_PART_MIN_KEYS = 32_768


@functools.cache
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=_PARTS, thread_name_prefix="created-ids")


def _sha1_hex(prefix: str, keys: pl.Series) -> pa.StringArray:
    """Hex SHA-1 of namespace bytes + UTF-8 of ``prefix + key`` for each key, on this thread's DuckDB
    connection.  A null key gets a placeholder digest (every row 40 characters; its id is nulled)."""
    from deep_sleep.core.duck import registered

    with registered(pl.DataFrame({"k": keys}).to_arrow()) as (con, name):
        digests = con.sql(
            f"SELECT coalesce(sha1(unhex($ns) || encode($prefix || k)), repeat('0', 40)) AS h FROM {name}",
            params={"ns": ID_NAMESPACE.hex, "prefix": prefix},
        ).to_arrow_table().column("h")
    return digests.combine_chunks().cast(pa.string())


# Hex digit (ASCII) → its value, and a nibble's value → the RFC 4122 variant digit ((nibble & 0x3) | 0x8).
_NIBBLE = np.zeros(256, dtype=np.uint8)
_NIBBLE[np.frombuffer(b"0123456789abcdef", dtype=np.uint8)] = np.arange(16, dtype=np.uint8)
_VARIANT = np.frombuffer(b"89ab89ab89ab89ab", dtype=np.uint8)


def _uuid_text(digests: pa.StringArray) -> pa.LargeStringArray:
    """UUID text of SHA-1 digests (40 lowercase hex digits each, no nulls): the first 32 digits with
    the version digit 5 and the variant digit set, hyphenated 8-4-4-4-12.  Every row has the same
    length, so the digests' bytes are an ``(n, 40)`` array and the ids an ``(n, 36)`` one: a few
    column copies instead of per-row string slicing."""
    n = len(digests)
    offsets = np.frombuffer(digests.buffers()[1], dtype=np.int32, count=n + 1, offset=digests.offset * 4)
    if n and not (np.diff(offsets) == 40).all():
        raise PhaseError("created_ids: a SHA-1 digest is not 40 hex digits")
    hexd = np.frombuffer(digests.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[0] + 40 * n].reshape(n, 40)
    out = np.empty((n, 36), dtype=np.uint8)
    out[:, 0:8] = hexd[:, 0:8]
    out[:, 9:13] = hexd[:, 8:12]
    out[:, 14] = ord("5")  # version digit (replaces digest digit 12)
    out[:, 15:18] = hexd[:, 13:16]
    out[:, 19] = _VARIANT[_NIBBLE[hexd[:, 16]]]
    out[:, 20:23] = hexd[:, 17:20]
    out[:, 24:36] = hexd[:, 20:32]
    out[:, [8, 13, 18, 23]] = ord("-")
    ends = np.arange(0, 36 * (n + 1), 36, dtype=np.int64)
    return pa.LargeStringArray.from_buffers(n, pa.py_buffer(ends), pa.py_buffer(out))


def delete_nodes(snapshot: Snapshot, doomed: pl.DataFrame, phase: str, reason: str) -> Diff:
    """Delete nodes (``id``, ``version``) and every edge incident to them (SPEC §3: edges go with the node)."""
    ids = doomed.get_column("id").implode()
    incident = (  # lazy: reads only these columns, however earlier folds left the frame's chunks
        snapshot.table("memory_edges")
        .lazy()
        .select("id", "version", "source_id", "target_id")
        .filter(pl.col("source_id").is_in(ids) | pl.col("target_id").is_in(ids))
        .select("id", "version")
        .collect()
    )
    return Diff.combine(
        [
            Diff.of("memory_nodes", phase, deletes=doomed.select("id", "version"), reason=reason),
            Diff.of("memory_edges", phase, deletes=incident, reason=f"{reason} (incident edge)"),
        ]
    )


def merge_json(frame: pl.DataFrame, patch: pl.Expr, column: str = "properties") -> pl.DataFrame:
    """Replace ``column`` (JSON object text) by its RFC 7386 merge with ``patch`` (an expression
    giving JSON object text, e.g. ``pl.struct(a=…).struct.json_encode()``).  Vectorized in DuckDB."""
    if not frame.height:
        return frame
    from deep_sleep.core.duck import registered

    work = frame.with_row_index("_ds_row").with_columns(patch.alias("_ds_patch"))
    with registered(work.select("_ds_row", column, "_ds_patch").to_arrow()) as (con, name):
        merged = con.sql(
            f"SELECT _ds_row, json_merge_patch(coalesce({column}, '{{}}'), _ds_patch)::VARCHAR AS {column} FROM {name}"
        ).pl()
    merged = merged.with_columns(pl.col("_ds_row").cast(pl.UInt32))
    return work.drop(column, "_ds_patch").join(merged, on="_ds_row", how="left").sort("_ds_row").drop("_ds_row").select(frame.columns)


def resolve_labels(nodes: pl.DataFrame) -> pl.DataFrame:
    """label → id of the node it resolves to: among semantic nodes with that exact label, the highest
    importance, then the latest ``updated_at``, then the smallest id (SPEC §3, phase 2.5)."""
    return (
        semantic(nodes)
        .sort(["label", "importance", "updated_at", "id"], descending=[False, True, True, False], nulls_last=True)
        .group_by("label", maintain_order=True)
        .agg(pl.col("id").first())
    )
