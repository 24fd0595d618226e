"""Recall's reranker on the online side: the 12 features of a candidate, and its score.

The model itself — linear, its output an adjustment capped at ±``CAP``, trained one step a night
— is phase D3's (:mod:`deep_sleep.transforms.train_reranker`: :data:`N_FEATURES`,
:func:`adjustment`); this module computes the features it is trained on, in :data:`FEATURES`
order (the order ``recall_events.features`` stores them), and ranks with it:

    score = base + clip(w · x + b, −CAP, +CAP)

``base`` is the similarity; for a neighbour reached by spreading activation, the larger of its
own similarity and its spread.  Ties go to the higher similarity, then the smaller id.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

import numpy as np

from deep_sleep.core.scope import SEP, Scope
from deep_sleep.transforms.label_recalls import query_words
from deep_sleep.transforms.train_reranker import N_FEATURES, adjustment

__all__ = ["DEGREE_LIMIT", "FEATURES", "Scored", "candidate", "model", "rank"]

FEATURES = (
    "similarity",      # cosine similarity of the query and the node (0 without an embedding)
    "importance",      # importance / 10
    "recency",         # exp(−days since updated_at / 30)
    "access",          # log(1 + access_count) / log(1 + 1000), capped at 1
    "degree",          # log(1 + current incident edges) / log(1 + 200), edges counted up to 100 each way
    "neighbour_hop",   # 1 if reached only by spreading activation from a top hit, else 0
    "spread",          # the activation it got that way: 0.5 × the top hit's similarity × min(edge weight, 1)
    "working",         # 1 for working memory, 0 for semantic
    "label_length",    # min(label characters, 200) / 200
    "scope_distance",  # levels between the reader's scope and the node's, / the reader's depth (0 = own scope)
    "query_overlap",   # share of the query's words (label_recalls.query_words) that are words of the label
    "meta",            # 1 for META: summary nodes
)
assert len(FEATURES) == N_FEATURES
SPREAD = 0.5
RECENCY_DAYS = 30.0
DEGREE_LIMIT = 100

#: One candidate before the model: (base, similarity, node id, scope path, layer, label, features, via).
Scored = tuple[float, float, str, "str | None", str, str, tuple[float, ...], "str | None"]


def candidate(row: tuple, seed_sim: dict[str, float], scope: Scope, now: datetime, words: set[str]) -> Scored:
    """A candidate row of the recall query — ``(id, scope_path, layer, label, importance,
    access_count, updated_at, dist, via, weight, degree)`` — with its base score and features.
    ``seed_sim`` maps the nearest nodes' ids to their similarity (a neighbour's spread comes from
    the one it was reached from); ``words`` are the query's (:func:`query_words`)."""
    nid, spath, layer, label, importance, access_count, updated_at, dist, via, weight, degree = row
    sim = 0.0 if dist is None or not math.isfinite(dist) else max(-1.0, min(1.0, 1.0 - dist))
    spread = SPREAD * seed_sim.get(via, 0.0) * min(max(weight or 0.0, 0.0), 1.0) if via else 0.0
    base = max(sim, spread) if via else sim
    age_days = max((now - updated_at).total_seconds(), 0.0) / 86400.0
    up = scope.depth - (spath.count(SEP) + 1) // 2 if spath else scope.depth - 1
    label_words = set(query_words(label))
    x = (
        sim,
        min(max(importance / 10.0, 0.0), 1.0) if importance is not None and math.isfinite(importance) else 0.5,
        math.exp(-age_days / RECENCY_DAYS),
        min(math.log1p(max(access_count, 0)) / math.log1p(1000), 1.0),
        min(math.log1p(degree) / math.log1p(2 * DEGREE_LIMIT), 1.0),
        1.0 if via else 0.0,
        spread,
        1.0 if layer == "working" else 0.0,
        min(len(label), 200) / 200.0,
        up / scope.depth,
        len(words & label_words) / len(words) if words else 0.0,
        1.0 if label.startswith("META:") else 0.0,
    )
    return base, sim, nid, spath, layer, label, x, via


def model(row: tuple | None) -> tuple[np.ndarray, float]:
    """The scope's reranker (weights, bias) from its ``reranker_models`` row; none yet, or
    unreadable: zeros (no adjustment)."""
    if row and row[0] is not None and len(row[0]) == N_FEATURES and all(math.isfinite(x) for x in row[0]):
        return np.asarray(row[0], dtype=np.float64), float(row[1] or 0.0)
    return np.zeros(N_FEATURES), 0.0


def rank(scored: Sequence[Scored], weights: np.ndarray, bias: float, k: int) -> list[Scored]:
    """The ``k`` best candidates, each with its score (base + the model's capped adjustment) in
    place of its base."""
    adj = adjustment(weights, bias, np.asarray([s[6] for s in scored], dtype=np.float64))
    return sorted(
        ((base + float(a), sim, nid, spath, layer, label, x, via) for (base, sim, nid, spath, layer, label, x, via), a in zip(scored, adj)),
        key=lambda r: (-r[0], -r[1], r[2]),
    )[:k]
