"""Recall's reranker on the online side: the 12 features of a candidate, and its score.

The model itself — linear, its output an adjustment capped at ±``CAP``, trained one step a night
— is phase D3's (:mod:`deep_sleep.transforms.train_reranker`: :data:`N_FEATURES`,
:func:`adjustment`); the features and the order are :mod:`deep_sleep.core.rank`'s (shared with the
recall-quality gate, :mod:`deep_sleep.run.gate`, so both score alike).  This module applies them
to one candidate row of the recall query at a time, in :data:`FEATURES` order (the order
``recall_events.features`` stores them), and ranks with the model:

    score = base + clip(w · x + b, −CAP, +CAP)

``base`` is the candidate's own merit (:func:`own_bases`: the similarity, or with lexical fusion the
reciprocal-rank fusion of its vector and word-match ranks); for a neighbour reached by spreading
activation, at least its spread.  Ties go to the higher similarity, then the smaller id.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

import numpy as np
from deep_sleep.transforms.label_recalls import WORD_RE
from deep_sleep.transforms.train_reranker import N_FEATURES, adjustment

from deep_sleep.core import rank as _rank
from deep_sleep.core.rank import DEGREE_LIMIT, FEATURES, RECENCY_DAYS, SPREAD, model
from deep_sleep.core.scope import SEP, Scope

__all__ = ["DEGREE_LIMIT", "FEATURES", "Scored", "candidate", "model", "own_bases", "rank"]
__all__ += ["RECENCY_DAYS", "SPREAD"]

assert len(FEATURES) == N_FEATURES

#: One candidate before the model: (base, similarity, id, scope path, layer, text, features, via).
Scored = tuple[float, float, str, "str | None", str, str, tuple[float, ...], "str | None"]

_S = _rank.SCALAR


def own_bases(rows: Sequence[tuple], fusion_k: float | None, lexical_weight: float = 1.0) -> dict[str, float]:
    """The base score of every candidate that was not reached by spreading (its own merit), by id.

    Rows are the recall query's (:func:`deep_sleep.online.recall.candidates_sql`: kind, id, …, dist
    at 8, lex at 9, via at 10).  ``fusion_k`` None: the similarity.  Else reciprocal-rank fusion of the
    vector order (by distance, then id; candidates with a vector) and the word-match order (by the
    word score, then id; candidates that match), the word rank weighing ``lexical_weight``:
    ``1 / (fusion_k + vector rank) + lexical_weight / (fusion_k + word rank)``, scaled by
    ``(fusion_k + 1) / (1 + lexical_weight)`` so that first in both is 1."""
    own = [r for r in rows if r[10] is None]
    if fusion_k is None:
        return {r[1]: _rank.similarity(math.nan if r[8] is None else r[8], _S) for r in own}
    out = dict.fromkeys((r[1] for r in own), 0.0)
    by_vector = sorted((r for r in own if r[8] is not None and math.isfinite(r[8])), key=lambda r: (r[8], r[1]))
    by_words = sorted((r for r in own if r[9] and r[9] > 0), key=lambda r: (-r[9], r[1]))
    for order, weight in ((by_vector, 1.0), (by_words, lexical_weight)):
        for i, r in enumerate(order, 1):
            out[r[1]] += weight / (fusion_k + i)
    scale = (fusion_k + 1.0) / (1.0 + lexical_weight)
    return {k: v * scale for k, v in out.items()}


def candidate(row: tuple, own: dict[str, float], scope: Scope, now: datetime, words: set[str], fused: bool = False) -> Scored:
    """A candidate row of the recall query — ``(kind, id, scope_path, layer, text, importance,
    access_count, updated_at, dist, lex, via, weight, degree, …)`` — with its base score and features.
    ``own``: :func:`own_bases`; a neighbour reached by spreading gets at least its spread from the one
    it was reached from (``SPREAD × that one's base × clip(weight, 0, 1)``), and without fusion at least
    its own similarity; ``words`` are the query's (:func:`query_words`).  An event has no importance
    (the feature's neutral 0.5), no access count, no degree."""
    kind, nid, spath, layer, label, importance, access_count, updated_at, dist, _lex, via, weight, degree = row[:13]
    sim = _rank.similarity(math.nan if dist is None else dist, _S)
    spread = _rank.spread(own.get(via, 0.0), weight or 0.0, _S) if via else 0.0
    base = max(0.0 if fused else sim, spread) if via else own[nid]
    up = scope.depth - (spath.count(SEP) + 1) // 2 if spath else scope.depth - 1
    # ``words`` holds no stop word, so meeting the label's raw words is meeting its query_words.
    overlap = len(words & set(WORD_RE.findall(label.lower()))) / len(words) if words else 0.0
    x = _rank.features(sim, importance, (now - updated_at).total_seconds(), access_count, degree, bool(via), spread,
                       layer == "working", len(label), up, scope.depth, overlap,
                       kind == "node" and label.startswith("META:"), _S)
    return base, sim, nid, spath, layer, label, x, via


def rank(scored: Sequence[Scored], weights: np.ndarray, bias: float, k: int) -> list[Scored]:
    """The ``k`` best candidates, each with its score (base + the model's capped adjustment) in
    place of its base."""
    adj = adjustment(weights, bias, np.asarray([s[6] for s in scored], dtype=np.float64))
    score = np.asarray([s[0] for s in scored], dtype=np.float64) + adj
    best = _rank.order(score, np.asarray([s[1] for s in scored], dtype=np.float64),
                       np.asarray([s[2] for s in scored], dtype=np.str_))[:k]
    return [(float(score[i]),) + tuple(scored[i][1:]) for i in best]
