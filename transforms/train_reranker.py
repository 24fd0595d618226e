"""Phase D3 — train_reranker: one optimizer step of the scope's recall reranker (SPEC §3, §5).

The model (the one :func:`deep_sleep.online.recall.recall` scores with) is linear over the 12 features
a recall logs (named and computed in :mod:`deep_sleep.online.reranker`), and its output is an
*adjustment* of the hit's base score, clipped to ±``CAP``:

    adjustment(x) = clip(w · x + b, −CAP, +CAP)          score = base + adjustment(x)

so it can reorder close calls but never bury a strong match or lift a weak one past it.
Training is least squares on what the adjustment should have been: the target of a labelled
recall is ``clip(label − similarity, −CAP, +CAP)``.  One step of gradient descent on the
weighted mean squared error, with learning rate ``learning_rate``:

    r_i = (w · x_i + b) − target_i
    w  ← w − lr · Σ s_i r_i x_i / Σ s_i          b ← b − lr · Σ s_i r_i / Σ s_i

where ``s_i`` is ``explicit_weight`` (2) for an explicit label (``label_source = "explicit"``,
feedback from the online path) and 1 otherwise.  A fresh scope starts from all zeros (no
adjustment).  Rows are taken in id order, so the sums — and the diff — are byte-identical on
every replay.
"""

from __future__ import annotations

from datetime import datetime

import numpy as np
import polars as pl
from deep_sleep.transforms._common import PhaseResult, created_id, skip
from pydantic import Field

from deep_sleep.core.config import PhaseConfig
from deep_sleep.core.diff import Diff
from deep_sleep.core.snapshot import Snapshot


class TrainRerankerConfig(PhaseConfig):
    learning_rate: float = Field(0.05, gt=0)
    explicit_weight: float = Field(2.0, gt=0)


#: The counters this phase reports (SPEC §3).
COUNTERS: tuple[str, ...] = ("reranker_steps",)


PHASE = "train_reranker"
N_FEATURES = 12
CAP = 0.25
EXPLICIT = "explicit"


def adjustment(weights: np.ndarray, bias: float, features: np.ndarray) -> np.ndarray:
    """The reranker's capped adjustment for each row of ``features`` (``(n, 12)``)."""
    return np.clip(features @ weights + bias, -CAP, CAP)


def gradient_step(weights: np.ndarray, bias: float, features: np.ndarray, target: np.ndarray,
                  sample_weight: np.ndarray, learning_rate: float) -> tuple[np.ndarray, float]:
    """One step of gradient descent on the weighted mean squared error (module docstring)."""
    residual = features @ weights + bias - target
    total = float(sample_weight.sum())
    grad_w = (sample_weight * residual) @ features / total
    grad_b = float((sample_weight * residual).sum()) / total
    return weights - learning_rate * grad_w, bias - learning_rate * grad_b


def train_reranker(snapshot: Snapshot, config: TrainRerankerConfig, as_of: datetime) -> PhaseResult:
    """One step on the recalls labelled but not yet trained on (``trained_at`` null, created at
    or before ``as_of``; labels written by phase D2 earlier in this run included).  Rows whose
    features are not 12 finite numbers are left untrained and named in the notes.  The step
    updates the scope's ``reranker_models`` row (or inserts it), with ``steps + 1`` and
    ``updated_at = as_of``, and sets ``trained_at = as_of`` on every row it used.
    """
    recalls = snapshot.table("recall_events")
    if not recalls.height:
        return skip("missing input: no recall events")
    fresh = recalls.filter(
        pl.col("label").is_not_null() & pl.col("label").is_finite() & pl.col("trained_at").is_null() & (pl.col("created_at") <= as_of)
    ).sort("id")
    good = (pl.col("features").list.len() == N_FEATURES) & pl.col("features").list.eval(pl.element().is_finite()).list.all()
    fresh = fresh.with_columns(good.fill_null(False).alias("_ok"))
    bad = fresh.filter(~pl.col("_ok"))
    notes = tuple(f"recall {rid}: features are not {N_FEATURES} finite numbers; not trained on" for rid in bad.get_column("id").to_list())
    fresh = fresh.filter(pl.col("_ok"))
    if not fresh.height:
        return PhaseResult(counters={"reranker_steps": 0}, notes=notes)

    # every list has N_FEATURES values (checked above): the flat values are the rows, without Python lists
    x = fresh.get_column("features").explode().cast(pl.Float64).to_numpy().reshape(-1, N_FEATURES)
    sim = fresh.get_column("similarity").fill_null(0.0).to_numpy().astype(np.float64)
    target = np.clip(fresh.get_column("label").to_numpy().astype(np.float64) - sim, -CAP, CAP)
    explicit = (fresh.get_column("label_source") == EXPLICIT).fill_null(False).to_numpy()
    s = np.where(explicit, config.explicit_weight, 1.0)

    model = snapshot.table("reranker_models").sort("id").head(1)
    stored = model.get_column("weights").to_list()[0] if model.height else None
    if stored is not None and len(stored) == N_FEATURES and np.isfinite(stored).all():
        w0 = np.asarray(stored, dtype=np.float64)
        b0 = float(model.item(0, "bias") or 0.0)
    else:  # no model yet, or one that cannot be read: start from "no adjustment"
        w0, b0 = np.zeros(N_FEATURES), 0.0
    w, b = gradient_step(w0, b0, x, target, s, config.learning_rate)

    ts = pl.lit(as_of, dtype=pl.Datetime("us", "UTC"))
    weights = pl.Series("weights", [w.tolist()], dtype=pl.List(pl.Float64))
    if model.height:
        steps = int(model.item(0, "steps") or 0) + 1
        row = pl.DataFrame({"id": model.get_column("id"), "version": model.get_column("version")}).with_columns(
            weights, pl.lit(b).alias("bias"), pl.lit(steps, pl.Int64).alias("steps"), ts.alias("updated_at")
        )
        model_diff = Diff.of("reranker_models", PHASE, updates=row)
    else:
        scope = snapshot.scope
        row = pl.DataFrame({"id": [created_id(scope.path, PHASE, "model")]}).with_columns(
            pl.lit(scope.path).alias("scope_path"), pl.lit(scope.tenant_id).alias("tenant_id"), weights,
            pl.lit(b).alias("bias"), pl.lit(1, pl.Int64).alias("steps"), ts.alias("updated_at"),
        )
        model_diff = Diff.of("reranker_models", PHASE, inserts=row)
    trained = fresh.select("id", "version", ts.alias("trained_at"))
    return PhaseResult(
        diff=Diff.combine([model_diff, Diff.of("recall_events", PHASE, updates=trained)]),
        counters={"reranker_steps": 1},
        notes=notes,
    )
