"""Recall's scoring rules, each against its expected values on the store (issue 37 item 7: a lexical
weight of 0 ignored, the reciprocal-rank constant taken as 60 rather than ``recall.fusion_k``, and
spreading from all the seeds rather than the ``k`` nearest were one-line bugs no test caught).

The scope: three nodes near the query by their vectors (harbour…) that hold none of its words, one
far node that holds its rare word (ravenstone) and an edge from it to a node with no vector and no
word (reachable only by spreading).  Events are left out (``recall.events`` false) and the scope has
no reranker row, so a hit's score is its base exactly.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from deep_sleep.online.recall import recall
from deep_sleep.transforms.config import load_config
from tests.online.helpers import NOW
from tests.storeutil import edge, embed_labels, insert, node

QUERY = "ravenstone harbour"
NEAR = ["harbourfront", "harbourview", "harbourmaster"]  # cosine .53, .415, .382 to the query; no query word
FAR = "kitchen drawer: ravenstone, spoons, forks, knives, napkins, candles, matches, string"  # .193; the rare word
HIDDEN = "grocery list milk bread eggs"  # no vector, no word: only spreading reaches it


def _scope(store, scope) -> dict[str, str]:
    rows = {label: node(scope, label, NOW - timedelta(days=1)) for label in [*NEAR, FAR, HIDDEN]}
    insert(store, "memory_nodes", list(rows.values()))
    embed_labels(store, scope)
    with store.pg() as con:  # the hidden node has no vector
        con.execute("UPDATE memory_nodes SET embedding = NULL, embedding_model = NULL WHERE id = %s", (rows[HIDDEN]["id"],))
        con.commit()
    link = edge(scope, rows[FAR]["id"], rows[HIDDEN]["id"])
    link["weight"] = 1.0
    insert(store, "memory_edges", [link])
    return {label: r["id"] for label, r in rows.items()}


def _config(**recall) -> object:
    return load_config(overrides={"recall": {"events": False, **recall}})


def test_with_lexical_weight_0_the_base_is_the_vector_rank_alone(store, scope):
    """``1/(fusion_k + vector rank)`` scaled by ``fusion_k + 1``: 21/21, 21/22, 21/23, 21/24 in vector
    order — the far node's word match adds nothing."""
    ids = _scope(store, scope)
    hits = recall(store, scope, QUERY, k=4, now=NOW, config=_config(lexical_weight=0.0))
    assert [h.node_id for h in hits] == [ids[x] for x in [*NEAR, FAR]]
    assert [round(h.score, 12) for h in hits] == [round(21 / (20 + r), 12) for r in (1, 2, 3, 4)]


@pytest.mark.parametrize("fusion_k", [20.0, 60.0, 5.0])
def test_the_reciprocal_rank_fusion_uses_recall_fusion_k(store, scope, fusion_k):
    """With the default lexical weight 2: the far node is first in the word order and fourth in the
    vector order, ``(1/(K + 4) + 2/(K + 1)) × (K + 1)/3``; a near node has only its vector rank r,
    ``1/(K + r) × (K + 1)/3`` — exact values for K = recall.fusion_k."""
    ids = _scope(store, scope)
    k = fusion_k
    hits = recall(store, scope, QUERY, k=5, now=NOW, config=_config(fusion_k=k))
    got = {h.node_id: h.score for h in hits}
    scale = (k + 1) / 3
    assert got[ids[FAR]] == pytest.approx((1 / (k + 4) + 2 / (k + 1)) * scale, abs=1e-12)
    for r, label in enumerate(NEAR, 1):
        assert got[ids[label]] == pytest.approx(scale / (k + r), abs=1e-12)
    assert hits[0].node_id == ids[FAR]


def test_spreading_starts_from_the_k_nearest_nodes_only(store, scope):
    """The far node is a seed (the scope has fewer nodes than ``max(k, 10)``) but fourth by distance:
    with k = 3 nothing spreads from it, so the hidden node is no candidate; with k = 4 it spreads, and
    the hidden node (0.5 × the far node's base × weight 1, 0.479) outranks the near nodes (1/3 and less)."""
    ids = _scope(store, scope)
    three = recall(store, scope, QUERY, k=3, now=NOW, config=_config())
    assert ids[HIDDEN] not in [h.node_id for h in three]
    assert [h.node_id for h in three] == [ids[FAR], ids[NEAR[0]], ids[NEAR[1]]]
    four = recall(store, scope, QUERY, k=4, now=NOW, config=_config())
    by_id = {h.node_id: h for h in four}
    assert ids[HIDDEN] in by_id and by_id[ids[HIDDEN]].via == ids[FAR]
    assert by_id[ids[HIDDEN]].score == pytest.approx(0.5 * by_id[ids[FAR]].score, abs=1e-12)
    assert [h.node_id for h in four] == [ids[FAR], ids[HIDDEN], ids[NEAR[0]], ids[NEAR[1]]]
