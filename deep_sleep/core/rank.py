"""Recall's scoring, in one place: the 12 reranker features of a candidate, its base score, the
model row, and the order of the hits (SPEC §5).

The live recall (:mod:`deep_sleep.online.reranker`, one candidate at a time) and the
recall-quality gate (:mod:`deep_sleep.run.gate`, every candidate of every replayed query at once)
both score with these functions, so the gate ranks exactly as the online path does.  Each formula
is written once, over a small math namespace: :data:`SCALAR` (``math``, for one candidate: no
numpy call overhead on the live path) or :data:`ARRAY` (numpy, elementwise over arrays).  The two
namespaces agree to the last bit on ``+ - * /``, ``min``/``max`` and ``log1p``; ``exp`` (recency)
may differ by one unit in the last place between the C library and numpy's SIMD loop, which moves
no rank unless two candidates tie to 1e-16.

Features, in :data:`FEATURES` order (the order ``recall_events.features`` stores them):

- ``similarity``: ``clip(1 − cosine distance, −1, 1)``; 0 without an embedding (or a non-finite distance)
- ``importance``: ``clip(importance / 10, 0, 1)``; 0.5 when null or not finite
- ``recency``: ``exp(−days since updated_at / 30)``, a future ``updated_at`` counting as now
- ``access``: ``min(log(1 + max(access_count, 0)) / log(1 + 1000), 1)``
- ``degree``: ``min(log(1 + degree) / log(1 + 200), 1)``, the degree being the current incident
  edges counted up to :data:`DEGREE_LIMIT` each way
- ``neighbour_hop``: 1 if reached only by spreading activation from a top hit, else 0
- ``spread``: ``0.5 × the top hit's similarity × clip(edge weight, 0, 1)`` (0 for a seed)
- ``working``: 1 for working memory, 0 for semantic
- ``label_length``: ``min(label characters, 200) / 200``
- ``scope_distance``: levels between the reader's scope and the node's, over the reader's depth
- ``query_overlap``: share of the query's words that are words of the label (the caller counts
  them with :func:`deep_sleep.transforms.label_recalls.query_words`)
- ``meta``: 1 for ``META:`` summary nodes

The score is ``base + clip(w · x + b, −0.25, +0.25)`` (the adjustment is phase D3's,
:func:`deep_sleep.transforms.train_reranker.adjustment`); ``base`` is the similarity, for a
neighbour the larger of its own similarity and its spread.  Ties go to the higher similarity, then
the smaller id (:func:`order`).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import numpy as np

__all__ = ["ARRAY", "DEGREE_LIMIT", "FAN_OUT", "FEATURES", "N_FEATURES", "RECENCY_DAYS", "SCALAR", "SEED_MIN",
           "SEED_PER_K", "SPREAD", "base_score", "features", "model", "n_seeds", "order", "similarity", "spread"]

FEATURES = (
    "similarity", "importance", "recency", "access", "degree", "neighbour_hop", "spread", "working",
    "label_length", "scope_distance", "query_overlap", "meta",
)
N_FEATURES = len(FEATURES)
SPREAD = 0.5
RECENCY_DAYS = 30.0
#: Candidates per order (vector, words; nodes, events): ``max(SEED_PER_K × k, SEED_MIN)``
#: (:func:`n_seeds`); spreading follows up to ``FAN_OUT`` current edges each way from each of the k nearest.
SEED_PER_K = 1
SEED_MIN = 10
FAN_OUT = 8
DEGREE_LIMIT = 100
_LOG_ACCESS = math.log1p(1000)
_LOG_DEGREE = math.log1p(2 * DEGREE_LIMIT)


def _scalar_where(cond: Any, a: Any, b: Any) -> Any:
    return a if cond else b


#: One candidate at a time: Python floats, ``math``.
SCALAR = SimpleNamespace(exp=math.exp, log1p=math.log1p, minimum=min, maximum=max,
                         isfinite=math.isfinite, where=_scalar_where, cast=float)
#: Many candidates at once: float64 arrays, numpy ufuncs.
ARRAY = SimpleNamespace(exp=np.exp, log1p=np.log1p, minimum=np.minimum, maximum=np.maximum,
                        isfinite=np.isfinite, where=np.where,
                        cast=lambda v: np.asarray(v, dtype=np.float64))


def n_seeds(k: int) -> int:
    """How many candidates each order of a recall of ``k`` hits takes (the live recall and the gate alike).
    Reciprocal-rank fusion over short orders keeps what is near the top of both: on the LoCoMo dev split
    longer orders (4k) found no more and cost time (benchmarks/README.md)."""
    return max(SEED_PER_K * k, SEED_MIN)


def similarity(dist: Any, xp: SimpleNamespace = ARRAY) -> Any:
    """``clip(1 − dist, −1, 1)``; 0 where ``dist`` is not finite (NaN stands for no embedding)."""
    finite = xp.isfinite(dist)
    return xp.where(finite, xp.maximum(-1.0, xp.minimum(1.0, 1.0 - xp.where(finite, dist, 0.0))), 0.0)


def spread(via_similarity: Any, weight: Any, xp: SimpleNamespace = ARRAY) -> Any:
    """The activation a neighbour gets from the top hit it was reached from:
    ``SPREAD × that hit's similarity × clip(weight, 0, 1)``."""
    return SPREAD * via_similarity * xp.minimum(xp.maximum(weight, 0.0), 1.0)


def base_score(sim: Any, spread_: Any, hop: Any, xp: SimpleNamespace = ARRAY) -> Any:
    """The score before the model: the similarity; for a neighbour (``hop``), the larger of it and its spread."""
    return xp.where(hop, xp.maximum(sim, spread_), sim)


def features(sim: Any, importance: Any, age_seconds: Any, access_count: Any, degree: Any, hop: Any,
             spread_: Any, working: Any, label_chars: Any, up: Any, depth: Any, overlap: Any, meta: Any,
             xp: SimpleNamespace = ARRAY) -> tuple:
    """The 12 features (:data:`FEATURES` order) of one candidate (``xp=SCALAR``, Python numbers) or of
    many (``xp=ARRAY``, equal-length arrays; booleans as 0/1 or bool).  ``importance`` NaN (or, for
    one candidate, None) stands for a null importance; ``up`` is how many levels the node's scope
    lies above the reader's, ``depth`` the reader's depth."""
    if importance is None:
        importance = math.nan
    imp_ok = xp.isfinite(importance)
    return (
        sim,
        xp.where(imp_ok, xp.minimum(xp.maximum(xp.where(imp_ok, importance, 0.0) / 10.0, 0.0), 1.0), 0.5),
        xp.exp(-(xp.maximum(age_seconds, 0.0) / 86400.0) / RECENCY_DAYS),
        xp.minimum(xp.log1p(xp.maximum(access_count, 0)) / _LOG_ACCESS, 1.0),
        xp.minimum(xp.log1p(degree) / _LOG_DEGREE, 1.0),
        xp.where(hop, 1.0, 0.0),
        spread_,
        xp.where(working, 1.0, 0.0),
        xp.minimum(label_chars, 200) / 200.0,
        up / depth,
        overlap,
        xp.where(meta, 1.0, 0.0),
    )


def model(row: tuple | None) -> tuple[np.ndarray, float]:
    """A scope's reranker (weights, bias) from its ``reranker_models`` row ``(weights, bias)``; none
    yet, or unreadable (not :data:`N_FEATURES` finite weights): zeros (no adjustment)."""
    if row and row[0] is not None and len(row[0]) == N_FEATURES and all(math.isfinite(x) for x in row[0]):
        return np.asarray(row[0], dtype=np.float64), float(row[1] or 0.0)
    return np.zeros(N_FEATURES), 0.0


def order(score: np.ndarray, sim: np.ndarray, ids: np.ndarray, group: np.ndarray | None = None) -> np.ndarray:
    """The indexes that sort candidates best first: higher score, then higher similarity, then
    the smaller id (string order); with ``group``, within each group, groups ascending."""
    keys = [np.asarray(ids), -np.asarray(sim, dtype=np.float64), -np.asarray(score, dtype=np.float64)]
    if group is not None:
        keys.append(np.asarray(group))
    return np.lexsort(keys)
