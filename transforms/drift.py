"""Phase D4 — drift: the agent's identity traits follow, slowly, what its working memory shows (SPEC §3).

Traits are numbers in [0, 1] kept with the SOUL profile: ``soul_profiles`` rows of the scope
with key ``trait:<name>`` and the number as text (``"0.5125"``, four decimals).  A trait that
has no row yet starts at ``NEUTRAL`` (0.5).  Each trait has a small lexicon (:data:`TRAITS`);
what recent working memory *shows* of it is the share of the window's working-memory notes
that use at least one of its words (whole words of the label and property values, as in
phase D2).  One exponential-moving-
average step moves the trait towards that share:

    value ← value + max_step · (shown − value)

Both ends are in [0, 1], so a step is at most ``max_step`` (0.05) in either direction and a
value never leaves [0, 1]: a week of terse notes nudges "warmth" down a little, not off a cliff.
The window is the usual one (``(window start, as_of]`` on ``updated_at``), so each note counts
once.  Notes phase 8 expired earlier in this run are no longer working memory and do not count.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime

import numpy as np

import polars as pl
from deep_sleep.transforms._common import (
    PhaseResult,
    in_scope_window,
    scope_paths,
    scoped_created_ids,
    scoped_result,
    scopes_without,
    skip,
    tenant_of,
    with_window,
)
from deep_sleep.transforms.label_recalls import JSON_KEY, WORD
from pydantic import Field

from deep_sleep.core.config import PhaseConfig
from deep_sleep.core.diff import Diff
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot


class DriftConfig(PhaseConfig):
    max_step: float = Field(0.05, ge=0, le=1)


#: The counters this phase reports (SPEC §3).
COUNTERS: tuple[str, ...] = ("identity_drifts",)


PHASE = "drift"
PREFIX = "trait:"
NEUTRAL = 0.5
DECIMALS = 4
NO_WORKING = "missing input: no working memory"
NO_WINDOW = "missing input: no working memory in the window"
TRAITS: dict[str, tuple[str, ...]] = {
    "curiosity": ("why", "wonder", "curious", "explore", "investigate", "question", "learn", "research", "hypothesis", "experiment"),
    "caution": ("careful", "verify", "check", "confirm", "risk", "risky", "safe", "safety", "validate", "backup"),
    "warmth": ("thanks", "thank", "appreciate", "glad", "happy", "sorry", "kind", "welcome", "love", "care"),
    "directness": ("must", "now", "immediately", "asap", "urgent", "exactly", "simply", "directly", "decide", "decided"),
    "formality": ("please", "kindly", "regards", "sincerely", "dear", "formal", "hereby", "accordingly", "therefore", "respectfully"),
}


def drift(snapshot: Snapshot | Shard, config: DriftConfig, as_of: datetime, lookback_hours: float) -> PhaseResult:
    """One EMA step of every trait towards its share in the window's working-memory notes
    (module docstring).  ``identity_drifts`` counts trait rows inserted or changed; a step too
    small to change the four-decimal value writes nothing.  A stored value that is not a number
    in [0, 1] is restarted from 0.5 and named in the notes.

    On a shard every scope steps its own traits (its own row per key: the smallest id), towards
    its own notes in its own window; a scope without working memory, or without any in its
    window, is skipped for "missing input".  Columnar over (scope, trait): no loop over scopes.
    """
    nodes = (  # lazy: reads only these columns, however earlier folds left the frame's chunks
        snapshot.table("memory_nodes").lazy().select("scope_path", "layer", "label", "properties", "updated_at")
        .filter(pl.col("layer") == "working").collect()
    )
    if not nodes.height:
        return skip(NO_WORKING)
    paths = scope_paths(snapshot)
    many = len(paths) > 1
    missing = scopes_without(snapshot, "memory_nodes", NO_WORKING, rows=nodes) if many else {}
    text = pl.concat_str([pl.col("label").fill_null(""), pl.col("properties").fill_null("").str.replace_all(JSON_KEY, " ")], separator=" ")
    words = (
        with_window(nodes.lazy(), snapshot, as_of, lookback_hours)
        .filter(in_scope_window("updated_at", as_of))
        .select("scope_path", text.str.to_lowercase().str.extract_all(WORD).alias("w"))
        .collect()
    )
    if many:  # a scope with working memory, but none in its window
        missing = {**scopes_without(snapshot, "memory_nodes", NO_WINDOW, rows=words), **missing}
    if not words.height:
        return skip(NO_WINDOW) if not many else scoped_result(Diff.empty(), None, COUNTERS, skipped_scopes=missing)
    # per scope that runs: the share of its window's notes that use a word of each trait's lexicon
    shown = (
        words.group_by("scope_path", maintain_order=True)
        .agg((pl.col("w").list.eval(pl.element().is_in(list(TRAITS[name]))).list.any().sum() / pl.len()).alias(name)
             for name in sorted(TRAITS))
        .unpivot(index="scope_path", variable_name="trait", value_name="shown")
        .with_columns((pl.lit(PREFIX) + pl.col("trait")).alias("key"))
    )
    stored = (
        snapshot.table("soul_profiles").filter(pl.col("key").str.starts_with(PREFIX)).sort("key", "id")
        .unique(["scope_path", "key"], keep="first", maintain_order=True)
        .select("scope_path", "key", "id", "version", pl.col("value").alias("stored"))
    )
    steps = shown.join(stored, on=["scope_path", "key"], how="left", maintain_order="left")
    steps = steps.with_columns(_numbers(steps.get_column("stored")).alias("old"))
    unreadable = steps.filter(pl.col("id").is_not_null() & pl.col("old").is_null()).sort("scope_path", "key")
    scope_notes: dict[str, tuple[str, ...]] = {}
    for scope, key, value in unreadable.select("scope_path", "key", "stored").iter_rows():  # rare: a bad stored value
        note = f"trait {key!r} held {value!r}, not a number in [0, 1]; restarted from {NEUTRAL}"
        scope_notes[scope] = (*scope_notes.get(scope, ()), note)
    old = steps.get_column("old").fill_null(NEUTRAL).to_numpy()
    steps = steps.with_columns(
        _fixed(old + config.max_step * (steps.get_column("shown").to_numpy() - old)).alias("value"))
    changed = steps.filter(pl.col("id").is_null() | (pl.col("value") != pl.col("stored")) | pl.col("stored").is_null())

    ts = pl.lit(as_of, dtype=pl.Datetime("us", "UTC"))
    diffs = []
    updates = changed.filter(pl.col("id").is_not_null())
    if updates.height:
        diffs.append(Diff.of("soul_profiles", PHASE, updates=updates.select(
            "id", pl.col("version").cast(pl.Int64), "value", ts.alias("updated_at"))))
    new = changed.filter(pl.col("id").is_null())
    if new.height:
        diffs.append(Diff.of("soul_profiles", PHASE, inserts=new.select(
            scoped_created_ids(new.get_column("scope_path"), PHASE, new.get_column("key")).alias("id"),
            "scope_path",
            tenant_of().alias("tenant_id"),
            "key",
            "value",
            ts.alias("updated_at"),
        )))
    counts = changed.group_by("scope_path").agg(pl.len().alias("identity_drifts"))
    result = scoped_result(Diff.combine(diffs), counts, COUNTERS, skipped_scopes=missing, scope_notes=scope_notes)
    # a run of one scope reports its notes as the phase's (the runner of a single snapshot reads those)
    return replace(result, notes=scope_notes.get(paths[0], ())) if not many else result


# A stored value is read as Python's float() reads it; plain decimals ("0.5125") are parsed by Polars
# (correctly rounded, as float() is), anything else by float() itself.
_PLAIN_DECIMAL = r"^[0-9]{1,30}(?:\.[0-9]{1,30})?$"


def _numbers(text: pl.Series) -> pl.Series:
    """Each stored text: ``float(text)`` when that is a number in [0, 1], else null."""
    plain = text.str.contains(_PLAIN_DECIMAL).fill_null(False)
    value = text.cast(pl.Float64, strict=False)
    if not plain.all():  # rare: Python reads what is not a plain decimal, once per distinct text
        other = text.filter(~plain).drop_nulls().unique()
        by_python = pl.Series([_python_number(t) for t in other.to_list()], dtype=pl.Float64)
        value = pl.select(pl.when(plain).then(value).otherwise(
            text.replace_strict(other, by_python, default=None, return_dtype=pl.Float64))).to_series()
    return pl.select(pl.when((value >= 0.0) & (value <= 1.0)).then(value)).to_series().alias(text.name)


def _python_number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _fixed(values: np.ndarray) -> pl.Series:
    """``f"{v:.4f}"`` of each value, vectorized: exact for values in [0, 2) (every trait value).

    A finite ``v ≥ 0`` is ``q / 2^p`` with an integer ``q < 2^53``; its 4-decimal text is the integer
    ``n = round_half_even(q · 10^4 / 2^p)`` (Python formats the exact binary value, ties to even)
    written as ``n // 10^4 "." n % 10^4``.  ``q · 625 < 2^63`` fits in 64 bits, so
    ``n = round(q · 625 / 2^(p − 4))`` is a shift and a comparison of the remainder with the half.
    Any other value (never a trait's) is formatted by Python."""
    values = np.asarray(values, dtype=np.float64)
    fast = np.isfinite(values) & (values >= 0.0) & ~np.signbit(values) & (values < 2.0)
    mant, exp = np.frexp(np.where(fast, values, 0.0))
    q = np.ldexp(mant, 53).astype(np.uint64) * np.uint64(625)
    shift = (53 - exp - DECIMALS).astype(np.int64)  # p − 4, ≥ 48 here
    wide = shift >= 64  # q · 625 / 2^shift < 1/2: rounds to 0
    sh = np.where(wide, 1, shift).astype(np.uint64)
    whole = q >> sh
    rem = q & ((np.uint64(1) << sh) - np.uint64(1))
    half = np.uint64(1) << (sh - np.uint64(1))
    up = (rem > half) | ((rem == half) & (whole & np.uint64(1)).astype(bool))
    n = np.where(wide, 0, whole + up.astype(np.uint64)).astype(np.int64)
    scale = 10**DECIMALS
    text = pl.Series(n // scale).cast(pl.String) + "." + pl.Series(n % scale).cast(pl.String).str.zfill(DECIMALS)
    if not fast.all():
        slow = np.flatnonzero(~fast)
        text = text.scatter(slow, [f"{v:.{DECIMALS}f}" for v in values[slow]])
    return text
