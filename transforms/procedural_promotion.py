"""Phase 12 — procedural_promotion: actions the agent keeps repeating become draft skills (SPEC §3).

Grammar of an action sentence (matched case-insensitively anywhere in an event's content, so
"Then I ran …", "and I deployed …" and "First I checked X, then I deployed Y" all match; the
first match of an event counts)::

    phrase  := "I" VERB OBJECT
    VERB    := one of ACTION_VERBS' forms (past or base: "ran" / "run", "rolled back" / "roll back", …)
    OBJECT  := word (blanks word)*      word = letters, digits, ' - _ /

The object ends at the first other character (punctuation, a line end).  Normalised, the
pattern key is ``<base verb> <object>`` where the object is casefolded, cut at the first
conjunction or relative word (CUT_WORDS: "and", "then", "that", …), stripped of the articles
"the", "a", "an" and kept to its first 4 words: "Then I deployed the billing service." →
``deploy billing service``.  A sentence with no object word left makes no pattern.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import numpy as np
import polars as pl
from deep_sleep.transforms._common import (
    PhaseResult,
    in_window,
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
from deep_sleep.core.embedding import EmbeddingProvider
from deep_sleep.core.errors import ConfigError
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.core.tables import EMBEDDING_DIM


class ProceduralPromotionConfig(PhaseConfig):
    lookback_days: float = Field(30, ge=0)
    min_occurrences: int = Field(3, ge=1)
    max_per_run: int = Field(5, ge=0)
    duplicate_cosine: float = Field(0.65, ge=0, le=1)


#: The counters this phase reports (SPEC §3).
COUNTERS: tuple[str, ...] = ("draft_skills_promoted",)


PHASE = "procedural_promotion"
NO_EVENTS = "missing input: no episodic events"

# base form → the forms that follow "I" (past first).
ACTION_VERBS: dict[str, tuple[str, ...]] = {
    "run": ("ran", "run"),
    "deploy": ("deployed", "deploy"),
    "build": ("built", "build"),
    "rebuild": ("rebuilt", "rebuild"),
    "create": ("created", "create"),
    "fix": ("fixed", "fix"),
    "patch": ("patched", "patch"),
    "debug": ("debugged", "debug"),
    "migrate": ("migrated", "migrate"),
    "restart": ("restarted", "restart"),
    "reboot": ("rebooted", "reboot"),
    "configure": ("configured", "configure"),
    "install": ("installed", "install"),
    "upgrade": ("upgraded", "upgrade"),
    "test": ("tested", "test"),
    "write": ("wrote", "write"),
    "update": ("updated", "update"),
    "release": ("released", "release"),
    "publish": ("published", "publish"),
    "merge": ("merged", "merge"),
    "review": ("reviewed", "review"),
    "revert": ("reverted", "revert"),
    "roll back": ("rolled back", "roll back"),
    "back up": ("backed up", "back up"),
    "restore": ("restored", "restore"),
    "set up": ("set up",),
    "clean up": ("cleaned up", "clean up"),
    "rotate": ("rotated", "rotate"),
    "reset": ("reset",),
    "schedule": ("scheduled", "schedule"),
    "send": ("sent", "send"),
    "close": ("closed", "close"),
    "provision": ("provisioned", "provision"),
    "scale": ("scaled", "scale"),
    "enable": ("enabled", "enable"),
    "disable": ("disabled", "disable"),
}
ARTICLES = ("the", "a", "an")
CUT_WORDS = ("and", "then", "but", "or", "so", "because", "while", "after", "before", "when", "that", "which", "who")
OBJECT_WORDS = 4
MAX_EXAMPLES = 5
EXAMPLE_MAX_CHARS = 200

_FORM_TO_BASE = {form: base for base, forms in ACTION_VERBS.items() for form in forms}
_VERB_ALT = "|".join(sorted((f.replace(" ", r"\s+") for f in _FORM_TO_BASE), key=lambda f: (-len(f), f)))
_WORD = r"[\p{L}\p{N}][\p{L}\p{N}'_/-]*"
# ASCII word boundary and case folding for "I" and the verbs (much faster than Unicode's); the
# object's words are Unicode.
ACTION_SENTENCE = rf"(?-u:\b)(?P<phrase>(?i-u:I\s+(?P<verb>{_VERB_ALT})\s+)(?P<object>{_WORD}(?:[ \t]+{_WORD})*))"
_CUT = rf"(?:^|\s)(?:{'|'.join(CUT_WORDS)})(?:\s.*)?$"
_ARTICLE = rf"(?:^|\s)(?:{'|'.join(ARTICLES)})(?:\s|$)"
_FIRST_WORDS = rf"^(\S+(?:\s\S+){{0,{OBJECT_WORDS - 1}}})"


def _normalised_action_type() -> pl.Expr:
    raw = pl.col("metadata").str.json_path_match("$.action_type")
    key = raw.str.to_lowercase().str.replace_all(r"[^\p{L}\p{N}]+", "_").str.strip_chars("_")
    return pl.when(key.str.len_chars() > 0).then(key)


def _sentence_pattern() -> tuple[pl.Expr, pl.Expr]:
    """(pattern key, the matched phrase) of the first action sentence of ``content``, or nulls."""
    groups = pl.col("content").str.extract_groups(ACTION_SENTENCE)
    verb = groups.struct.field("verb").str.to_lowercase().str.replace_all(r"\s+", " ").replace_strict(_FORM_TO_BASE, default=None)
    obj = (
        pl.concat_str([pl.lit(" "), groups.struct.field("object").str.to_lowercase().str.replace_all(r"\s+", "  "), pl.lit(" ")])
        .str.replace(_CUT, "")
        .str.replace_all(_ARTICLE, " ")
        .str.strip_chars()
        .str.replace_all(r"\s+", " ")
        .str.extract(_FIRST_WORDS, 1)
    )
    key = pl.concat_str([verb, obj], separator=" ")
    phrase = groups.struct.field("phrase").str.replace_all(r"\s+", " ")
    return key, phrase


def procedural_promotion(
    snapshot: Snapshot | Shard, config: ProceduralPromotionConfig, as_of: datetime, embedder: EmbeddingProvider,
    extracted: Snapshot | Shard | None = None,
) -> PhaseResult:
    """In episodic events with ``created_at`` in (as_of − ``lookback_days``, as_of], an event's
    action pattern is its ``metadata.action_type`` when present and non-empty (casefolded, runs
    of non-alphanumerics → ``_``: "Deploy-Service" → ``deploy_service``), else the verb-object
    phrase of its first action sentence (module docstring: "I deployed the billing service" →
    ``deploy billing service``).  A pattern seen in ≥ ``min_occurrences`` events becomes a
    ``procedural_skills`` row with status ``draft`` (never ``active``), source
    ``consolidation``, name = the pattern as a title ("Deploy billing service"), steps = up to 5
    distinct example phrases (the matched sentence, or the event's trimmed content cut at 200
    characters for ``action_type`` patterns), oldest first, and embedding = the embedder's
    vector of the name.  Candidates go most frequent first (ties by pattern key), at most
    ``max_per_run`` per run; one is skipped if a skill of the scope — of any status, so a
    rejected or archived draft is not proposed again — already has its pattern key, or if its
    name's cosine with the name of such a skill, or of a candidate accepted earlier in this run,
    is ≥ ``duplicate_cosine`` (existing names are re-embedded with the same embedder; stored
    embeddings are not trusted, they may come from another model).

    On a shard all of this is per scope — the patterns and their counts, the existing skills a
    candidate is compared with, the candidates accepted earlier and the cap — in one columnar pass
    (:func:`_greedy_by_scope`); a scope without episodic events is skipped for "missing input".
    """
    # Events summarised (and deleted) by phase 10 earlier in this run still happened: count them.
    events = (extracted or snapshot).table("episodic_events")
    if not events.height:
        return skip(NO_EVENTS)
    if embedder.dim != EMBEDDING_DIM:
        raise ConfigError(
            f"{PHASE}: embedder {embedder.name!r} makes {embedder.dim}-dimensional vectors; "
            f"procedural_skills.embedding is vector({EMBEDDING_DIM}). Project its output to {EMBEDDING_DIM} dimensions."
        )
    many = len(scope_paths(snapshot)) > 1
    missing = scopes_without(snapshot, "episodic_events", NO_EVENTS, rows=events) if many else {}
    start = as_of - timedelta(days=config.lookback_days)
    sentence_key, phrase = _sentence_pattern()
    recent = events.filter(in_window("created_at", start, as_of)).with_row_index("_row")
    typed = recent.filter(pl.col("metadata").str.contains("action_type", literal=True))
    # Parse each distinct metadata text once: events of one action repeat the same metadata.
    kinds = typed.select(pl.col("metadata").unique()).with_columns(_normalised_action_type().alias("pattern_key"))
    typed = typed.with_columns(
        pl.col("metadata").replace_strict(kinds.get_column("metadata"), kinds.get_column("pattern_key"), default=None).alias("pattern_key")
    ).drop_nulls("pattern_key")
    by_type = typed.select(
        "_row", "scope_path", "created_at", "id", "pattern_key",
        pl.col("content").fill_null("").str.strip_chars().str.replace_all(r"\s+", " ").alias("example"),
    ).with_columns(
        pl.when(pl.col("example").str.len_chars() > EXAMPLE_MAX_CHARS)
        .then(pl.col("example").str.slice(0, EXAMPLE_MAX_CHARS - 1) + "…")
        .otherwise(pl.col("example"))
        .alias("example")
    )
    said = recent.filter(~pl.col("_row").is_in(typed.get_column("_row").implode()) & pl.col("content").str.contains(ACTION_SENTENCE))
    # Parse each distinct text once: episodes repeat their sentences (that is what makes a pattern).
    parsed = said.select(pl.col("content").unique()).with_columns(sentence_key.alias("pattern_key"), phrase.alias("example"))
    by_sentence = (said.join(parsed, on="content").select("_row", "scope_path", "created_at", "id", "pattern_key", "example")
                   .drop_nulls("pattern_key"))
    seen = pl.concat([by_type, by_sentence.select(by_type.columns)], how="vertical_relaxed")
    skills = snapshot.table("procedural_skills")
    candidates = (
        seen.sort(["created_at", "id"])
        .group_by(["scope_path", "pattern_key"], maintain_order=True)
        .agg(pl.len().alias("occurrences"), pl.col("example").unique(maintain_order=True).head(MAX_EXAMPLES).alias("steps"))
        .filter(pl.col("occurrences") >= config.min_occurrences)
        .join(skills.select("scope_path", "pattern_key").drop_nulls(), on=["scope_path", "pattern_key"], how="anti")
        .sort(["scope_path", "occurrences", "pattern_key"], descending=[False, True, False])
    )
    if not candidates.height or config.max_per_run == 0:
        return _promoted(None, missing)
    candidates = candidates.with_columns(
        scoped_created_ids(candidates.get_column("scope_path"), PHASE, candidates.get_column("pattern_key")).alias("id"))
    candidates = candidates.join(skills.select("id"), on="id", how="anti", maintain_order="left")
    title = pl.col("pattern_key").str.replace_all("_", " ")
    candidates = candidates.with_columns((title.str.slice(0, 1).str.to_uppercase() + title.str.slice(1)).alias("name"))

    vectors = embedder.embed(candidates.get_column("name").to_list())
    # the skills a candidate is compared with: those of its scope (their names re-embedded)
    known = skills.select("scope_path", "name").drop_nulls("name")
    if many:
        known = known.filter(pl.col("scope_path").is_in(candidates.get_column("scope_path").unique().implode()))
    existing = embedder.embed(known.get_column("name").to_list()).astype(np.float64)
    if not many:
        keep = _greedy_distinct(vectors.astype(np.float64), existing, config.duplicate_cosine, config.max_per_run)
    else:
        order = pl.Series(scope_paths(snapshot), dtype=pl.String)
        keep = _greedy_by_scope(_scope_index(candidates, order), vectors.astype(np.float64), _scope_index(known, order), existing,
                                config.duplicate_cosine, config.max_per_run)
    chosen = (
        candidates.with_columns(pl.Series("embedding", vectors).cast(pl.Array(pl.Float32, EMBEDDING_DIM)))
        .with_row_index("_rank")
        .filter(pl.col("_rank").is_in(keep))
    )
    if not chosen.height:
        return _promoted(None, missing)
    inserts = chosen.select(
        "id",
        "scope_path",
        tenant_of().alias("tenant_id"),
        "name",
        pl.concat_str(
            [
                pl.lit("Seen in "), pl.col("occurrences").cast(pl.String),
                pl.lit(f" episodic events of the last {config.lookback_days:g} days (pattern "), pl.col("pattern_key"),
                pl.lit("). Drafted by consolidation: review before activating."),
            ]
        ).alias("description"),
        # a JSON array of strings: encode {"steps": [...]} and keep the array
        pl.struct("steps").struct.json_encode().str.strip_prefix('{"steps":').str.strip_suffix("}").alias("steps"),
        pl.lit("draft").alias("status"),
        pl.lit("consolidation").alias("source"),
        "pattern_key",
        pl.col("occurrences").cast(pl.Int64),
        "embedding",
        pl.lit(as_of).alias("created_at"),
        pl.lit(as_of).alias("updated_at"),
    )
    return _promoted(inserts, missing)


def _scope_index(frame: pl.DataFrame, order: pl.Series) -> np.ndarray:
    """The position in ``order`` (the shard's sorted scope paths) of each row's ``scope_path``."""
    return order.search_sorted(frame.get_column("scope_path")).to_numpy().astype(np.int64)


def _greedy_distinct(candidates: np.ndarray, existing: np.ndarray, threshold: float, limit: int) -> list[int]:
    """Indices of up to ``limit`` candidates, in order, each with cosine < ``threshold`` to every
    existing vector and to every candidate kept before it (rows are unit or zero vectors)."""
    free = np.ones(len(candidates), dtype=bool)
    if len(existing):
        free &= (candidates @ existing.T).max(axis=1) < threshold
    kept: list[int] = []
    for _ in range(limit):  # at most max_per_run rounds, each vectorized over all candidates
        left = np.flatnonzero(free)
        if not len(left):
            break
        pick = int(left[0])
        kept.append(pick)
        free &= candidates @ candidates[pick] < threshold
        free[pick] = False
    return kept


# How far from the threshold a cosine computed here may lie before the comparison could go the other
# way in a run of the scope alone (whose cosines come from BLAS, summed in another order): relative
# to the vectors' norms, far above the ~d·ε error of either sum.
UNSURE = 1e-9


def _greedy_by_scope(group: np.ndarray, candidates: np.ndarray, existing_group: np.ndarray, existing: np.ndarray,
                     threshold: float, limit: int) -> np.ndarray:
    """:func:`_greedy_distinct` of every scope at once: the indices of the candidates kept.

    ``group`` is each candidate's scope (a scope's candidates are contiguous and in their order),
    ``existing_group`` each existing vector's.  Round ``r`` (at most ``limit``) keeps the first free
    candidate of every scope that has one and frees none of its scope's candidates within
    ``threshold`` of it; so each scope's candidates are compared with its own skills and its own
    earlier picks only.  Cosines are row-wise sums here, not the BLAS products of a run of one
    scope: a scope with any cosine within :data:`UNSURE` of ``threshold`` is redone exactly with
    :func:`_greedy_distinct` (as a run of it alone would do it) — in practice never."""
    n = len(candidates)
    free = np.ones(n, dtype=bool)
    unsure = np.zeros(n, dtype=bool)  # by candidate: its scope must be redone
    norms = np.linalg.norm(candidates, axis=1)
    if len(existing):
        pairs = (  # (candidate, existing skill) of the same scope
            pl.DataFrame({"g": group, "c": np.arange(n)})
            .join(pl.DataFrame({"g": existing_group, "e": np.arange(len(existing))}), on="g")
        )
        c_idx, e_idx = pairs.get_column("c").to_numpy(), pairs.get_column("e").to_numpy()
        e_norms = np.linalg.norm(existing, axis=1)
        step = max(1, (1 << 22) // max(1, candidates.shape[1]))  # bounded memory: ~32 MB a chunk
        for at in range(0, len(c_idx), step):  # chunks of pairs, not scopes
            c, e = c_idx[at : at + step], e_idx[at : at + step]
            cos = np.einsum("ij,ij->i", candidates[c], existing[e])
            unsure[c[np.abs(cos - threshold) <= UNSURE * (1.0 + norms[c] * e_norms[e])]] = True
            free[c[cos >= threshold]] = False
    kept = np.zeros(n, dtype=bool)
    for _ in range(limit):  # at most max_per_run rounds, each vectorized over every scope's candidates
        left = np.flatnonzero(free)
        if not len(left):
            break
        g_left = group[left]
        picks = left[np.flatnonzero(np.concatenate([[True], g_left[1:] != g_left[:-1]]))]  # each scope's first free one
        kept[picks] = True
        free[picks] = False
        pick_of = np.full(int(group.max()) + 1, -1, dtype=np.int64)
        pick_of[group[picks]] = picks
        rows = np.flatnonzero(free & (pick_of[group] >= 0))
        other = pick_of[group[rows]]
        cos = np.einsum("ij,ij->i", candidates[rows], candidates[other])
        unsure[rows[np.abs(cos - threshold) <= UNSURE * (1.0 + norms[rows] * norms[other])]] = True
        free[rows[cos >= threshold]] = False
    for g in np.unique(group[unsure]):  # rare: redo these scopes exactly
        mine = np.flatnonzero(group == g)
        kept[mine] = False
        redo = _greedy_distinct(candidates[mine], existing[existing_group == g], threshold, limit)
        kept[mine[redo]] = True
    return np.flatnonzero(kept)


def _promoted(inserts: pl.DataFrame | None, missing: dict[str, str]) -> PhaseResult:
    if inserts is None or not inserts.height:
        return scoped_result(Diff.empty(), None, COUNTERS, skipped_scopes=missing)
    counts = inserts.group_by("scope_path").agg(pl.len().alias("draft_skills_promoted"))
    return scoped_result(Diff.of("procedural_skills", PHASE, inserts=inserts), counts, COUNTERS, skipped_scopes=missing)
