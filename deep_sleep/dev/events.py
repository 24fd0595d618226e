"""One scope's ``episodic_events`` (markers, SOUL mentions, actions, chatter) and
``memory_access_log`` (recent and older accesses)."""

from __future__ import annotations

import numpy as np
import polars as pl

from deep_sleep.dev.arrays import (
    _DAY,
    _US,
    ScopeCtx,
    _cat,
    _emb_series,
    _h64,
    _pick,
    _ts,
    _unit_vectors,
    _when,
    _zipf_p,
)
from deep_sleep.dev.spec import ACTIONS, MARKERS, PREFIXES, WORDS


def gen_episodic(c: ScopeCtx, nodes: pl.DataFrame, info: dict[str, np.ndarray]) -> pl.DataFrame:
    rng = c.rng("episodic")
    now, horizon = c.now, c.spec.days * _DAY
    count = max(60, c.n // 2) if c.legacy else max(120, c.n // 5)
    hot_labels = nodes["label"].filter(pl.Series(info["hot"])).to_list()
    cat_p = np.array([0.30, 0.08, 0.02, 0.28, 0.32])  # markers, soul, ghost marker, action, chatter
    if len(hot_labels) < 2 or c.legacy:
        cat_p[:3] = 0.0
    cat = rng.choice(5, count, p=cat_p / cat_p.sum())

    # times: half in the last 7 days (markers 80 %), a quarter in 7-30 days, the rest older
    band = rng.choice(3, count, p=(0.5, 0.25, 0.25))
    band = np.where((cat == 0) & (rng.random(count) < 0.8), 0, band)
    lo = np.array([60 * _US, 7 * _DAY, 30 * _DAY])[band]
    hi = np.minimum(np.array([7 * _DAY, 30 * _DAY, horizon])[band], horizon)
    lo = np.minimum(lo, hi - 1)
    age = lo + ((hi - lo) * rng.random(count)).astype(np.int64)
    order = np.argsort(-age, kind="stable")  # chronological
    cat, age = cat[order], age[order]
    created = now - age

    # marker content: a few hot pairs, Zipf-weighted, so pairs repeat
    nh = len(hot_labels)
    pairs = [(0, 1), (0, 2), (1, 2), (3, 4), (2, 5), (1, 4)]
    pairs = [(a, b) for a, b in pairs if a < nh and b < nh] or [(0, 0)]
    pi = rng.choice(len(pairs), count, p=_zipf_p(len(pairs), 1.2))
    pa_, pb_ = np.array(pairs)[pi].T
    hot = hot_labels or [""]
    la, lb = _pick(hot, pa_), _pick(hot, pb_)
    act = rng.choice(len(ACTIONS), count, p=_zipf_p(len(ACTIONS), 1.3))
    verb = _pick([a[0] for a in ACTIONS], act)
    obj = _pick([a[1] for a in ACTIONS], act)
    atype = _pick([a[2] for a in ACTIONS], act)
    tmpl = rng.integers(0, 3, count)
    w1 = _pick(WORDS, rng.integers(0, len(WORDS), count))
    w2 = pl.select(
        pl.when(_when(rng.random(count) < 0.05)).then(_pick(MARKERS, rng.integers(0, len(MARKERS), count)))
        .otherwise(_pick(WORDS, rng.integers(0, len(WORDS), count)))
    ).to_series()
    pre = _pick(PREFIXES, rng.integers(0, len(PREFIXES), count))
    content = pl.select(
        pl.when(_when((cat == 0) & (tmpl == 0)))
        .then(_cat("User asked about [semantic:", la, "] while discussing [semantic:", lb, "]."))
        .when(_when(cat == 0))
        .then(_cat("Linked [semantic:", la, "] with [semantic:", lb, "] for the ", w1, " follow-up."))
        .when(_when(cat == 1)).then(_cat("[SOUL:name] greeted the user and recalled [semantic:", la, "]."))
        .when(_when(cat == 2)).then(_cat("Mentioned [semantic:ghost ", w1, "] which nobody remembers."))
        .when(_when((cat == 3) & (tmpl == 0))).then(_cat("I ", verb, " the ", obj, "."))
        .when(_when((cat == 3) & (tmpl == 1))).then(_cat("Then I ", verb, " the ", obj, "."))
        .when(_when(cat == 3)).then(_cat("First I checked the status dashboard, then I ", verb, " the ", obj, "."))
        .otherwise(_cat("Talked about ", w1, " ", w2, " for the ", pre, " review."))
    ).to_series()
    mr = rng.random(count)
    turn = pl.Series(rng.integers(1, 40, count)).cast(pl.String)
    metadata = pl.select(
        pl.when(_when((cat == 3) & (mr < 0.4))).then(_cat('{"action_type": "', atype, '"}'))
        .when(_when(mr < 0.3)).then(pl.lit("{}"))
        .when(_when(mr < 0.8)).then(_cat('{"channel": "chat", "turn": ', turn, "}"))
        .otherwise(pl.lit('{"channel": "voice"}'))
    ).to_series()
    sessions = 36
    sess_names = [f"sess-{_h64(c.spec.seed, c.key, 'session') & 0xFFFFFF:06x}-{k:02d}" for k in range(sessions)]
    sess = _pick(sess_names, np.arange(count) * sessions // count)
    df = pl.DataFrame([
        c.ids("episodic_events", count),
        *c.common(count),
        sess.alias("session_id"),
        content.alias("content"),
        metadata.alias("metadata"),
        _ts(created, "created_at"),
        pl.Series("version", np.ones(count, dtype=np.int64)),
    ])
    if c.spec.embeddings:
        df = df.with_columns(_emb_series(_unit_vectors(c.rng("episodic-embeddings"), count), count))
    return df


def gen_access(c: ScopeCtx, nodes: pl.DataFrame, info: dict[str, np.ndarray]) -> pl.DataFrame:
    rng = c.rng("access")
    now, horizon = c.now, c.spec.days * _DAY
    total = nodes.height
    sem = ~info["working"]
    r = rng.random(total)
    recent_pick = np.flatnonzero(sem & (r < 0.10))
    k_recent = 1 + rng.poisson(1.3, len(recent_pick))
    work_pick = np.flatnonzero(info["working"] & (r < 0.10))
    old_pick = np.flatnonzero(rng.random(total) < 0.15)
    k_old = rng.integers(1, 4, len(old_pick))
    n_r = np.repeat(recent_pick, k_recent)
    n_w = np.repeat(work_pick, 2)
    n_o = np.repeat(old_pick, k_old)
    t_r = now - rng.integers(_US, _DAY - _US, len(n_r) + len(n_w))
    t_o = now - rng.integers(_DAY, max(horizon, _DAY + 1), len(n_o))
    node = np.concatenate([n_r, n_w, n_o])
    at = np.maximum(np.concatenate([t_r, t_o]), info["created"][node])
    order = np.lexsort((node, at))
    node, at = node[order], at[order]
    e = len(node)
    return pl.DataFrame([
        *c.common(e),
        nodes["id"].gather(node).alias("node_id"),
        _ts(at, "accessed_at"),
        pl.Series("kind", np.where(rng.random(e) < 0.75, "read", "write")).cast(pl.String),
    ])
