"""Phase 10 — episodic_summary: the oldest episodic events are folded into summary nodes (SPEC §3)."""

from __future__ import annotations

from datetime import datetime

import polars as pl
from deep_sleep.transforms._common import (
    PhaseResult,
    created_id,
    merge_json,
    scope_paths,
    scoped_created_ids,
    scoped_result,
    scopes_without,
    skip,
    tenant_of,
)
from pydantic import Field

from deep_sleep.core.config import PhaseConfig
from deep_sleep.core.diff import Diff
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.core.summary import Summarizer, SummaryRequest


class EpisodicSummaryConfig(PhaseConfig):
    threshold: int = Field(100, ge=1)
    batch_size: int = Field(50, ge=1)
    max_batches: int = Field(1, ge=1)


#: The counters this phase reports (SPEC §3).
COUNTERS: tuple[str, ...] = ("episodes_summarized",)


PHASE = "episodic_summary"
LABEL = "META:episodic_summary"
IMPORTANCE = 5.0
# The summary text is capped so one node's properties stay a sane size; the events themselves
# are kept whole in consolidation_archive by the apply.
SUMMARY_MAX_CHARS = 32000
NO_EVENTS = "missing input: no episodic events"
TRUNCATED_NOTE = "\n… [truncated: the full events are kept in consolidation_archive]"


def _iso_text(column: str) -> pl.Expr:
    """A UTC timestamp as ISO 8601 text, the same form as :func:`deep_sleep.core.snapshot.iso`
    (``…T03:00:00Z``, with ``.ffffff`` only when there are microseconds)."""
    col = pl.col(column)
    return (
        pl.when(col.dt.microsecond() == 0)
        .then(col.dt.to_string("%Y-%m-%dT%H:%M:%SZ"))
        .otherwise(col.dt.to_string("%Y-%m-%dT%H:%M:%S%.6fZ"))
    )


def summary_batches(count: int, config: EpisodicSummaryConfig) -> list[range]:
    """The phase's batching rule, for a scope holding ``count`` episodic events: the positions of
    the events each summary node takes, in the scope's events ordered oldest first by
    ``(created_at, id)``.  While more than ``threshold`` events remain, batches of ``batch_size``
    from the oldest, at most ``max_batches``: ``min(max_batches, ⌈(count − threshold) /
    batch_size⌉)`` of them (the last one shorter only when ``count`` runs out first, which takes a
    threshold below the batch size).  Pure; the quick nap's targeted snapshot uses it too.

    >>> summary_batches(130, EpisodicSummaryConfig(threshold=100, batch_size=50, max_batches=2))
    [range(0, 50)]
    >>> summary_batches(30, EpisodicSummaryConfig(threshold=10, batch_size=50, max_batches=2))
    [range(0, 30)]
    """
    excess = count - config.threshold
    if excess <= 0:
        return []
    size = config.batch_size
    return [range(b * size, min((b + 1) * size, count)) for b in range(min(config.max_batches, -(-excess // size)))]


def summary_node_id(scope_path: str, first_event_id: str, last_event_id: str) -> str:
    """The id of a batch's summary node: the UUIDv5 of the batch's first and last event ids."""
    return created_id(scope_path, PHASE, f"{first_event_id}|{last_event_id}")


def episodic_summary(snapshot: Snapshot | Shard, config: EpisodicSummaryConfig, as_of: datetime,
                     summarizer: Summarizer | None = None) -> PhaseResult:
    """While the scope holds more than ``threshold`` episodic events, and for at most
    ``max_batches`` batches per run, the oldest ``batch_size`` events (by ``created_at``, ties by
    id) become one semantic node ``META:episodic_summary`` (importance 5.0) and are deleted (the
    apply archives them).  So a run makes ``min(max_batches, ⌈(count − threshold) / batch_size⌉)``
    batches of ``batch_size`` events (fewer only if the scope holds fewer events than that, which
    takes a threshold below the batch size), and later runs keep working down a backlog.
    The node's ``properties`` hold ``summary`` (the events' contents, each trimmed, oldest first,
    joined by newlines; over 8 000 characters it is cut and ends with a note that the full events
    are in ``consolidation_archive``), ``source_count``, ``first_at`` / ``last_at`` (ISO 8601,
    the batch's oldest and newest ``created_at``) and ``source_ids`` (in that order).  Its id is
    the UUIDv5 of the batch's first and last event ids, so several summary nodes accumulate over
    time, all labelled ``META:episodic_summary``; if that node already exists (a previous run's
    event deletes lost to a live write), its summary properties are refreshed instead of
    inserted.  Each deleted event's reason names its summary node.  The counter counts events.
    With a ``summarizer`` (SPEC §7), a batch's ``summary`` is the model's text where it gives one,
    and then ``properties.summary_model`` names the model; on the fallback it is the
    concatenation above and ``summary_model`` is absent.

    On a shard every one of these rules is per scope: each scope's own event count, threshold,
    batches and oldest events; a scope without events is skipped ("missing input"); the
    summarizer gets the batches in scope order (then oldest first), each request naming its scope.
    """
    events = snapshot.table("episodic_events")
    if not events.height:
        return skip(NO_EVENTS)
    paths = scope_paths(snapshot)
    skipped = scopes_without(snapshot, "episodic_events", NO_EVENTS, events) if len(paths) > 1 else {}
    chosen = _oldest(events, config, len(paths) == 1)
    if chosen is None:
        return scoped_result(Diff.empty(), None, COUNTERS, skipped_scopes=skipped)
    summaries = (
        chosen.group_by("scope_path", "_batch", maintain_order=True)
        .agg(
            pl.col("content").fill_null("").str.strip_chars().str.join("\n").alias("summary"),
            pl.col("content").fill_null("").str.strip_chars().alias("_contents"),
            pl.len().alias("source_count"),
            pl.col("created_at").first().alias("first_at"),
            pl.col("created_at").last().alias("last_at"),
            pl.col("id").alias("source_ids"),
        )
        .with_columns(
            pl.when(pl.col("summary").str.len_chars() > SUMMARY_MAX_CHARS)
            .then(pl.col("summary").str.slice(0, SUMMARY_MAX_CHARS - len(TRUNCATED_NOTE)) + pl.lit(TRUNCATED_NOTE))
            .otherwise(pl.col("summary"))
            .alias("summary"),
            # the summary's cache key, and the natural key of its node's id
            (pl.col("source_ids").list.first() + "|" + pl.col("source_ids").list.last()).alias("_key"),
        )
    )
    # summary_node_id of each batch, vectorized over the shard's scopes
    summaries = summaries.with_columns(scoped_created_ids(summaries.get_column("scope_path"), PHASE,
                                                          summaries.get_column("_key")).alias("id"))
    summaries = _summarised(summaries, summarizer)
    fields = (
        "summary",
        pl.col("source_count").cast(pl.Int64),
        _iso_text("first_at").alias("first_at"),
        _iso_text("last_at").alias("last_at"),
        "source_ids",
    )
    # A deterministic summary has no summary_model key (the diff without the model is unchanged);
    # a refresh always sends it, so a JSON null removes a model's name an earlier run left.
    with_model = pl.struct(*fields, "summary_model").struct.json_encode()
    patch = pl.when(pl.col("summary_model").is_null()).then(pl.struct(*fields).struct.json_encode()).otherwise(with_model)
    summaries = summaries.with_columns(patch.alias("properties"), with_model.alias("_refresh"))

    # The summary node exists already only if a previous run's event deletes lost to a live write.
    found = (  # lazy: reads only these columns, however earlier folds left the frame's chunks
        snapshot.table("memory_nodes")
        .lazy()
        .select("id", "version", "properties")
        .filter(pl.col("id").is_in(summaries.get_column("id").implode()))
        .collect()
    )
    new = summaries.filter(~pl.col("id").is_in(found.get_column("id").implode()))
    inserts = new.select(
        "id",
        "scope_path",
        tenant_of().alias("tenant_id"),
        pl.lit("semantic").alias("layer"),
        pl.lit(LABEL).alias("label"),
        "properties",
        pl.lit(IMPORTANCE).alias("importance"),
        pl.lit(0, pl.Int64).alias("access_count"),
        pl.lit(as_of).alias("created_at"),
        pl.lit(as_of).alias("updated_at"),
    )
    refreshed = merge_json(
        found.select("id", "version", "properties", pl.col("properties").alias("_old"))
        .join(summaries.select("id", pl.col("_refresh").alias("_patch")), on="id"),
        pl.col("_patch"),
    )
    refreshed = refreshed.filter(pl.col("properties") != pl.col("_old")).select("id", "version", "properties")
    deletes = chosen.join(summaries.select("scope_path", "_batch", "id"), on=["scope_path", "_batch"], suffix="_node").select(
        "id", "version", (pl.lit(f"summarised into {LABEL} ") + pl.col("id_node")).alias("reason")
    )
    counts = chosen.group_by("scope_path").agg(pl.len().alias("episodes_summarized"))
    nodes = Diff.of("memory_nodes", PHASE, inserts=inserts if inserts.height else None,
                    updates=refreshed if refreshed.height else None)
    events = Diff.of("episodic_events", PHASE, deletes=deletes)
    # Two tables, and the node updates refresh existing summaries while the inserts are new ones:
    # nothing for Diff.combine to normalise.
    diff = Diff({**nodes.tables, **events.tables})
    return scoped_result(diff, counts, COUNTERS, skipped_scopes=skipped)


def _oldest(events: pl.DataFrame, config: EpisodicSummaryConfig, one_scope: bool) -> pl.DataFrame | None:
    """The events each scope's batches take (:func:`summary_batches` of the scope's event count):
    its oldest by ``(created_at, id)`` (null timestamps last, as ``bottom_k`` picks them), with
    ``_batch`` (the batch within the scope), in scope order, then ``(created_at, id)`` (nulls
    first); ``None`` when no scope has a batch."""
    size = config.batch_size
    if one_scope:
        batches = len(summary_batches(events.height, config))
        take = batches * size
        if not take:
            return None
        created = events.get_column("created_at")
        if created.null_count():  # keeps bottom_k's ordering of null timestamps
            oldest = events.bottom_k(take, by=["created_at", "id"])
        else:
            # bottom_k by (created_at, id text) is slow: cut at the take-th smallest created_at instead
            # (rows tied at the cut included, so the id still decides) and sort only those rows.
            oldest = events.filter(pl.col("created_at") <= created.bottom_k(take).max())
        return (
            oldest.sort(["created_at", "id"])
            .head(take)
            .with_row_index("_pos")
            .with_columns((pl.col("_pos") // size).alias("_batch"))
        )
    # Per scope: summary_batches' count, as a column (b = min(max_batches, ⌈excess / size⌉)).
    excess = pl.len() - config.threshold
    takes = (
        events.group_by("scope_path")
        .agg(pl.when(excess > 0).then(pl.min_horizontal(pl.lit(config.max_batches), (excess + size - 1) // size) * size)
             .otherwise(0).alias("_take"))
        .filter(pl.col("_take") > 0)
    )
    if not takes.height:
        return None
    # Ranked on the key columns alone, then the chosen rows gathered: the events' text is not sorted.
    keys = ["scope_path", "created_at", "id"]
    picked = (
        events.select(pl.int_range(pl.len(), dtype=pl.UInt32).alias("_row"), *keys)
        .join(takes, on="scope_path")
        .sort(keys, nulls_last=True)
        .filter(pl.int_range(pl.len()).over("scope_path") < pl.col("_take"))
        .sort(keys)  # the batches' order: as the one-scope path sorts (null timestamps first)
        .select("_row", pl.int_range(pl.len(), dtype=pl.UInt32).over("scope_path").alias("_pos"))
    )
    return events[picked.get_column("_row")].with_columns(picked.get_column("_pos"), (picked.get_column("_pos") // size).alias("_batch"))


def _summarised(summaries: pl.DataFrame, summarizer: Summarizer | None) -> pl.DataFrame:
    """``summaries`` with ``summary`` replaced by the summarizer's text where it gives one, and
    ``summary_model`` (the model's name, null for the deterministic text).  One request per row,
    in the rows' order, each naming its row's ``scope_path``."""
    if summarizer is None:
        return summaries.drop("_contents").with_columns(pl.lit(None, pl.String).alias("summary_model"))
    requests = [
        SummaryRequest(PHASE, row["scope_path"], row["_key"], tuple(row["_contents"]), row["summary"])
        for row in summaries.select("scope_path", "_key", "_contents", "summary").iter_rows(named=True)
    ]
    answers = summarizer.summarize(requests)
    return summaries.drop("_contents").with_columns(
        pl.Series("summary", [a.text if a else r.fallback for r, a in zip(requests, answers, strict=True)], pl.String),
        pl.Series("summary_model", [a.model if a else None for a in answers], pl.String),
    )
