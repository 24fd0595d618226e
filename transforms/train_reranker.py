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

from dataclasses import replace
from datetime import datetime

import numpy as np
import polars as pl
from deep_sleep.transforms._common import (
    PhaseResult,
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
from deep_sleep.core.shard import Shard
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
NO_RECALLS = "missing input: no recall events"


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


def train_reranker(snapshot: Snapshot | Shard, config: TrainRerankerConfig, as_of: datetime) -> PhaseResult:
    """One step on the recalls labelled but not yet trained on (``trained_at`` null, created at
    or before ``as_of``; labels written by phase D2 earlier in this run included).  Rows whose
    features are not 12 finite numbers are left untrained and named in the notes.  The step
    updates the scope's ``reranker_models`` row (or inserts it), with ``steps + 1`` and
    ``updated_at = as_of``, and sets ``trained_at = as_of`` on every row it used.

    On a shard every scope takes its own step on its own rows, from its own model (the one with
    the smallest id), and is skipped for "missing input" if it has no recall events.  The step is
    :func:`gradient_step` on that scope's rows, exactly as a run of the scope alone calls it — the
    sums are BLAS reductions whose rounding depends on the rows reduced together, so it is the one
    part done scope by scope (a few numpy calls per scope that trains; selection, notes and the
    diff are columnar over the shard).
    """
    recalls = snapshot.table("recall_events")
    if not recalls.height:
        return skip(NO_RECALLS)
    paths = scope_paths(snapshot)
    many = len(paths) > 1
    missing = scopes_without(snapshot, "recall_events", NO_RECALLS) if many else {}
    fresh = recalls.filter(
        pl.col("label").is_not_null() & pl.col("label").is_finite() & pl.col("trained_at").is_null() & (pl.col("created_at") <= as_of)
    ).sort(["scope_path", "id"] if many else "id")
    good = (pl.col("features").list.len() == N_FEATURES) & pl.col("features").list.eval(pl.element().is_finite()).list.all()
    fresh = fresh.with_columns(good.fill_null(False).alias("_ok"))
    bad = fresh.filter(~pl.col("_ok"))
    scope_notes = {}
    if bad.height:
        said = bad.group_by("scope_path", maintain_order=True).agg(
            pl.format("recall {}: features are not {} finite numbers; not trained on", "id", pl.lit(N_FEATURES)).alias("n"))
        scope_notes = dict(zip(said.get_column("scope_path").to_list(), map(tuple, said.get_column("n").to_list()), strict=True))
    fresh = fresh.filter(pl.col("_ok"))
    if not fresh.height:
        return _result(Diff.empty(), None, paths, missing, scope_notes)

    # every list has N_FEATURES values (checked above): the flat values are the rows, without Python lists
    x = fresh.get_column("features").explode().cast(pl.Float64).to_numpy().reshape(-1, N_FEATURES)
    sim = fresh.get_column("similarity").fill_null(0.0).to_numpy().astype(np.float64)
    target = np.clip(fresh.get_column("label").to_numpy().astype(np.float64) - sim, -CAP, CAP)
    explicit = (fresh.get_column("label_source") == EXPLICIT).fill_null(False).to_numpy()
    s = np.where(explicit, config.explicit_weight, 1.0)

    # the scopes that train (in the rows' order) and each one's model, if it has one
    runs = fresh.get_column("scope_path").rle()
    lengths = runs.struct.field("len").to_numpy()
    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    models = snapshot.table("reranker_models").sort("id").unique("scope_path", keep="first", maintain_order=True)
    weights_ok = (pl.col("weights").list.len() == N_FEATURES) & pl.col("weights").list.eval(pl.element().is_finite()).list.all()
    training = (
        pl.DataFrame({"scope_path": runs.struct.field("value")})
        .join(models.select("scope_path", "id", "version", "weights", "bias", "steps"), on="scope_path", how="left",
              maintain_order="left")
        .with_columns(weights_ok.fill_null(False).alias("_readable"))
    )
    k = training.height
    # a model that cannot be read (or none): start from "no adjustment"
    w0 = np.zeros((k, N_FEATURES))
    readable = training.get_column("_readable").to_numpy()
    if readable.any():
        w0[readable] = training.filter("_readable").get_column("weights").explode().cast(pl.Float64).to_numpy().reshape(-1, N_FEATURES)
    bias = pl.col("bias")
    b0 = training.select(  # the stored bias, as `float(bias or 0.0)`: null and ±0 read 0.0
        pl.when(pl.col("_readable") & bias.is_not_null() & (bias != 0)).then(bias).otherwise(0.0).cast(pl.Float64)
    ).to_series().to_numpy()
    w = np.empty((k, N_FEATURES))
    b = np.empty(k)
    for i in range(k):  # per scope: see the docstring
        lo, hi = bounds[i], bounds[i + 1]
        w[i], b[i] = gradient_step(w0[i], b0[i], x[lo:hi], target[lo:hi], s[lo:hi], config.learning_rate)

    ts = pl.lit(as_of, dtype=pl.Datetime("us", "UTC"))
    stepped = training.select(
        "scope_path", "id", "version", "steps",
        pl.Series("weights", w).cast(pl.List(pl.Float64)), pl.Series("bias", b, dtype=pl.Float64),
    )
    known = stepped.filter(pl.col("id").is_not_null())
    new = stepped.filter(pl.col("id").is_null())
    updates = known.select(
        "id", "version", "weights", "bias", (pl.col("steps").fill_null(0) + 1).cast(pl.Int64).alias("steps"), ts.alias("updated_at"),
    ) if known.height else None
    inserts = new.select(
        scoped_created_ids(new.get_column("scope_path"), PHASE, pl.Series("key", ["model"] * new.height, dtype=pl.String)).alias("id"),
        "scope_path", tenant_of().alias("tenant_id"), "weights", "bias", pl.lit(1, pl.Int64).alias("steps"), ts.alias("updated_at"),
    ) if new.height else None
    trained = fresh.select("id", "version", ts.alias("trained_at"))
    diff = Diff.combine([Diff.of("reranker_models", PHASE, inserts=inserts, updates=updates),
                         Diff.of("recall_events", PHASE, updates=trained)])
    counts = training.select("scope_path", pl.lit(1, pl.Int64).alias("reranker_steps"))
    return _result(diff, counts, paths, missing, scope_notes)


def _result(diff: Diff, counts: pl.DataFrame | None, paths: tuple[str, ...], missing: dict[str, str],
            scope_notes: dict[str, tuple[str, ...]]) -> PhaseResult:
    result = scoped_result(diff, counts, COUNTERS, skipped_scopes=missing, scope_notes=scope_notes)
    # a run of one scope reports its notes as the phase's (the runner of a single snapshot reads those)
    return replace(result, notes=scope_notes.get(paths[0], ())) if len(paths) == 1 else result
