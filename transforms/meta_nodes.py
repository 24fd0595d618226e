"""Phase 4 — meta_nodes: a META:<prefix> node summarises each large label group (SPEC §3)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import polars as pl
from deep_sleep.transforms._common import (
    PhaseResult,
    is_protected,
    json_number,
    label_prefix,
    merge_json,
    resolve_labels,
    scope_paths,
    scoped_created_ids,
    scoped_result,
    scopes,
    semantic,
    tenant_of,
)
from pydantic import Field

from deep_sleep.core.config import PhaseConfig
from deep_sleep.core.diff import Diff, TableDiff
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.core.summary import Summarizer, SummaryRequest


class MetaNodesConfig(PhaseConfig):
    min_group: int = Field(3, ge=2)
    max_members: int = Field(10, ge=1)


#: The counters this phase reports (SPEC §3).
COUNTERS: tuple[str, ...] = ("meta_nodes_created", "meta_nodes_updated")


PHASE = "meta_nodes"
RELATION = "CLUSTERS"
STALE_REASON = "meta member no longer among the group's top members"
TS = pl.Datetime("us", "UTC")


def meta_nodes(snapshot: Snapshot | Shard, config: MetaNodesConfig, as_of: datetime,
               summarizer: Summarizer | None = None) -> PhaseResult:
    """Group semantic nodes by label prefix, leaving out ``META:`` and protected labels and labels
    without a prefix (empty or blank).  A group of ≥ ``min_group`` gets the node ``META:<prefix>``
    (importance 5.0): created when no semantic node of the scope has that label, otherwise the one
    the label resolves to (as in phase 2.5) is updated — only if its properties would change.
    ``properties``: ``summary`` (``"<prefix> (<n>): label; label; … and <k> more"``, the top
    ``max_members`` labels by importance desc, ``updated_at`` desc, id asc), ``member_count`` (the
    whole group) and ``member_ids`` (the top members, in that order); other keys are kept.  The META
    node has a ``CLUSTERS`` edge to exactly its top members: missing ones are created and those to
    nodes that fell out of the top (or out of the group) are deleted, so its fan-out never exceeds
    ``max_members``.  A META node whose group shrank below ``min_group`` is left untouched.  If the
    id a new META node would take already belongs to another node, the group is skipped and noted.
    With a ``summarizer`` (SPEC §7), each group's ``summary`` is the model's text where it gives
    one, and then ``properties.summary_model`` names the model; where it gives none (the
    fallback) the summary is the deterministic one and ``summary_model`` is absent.

    Shard-native: on a :class:`Shard` everything is per scope — groups are (scope_path, prefix),
    labels resolve among the scope's own nodes, an id is taken only by a node of the same scope,
    CLUSTERS edges are matched within the scope, and the summarizer gets each group's own
    ``scope_path`` — with counters and notes per scope.
    """
    nodes = snapshot.table("memory_nodes")
    paths = scope_paths(snapshot)
    many = len(paths) > 1  # one scope: the scope is a literal, never a key
    groups = _groups(nodes, config, many)
    if not groups.height:
        return scoped_result(Diff.empty(), None, COUNTERS)
    if not many:
        tenant = snapshot.scope.tenant_id if isinstance(snapshot, Snapshot) else scopes(snapshot).item(0, "tenant_id")
        groups = groups.with_columns(pl.lit(paths[0]).alias("scope_path"), pl.lit(tenant, pl.String).alias("tenant_id"))
    else:
        groups = groups.with_columns(tenant_of().alias("tenant_id"))
    groups = _summarised(groups, summarizer)
    scope = ["scope_path"] if many else []

    candidates = nodes.lazy().filter(pl.col("label").is_in(groups.get_column("label").implode())).collect()
    if many:
        candidates = candidates.join(groups.select("scope_path", "label"), on=["scope_path", "label"], how="semi",
                                     maintain_order="left")
    resolved = _resolve_labels(candidates, many)
    groups = groups.join(resolved.rename({"id": "meta_id"}), on=[*scope, "label"], how="left", maintain_order="left")
    existing = groups.filter(pl.col("meta_id").is_not_null())
    new = groups.filter(pl.col("meta_id").is_null())
    new = new.with_columns(scoped_created_ids(new.get_column("scope_path"), PHASE, new.get_column("prefix")).alias("meta_id"))
    holders = nodes.lazy().filter(pl.col("id").is_in(new.get_column("meta_id").implode())).collect() if new.height else nodes.clear()
    taken = new.join(holders.select(pl.col("id").alias("meta_id"), pl.col("label").alias("holder"), *scope),
                     on=["meta_id", *scope], maintain_order="left")
    new = new.join(taken.select("meta_id"), on="meta_id", how="anti")
    notes = taken.select(
        "scope_path", pl.format("META group '{}' skipped: its id {} belongs to node '{}'", "prefix", "meta_id", "holder").alias("note")
    )
    inserts, updates = _inserts(new, as_of), _updates(candidates, existing, many)
    node_diff = Diff.of(
        "memory_nodes", PHASE, inserts=inserts if inserts.height else None, updates=updates if updates.height else None
    )
    metas = pl.concat([new.select("meta_id", "member_ids", "scope_path"), existing.select("meta_id", "member_ids", "scope_path")])
    edge_diff = _clusters(snapshot, metas, as_of, many)
    if many:
        created = inserts.group_by("scope_path").agg(pl.len().alias("meta_nodes_created"))
        changed = updates.group_by("scope_path").agg(pl.len().alias("meta_nodes_updated"))
        counts = created.join(changed, on="scope_path", how="full", coalesce=True)
        scope_notes = {s: tuple(part.get_column("note").to_list())
                       for (s,), part in notes.partition_by("scope_path", as_dict=True, maintain_order=True).items()}
    else:
        counts = pl.DataFrame({"scope_path": [paths[0]], "meta_nodes_created": [inserts.height],
                               "meta_nodes_updated": [updates.height]})
        scope_notes = {paths[0]: tuple(notes.get_column("note").to_list())} if notes.height else {}
    result = scoped_result(
        Diff({**node_diff.tables, **edge_diff.tables}),  # two tables, nothing to normalise
        counts, COUNTERS, scope_notes=scope_notes,
    )
    return replace(result, notes=scope_notes.get(paths[0], ())) if not many else result


def _resolve_labels(candidates: pl.DataFrame, many: bool) -> pl.DataFrame:
    """:func:`resolve_labels` within each scope: (scope_path,) label → id (``many`` scopes), else label → id."""
    if not many:
        return resolve_labels(candidates)
    return (
        semantic(candidates)
        .sort(["scope_path", "label", "importance", "updated_at", "id"], descending=[False, False, True, True, False],
              nulls_last=True)
        .group_by(["scope_path", "label"], maintain_order=True)
        .agg(pl.col("id").first())
    )


def _with_scope_deletes(diff: Diff, rows: pl.DataFrame) -> Diff:
    """``diff`` (one table, as :meth:`Diff.of` built it from ``rows``, in their order) with the rows'
    ``scope_path`` put back on its deletes (``Diff.of`` keeps only id, version and reason)."""
    if "scope_path" not in rows.columns:
        return diff
    return Diff({name: TableDiff(inserts=td.inserts, updates=td.updates,
                                 deletes=td.deletes.with_columns(rows.get_column("scope_path")) if td.deletes.height else td.deletes)
                 for name, td in diff.tables.items()})


def _groups(nodes: pl.DataFrame, config: MetaNodesConfig, many: bool = False) -> pl.DataFrame:
    """One row per group of ≥ ``min_group``, in prefix order: prefix, label (``META:<prefix>``),
    member_count, member_ids (the top ``max_members``), member_labels and summary.  With ``many``
    scopes a group is (scope_path, prefix), in that order, and the rows have ``scope_path``."""
    k = config.max_members
    keys = ["scope_path", "prefix"] if many else ["prefix"]
    members = (
        _with_prefix(
            nodes.lazy()
            .filter((pl.col("layer") == "semantic") & ~pl.col("label").str.starts_with("META:") & ~is_protected())
            .select("id", "label", "importance", "updated_at", *keys[:-1])
        )
        .filter(pl.col("prefix").is_not_null() & (pl.col("prefix") != ""))
        .collect()
        .lazy()
    )
    # Sorting every member by (importance, updated_at, id) is what costs; only a group's top k are
    # wanted.  A member whose importance is below the k-th highest of its group has k members
    # strictly ahead of it, so it cannot be among the top k: keep only the others (ties included)
    # and sort those.  Null importance sorts last, as -inf does.
    rank = pl.col("importance").fill_null(float("-inf"))
    sizes = (
        members.group_by(keys)
        .agg(pl.len().alias("member_count"), rank.top_k(k).min().alias("_floor"))
        .filter(pl.col("member_count") >= config.min_group)
        .collect()
    )
    # Every group's floor is at least the lowest one: that cheap test first, then the join on far fewer rows.
    lowest = sizes.get_column("_floor").min()
    return (
        members.filter(rank >= pl.lit(lowest, dtype=pl.Float64))
        .join(sizes.lazy(), on=keys)
        .filter(rank >= pl.col("_floor"))
        .sort([*keys, "importance", "updated_at", "id"], descending=[*(False for _ in keys), True, True, False],
              nulls_last=True)
        .group_by(keys, maintain_order=True)
        .agg(
            pl.col("member_count").first(),
            pl.col("id").head(k).alias("member_ids"),
            pl.col("label").head(k).str.join("; ").alias("top_labels"),
            pl.col("label").head(k).alias("member_labels"),
        )
        .with_columns(
            pl.format("{} ({}): {}", "prefix", "member_count", "top_labels").alias("summary"),
            pl.format("META:{}", "prefix").alias("label"),
        )
        .with_columns(
            pl.when(pl.col("member_count") > k)
            .then(pl.format("{} … and {} more", "summary", pl.col("member_count") - k))
            .otherwise("summary")
            .alias("summary")
        )
        .drop("top_labels")
        .collect()
    )


def _with_prefix(members: pl.LazyFrame) -> pl.LazyFrame:
    """``members`` with the column ``prefix`` = :func:`label_prefix` of its label (row order not kept).

    label_prefix evaluates both of its branches (a split and a regex extract, then strip and
    lowercase) on every label: most of this phase's time.  Most labels are ASCII and their first
    colon or whitespace ends the prefix, with nothing to strip: for those the prefix is simply the
    lowercased head of the label up to that byte (or the whole label).  Only the other labels —
    non-ASCII, leading whitespace, or whitespace before a colon ("my project: x") — go through
    label_prefix.  Exact: for an ASCII label the byte offsets of ``find`` are character offsets, the
    ASCII characters that strip_chars and ``\\s`` treat as whitespace (Unicode White_Space) are
    exactly ``(?-u)\\s`` = ``[\\t\\n\\v\\f\\r ]``, and ASCII lowercasing is the full one.
    """
    label, pos, colon = pl.col("label"), pl.col("_pos"), pl.col("_colon")
    marked = members.with_columns(
        _pos=label.str.find(r"(?-u)[:\s]"),  # the first colon or (ASCII) whitespace
        _colon=label.str.find(":", literal=True),
        _ascii=label.str.len_bytes() == label.str.len_chars(),
    ).with_columns(
        # no delimiter (one token), the colon comes first, or a token ended by whitespace and no colon
        _simple=(pl.col("_ascii") & (pos.is_null() | (pos == colon) | (colon.is_null() & (pos > 0)))).fill_null(False)
    ).collect()
    simple = marked.lazy().filter("_simple").with_columns(
        pl.when(pos.is_null()).then(label).otherwise(label.str.head(pos)).str.to_lowercase().alias("prefix")
    )
    other = marked.lazy().filter(~pl.col("_simple")).with_columns(label_prefix().alias("prefix"))
    return pl.concat([simple, other]).drop("_pos", "_colon", "_ascii", "_simple")


def _summarised(groups: pl.DataFrame, summarizer: Summarizer | None) -> pl.DataFrame:
    """``groups`` with ``summary`` replaced by the summarizer's text where it gives one, and
    ``summary_model`` (the model's name, null for the deterministic text).  Each request names its
    group's own ``scope_path``."""
    if summarizer is None:
        return groups.drop("member_labels").with_columns(pl.lit(None, pl.String).alias("summary_model"))
    requests = [
        SummaryRequest(PHASE, row["scope_path"], row["prefix"],
                       (f"group: {row['prefix']}", f"members: {row['member_count']}", *row["member_labels"]),
                       row["summary"])
        for row in groups.select("scope_path", "prefix", "member_count", "member_labels", "summary").iter_rows(named=True)
    ]
    answers = summarizer.summarize(requests)
    return groups.drop("member_labels").with_columns(
        pl.Series("summary", [a.text if a else r.fallback for r, a in zip(requests, answers, strict=True)], pl.String),
        pl.Series("summary_model", [a.model if a else None for a in answers], pl.String),
    )


_PATCH = pl.struct("summary", "member_count", "member_ids").struct.json_encode()
# A model's summary also names the model; a deterministic one has no summary_model key (so the
# diff of a run without the model is byte for byte what it always was).  Updates always send the
# key: a JSON null removes a model's name left by an earlier run (RFC 7386).
_PATCH_MODEL = pl.struct("summary", "member_count", "member_ids", "summary_model").struct.json_encode()
_INSERT_PROPERTIES = pl.when(pl.col("summary_model").is_null()).then(_PATCH).otherwise(_PATCH_MODEL)


def _inserts(new: pl.DataFrame, as_of: datetime) -> pl.DataFrame:
    """New META nodes, each with its group's ``scope_path`` and ``tenant_id``."""
    return new.select(
        pl.col("meta_id").alias("id"),
        "scope_path",
        "tenant_id",
        pl.lit("semantic").alias("layer"),
        "label",
        _INSERT_PROPERTIES.alias("properties"),
        pl.lit(5.0).alias("importance"),
        pl.lit(0, dtype=pl.Int64).alias("access_count"),
        pl.lit(as_of, dtype=TS).alias("created_at"),
        pl.lit(as_of, dtype=TS).alias("updated_at"),
    )


def _updates(candidates: pl.DataFrame, existing: pl.DataFrame, many: bool = False) -> pl.DataFrame:
    """Existing META nodes (``candidates``: the scope's nodes carrying a META label) whose summary, member_count or member_ids differ (compared as JSON values,
    so the store's formatting and key order do not matter), with the three keys merged in (and,
    with ``many`` scopes, their ``scope_path``)."""
    props = pl.col("properties")
    ids_json = pl.format('["{}"]', pl.col("member_ids").list.join('","'))  # uuids need no escaping
    changed = (
        existing.join(candidates.select(pl.col("id").alias("meta_id"), "version", "properties"), on="meta_id")
        .filter(
            (props.str.json_path_match("$.summary") != pl.col("summary")).fill_null(True)
            | (json_number("properties", "member_count") != pl.col("member_count").cast(pl.Float64)).fill_null(True)
            | (props.str.json_path_match("$.member_ids") != ids_json).fill_null(True)
            | props.str.json_path_match("$.summary_model").ne_missing(pl.col("summary_model"))
        )
        .select(pl.col("meta_id").alias("id"), "version", "properties", "summary", "member_count", "member_ids",
                "summary_model", "scope_path")
    )
    return merge_json(changed, _PATCH_MODEL).select("id", "version", "properties", *(["scope_path"] if many else [])).sort("id")


def _clusters(snapshot: Snapshot | Shard, metas: pl.DataFrame, as_of: datetime, many: bool = False) -> Diff:
    """CLUSTERS edges from each META node to exactly its top members: insert the missing, delete the
    stale.  ``metas``: meta_id, member_ids, scope_path; with ``many`` scopes an edge counts only for
    a META node of its own scope."""
    scope = ["scope_path"] if many else []
    wanted = metas.explode("member_ids").select(
        pl.col("meta_id").alias("source_id"), pl.col("member_ids").alias("target_id"), "scope_path"
    )
    have = (
        snapshot.table("memory_edges")
        .lazy()
        .filter(pl.col("relation") == RELATION)
        .select("id", "version", "source_id", "target_id", *scope)
        .join(metas.lazy().select(pl.col("meta_id").alias("source_id"), *scope), on=["source_id", *scope], how="semi")
        .collect()
    )
    # Any existing row with the same (source, target, relation) — even a superseded one — holds the natural key.
    missing = wanted.join(have, on=["source_id", "target_id", *scope], how="anti").sort("scope_path", "source_id", "target_id")
    stale = have.join(wanted, on=["source_id", "target_id", *scope], how="anti").select("id", "version", *scope).sort("id")
    keys = missing.select(pl.format("{}|{}", "source_id", "target_id")).to_series()
    ts = pl.lit(as_of, dtype=TS)
    tenant = (tenant_of() if many else pl.lit(snapshot.scope.tenant_id if isinstance(snapshot, Snapshot)
                                              else scopes(snapshot).item(0, "tenant_id"), pl.String)).alias("tenant_id")
    inserts = missing.select(
        scoped_created_ids(missing.get_column("scope_path"), PHASE, keys).alias("id"),
        "scope_path",
        tenant,
        "source_id",
        "target_id",
        pl.lit(RELATION).alias("relation"),
        pl.lit(1.0).alias("weight"),
        pl.lit("{}").alias("properties"),
        ts.alias("created_at"),
        ts.alias("updated_at"),
        ts.alias("valid_from"),
    )
    diff = Diff.of(
        "memory_edges",
        PHASE,
        inserts=inserts if inserts.height else None,
        deletes=stale if stale.height else None,
        reason=STALE_REASON,
    )
    return _with_scope_deletes(diff, stale)
