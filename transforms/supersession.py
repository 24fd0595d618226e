"""Phase D1 — supersession: a newer value of a functional fact closes the older ones (SPEC §3)."""

from __future__ import annotations

from datetime import datetime

import numpy as np
import polars as pl
from deep_sleep.transforms._common import PhaseResult, merge_json, scope_paths, scoped_result

from deep_sleep.core.config import PhaseConfig
from deep_sleep.core.diff import Diff
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot


class SupersessionConfig(PhaseConfig):
    functional_relations: tuple[str, ...] = ("is", "lives_in", "works_at", "prefers", "role")


#: The counters this phase reports (SPEC §3).
COUNTERS: tuple[str, ...] = ("facts_superseded",)


def supersession(snapshot: Snapshot | Shard, config: SupersessionConfig, as_of: datetime) -> PhaseResult:
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

    Shard-native: on a :class:`Shard` the groups are (scope_path, source_id, relation), so an edge
    only ever supersedes an edge of its own scope, and ``facts_superseded`` is counted per scope.
    """
    edges = snapshot.table("memory_edges")
    paths = scope_paths(snapshot)
    many = len(paths) > 1  # one scope: no scope_path column to carry, group or sort on
    closed = _closed(_functional(edges, config, many), many)
    if not closed.height:
        return scoped_result(Diff.empty(), None, COUNTERS)
    # Version and properties are needed only for the edges that close: fetch them last (a filter on
    # the row number, which unlike a gather stays fast when the edges are in many chunks).  Both are
    # in row order, so the fetched rows line up with ``closed``'s.
    fetched = (
        edges.lazy()
        .select("version", "properties")
        .with_row_index("_row")
        .filter(pl.col("_row").is_in(closed.get_column("_row").implode()))
        .select("version", "properties")
        .collect()
    )
    scope = ("scope_path",) if many else ()
    closed = (
        closed.hstack(fetched)
        .select("id", "version", "valid_to", "properties", "_next_id", *scope)
        .sort("id", multithreaded=False)  # polars' parallel sort of strings is slower at these sizes
    )
    updates = _mark_superseded(closed)
    if many:
        counts = updates.group_by("scope_path").agg(pl.len().alias("facts_superseded"))
    else:
        counts = pl.DataFrame({"scope_path": [paths[0]], "facts_superseded": [updates.height]})
    return scoped_result(Diff.of("memory_edges", "supersession", updates=updates), counts, COUNTERS)


def _functional(edges: pl.DataFrame, config: SupersessionConfig, many: bool = False) -> pl.DataFrame:
    """Current functional edges: row number, id, source_id, relation, created_at (and, ``many``
    scopes, scope_path)."""
    current = pl.col("valid_to").is_null()
    relations = config.functional_relations
    # Equality with each relation compares the strings' inline prefixes: cheaper than hashing every
    # relation for an is_in, and the same answer (a null relation gives null either way).
    declared = (
        pl.any_horizontal(pl.col("relation") == r for r in relations)
        if relations
        else pl.col("relation").is_in(pl.Series([], dtype=pl.String).implode())
    )
    # Both masks in one pass, then only the selected rows of the needed columns (a lazy filter on a
    # precomputed mask): a lazy plan holding the JSON test would fuse the filters and read the JSON
    # path of every edge, so that test runs last, on the few edges whose properties mention the key.
    masks = edges.lazy().select(
        declared=current & declared, mentioned=current & pl.col("properties").str.contains("functional", literal=True)
    ).collect()
    cols = ("_row", "id", "source_id", "relation", "created_at", *(("scope_path",) if many else ()))

    def rows(mask: pl.Series, *extra: str) -> pl.DataFrame:
        return edges.lazy().with_row_index("_row").filter(pl.lit(mask)).select(*cols, *extra).collect()

    parts = [rows(masks.get_column("declared"))]
    if masks.get_column("mentioned").any():
        maybe = rows(masks.get_column("mentioned"), "properties")
        parts.append(maybe.filter(~declared & _json_true("properties", "functional")).select(cols))
    return pl.concat(parts)


def _closed(current: pl.DataFrame, many: bool = False) -> pl.DataFrame:
    """Every edge but the newest of its (source_id, relation) group — (scope_path, source_id,
    relation) with ``many`` scopes — with the next newer edge's id (``_next_id``) and ``created_at``
    (as ``valid_to``), in row (``_row``) order."""
    group = ["scope_path", "source_id", "relation"] if many else ["source_id", "relation"]
    same_group_next = pl.all_horizontal(pl.col(c).shift(-1) == pl.col(c) for c in group).fill_null(False)
    hashed = pl.col("source_id").hash() ^ pl.col("relation").hash()
    if many:
        hashed = hashed ^ pl.col("scope_path").hash(1)
    key = current.select(hashed).to_series().to_numpy()
    return (
        # Only groups of two or more edges (by hash: a collision merely lets a lone edge through).
        current.filter(pl.Series(_repeated(key)))
        .sort([*group, "created_at", "id"])
        .with_columns(
            pl.when(same_group_next).then(pl.col("id").shift(-1)).alias("_next_id"),
            pl.when(same_group_next).then(pl.col("created_at").shift(-1)).alias("valid_to"),
        )
        .filter(pl.col("_next_id").is_not_null())
        .select("_row", "id", "valid_to", "_next_id", *(("scope_path",) if many else ()))
        .sort("_row")
    )


def _repeated(key: np.ndarray) -> np.ndarray:
    """Which of the 64-bit ``key`` values occur more than once, up to false positives (rarely: keys
    equal in their top 64 − b bits also count as repeated).  Each key's top bits and its position
    (low b bits) packed into one integer: one plain sort of those instead of a hash table (polars'
    ``is_duplicated``) or an argsort, each several times slower."""
    n = len(key)
    b = max(int(n).bit_length(), 1)
    packed = (key >> np.uint64(b)) << np.uint64(b) | np.arange(n, dtype=np.uint64)
    packed.sort()
    top = packed >> np.uint64(b)
    same = top[1:] == top[:-1]
    hit = np.zeros(n, dtype=bool)
    hit[1:] |= same
    hit[:-1] |= same
    out = np.zeros(n, dtype=bool)
    out[(packed & np.uint64((1 << b) - 1))[hit].astype(np.int64)] = True
    return out


def _json_true(column: str, key: str) -> pl.Expr:
    """Top-level ``key`` of the JSON object ``column`` is the boolean ``true`` (not the string "true")."""
    return (pl.col(column).str.json_path_match(f"$.{key}") == "true").fill_null(False) & pl.col(column).str.contains(
        f'"{key}"\\s*:\\s*true'
    ).fill_null(False)


_PLAIN_ID = r"^[0-9A-Za-z-]+$"  # needs no JSON escaping


def _mark_superseded(closed: pl.DataFrame) -> pl.DataFrame:
    """``properties`` merged with ``{"superseded_by": _next_id}`` (RFC 7386, as :func:`merge_json`),
    the other columns kept, row order kept, ``_next_id`` dropped.  Most closed edges have empty
    properties (``{}``) and a uuid id: for those the merge is the patch itself, written directly —
    byte for byte what DuckDB's merge returns; only the others go through DuckDB."""
    patch = pl.struct(superseded_by=pl.col("_next_id")).struct.json_encode()
    plain = (pl.col("properties") == "{}") & pl.col("_next_id").str.contains(_PLAIN_ID)
    marked = closed.with_row_index("_order").with_columns(plain.fill_null(False).alias("_plain"))
    # A plain id needs no escaping: the patch's text is a format (several times cheaper than json_encode).
    direct = marked.filter("_plain").with_columns(pl.format('{{"superseded_by":"{}"}}', "_next_id").alias("properties"))
    merged = merge_json(marked.filter(~pl.col("_plain")), patch)
    return pl.concat([direct, merged]).sort("_order").drop("_order", "_plain", "_next_id")
