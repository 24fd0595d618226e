"""Shared vocabulary of the phases (SPEC §3 "Terms"); every helper is a pure function."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import polars as pl

from deep_sleep.diff import Diff
from deep_sleep.snapshot import Snapshot

PROTECTED_PREFIXES = ("SOUL:", "AGENT_IDENTITY:")
# Namespace of the UUIDv5 ids of rows a phase creates: uuid5(NS, "scope_path|phase|natural key").
ID_NAMESPACE = uuid.UUID("5d1e3c2a-8f4b-5b7e-9a61-0d5ee9000001")


@dataclass(frozen=True)
class PhaseResult:
    """What a phase returns: its diff, its counters, and why it did not run (if it did not)."""

    diff: Diff = field(default_factory=Diff.empty)
    counters: dict[str, int] = field(default_factory=dict)
    skipped: str | None = None
    notes: tuple[str, ...] = ()


def skip(reason: str) -> PhaseResult:
    return PhaseResult(skipped=reason)


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


def created_ids(scope_path: str, phase: str, keys: pl.Series) -> pl.Series:
    """UUIDv5 of (scope_path, phase, natural key) for each key, in order — identical to :func:`created_id`.

    Vectorized: SHA-1 in DuckDB, then the version/variant bits set in Polars (RFC 4122 §4.3).
    """
    prefix = f"{scope_path}|{phase}|"
    if keys.len() < 256:  # a short Python loop beats the round trip
        return pl.Series(keys.name, [str(uuid.uuid5(ID_NAMESPACE, prefix + k)) for k in keys.to_list()], dtype=pl.String)
    from deep_sleep.duck import registered

    with registered(pl.DataFrame({"k": keys}).to_arrow()) as (con, name):
        digest = con.sql(
            f"SELECT sha1(unhex($ns) || encode($prefix || k)) AS h FROM {name}", params={"ns": ID_NAMESPACE.hex, "prefix": prefix}
        ).pl().get_column("h")
    variant = pl.Series(list("89ab89ab89ab89ab"))  # (nibble & 0x3) | 0x8 for nibbles 0..f
    h = pl.col("h")
    return pl.DataFrame({"h": digest, "v": digest.str.slice(16, 1).str.to_integer(base=16)}).select(
        pl.concat_str(
            h.str.slice(0, 8), pl.lit("-"), h.str.slice(8, 4), pl.lit("-5"), h.str.slice(13, 3), pl.lit("-"),
            pl.lit(variant).gather(pl.col("v")), h.str.slice(17, 3), pl.lit("-"), h.str.slice(20, 12),
        ).alias(keys.name)
    ).to_series()


def delete_nodes(snapshot: Snapshot, doomed: pl.DataFrame, phase: str, reason: str) -> Diff:
    """Delete nodes (``id``, ``version``) and every edge incident to them (SPEC §3: edges go with the node)."""
    edges = snapshot.table("memory_edges")
    ids = doomed.get_column("id").implode()
    incident = edges.filter(pl.col("source_id").is_in(ids) | pl.col("target_id").is_in(ids))
    return Diff.combine(
        [
            Diff.of("memory_nodes", phase, deletes=doomed.select("id", "version"), reason=reason),
            Diff.of("memory_edges", phase, deletes=incident.select("id", "version"), reason=f"{reason} (incident edge)"),
        ]
    )


def merge_json(frame: pl.DataFrame, patch: pl.Expr, column: str = "properties") -> pl.DataFrame:
    """Replace ``column`` (JSON object text) by its RFC 7386 merge with ``patch`` (an expression
    giving JSON object text, e.g. ``pl.struct(a=…).struct.json_encode()``).  Vectorized in DuckDB."""
    if not frame.height:
        return frame
    from deep_sleep.duck import registered

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
