"""Phase 2 — tag_risk: recent nodes that talk about risk are flagged (SPEC §3)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import datetime

import polars as pl
from deep_sleep.transforms._common import (
    PhaseResult,
    in_own_window,
    merge_json,
    scope_paths,
    scoped_result,
)

from deep_sleep.core.config import PhaseConfig
from deep_sleep.core.diff import Diff
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot, iso


class TagRiskConfig(PhaseConfig):
    markers: tuple[str, ...] = (
        "risk", "danger", "failure", "loss", "negative", "decline", "warning", "critical", "error", "threat",
    )


#: The counters this phase reports (SPEC §3).
COUNTERS: tuple[str, ...] = ("risk_nodes_tagged",)


# A word start is the start of the text or any character that is not a letter, mark or digit.
_WORD_START = r"(?:^|[^\p{L}\p{M}\p{N}])"
_META = re.compile(r"([\\.+*?()|\[\]{}^$])")

# JSON tokens that matter for finding top-level string values: string literals and punctuation.
_TOKEN = r'"(?:[^"\\]|\\.)*"|[{}\[\]:,]'


def tag_risk(snapshot: Snapshot | Shard, config: TagRiskConfig, as_of: datetime, lookback_hours: float) -> PhaseResult:
    """Recent nodes whose label or any top-level string value of ``properties`` contains a marker word
    at a word start, case-insensitively (``errors``, ``Risky``, ``my_error`` match; ``terror`` does not),
    get ``properties.risk_node = true`` and ``properties.risk_tagged_at = as_of`` (ISO 8601, ``Z``).  A
    word start is the start of the text or a character that is not a Unicode letter, mark or digit (so
    ``_``, ``-`` and spaces separate words).  Keys, and strings nested inside arrays or objects, are not
    searched: a property's value is text only when it is a top-level string.  Nodes whose
    ``risk_node`` is already the JSON boolean ``true`` are skipped (``false`` or the string "true" are
    re-tagged).  A matching node whose properties are not a JSON
    object is left alone (tagging would overwrite them) and reported in the notes.  Empty markers are
    ignored.

    Per scope (a :class:`~deep_sleep.core.shard.Shard` or a single-scope snapshot): "recent" is each
    scope's own window (from its previous run), and each scope's note lists its own untaggable nodes.
    """
    markers = sorted({m for m in config.markers if m})
    if not markers:
        return scoped_result(Diff.empty(), None, COUNTERS)
    words = "|".join(_escape(m) for m in markers)
    pattern = f"{_WORD_START}(?i:{words})"
    # The text tests are computed in the query that reads the window (not in eager passes over its result).
    # Only nodes whose raw JSON holds a marker (or an escape that might spell one) need their
    # values looked at one by one; most nodes have none.
    paths = scope_paths(snapshot)
    single = len(paths) == 1
    scoped = [] if single else ["scope_path"]  # one scope: every row is of it
    recent = (
        snapshot.table("memory_nodes")
        .lazy()
        .filter((pl.col("layer") == "semantic") & in_own_window(snapshot, "updated_at", as_of, lookback_hours))
        .select(
            *scoped,
            "id",
            "version",
            "label",
            "properties",
            pl.col("label").str.contains(pattern).fill_null(False).alias("_label_hit"),
            pl.col("properties").str.strip_chars_start().str.starts_with("{").fill_null(False).alias("_object"),
            (pl.col("properties").str.contains(f"(?i)(?:{words})") | pl.col("properties").str.contains("\\", literal=True))
            .fill_null(False)
            .alias("_maybe"),
        )
        .with_row_index("_row")
        .collect()
    )
    # Nodes are named by ``_row`` (integers: cheaper to look up than ids), and the already-tagged
    # ones are left out by the two filters below rather than by a copy of ``recent``.
    todo = ~pl.col("_row").is_in(_tagged(recent).implode())
    maybe = recent.filter(todo & ~pl.col("_label_hit") & pl.col("_object") & pl.col("_maybe"))
    value_hits = _value_hits(maybe, pattern) if maybe.height else pl.Series("_row", [], pl.UInt32)
    hits = recent.filter(todo & (pl.col("_label_hit") | pl.col("_row").is_in(value_hits.implode())))
    untaggable = hits.filter(~pl.col("_object"))
    notes = _untaggable_notes(untaggable.with_columns(pl.lit(paths[0]).alias("scope_path")) if single else untaggable)
    tagged = hits.filter(pl.col("_object")).select(*scoped, "id", "version", "properties").sort("id")
    if not tagged.height:
        return _with_notes(scoped_result(Diff.empty(), None, COUNTERS, scope_notes=notes), single)
    patch = json.dumps({"risk_node": True, "risk_tagged_at": iso(as_of)}, separators=(",", ":"))
    updates = merge_json(tagged, pl.lit(patch))
    counts = (pl.DataFrame({"scope_path": [paths[0]], "risk_nodes_tagged": [updates.height]}) if single
              else updates.group_by("scope_path").len("risk_nodes_tagged"))
    # The shard's diff names its rows' scope as well (Diff.by_scope); a scope's, by id alone.
    return _with_notes(scoped_result(Diff.of("memory_nodes", "tag_risk", updates=updates), counts, COUNTERS,
                                     scope_notes=notes), single)


def _with_notes(result: PhaseResult, single: bool) -> PhaseResult:
    """A single-scope run reports its scope's notes as the result's ``notes`` too."""
    return replace(result, notes=next(iter(result.scope_notes.values()))) if single and result.scope_notes else result


def _untaggable_notes(untaggable: pl.DataFrame) -> dict[str, tuple[str, ...]]:
    """Each scope's note on its matching nodes whose properties are not a JSON object: their count
    and their first 10 ids in id order (`` …`` when there are more)."""
    if not untaggable.height:
        return {}
    shown = (
        untaggable.group_by("scope_path")
        .agg(pl.len().alias("n"), pl.col("id").sort().head(10).str.join(", ").alias("ids"))
        .select(
            "scope_path",
            pl.format("{} risk node(s) not tagged: properties are not a JSON object ({}{})", "n", "ids",
                      pl.when(pl.col("n") > 10).then(pl.lit(" …")).otherwise(pl.lit(""))).alias("note"),
        )
    )
    return {s: (note,) for s, note in shown.iter_rows()}


def _tagged(nodes: pl.DataFrame) -> pl.Series:
    """``_row`` of the nodes whose ``risk_node`` is already the JSON boolean ``true``.  Reading a JSON
    path is slow, so it is read only where the key's literal text occurs (which :func:`_json_true` requires)."""
    return (
        nodes.filter(pl.col("properties").str.contains('"risk_node"', literal=True))
        .filter(_json_true("properties", "risk_node"))
        .get_column("_row")
    )


def _json_true(column: str, key: str) -> pl.Expr:
    """Top-level ``key`` of the JSON object ``column`` is the boolean ``true`` (not the string "true")."""
    return (pl.col(column).str.json_path_match(f"$.{key}") == "true").fill_null(False) & pl.col(column).str.contains(
        f'"{key}"\\s*:\\s*true'
    ).fill_null(False)


def _value_hits(maybe: pl.DataFrame, pattern: str) -> pl.Series:
    """``_row`` of the nodes with a top-level string value matching ``pattern``: tokenize the JSON text,
    keep string tokens right after a ``:`` at depth 1 (inside the outer object only), decode, match."""
    step = pl.when(pl.col("tok").is_in(["{", "["])).then(1).when(pl.col("tok").is_in(["}", "]"])).then(-1).otherwise(0)
    # A node's tokens are consecutive rows: the previous token and the running depth within the node
    # come from whole-column shift / cum_sum, restarted at each node's first token (cheaper than `over`).
    first = (pl.col("_row") != pl.col("_row").shift(1)).fill_null(True)
    total = step.cum_sum()
    return (
        maybe.select("_row", pl.col("properties").str.extract_all(_TOKEN).alias("tok"))
        .explode("tok")
        .with_columns(
            pl.when(~first).then(pl.col("tok").shift(1)).alias("_prev"),
            (total - pl.when(first).then(total - step).forward_fill()).alias("_depth"),
        )
        .filter(pl.col("tok").str.starts_with('"') & (pl.col("_depth") == 1) & (pl.col("_prev") == ":"))
        .filter(pl.col("tok").str.json_decode(pl.String).str.contains(pattern))
        .get_column("_row")
        .unique()
    )


def _escape(marker: str) -> str:
    """A marker as a regex literal (Polars uses Rust regex syntax)."""
    return _META.sub(r"\\\1", marker)
