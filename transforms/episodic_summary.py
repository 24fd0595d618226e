"""Phase 10 — episodic_summary: the oldest episodic events are folded into summary nodes (SPEC §3)."""

from __future__ import annotations

import json
import math
import re
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
from deep_sleep.transforms.label_recalls import STOP_WORDS


class EpisodicSummaryConfig(PhaseConfig):
    threshold: int = Field(100, ge=1)
    batch_size: int = Field(50, ge=1)
    max_batches: int = Field(1, ge=1)
    #: The summary text's bound (the digest's, and a model's summary is cut to it).
    max_chars: int = Field(1000, ge=120, le=32000)
    #: The folded turns' distinct words kept as the summary's word key (``properties.keywords``).
    max_keywords: int = Field(1000, ge=0, le=20000)


#: The counters this phase reports (SPEC §3).
COUNTERS: tuple[str, ...] = ("episodes_summarized",)


PHASE = "episodic_summary"
LABEL = "META:episodic_summary"
IMPORTANCE = 5.0
NO_EVENTS = "missing input: no episodic events"
#: A folded event's delete reason starts so, and names its summary node after it: the apply moves
#: such an event into ``episodic_folded`` under that node (:data:`deep_sleep.run.statements.FOLD_SQL`).
FOLD_REASON = f"summarised into {LABEL} "
#: A turn quoted in the digest is cut here (a digest line, not the turn's whole text).
TURN_CHARS = 160
#: At most this many names, and numbers or dates, in a digest.
DIGEST_TERMS = 10
#: A turn's weight sums its words' inverse frequencies in units of 1 / IDF_SCALE (integers: exact in any order).
IDF_SCALE = 2.0**32
#: A speaker is the name before ``": "`` at the start of a turn (letters, spaces, ``.'’-``; at most 40
#: characters) when no ``metadata.speaker`` says it.
_SPEAKER = r"^(\p{L}[\p{L}\p{M}'’. -]{0,39}):\s"
_KEY_WORD = r"[^\W_]*\d[^\W_]*|[^\W\d_]{3,}"
#: A name: a capitalised word inside a sentence (after a character that ends no sentence), so that a
#: sentence's first word ("Thanks", "Wow") is not one.
_NAME = r"[^.!?\s]\s+\p{Lu}\p{Ll}+\b"
_NUMBER = r"\b\d[\d,.:/-]*\d\b|\b\d\b|\b\d+(?:st|nd|rd|th|s|am|pm|%)"


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
    The node's ``properties`` hold ``summary`` (a bounded extractive digest, at most ``max_chars``
    characters: :func:`_digests` — never the concatenation of the events), ``keywords`` (the folded
    turns' distinct words: the summary's word key), ``source_count``, ``first_at`` / ``last_at`` (ISO
    8601, the batch's oldest and newest ``created_at``) and ``source_ids`` (in that order).  The
    events themselves are deleted with the reason :data:`FOLD_REASON` + the node's id, and the apply
    moves each one whole into ``episodic_folded`` under that node, where recall finds it line by line
    (SPEC §3 phase 10 and §5 as amended 2026-12-06); undo brings them back.  Its id is
    the UUIDv5 of the batch's first and last event ids, so several summary nodes accumulate over
    time, all labelled ``META:episodic_summary``; if that node already exists (a previous run's
    event deletes lost to a live write), its summary properties are refreshed instead of
    inserted.  Each deleted event's reason names its summary node.  The counter counts events.
    With a ``summarizer`` (SPEC §7), a batch's ``summary`` is the model's text where it gives one,
    cut at ``max_chars``, and then ``properties.summary_model`` names the model; on the fallback it
    is the digest and ``summary_model`` is absent.

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
            pl.col("content").fill_null("").str.strip_chars().alias("_contents"),
            pl.len().alias("source_count"),
            pl.col("created_at").first().alias("first_at"),
            pl.col("created_at").last().alias("last_at"),
            pl.col("id").alias("source_ids"),
        )
        .with_columns(
            # the summary's cache key, and the natural key of its node's id
            (pl.col("source_ids").list.first() + "|" + pl.col("source_ids").list.last()).alias("_key"),
        )
        .join(_digests(chosen, config), on=["scope_path", "_batch"], how="left", maintain_order="left")
    )
    # summary_node_id of each batch, vectorized over the shard's scopes
    summaries = summaries.with_columns(scoped_created_ids(summaries.get_column("scope_path"), PHASE,
                                                          summaries.get_column("_key")).alias("id"))
    summaries = _summarised(summaries, summarizer, config.max_chars)
    fields = (
        "summary",
        "keywords",
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
        "id", "version", (pl.lit(FOLD_REASON) + pl.col("id_node")).alias("reason")
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


def _summarised(summaries: pl.DataFrame, summarizer: Summarizer | None, max_chars: int) -> pl.DataFrame:
    """``summaries`` with ``summary`` replaced by the summarizer's text where it gives one (cut at
    ``max_chars``, the bound of every summary), and ``summary_model`` (the model's name, null for the
    deterministic digest).  One request per row, in the rows' order, each naming its row's ``scope_path``."""
    if summarizer is None:
        return summaries.drop("_contents").with_columns(pl.lit(None, pl.String).alias("summary_model"))
    requests = [
        SummaryRequest(PHASE, row["scope_path"], row["_key"], tuple(row["_contents"]), row["summary"])
        for row in summaries.select("scope_path", "_key", "_contents", "summary").iter_rows(named=True)
    ]
    answers = summarizer.summarize(requests)
    return summaries.drop("_contents").with_columns(
        pl.Series("summary", [_cut(a.text, max_chars) if a else r.fallback
                              for r, a in zip(requests, answers, strict=True)], pl.String),
        pl.Series("summary_model", [a.model if a else None for a in answers], pl.String),
    )


def _cut(text: str, limit: int) -> str:
    """``text`` at most ``limit`` characters: cut at the last space before the limit, with an ellipsis."""
    text = " ".join(text.split()) if "\n" not in text else text.strip()
    if len(text) <= limit:
        return text
    head = text[: limit - 1]
    return (head.rsplit(" ", 1)[0] if " " in head[limit // 2:] else head) + "…"


def _digests(chosen: pl.DataFrame, config: EpisodicSummaryConfig, plain: bool = True) -> pl.DataFrame:
    """Each batch's deterministic digest (``summary``) and word key (``keywords``), per (scope_path,
    _batch) — one vectorized pass over every batch of the shard.

    The digest, at most ``max_chars`` characters, is extractive (it quotes, never invents):

    1. a header: the participants (each turn's ``metadata.speaker``, else the text before ``": "`` at
       its start; in order of first appearance), the time span (first and last ``created_at``, UTC,
       to the minute) and the number of turns;
    2. ``Names:`` the capitalised words the turns mention most inside a sentence (not a participant,
       not a stop word, never written in lower case in the batch), at most :data:`DIGEST_TERMS`, most
       frequent first;
    3. ``Numbers:`` the numbers, dates and times the turns mention, first seen first, at most
       :data:`DIGEST_TERMS`;
    4. the most distinctive turns, each cut at :data:`TURN_CHARS` characters, in time order, as many
       as fit: a turn's weight is the sum of the inverse batch frequencies ``ln((n + 1) / df)`` of its
       distinct words (3+ letters, not stop words) over the square root of their number, so a turn of
       rare words (a name, a place, a plan) outranks small talk; ties go to the earlier turn (each
       ``ln`` is rounded down to a multiple of 2⁻³² and summed exactly, so turns of the same words
       tie in any order of summation); a turn said twice is quoted once.

    ``keywords``: the batch's distinct words (3+ letters, or any run of letters and digits holding a
    digit; lower case, not stop words) in
    order of first appearance, at most ``max_keywords``, space-separated — the summary's word key: the
    store indexes it with the label and the digest, so any folded turn's words find the summary, whose
    recall passage then quotes the matching turns themselves (SPEC §5).

    A few batches of ASCII text (the quick nap's) take :func:`plain_digests`,
    the same rules in plain Python (this pass's fixed cost is most of a nap's transform), unless ``plain``
    is false."""
    done = plain_digests(chosen, config.max_chars, config.max_keywords) if plain else None
    if done is not None:
        return done
    key = ["scope_path", "_batch"]
    meta = pl.col("metadata") if "metadata" in chosen.columns else pl.lit(None, pl.String)
    text = pl.col("content").fill_null("").str.replace_all(r"\s+", " ").str.strip_chars()
    turns = chosen.select(
        *key, "_pos", "created_at", text.alias("_text"),
        pl.coalesce(meta.str.json_path_match("$.speaker"), pl.col("content").fill_null("").str.extract(_SPEAKER, 1))
        .str.strip_chars().alias("_speaker"),
    )
    stop = list(STOP_WORDS)
    # participants, span, size
    heads = (
        turns.group_by(key, maintain_order=True)
        .agg(pl.col("_speaker").drop_nulls().filter(pl.col("_speaker").drop_nulls() != "").unique(maintain_order=True)
             .head(6).alias("_who"),
             pl.col("created_at").min().alias("_first"), pl.col("created_at").max().alias("_last"), pl.len().alias("_n"))
        .with_columns(pl.concat_str([
            pl.when(pl.col("_who").list.len() > 0).then(pl.col("_who").list.join(", ") + pl.lit(" · ")).otherwise(pl.lit("")),
            pl.col("_first").dt.strftime("%Y-%m-%d %H:%M").fill_null("?"), pl.lit(" – "),
            pl.col("_last").dt.strftime("%Y-%m-%d %H:%M").fill_null("?"), pl.lit(" UTC · "),
            pl.col("_n").cast(pl.String), pl.lit(" turns")]).alias("_head"))
    )
    body = turns.with_columns(
        pl.when(pl.col("_speaker").is_not_null() & pl.col("_text").str.starts_with(pl.col("_speaker") + ": "))
        .then(pl.col("_text").str.slice(pl.col("_speaker").str.len_chars() + 2)).otherwise(pl.col("_text")).alias("_said"))
    # names: capitalised words never written in lower case in the batch
    lower = (body.select(*key, pl.col("_said").str.extract_all(r"[^\W\d_]+").alias("w")).explode("w")
             .filter(pl.col("w").is_not_null() & (pl.col("w") == pl.col("w").str.to_lowercase()))
             .select(*key, "w").unique())
    names = (
        body.select(*key, "_pos", pl.col("_said").str.extract_all(_NAME).alias("w")).explode("w")
        .drop_nulls("w").with_columns(pl.col("w").str.extract(r"(\p{Lu}\p{Ll}+)$", 1)).drop_nulls("w").with_row_index("_at")
        .filter(~pl.col("w").str.to_lowercase().is_in(stop))
        .join(lower.with_columns(pl.col("w").str.to_titlecase().alias("w")), on=[*key, "w"], how="anti")
        .join(turns.select(*key, pl.col("_speaker").alias("w")).drop_nulls().unique(), on=[*key, "w"], how="anti")
        .group_by(*key, "w").agg(pl.len().alias("c"), pl.col("_at").min().alias("first"))
        .sort([*key, "c", "first"], descending=[False, False, True, False])
        .group_by(key, maintain_order=True).agg(pl.col("w").head(DIGEST_TERMS).str.join(", ").alias("_names"))
    )
    numbers = (
        body.select(*key, pl.col("_said").str.extract_all(_NUMBER).alias("w")).explode("w").drop_nulls("w")
        .unique([*key, "w"], maintain_order=True)
        .group_by(key, maintain_order=True).agg(pl.col("w").head(DIGEST_TERMS).str.join(", ").alias("_numbers"))
    )
    # distinctive turns
    words = (body.select(*key, "_pos", pl.col("_said").str.to_lowercase().str.extract_all(r"[^\W\d_]{3,}").alias("w"))
             .explode("w").drop_nulls("w").filter(~pl.col("w").is_in(stop)).unique([*key, "_pos", "w"]))
    idf = (words.group_by(*key, "w").agg(pl.len().alias("df"))
           .join(heads.select(*key, "_n"), on=key)
           .with_columns((((pl.col("_n") + 1) / pl.col("df")).log() * IDF_SCALE).floor().cast(pl.Int64).alias("_q")))
    # summed in fixed point: the order of a turn's words here is not fixed (joins, hash groups), and a
    # float sum of the same idfs in another order gave equal turns weights a bit apart — which of them
    # was quoted changed from run to run
    weight = (words.join(idf.select(*key, "w", "_q"), on=[*key, "w"])
              .group_by(*key, "_pos").agg((pl.col("_q").sum() / IDF_SCALE / pl.len().sqrt()).alias("_weight")))
    lines = (
        body.join(weight, on=[*key, "_pos"], how="left")
        .with_columns(pl.col("_weight").fill_null(0.0),
                      pl.when(pl.col("_text").str.len_chars() > TURN_CHARS)
                      .then(pl.col("_text").str.slice(0, TURN_CHARS - 1) + pl.lit("…")).otherwise(pl.col("_text"))
                      .alias("_line"))
        .filter(pl.col("_line") != "")
        .sort([*key, "_weight", "_pos"], descending=[False, False, True, False])
        .unique([*key, "_line"], keep="first", maintain_order=True)  # a turn said twice is quoted once
        .with_columns((pl.col("_line").str.len_chars() + 3).cum_sum().over(key).alias("_used"))
    )
    top = (
        heads.select(*key, "_head")
        .join(names, on=key, how="left").join(numbers, on=key, how="left")
        .with_columns(pl.concat_str([
            pl.col("_head"),
            pl.when(pl.col("_names").fill_null("") != "").then(pl.lit("\nNames: ") + pl.col("_names")).otherwise(pl.lit("")),
            pl.when(pl.col("_numbers").fill_null("") != "").then(pl.lit("\nNumbers: ") + pl.col("_numbers")).otherwise(pl.lit("")),
        ]).str.slice(0, config.max_chars).alias("_top"))
        .select(*key, "_top")
    )
    quoted = (
        lines.join(top.select(*key, (config.max_chars - pl.col("_top").str.len_chars()).alias("_room")), on=key)
        .filter(pl.col("_used") <= pl.col("_room"))
        .sort([*key, "_pos"])
        .group_by(key, maintain_order=True).agg(("- " + pl.col("_line")).str.join("\n").alias("_quoted"))
    )
    keywords = (
        body.select(*key, "_pos", pl.col("_said").str.to_lowercase().str.extract_all(_KEY_WORD).alias("w"))
        .sort([*key, "_pos"]).explode("w").drop_nulls("w").filter(~pl.col("w").is_in(stop))
        .unique([*key, "w"], maintain_order=True)
        .group_by(key, maintain_order=True).agg(pl.col("w").head(config.max_keywords).str.join(" ").alias("keywords"))
    )
    return (
        top.join(quoted, on=key, how="left").join(keywords, on=key, how="left")
        .select(*key,
                pl.when(pl.col("_quoted").is_not_null()).then(pl.col("_top") + pl.lit("\n") + pl.col("_quoted"))
                .otherwise(pl.col("_top")).alias("summary"),
                pl.col("keywords").fill_null(""))
    )


# -- the fast path: the digest in plain Python --------------------------------------------------
# Phase 10's digest and word key in plain Python, for a few batches of ASCII text (the quick nap's).
#
# :func:`_digests` computes them in Polars, one vectorized pass
# over every batch of a shard; on one 50-turn batch that pass is ~60 Polars calls of fixed cost, about
# half of a quick nap's transform.  :func:`plain_digests` gives the same frame row for row (the same
# rules, step by step, in the same order; tests/transforms/test_digest_paths.py checks both against
# the golden cases and against each other on random batches) when every turn's text is ASCII, where the
# regular expressions of Rust's engine and of Python's ``re`` (spelt here with explicit ASCII classes)
# match the same text, and every ``metadata.speaker`` is absent or a string; otherwise it returns
# None and the Polars pass runs.
#
# Whitespace is Rust's (Unicode ``White_Space``; in ASCII ``\t \n \v \f \r`` and the space): Python's
# ``str.isspace`` and ``re``'s ``\s`` also count ``\x1c``–``\x1f``, so they are not used.

#: Up to this many chosen events (every batch of the shard together) the plain path is taken.
PLAIN_MAX_ROWS = 1_000

_WS = "\t\n\x0b\x0c\r "
_SPACES = re.compile(f"[{_WS}]+")
# the Polars pass's patterns on ASCII text: \p{L} = [A-Za-z], \p{Lu} = [A-Z], \p{Ll} = [a-z], \d = [0-9],
# \w = [A-Za-z0-9_], \s = _WS (\b is the same on ASCII text in both engines)
_PY_SPEAKER = re.compile(f"([A-Za-z][A-Za-z'. -]{{0,39}}):[{_WS}]")
_LETTERS = re.compile(r"[A-Za-z]+")
_PY_NAME = re.compile(f"[^.!?{_WS}][{_WS}]+[A-Z][a-z]+\\b")
_NAME_END = re.compile(r"([A-Z][a-z]+)\Z")
_PY_NUMBER = re.compile(r"\b[0-9][0-9,.:/-]*[0-9]\b|\b[0-9]\b|\b[0-9]+(?:st|nd|rd|th|s|am|pm|%)")
_WORD = re.compile(r"[a-z]{3,}")  # on lower-cased text
_PY_KEY_WORD = re.compile(r"[a-z0-9]*[0-9][a-z0-9]*|[a-z]{3,}")  # on lower-cased text
_NOT_GIVEN = object()


class _Declined(Exception):
    """A metadata text this path leaves to the Polars pass (an internal signal, never raised out)."""


def _speaker_of(metadata: str | None) -> object:
    """``metadata.speaker`` as ``json_path_match("$.speaker")`` gives it: None when absent, the string;
    ``_NOT_GIVEN`` for what this path does not decide (not JSON, not an object, a speaker that is not a
    string, or not ASCII), which sends the batch to the Polars pass."""
    if metadata is None:
        return None
    try:
        value = json.loads(metadata, object_pairs_hook=_no_repeats, parse_constant=_not_json)
    except (ValueError, RecursionError, _Declined):  # not JSON (JSONDecodeError is a ValueError), or declined
        return _NOT_GIVEN
    if not isinstance(value, dict):
        return _NOT_GIVEN
    speaker = value.get("speaker")
    if speaker is None:
        return None if "speaker" not in value else _NOT_GIVEN
    return speaker if isinstance(speaker, str) and speaker.isascii() else _NOT_GIVEN


def _no_repeats(pairs: list[tuple[str, object]]) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _Declined("a repeated key")  # which one a JSON path reads is the engine's choice
    return dict(pairs)


def _not_json(constant: str) -> object:
    raise _Declined(f"{constant} is not JSON")


def _minute(at: datetime | None) -> str:
    return "?" if at is None else f"{at.year:04d}-{at.month:02d}-{at.day:02d} {at.hour:02d}:{at.minute:02d}"


def _digest(rows: list[tuple[str, str | None, datetime | None]], max_chars: int, max_keywords: int) -> tuple[str, str]:
    """One batch's (summary, keywords); ``rows``: (text, speaker, created_at) in the batch's order."""
    n = len(rows)
    turns = []  # (position, text, speaker, said)
    for pos, (text, speaker, _) in enumerate(rows):
        said = text[len(speaker) + 2:] if speaker is not None and text.startswith(speaker + ": ") else text
        turns.append((pos, text, speaker, said))
    # header: participants, span, size
    who: list[str] = []
    for _, _, speaker, _ in turns:
        if speaker and speaker not in who:
            who.append(speaker)
    stamps = [at for _, _, at in rows if at is not None]
    head = ((", ".join(who[:6]) + " · ") if who else "") + (
        f"{_minute(min(stamps) if stamps else None)} – {_minute(max(stamps) if stamps else None)} UTC · {n} turns")
    # names: capitalised words inside a sentence, never written in lower case in the batch
    lower = {w for _, _, _, said in turns for w in _LETTERS.findall(said) if w == w.lower()}
    lower_titled = {w[:1].upper() + w[1:] for w in lower}
    speakers = {s for _, _, s, _ in turns if s is not None}
    counts: dict[str, int] = {}
    for _, _, _, said in turns:
        for match in _PY_NAME.findall(said):
            name = _NAME_END.search(match).group(1)
            if name.lower() in STOP_WORDS or name in lower_titled or name in speakers:
                continue
            counts[name] = counts.get(name, 0) + 1  # dicts keep first-seen order: ties go to the first seen
    names = sorted(counts, key=lambda w: -counts[w])[:DIGEST_TERMS]
    numbers: list[str] = []
    for _, _, _, said in turns:
        for number in _PY_NUMBER.findall(said):
            if number not in numbers:
                numbers.append(number)
    # distinctive turns: the sum of the words' inverse batch frequencies over the root of their number
    words = {pos: {w for w in _WORD.findall(said.lower()) if w not in STOP_WORDS} for pos, _, _, said in turns}
    df: dict[str, int] = {}
    for ws in words.values():
        for w in ws:
            df[w] = df.get(w, 0) + 1
    q = {w: math.floor(math.log((n + 1) / d) * IDF_SCALE) for w, d in df.items()}
    lines, seen = [], set()
    for pos, text, _, _ in turns:
        ws = words[pos]
        weight = sum(q[w] for w in ws) / IDF_SCALE / math.sqrt(len(ws)) if ws else 0.0
        line = text if len(text) <= TURN_CHARS else text[: TURN_CHARS - 1] + "…"
        if line:
            lines.append((-weight, pos, line))
    lines.sort()
    used, picked = 0, []
    top = head + (f"\nNames: {', '.join(names)}" if names else "") + (f"\nNumbers: {', '.join(numbers[:DIGEST_TERMS])}" if numbers else "")
    top = top[:max_chars]
    room = max_chars - len(top)
    for _, pos, line in lines:
        if line in seen:  # a turn said twice is quoted once
            continue
        seen.add(line)
        used += len(line) + 3
        if used <= room:
            picked.append((pos, line))
    picked.sort()
    summary = top + "\n" + "\n".join("- " + line for _, line in picked) if picked else top
    keys: list[str] = []
    known: set[str] = set()
    for _, _, _, said in turns:
        for w in _PY_KEY_WORD.findall(said.lower()):
            if w not in STOP_WORDS and w not in known:
                known.add(w)
                keys.append(w)
    return summary, " ".join(keys[:max_keywords])


def plain_digests(chosen: pl.DataFrame, max_chars: int, max_keywords: int) -> pl.DataFrame | None:
    """:func:`~deep_sleep.transforms.episodic_summary._digests` of ``chosen`` (its ``scope_path``,
    ``_batch``, ``summary``, ``keywords``), or None when a turn's text is not ASCII, a ``metadata.speaker``
    is not a string, or ``chosen`` holds more than :data:`PLAIN_MAX_ROWS` rows."""
    if chosen.height > PLAIN_MAX_ROWS:
        return None
    contents = chosen.get_column("content").to_list()
    if not all(c is None or c.isascii() for c in contents):
        return None
    metadata = chosen.get_column("metadata").to_list() if "metadata" in chosen.columns else [None] * chosen.height
    given = [_speaker_of(m) for m in metadata]
    if any(s is _NOT_GIVEN for s in given):
        return None
    groups: dict[tuple, list[tuple[str, str | None, datetime | None]]] = {}
    for path, batch, content, speaker, at in zip(chosen.get_column("scope_path").to_list(), chosen.get_column("_batch").to_list(),
                                                  contents, given, chosen.get_column("created_at").to_list(), strict=True):
        raw = content or ""
        if speaker is None:
            found = _PY_SPEAKER.match(raw)
            speaker = found.group(1) if found else None
        if speaker is not None:
            speaker = speaker.strip(_WS)
        groups.setdefault((path, batch), []).append((_SPACES.sub(" ", raw).strip(_WS), speaker, at))
    out = [(path, batch, *_digest(rows, max_chars, max_keywords)) for (path, batch), rows in groups.items()]
    return pl.DataFrame(out, schema={"scope_path": pl.String, "_batch": chosen.schema["_batch"], "summary": pl.String,
                                     "keywords": pl.String}, orient="row")
