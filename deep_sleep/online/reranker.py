"""Recall's reranker on the online side: the 12 features of a candidate, and its score.

The model itself — linear, its output an adjustment capped at ±``CAP``, trained one step a night
— is phase D3's (:mod:`deep_sleep.transforms.train_reranker`: :data:`N_FEATURES`,
:func:`adjustment`); the features and the order are :mod:`deep_sleep.core.rank`'s (shared with the
recall-quality gate, :mod:`deep_sleep.run.gate`, so both score alike).  This module applies them
to one candidate row of the recall query at a time, in :data:`FEATURES` order (the order
``recall_events.features`` stores them), and ranks with the model:

    score = base + clip(w · x + b, −CAP, +CAP)

``base`` is the similarity; for a neighbour reached by spreading activation, the larger of its
own similarity and its spread.  Ties go to the higher similarity, then the smaller id.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

import numpy as np
from deep_sleep.transforms.label_recalls import query_words
from deep_sleep.transforms.train_reranker import N_FEATURES, adjustment

from deep_sleep.core import rank as _rank
from deep_sleep.core.rank import DEGREE_LIMIT, FEATURES, RECENCY_DAYS, SPREAD, model
from deep_sleep.core.scope import SEP, Scope

__all__ = ["DEGREE_LIMIT", "FEATURES", "Scored", "candidate", "model", "rank"]
__all__ += ["RECENCY_DAYS", "SPREAD"]

assert len(FEATURES) == N_FEATURES

#: One candidate before the model: (base, similarity, node id, scope path, layer, label, features, via).
Scored = tuple[float, float, str, "str | None", str, str, tuple[float, ...], "str | None"]

_S = _rank.SCALAR


def candidate(row: tuple, seed_sim: dict[str, float], scope: Scope, now: datetime, words: set[str]) -> Scored:
    """A candidate row of the recall query — ``(id, scope_path, layer, label, importance,
    access_count, updated_at, dist, via, weight, degree)`` — with its base score and features.
    ``seed_sim`` maps the nearest nodes' ids to their similarity (a neighbour's spread comes from
    the one it was reached from); ``words`` are the query's (:func:`query_words`)."""
    nid, spath, layer, label, importance, access_count, updated_at, dist, via, weight, degree = row
    sim = _rank.similarity(math.nan if dist is None else dist, _S)
    spread = _rank.spread(seed_sim.get(via, 0.0), weight or 0.0, _S) if via else 0.0
    base = _rank.base_score(sim, spread, bool(via), _S)
    up = scope.depth - (spath.count(SEP) + 1) // 2 if spath else scope.depth - 1
    overlap = len(words & set(query_words(label))) / len(words) if words else 0.0
    x = _rank.features(sim, importance, (now - updated_at).total_seconds(), access_count, degree, bool(via), spread,
                       layer == "working", len(label), up, scope.depth, overlap, label.startswith("META:"), _S)
    return base, sim, nid, spath, layer, label, x, via


def rank(scored: Sequence[Scored], weights: np.ndarray, bias: float, k: int) -> list[Scored]:
    """The ``k`` best candidates, each with its score (base + the model's capped adjustment) in
    place of its base."""
    adj = adjustment(weights, bias, np.asarray([s[6] for s in scored], dtype=np.float64))
    score = np.asarray([s[0] for s in scored], dtype=np.float64) + adj
    best = _rank.order(score, np.asarray([s[1] for s in scored], dtype=np.float64),
                       np.asarray([s[2] for s in scored], dtype=np.str_))[:k]
    return [(float(score[i]),) + tuple(scored[i][1:]) for i in best]
