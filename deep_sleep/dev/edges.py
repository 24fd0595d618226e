"""One scope's ``memory_edges``: functional groups, co-occurrence pairs and hub-skewed links
between semantic nodes (no edge touches a working node)."""

from __future__ import annotations

import numpy as np
import polars as pl

from deep_sleep.dev.arrays import _HOUR, _US, ScopeCtx, _cat, _pick, _ts, _when
from deep_sleep.dev.spec import RELATION_P, RELATIONS


def gen_edges(c: ScopeCtx, nodes: pl.DataFrame, info: dict[str, np.ndarray]) -> pl.DataFrame:
    rng = c.rng("edges")
    now = c.now
    sem = np.flatnonzero(info["bulk"] & ~info["working"])
    ns = len(sem)
    if ns < 2:
        return pl.DataFrame()
    # functional groups: one source, 2-3 targets, one relation (is / lives_in)
    f = max(2, ns // 40)
    fsrc = sem[rng.choice(ns, min(f, ns), replace=False)]
    k = rng.integers(2, 4, len(fsrc))
    g_src = np.repeat(fsrc, k)
    g_rel = np.repeat(np.where(rng.random(len(fsrc)) < 0.5, RELATIONS.index("is"), RELATIONS.index("lives_in")), k)
    g_tgt = sem[rng.integers(0, ns, len(g_src))]

    # CO_OCCURRED edges between recent nodes close in time (phase 1.5 reinforces them)
    rec = np.flatnonzero(info["recent"] & info["bulk"])
    rec = rec[np.argsort(info["updated"][rec], kind="stable")]
    close = np.flatnonzero(np.diff(info["updated"][rec]) <= 900 * _US)
    close = close[rng.random(len(close)) < 0.3]
    flip = rng.random(len(close)) < 0.5
    c_src = np.where(flip, rec[close + 1], rec[close])
    c_tgt = np.where(flip, rec[close], rec[close + 1])

    # the rest: uniform sources, targets half uniform and half hub-skewed (density ~ rank^-2/3),
    # so some nodes are hubs and many have at most one neighbour
    m = max(0, int(round(1.5 * nodes.height * 1.01)) - len(g_src) - len(c_src))
    r_src = sem[rng.integers(0, ns, m)]
    perm = rng.permutation(ns)
    hub = rng.random(m) < 0.45
    rank = np.minimum((ns * rng.random(m) ** 3).astype(np.int64), ns - 1)
    r_tgt = np.where(hub, sem[perm[rank]], sem[rng.integers(0, ns, m)])
    r_rel = rng.choice(len(RELATIONS), m, p=RELATION_P)

    src = np.concatenate([g_src, c_src, r_src])
    tgt = np.concatenate([g_tgt, c_tgt, r_tgt])
    rel = np.concatenate([g_rel, np.full(len(c_src), RELATIONS.index("CO_OCCURRED")), r_rel])
    kind = np.concatenate([np.ones(len(g_src), np.int8), np.full(len(c_src), 2, np.int8), np.zeros(m, np.int8)])
    keep = src != tgt
    src, tgt, rel, kind = src[keep], tgt[keep], rel[keep], kind[keep]
    key = (src.astype(np.int64) * nodes.height + tgt) * len(RELATIONS) + rel
    _, first = np.unique(key, return_index=True)
    first.sort()
    src, tgt, rel, kind = src[first], tgt[first], rel[first], kind[first]
    e = len(src)

    created_n = info["created"]
    base = np.maximum(created_n[src], created_n[tgt])
    created = base + ((now - base) * rng.random(e) ** 0.7).astype(np.int64)
    # crafted co-occurrence edges were made when both ends were last touched
    co = kind == 2
    created = np.where(co, np.minimum(info["updated"][src], info["updated"][tgt]) - _HOUR, created)
    created = np.maximum(created, base)
    upd = np.where(rng.random(e) < 0.3, created + ((now - created) * rng.random(e)).astype(np.int64), created)
    w = np.where(rel == 0, np.round(rng.uniform(0.1, 3.0, e), 2),
                 np.where(rel == 1, rng.integers(1, 6, e).astype(np.float64),
                          np.where(rng.random(e) < 0.7, 1.0, np.round(rng.uniform(0.5, 1.5, e), 2))))
    p = rng.random(e)
    props = pl.select(
        pl.when(_when(co)).then(pl.lit('{"source": "cooccurrence"}'))
        .when(_when(p < 0.7)).then(pl.lit("{}"))
        .when(_when(p < 0.9)).then(pl.lit('{"source": "chat"}'))
        .otherwise(_cat('{"confidence": ', pl.Series(np.round(rng.uniform(0.3, 0.99, e), 2)).cast(pl.String), "}"))
    ).to_series()
    node_ids = nodes["id"]
    return pl.DataFrame([
        c.ids("memory_edges", e),
        *c.common(e),
        node_ids.gather(src).alias("source_id"),
        node_ids.gather(tgt).alias("target_id"),
        _pick(RELATIONS, rel).alias("relation"),
        pl.Series("weight", w.astype(np.float64)),
        props.alias("properties"),
        _ts(created, "created_at"),
        _ts(upd, "updated_at"),
        _ts(created, "valid_from"),
        pl.Series("valid_to", [None] * e, dtype=pl.Datetime("us", "UTC")),
        pl.Series("version", (rng.geometric(0.7, e)).astype(np.int64)),
    ])
