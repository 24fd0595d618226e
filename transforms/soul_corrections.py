"""Phase 5 — soul_corrections: a user's manual edits of SOUL:<key> nodes reach the soul profile (SPEC §3)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import polars as pl
from deep_sleep.transforms._common import (
    PhaseResult,
    in_scope_window,
    scope_paths,
    scoped_created_ids,
    scoped_result,
    scopes,
    tenant_of,
    with_window,
)

from deep_sleep.core.config import PhaseConfig
from deep_sleep.core.diff import Diff
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot


class SoulCorrectionsConfig(PhaseConfig):
    canonical_keys: tuple[str, ...] = ("name", "role", "personality", "language")


#: The counters this phase reports (SPEC §3).
COUNTERS: tuple[str, ...] = ("soul_updates", "soul_rejected")


PHASE = "soul_corrections"
EDITOR = "user_manual_edit"


def soul_corrections(
    snapshot: Snapshot | Shard, config: SoulCorrectionsConfig, as_of: datetime, lookback_hours: float
) -> PhaseResult:
    """Recent semantic nodes labelled ``SOUL:<key>`` with ``properties._last_edited_by ==
    "user_manual_edit"`` set ``soul_profiles[key] = properties.value``.  The key is the text after
    ``SOUL:``, trimmed and lower-cased; per key the latest edit wins (``updated_at`` descending, ties
    to the smallest node id).  Only ``canonical_keys`` are honoured: an absent key is inserted, an
    existing one updated only when its value differs; both set the profile's ``updated_at`` to as_of
    (the moment the profile took the value).  Every edit of any other key — and every edit without a
    ``value`` — is rejected, counted in ``soul_rejected`` and named in the notes.  A non-string JSON
    ``value`` is stored as its JSON text (``42``, ``true``, ``["a"]``).  ``soul_updates`` counts
    profile rows inserted or changed.  A profile is identified by (scope_path, ``key``) (SPEC §1):
    updates carry ``key`` and the apply matches on it.

    Shard-native: on a :class:`Shard` each scope has its own window (its own previous run), the
    latest edit wins per (scope_path, key), an edit reaches only its own scope's profile, and
    counters and notes are per scope.
    """
    paths = scope_paths(snapshot)
    many = len(paths) > 1  # one scope: the scope is a literal, never a key
    scope = ["scope_path"] if many else []
    # The cheap window, layer and prefix tests run lazily over only the columns used (no copy of the
    # whole frame); JSON is parsed after the collect, on the few SOUL: edits they leave.
    recent = with_window(
        snapshot.table("memory_nodes").lazy().select("id", "layer", "label", "properties", "updated_at", "scope_path"),
        snapshot, as_of, lookback_hours,
    )
    edits = (
        recent.filter(in_scope_window("updated_at", as_of) & (pl.col("layer") == "semantic")
                      & pl.col("label").str.starts_with("SOUL:"))
        .collect()
        .filter(pl.col("properties").str.json_path_match("$._last_edited_by") == EDITOR)
        .select(
            "id",
            "updated_at",
            pl.col("label").str.slice(len("SOUL:")).alias("raw_key"),
            pl.col("label").str.slice(len("SOUL:")).str.strip_chars().str.to_lowercase().alias("key"),
            pl.col("properties").str.json_path_match("$.value").alias("value"),
            pl.col("scope_path") if many else pl.lit(paths[0]).alias("scope_path"),
        )
    )
    if not edits.height:  # the usual case, and a quick nap's: no edit in the window
        return scoped_result(Diff.empty(), None, COUNTERS)
    canonical = pl.col("key").is_in(list(config.canonical_keys))
    rejected = edits.filter(~canonical | pl.col("value").is_null()).sort(*scope, "key", "id")
    notes = rejected.select(
        "scope_path",
        pl.when(canonical)
        .then(pl.format("rejected SOUL key '{}' (node {}): the edit has no value", "raw_key", "id"))
        .otherwise(
            pl.format(
                "rejected SOUL key '{}' (node {}): only {} are honoured",
                "raw_key", "id", pl.lit(", ".join(config.canonical_keys)),
            )
        )
        .alias("note"),
    )
    latest = (
        edits.filter(canonical & pl.col("value").is_not_null())
        .sort([*scope, "key", "updated_at", "id"], descending=[*(False for _ in scope), False, True, False])
        .unique([*scope, "key"], keep="first", maintain_order=True)
        .select("scope_path", "key", "value")
    )
    profiles = snapshot.table("soul_profiles")
    ts = pl.lit(as_of, dtype=pl.Datetime("us", "UTC"))
    updates = (
        profiles.drop([] if many else ["scope_path"], strict=False)
        .join(latest, on=[*scope, "key"], how="inner", suffix="_new")
        .filter(pl.col("value") != pl.col("value_new"))
        .select("id", "version", "key", pl.col("value_new").alias("value"), ts.alias("updated_at"), "scope_path")
        .sort("id")
    )
    absent = latest.join(profiles.select(*scope, "key"), on=[*scope, "key"], how="anti")
    if many:
        tenant = tenant_of()
    else:
        tenant = pl.lit(snapshot.scope.tenant_id if isinstance(snapshot, Snapshot) else scopes(snapshot).item(0, "tenant_id"),
                        pl.String)
    inserts = absent.select(
        scoped_created_ids(absent.get_column("scope_path"), PHASE, absent.get_column("key")).alias("id"),
        "scope_path",
        tenant.alias("tenant_id"),
        "key",
        "value",
        ts.alias("updated_at"),
    )
    diff = Diff.of(
        "soul_profiles",
        PHASE,
        inserts=inserts if inserts.height else None,
        updates=(updates if many else updates.drop("scope_path")) if updates.height else None,
    )
    counts = (
        pl.concat([updates.select("scope_path"), inserts.select("scope_path")])
        .group_by("scope_path").agg(pl.len().alias("soul_updates"))
        .join(rejected.group_by("scope_path").agg(pl.len().alias("soul_rejected")), on="scope_path", how="full",
              coalesce=True)
    )
    scope_notes = {s: tuple(part.get_column("note").to_list())
                   for (s,), part in notes.partition_by("scope_path", as_dict=True, maintain_order=True).items()}
    result = scoped_result(diff, counts, COUNTERS, scope_notes=scope_notes)
    return result if many else replace(result, notes=scope_notes.get(paths[0], ()))
