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

from datetime import datetime

import polars as pl
from deep_sleep.transforms._common import (
    PhaseResult,
    created_ids,
    in_window,
    skip,
    window_start,
)
from deep_sleep.transforms.label_recalls import JSON_KEY, WORD
from pydantic import Field

from deep_sleep.core.config import PhaseConfig
from deep_sleep.core.diff import Diff
from deep_sleep.core.snapshot import Snapshot


class DriftConfig(PhaseConfig):
    max_step: float = Field(0.05, ge=0, le=1)


#: The counters this phase reports (SPEC §3).
COUNTERS: tuple[str, ...] = ("identity_drifts",)


PHASE = "drift"
PREFIX = "trait:"
NEUTRAL = 0.5
DECIMALS = 4
TRAITS: dict[str, tuple[str, ...]] = {
    "curiosity": ("why", "wonder", "curious", "explore", "investigate", "question", "learn", "research", "hypothesis", "experiment"),
    "caution": ("careful", "verify", "check", "confirm", "risk", "risky", "safe", "safety", "validate", "backup"),
    "warmth": ("thanks", "thank", "appreciate", "glad", "happy", "sorry", "kind", "welcome", "love", "care"),
    "directness": ("must", "now", "immediately", "asap", "urgent", "exactly", "simply", "directly", "decide", "decided"),
    "formality": ("please", "kindly", "regards", "sincerely", "dear", "formal", "hereby", "accordingly", "therefore", "respectfully"),
}


def drift(snapshot: Snapshot, config: DriftConfig, as_of: datetime, lookback_hours: float) -> PhaseResult:
    """One EMA step of every trait towards its share in the window's working-memory notes
    (module docstring).  ``identity_drifts`` counts trait rows inserted or changed; a step too
    small to change the four-decimal value writes nothing.  A stored value that is not a number
    in [0, 1] is restarted from 0.5 and named in the notes.
    """
    nodes = (  # lazy: reads only these columns, however earlier folds left the frame's chunks
        snapshot.table("memory_nodes").lazy().select("layer", "label", "properties", "updated_at").filter(pl.col("layer") == "working").collect()
    )
    if not nodes.height:
        return skip("missing input: no working memory")
    start = window_start(snapshot, as_of, lookback_hours)
    text = pl.concat_str([pl.col("label").fill_null(""), pl.col("properties").fill_null("").str.replace_all(JSON_KEY, " ")], separator=" ")
    words = nodes.filter(in_window("updated_at", start, as_of)).select(text.str.to_lowercase().str.extract_all(WORD).alias("w"))
    if not words.height:
        return skip("missing input: no working memory in the window")
    shown = words.select(
        (pl.col("w").list.eval(pl.element().is_in(list(lexicon))).list.any().sum() / words.height).alias(name)
        for name, lexicon in TRAITS.items()
    ).row(0, named=True)

    stored = {r["key"]: r for r in snapshot.table("soul_profiles").filter(pl.col("key").str.starts_with(PREFIX)).sort("key", "id").unique("key", keep="first").iter_rows(named=True)}
    updates, inserts, notes = [], [], []
    for name in sorted(TRAITS):
        key = PREFIX + name
        row = stored.get(key)
        old = _number(row["value"]) if row else NEUTRAL
        if old is None:
            notes.append(f"trait {key!r} held {row['value']!r}, not a number in [0, 1]; restarted from {NEUTRAL}")
            old = NEUTRAL
        value = f"{old + config.max_step * (shown[name] - old):.{DECIMALS}f}"
        if row is None:
            inserts.append({"key": key, "value": value})
        elif value != row["value"]:
            updates.append({"id": row["id"], "version": row["version"], "value": value})
    ts = pl.lit(as_of, dtype=pl.Datetime("us", "UTC"))
    scope = snapshot.scope
    diffs = []
    if updates:
        diffs.append(Diff.of("soul_profiles", PHASE, updates=pl.DataFrame(updates, schema={"id": pl.String, "version": pl.Int64, "value": pl.String}).with_columns(ts.alias("updated_at"))))
    if inserts:
        new = pl.DataFrame(inserts, schema={"key": pl.String, "value": pl.String})
        diffs.append(Diff.of("soul_profiles", PHASE, inserts=new.select(
            created_ids(scope.path, PHASE, new.get_column("key")).alias("id"),
            pl.lit(scope.path).alias("scope_path"),
            pl.lit(scope.tenant_id).alias("tenant_id"),
            "key",
            "value",
            ts.alias("updated_at"),
        )))
    return PhaseResult(diff=Diff.combine(diffs), counters={"identity_drifts": len(updates) + len(inserts)}, notes=tuple(notes))


def _number(text: str | None) -> float | None:
    try:
        value = float(text)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if 0.0 <= value <= 1.0 else None
