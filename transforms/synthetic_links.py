"""Phase 11 — synthetic_links: nodes the episodes keep mentioning together get linked (SPEC §3)."""

from __future__ import annotations

from datetime import datetime, timedelta

import polars as pl
from deep_sleep.transforms._common import (
    PhaseResult,
    in_window,
    scope_paths,
    scoped_created_ids,
    scoped_result,
    scopes_without,
    semantic,
    skip,
    tenant_of,
)
from pydantic import Field

from deep_sleep.core.config import PhaseConfig
from deep_sleep.core.diff import Diff
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot


class SyntheticLinksConfig(PhaseConfig):
    lookback_days: float = Field(7, ge=0)
    min_cooccurrences: int = Field(2, ge=0)  # pairs seen together in MORE than this many events
    weight: float = Field(0.1, ge=0)
    max_sources: int = Field(20, ge=1)
    max_pairs: int = Field(50, ge=0)


#: The counters this phase reports (SPEC §3).
COUNTERS: tuple[str, ...] = ("synthetic_edges_created",)


PHASE = "synthetic_links"
RELATION = "SYNTHETIC_LINK"
# `[semantic:X]` names the node labelled X; `[SOUL:X]` the node labelled `SOUL:X`.  X is
# everything up to the closing bracket (no nested brackets), taken verbatim.
MARKER = r"\[(?:semantic|SOUL):[^\[\]]+\]"
_SHIFT = 1 << 32
NO_EVENTS = "missing input: no episodic events"


def synthetic_links(snapshot: Snapshot | Shard, config: SyntheticLinksConfig, as_of: datetime) -> PhaseResult:
    """In episodic events with ``created_at`` in (as_of − ``lookback_days``, as_of], markers
    ``[semantic:X]`` (the node labelled exactly X) and ``[SOUL:X]`` (the node labelled
    ``SOUL:X``) are resolved among the scope's semantic nodes as in phase 2.5 (highest
    importance, then latest ``updated_at``, then smallest id); an unresolvable marker is ignored.
    Each event counts once per pair of distinct nodes it references (a marker repeated, or two
    markers resolving to one node, adds nothing).  A pair seen together in more than
    ``min_cooccurrences`` events gets a ``SYNTHETIC_LINK`` edge (source = smaller id, weight
    ``weight``, ``valid_from`` = as_of) with ``properties.provenance = "synthetic"`` and
    ``source_episodic_ids`` = the first ``max_sources`` of its events' ids in sorted order —
    unless a ``SYNTHETIC_LINK`` edge already joins the pair in either direction (current or
    superseded).  At most ``max_pairs`` edges per run: highest co-count first, ties by
    (source, target); the rest wait for the next run.  Markers are case-sensitive, as written.

    On a shard all of it is per scope: an event's markers resolve among its own scope's nodes
    (a label two scopes share names a different node in each), and each scope has its own
    ``max_pairs``; a scope without episodic events is skipped ("missing input").
    """
    start = as_of - timedelta(days=config.lookback_days)
    events = snapshot.table("episodic_events")
    if not events.height:
        return skip(NO_EVENTS)
    paths = scope_paths(snapshot)
    skipped = scopes_without(snapshot, "episodic_events", NO_EVENTS, events) if len(paths) > 1 else {}
    # Events and nodes are handled as integer codes (uuid text is slow to hash and join); node
    # codes follow id order, so comparing codes compares ids.  An event's code is its row in the
    # window; its scope rides along as the scope's code (its position in ``paths``).
    scope_code = pl.DataFrame({"scope_path": list(paths), "scope": pl.int_range(len(paths), dtype=pl.UInt32, eager=True)})
    window = (
        events.lazy()
        .filter(in_window("created_at", start, as_of) & pl.col("content").str.contains("[", literal=True))
        .select("id", "scope_path", "content")
        .collect()
    )
    mentions = (
        window.select(pl.int_range(pl.len(), dtype=pl.UInt32).alias("event"), "scope_path",
                      pl.col("content").str.extract_all(MARKER).alias("marker"))
        .explode("marker")
        .drop_nulls("marker")
    )
    markers = mentions.select("scope_path", "marker").unique().with_columns(
        pl.col("marker").str.strip_prefix("[").str.strip_suffix("]").str.strip_prefix("semantic:").alias("label")
    )
    named = snapshot.table("memory_nodes").lazy().filter(pl.col("label").is_in(markers.get_column("label").unique().implode()))
    resolved = (
        _resolve_labels(named.select("id", "scope_path", "layer", "label", "importance", "updated_at").collect())
        .sort("id")
        .with_row_index("node")
    )
    # Distinct (event, node) pairs, packed into one integer: far cheaper to deduplicate than two columns.
    refs = (
        mentions.join(markers.join(resolved, on=["scope_path", "label"]).select("scope_path", "marker", "node"),
                      on=["scope_path", "marker"])
        .select((pl.col("event").cast(pl.UInt64) * _SHIFT + pl.col("node")).unique().alias("ref"))
        .select((pl.col("ref") // _SHIFT).cast(pl.UInt32).alias("event"), (pl.col("ref") % _SHIFT).cast(pl.UInt32).alias("node"))
    )
    together = refs.join(refs, on="event", suffix="_b").filter(pl.col("node") < pl.col("node_b"))
    code = resolved.select("id", "node")
    linked = (
        snapshot.table("memory_edges")
        .lazy()
        .filter(pl.col("relation") == RELATION)
        .select("source_id", "target_id")
        .join(code.lazy().rename({"id": "source_id", "node": "a"}), on="source_id")
        .join(code.lazy().rename({"id": "target_id", "node": "b"}), on="target_id")
        .select(pl.min_horizontal("a", "b").alias("node"), pl.max_horizontal("a", "b").alias("node_b"))
        .collect()
    )
    node_scope = resolved.join(scope_code, on="scope_path").select("node", "scope")
    chosen = (
        together.group_by("node", "node_b")
        .len("co_count")
        .filter(pl.col("co_count") > config.min_cooccurrences)
        .join(linked, on=["node", "node_b"], how="anti")
        .join(node_scope, on="node")  # a pair's nodes are of one scope: its events'
        .sort(["scope", "co_count", "node", "node_b"], descending=[False, True, False, False])
        .filter(pl.int_range(pl.len()).over("scope") < config.max_pairs)  # max_pairs per scope
    )
    if not chosen.height:
        return scoped_result(Diff.empty(), None, COUNTERS, skipped_scopes=skipped)
    event_ids = window.select(pl.int_range(pl.len(), dtype=pl.UInt32).alias("event"), pl.col("id").alias("event_id"))
    sources = (
        together.join(chosen.select("node", "node_b"), on=["node", "node_b"], how="semi")
        .join(event_ids, on="event")
        .group_by("node", "node_b")
        .agg(pl.col("event_id").sort().head(config.max_sources).alias("source_episodic_ids"))
    )
    chosen = (
        chosen.join(sources, on=["node", "node_b"], maintain_order="left")
        .join(code.rename({"id": "source_id"}), on="node", maintain_order="left")
        .join(code.rename({"id": "target_id", "node": "node_b"}), on="node_b", maintain_order="left")
        .join(scope_code, on="scope", maintain_order="left")
    )
    keys = chosen.select(pl.col("source_id") + "|" + pl.col("target_id")).to_series()
    inserts = chosen.select(
        scoped_created_ids(chosen.get_column("scope_path"), PHASE, keys).alias("id"),
        "scope_path",
        tenant_of().alias("tenant_id"),
        "source_id",
        "target_id",
        pl.lit(RELATION).alias("relation"),
        pl.lit(float(config.weight)).alias("weight"),
        pl.struct(pl.lit("synthetic").alias("provenance"), "source_episodic_ids").struct.json_encode().alias("properties"),
        pl.lit(as_of).alias("created_at"),
        pl.lit(as_of).alias("updated_at"),
        pl.lit(as_of).alias("valid_from"),
    )
    counts = inserts.group_by("scope_path").agg(pl.len().alias("synthetic_edges_created"))
    return scoped_result(Diff.of("memory_edges", PHASE, inserts=inserts), counts, COUNTERS, skipped_scopes=skipped)


def _resolve_labels(nodes: pl.DataFrame) -> pl.DataFrame:
    """:func:`~deep_sleep.transforms._common.resolve_labels` per scope: (``scope_path``, label) →
    id of the node it resolves to among that scope's semantic nodes (highest importance, then the
    latest ``updated_at``, then the smallest id)."""
    return (
        semantic(nodes)
        .sort(["scope_path", "label", "importance", "updated_at", "id"], descending=[False, False, True, True, False],
              nulls_last=True)
        .group_by("scope_path", "label", maintain_order=True)
        .agg(pl.col("id").first())
    )
