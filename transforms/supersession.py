"""Phase D1 — supersession: a newer value of a functional fact closes the older ones (SPEC §3)."""

from __future__ import annotations

from datetime import datetime

import polars as pl

from deep_sleep.config import SupersessionConfig
from deep_sleep.diff import Diff
from deep_sleep.snapshot import Snapshot
from transforms._common import PhaseResult, merge_json


def supersession(snapshot: Snapshot, config: SupersessionConfig, as_of: datetime) -> PhaseResult:
    """Functional edges are those whose relation is in ``functional_relations`` or whose
    ``properties.functional`` is the JSON boolean ``true`` (the string "true" is not).  Only functional
    edges take part: a non-functional edge neither supersedes nor is superseded, even when it shares
    source and relation with flagged ones.
    Among current functional edges (``valid_to`` null) grouped by (source_id, relation) — their targets
    differ, by the store's unique key — ordered by ``created_at`` then id, every edge but the newest
    gets ``valid_to`` = the ``created_at`` of the next newer edge of its group and
    ``properties.superseded_by`` = that edge's id, so a chain x → y → z closes x at y and y at z.
    Ties in ``created_at`` go to the larger id as the newer.  Edges are never deleted; edges already
    closed are ignored, so a rerun changes nothing.  ``as_of`` plays no part: the rule is timeless.
    """
    edges = (
        snapshot.table("memory_edges")
        .select("id", "version", "source_id", "relation", "properties", "created_at", "valid_to")
        .filter(pl.col("valid_to").is_null())
    )
    declared = pl.col("relation").is_in(pl.Series(list(config.functional_relations), dtype=pl.String).implode())
    flagged = edges.filter(~declared & pl.col("properties").str.contains("functional", literal=True)).filter(
        _json_true("properties", "functional")
    )
    current = pl.concat([edges.filter(declared), flagged])
    group = ["source_id", "relation"]
    same_group_next = pl.all_horizontal(pl.col(c).shift(-1) == pl.col(c) for c in group).fill_null(False)
    closed = (
        # Only groups of two or more edges (by hash: a collision merely lets a lone edge through).
        current.filter(pl.struct(group).hash().is_duplicated())
        .sort([*group, "created_at", "id"])
        .with_columns(
            pl.when(same_group_next).then(pl.col("id").shift(-1)).alias("_next_id"),
            pl.when(same_group_next).then(pl.col("created_at").shift(-1)).alias("valid_to"),
        )
        .filter(pl.col("_next_id").is_not_null())
        .select("id", "version", "valid_to", "properties", "_next_id")
        .sort("id")
    )
    if not closed.height:
        return PhaseResult(counters={"facts_superseded": 0})
    updates = merge_json(closed, pl.struct(superseded_by=pl.col("_next_id")).struct.json_encode()).drop("_next_id")
    return PhaseResult(
        diff=Diff.of("memory_edges", "supersession", updates=updates),
        counters={"facts_superseded": updates.height},
    )


def _json_true(column: str, key: str) -> pl.Expr:
    """Top-level ``key`` of the JSON object ``column`` is the boolean ``true`` (not the string "true")."""
    return (pl.col(column).str.json_path_match(f"$.{key}") == "true").fill_null(False) & pl.col(column).str.contains(
        f'"{key}"\\s*:\\s*true'
    ).fill_null(False)
