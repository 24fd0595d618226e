"""Phase 5 — soul_corrections: a user's manual edits of SOUL:<key> nodes reach the soul profile (SPEC §3)."""

from __future__ import annotations

from datetime import datetime

import polars as pl
from deep_sleep.transforms._common import (
    PhaseResult,
    created_ids,
    in_window,
    window_start,
)

from deep_sleep.core.config import PhaseConfig
from deep_sleep.core.diff import Diff
from deep_sleep.core.snapshot import Snapshot


class SoulCorrectionsConfig(PhaseConfig):
    canonical_keys: tuple[str, ...] = ("name", "role", "personality", "language")


#: The counters this phase reports (SPEC §3).
COUNTERS: tuple[str, ...] = ("soul_updates", "soul_rejected")


PHASE = "soul_corrections"
EDITOR = "user_manual_edit"


def soul_corrections(
    snapshot: Snapshot, config: SoulCorrectionsConfig, as_of: datetime, lookback_hours: float
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
    """
    start = window_start(snapshot, as_of, lookback_hours)
    # The cheap window, layer and prefix tests run lazily over only the columns used (no copy of the
    # whole frame); JSON is parsed after the collect, on the few SOUL: edits they leave.
    edits = (
        snapshot.table("memory_nodes")
        .lazy()
        .select("id", "layer", "label", "properties", "updated_at")
        .filter(in_window("updated_at", start, as_of) & (pl.col("layer") == "semantic") & pl.col("label").str.starts_with("SOUL:"))
        .collect()
        .filter(pl.col("properties").str.json_path_match("$._last_edited_by") == EDITOR)
        .select(
            "id",
            "updated_at",
            pl.col("label").str.slice(len("SOUL:")).alias("raw_key"),
            pl.col("label").str.slice(len("SOUL:")).str.strip_chars().str.to_lowercase().alias("key"),
            pl.col("properties").str.json_path_match("$.value").alias("value"),
        )
    )
    if not edits.height:  # the usual case, and a quick nap's: no edit in the window
        return PhaseResult(counters={"soul_updates": 0, "soul_rejected": 0})
    canonical = pl.col("key").is_in(list(config.canonical_keys))
    rejected = edits.filter(~canonical | pl.col("value").is_null()).sort("key", "id")
    notes = tuple(
        rejected.select(
            pl.when(canonical)
            .then(pl.format("rejected SOUL key '{}' (node {}): the edit has no value", "raw_key", "id"))
            .otherwise(
                pl.format(
                    "rejected SOUL key '{}' (node {}): only {} are honoured",
                    "raw_key", "id", pl.lit(", ".join(config.canonical_keys)),
                )
            )
        ).to_series().to_list()
    )
    latest = (
        edits.filter(canonical & pl.col("value").is_not_null())
        .sort(["key", "updated_at", "id"], descending=[False, True, False])
        .unique("key", keep="first", maintain_order=True)
        .select("key", "value")
    )
    profiles = snapshot.table("soul_profiles")
    ts = pl.lit(as_of, dtype=pl.Datetime("us", "UTC"))
    updates = (
        profiles.join(latest, on="key", how="inner", suffix="_new")
        .filter(pl.col("value") != pl.col("value_new"))
        .select("id", "version", "key", pl.col("value_new").alias("value"), ts.alias("updated_at"))
        .sort("id")
    )
    absent = latest.join(profiles.select("key"), on="key", how="anti")
    inserts = absent.select(
        created_ids(snapshot.scope_path, PHASE, absent.get_column("key")).alias("id"),
        pl.lit(snapshot.scope_path).alias("scope_path"),
        pl.lit(snapshot.scope.tenant_id).alias("tenant_id"),
        "key",
        "value",
        ts.alias("updated_at"),
    )
    diff = Diff.of(
        "soul_profiles",
        PHASE,
        inserts=inserts if inserts.height else None,
        updates=updates if updates.height else None,
    )
    return PhaseResult(
        diff=diff,
        counters={"soul_updates": updates.height + inserts.height, "soul_rejected": rejected.height},
        notes=notes,
    )
