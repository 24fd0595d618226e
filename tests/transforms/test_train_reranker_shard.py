"""train_reranker on a shard: every scope takes its own step, from its own model, on its own rows."""

from __future__ import annotations

from datetime import timedelta

import numpy as np

from deep_sleep.transforms._common import created_id
from deep_sleep.transforms.config import ConsolidationConfig
from deep_sleep.transforms.train_reranker import N_FEATURES, gradient_step, train_reranker
from tests.transforms.shard_cases import AC, ACME, AS_OF, NESTED, assert_each_scope_alone, of_scope, interleaved_shard as shard_of, uid

ZED = "org\x1fzed"
T0 = AS_OF - timedelta(hours=6)
W_AC = [0.1, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, -0.1]


def _recall(scope: str, s: int, n: int, label: float | None, features: list[float], source: str = "implicit", **kw) -> dict:
    return {"id": uid(s, n), "scope_path": scope, "query": "q", "node_id": uid(s, 900), "similarity": 0.5,
            "features": features, "score": 0.5, "created_at": T0, "label": label, "label_source": source, **kw}


def _f(k: int) -> list[float]:
    return [float((k * 7 + i) % 5) / 4 for i in range(N_FEATURES)]


def _fixture():
    recalls = [
        _recall(ACME, 2, 1, 0.9, _f(1)),
        _recall(AC, 1, 1, 0.0, _f(2), "explicit"),
        _recall(ACME, 2, 2, 0.4, [1.0, float("nan")] + [0.0] * 10),  # not trained on: a note of ACME's
        _recall(AC, 1, 2, 1.0, _f(3)),
        _recall(ACME, 2, 3, 0.2, _f(4), trained_at=T0),  # trained on by an earlier run
        _recall(NESTED, 3, 1, None, _f(5)),  # not labelled: nothing to train on
    ]
    models = [  # AC has two rows (the smallest id is the model); ACME has none: it starts from zeros
        {"id": uid(1, 300), "scope_path": AC, "weights": W_AC, "bias": 0.05, "steps": 7, "version": 3},
        {"id": uid(1, 301), "scope_path": AC, "weights": [1.0] * 12, "bias": 1.0, "steps": 70, "version": 1},
        {"id": uid(3, 300), "scope_path": NESTED, "weights": [0.5] * 12, "bias": 0.5, "steps": 2, "version": 1},
    ]
    return shard_of({"recall_events": recalls, "reranker_models": models}, (AC, ACME, NESTED, ZED))


def test_each_scope_steps_its_own_model_on_its_own_rows():
    config = ConsolidationConfig().phase("train_reranker")
    shard, snaps = _fixture()
    result = train_reranker(shard, config, AS_OF)
    models = result.diff.tables["reranker_models"]
    x_ac = np.array([_f(2), _f(3)])
    w, b = gradient_step(np.array(W_AC), 0.05, x_ac, np.clip(np.array([0.0, 1.0]) - 0.5, -0.25, 0.25),
                         np.array([config.explicit_weight, 1.0]), config.learning_rate)
    up = models.updates.row(0, named=True)
    assert models.updates.height == 1 and up["id"] == uid(1, 300) and up["steps"] == 8
    assert up["weights"] == w.tolist() and up["bias"] == b
    w, b = gradient_step(np.zeros(N_FEATURES), 0.0, np.array([_f(1)]), np.array([0.25]), np.array([1.0]), config.learning_rate)
    new = of_scope(models.inserts, ACME).row(0, named=True)
    assert models.inserts.height == 1 and new["id"] == created_id(ACME, "train_reranker", "model")
    assert (new["tenant_id"], new["steps"], new["weights"], new["bias"]) == ("acme", 1, w.tolist(), b)
    trained = set(result.diff.tables["recall_events"].updates.get_column("id"))
    assert trained == {uid(1, 1), uid(1, 2), uid(2, 1)}
    assert dict(result.scope_notes) == {ACME: (f"recall {uid(2, 2)}: features are not 12 finite numbers; not trained on",)}
    assert dict(result.by_scope.select("scope_path", "reranker_steps").iter_rows()) == {AC: 1, ACME: 1}
    assert result.skipped_scopes == {ZED: "missing input: no recall events"}
    reports = assert_each_scope_alone(shard, snaps, ("train_reranker",))
    assert reports[NESTED].phases_run == ["train_reranker"] and reports[NESTED].counters["reranker_steps"] == 0


def test_labels_of_the_same_run_train_each_scope():
    shard, snaps = _fixture()
    reports = assert_each_scope_alone(shard, snaps, ("label_recalls", "train_reranker"))
    assert {s: r.counters["reranker_steps"] for s, r in reports.items()} == {AC: 1, ACME: 1, NESTED: 1, ZED: 0}
