"""Recall's reranker (deep_sleep/online/reranker.py) on hand-made candidate rows, without a store:
the features, a neighbour's spread, the model's cap and the tie order."""

from __future__ import annotations

import math
from datetime import timedelta

import numpy as np
import pytest
from deep_sleep.transforms.train_reranker import CAP, N_FEATURES

from deep_sleep.core.scope import Scope
from deep_sleep.online.reranker import FEATURES, candidate, model, own_bases, rank
from tests.online.helpers import NOW

SCOPE = Scope.root("org", "acme").child("brand", "b1")


def _row(nid, label, dist, *, via=None, weight=None, spath=None, layer="semantic", importance=5.0, access=0, degree=0,
         age_days=0.0, lex=0.0, kind="node"):
    """A candidate row in the recall query's layout (:func:`deep_sleep.online.recall.candidates_sql`)."""
    spath = SCOPE.path if spath is None else spath
    return (kind, nid, spath, layer, label, importance, access, NOW - timedelta(days=age_days), dist, lex, via, weight,
            degree, "hashing-char3gram-blake2b-256", "{}")


def test_the_features_of_a_seed_and_of_a_neighbour():
    seed = _row("a", "billing migration plan", 0.2, importance=8.0, access=1000, degree=200, age_days=30.0)
    hop = _row("b", "META: rollback", None, via="a", weight=0.5, layer="working", spath=Scope.root("org", "acme").path)
    base, sim, *_, x, via = candidate(seed, {"a": 0.8}, SCOPE, NOW, {"billing", "plan", "x"})
    assert len(x) == len(FEATURES) == N_FEATURES
    assert (base, sim, via) == (pytest.approx(0.8), pytest.approx(0.8), None)
    named = dict(zip(FEATURES, x))
    assert named["importance"] == 0.8 and named["recency"] == pytest.approx(math.exp(-1))
    assert named["access"] == 1.0 and named["degree"] == 1.0 and named["neighbour_hop"] == 0.0
    assert named["scope_distance"] == 0.0 and named["query_overlap"] == pytest.approx(2 / 3)

    base, sim, *_, x, via = candidate(hop, {"a": 0.8}, SCOPE, NOW, {"billing"})
    named = dict(zip(FEATURES, x))
    assert (sim, via) == (0.0, "a") and base == named["spread"] == pytest.approx(0.5 * 0.8 * 0.5)
    assert named["neighbour_hop"] == named["working"] == named["meta"] == 1.0
    assert named["scope_distance"] == pytest.approx(1 / 2)  # one level up of two


def test_rank_caps_the_adjustment_and_breaks_ties_by_similarity_then_id():
    rows = [_row("c", "x", 0.5), _row("b", "x", 0.5), _row("a", "y", None, via="b", weight=1.0)]
    scored = [candidate(r, {"b": 0.5, "c": 0.5}, SCOPE, NOW, set()) for r in rows]
    # a's spread (0.25) is below the seeds' 0.5; b and c tie on base and similarity: smaller id first
    assert [r[2] for r in rank(scored, *model(None), k=3)] == ["b", "c", "a"]
    assert [r[2] for r in rank(scored, *model(None), k=2)] == ["b", "c"]
    for w, cap in ((100.0, CAP), (-100.0, -CAP)):
        ranked = rank(scored, *model(([w] * N_FEATURES, w)), k=3)
        assert [r[0] - r[1] for r in ranked[:2]] == [pytest.approx(cap)] * 2


def test_an_unreadable_model_is_no_model():
    for row in (None, (None, 1.0), ([1.0] * (N_FEATURES - 1), 0.0), ([float("nan")] * N_FEATURES, 0.0)):
        weights, bias = model(row)
        assert not weights.any() and bias == 0.0
    weights, bias = model(([0.5] * N_FEATURES, None))
    assert np.array_equal(weights, np.full(N_FEATURES, 0.5)) and bias == 0.0


def test_own_bases_fuse_the_vector_and_word_ranks():
    """Reciprocal-rank fusion, golden: ``(1/(k + vector rank) + w/(k + word rank)) × (k + 1)/(1 + w)``; a
    candidate missing from one order gets nothing from it; neighbours reached by spreading have none."""
    rows = [_row("a", "x", 0.1, lex=0.0), _row("b", "x", 0.2, lex=3.0), _row("c", "x", None, lex=1.0),
            _row("d", "x", 0.3, via="a", weight=1.0)]
    got = own_bases(rows, 20.0, 2.0)
    scale = 21.0 / 3.0
    assert got == pytest.approx({"a": scale * (1 / 21), "b": scale * (1 / 22 + 2 / 21), "c": scale * (2 / 22)})
    assert own_bases(rows[:2], 20.0, 2.0)["b"] < 1.0 and max(own_bases([_row("e", "x", 0.1, lex=1.0)], 20.0, 2.0).values()) == pytest.approx(1.0)
    # without fusion: the similarity
    assert own_bases(rows, None) == pytest.approx({"a": 0.9, "b": 0.8, "c": 0.0})
    # ties in an order go by id: the same input in any order gives the same bases
    assert own_bases(list(reversed(rows)), 20.0, 2.0) == got


def test_an_event_candidate_has_no_importance_access_or_degree():
    ev = _row("e", "Ada: my dog Biscuit chewed my sneakers", 0.3, importance=None, kind="event", lex=2.0)
    base, sim, *_, x, via = candidate(ev, {"e": 0.7}, SCOPE, NOW, {"biscuit", "sneakers"})
    named = dict(zip(FEATURES, x))
    assert base == 0.7 and sim == pytest.approx(0.7) and via is None
    assert named["importance"] == 0.5 and named["access"] == 0.0 and named["degree"] == 0.0 and named["meta"] == 0.0
    assert named["query_overlap"] == 1.0
