"""One scope's ``memory_nodes``: the bulk of ordinary nodes (labels, importance, timestamps,
properties, embeddings) and the special rows every scope has (SOUL edits, AGENT_IDENTITY facts,
an expired thinking note); see :mod:`deep_sleep.dev.generate` for what the data holds."""

from __future__ import annotations

import numpy as np
import polars as pl

from deep_sleep.dev.arrays import (
    _DAY,
    _HOUR,
    _US,
    ScopeCtx,
    _cat,
    _emb_series,
    _h64,
    _iso,
    _json_str,
    _pick,
    _ts,
    _unit_vectors,
    _when,
    _zipf_p,
)
from deep_sleep.dev.spec import (
    COLORS,
    MARKERS,
    NEAR_MISSES,
    PERSONALITIES,
    PERSONAS,
    PREFIXES,
    ROLES,
    WORDS,
)


def gen_nodes(c: ScopeCtx) -> tuple[pl.DataFrame, dict[str, np.ndarray]]:
    rng = c.rng("nodes")
    now, days = c.now, c.spec.days
    horizon = days * _DAY
    specials = [] if c.legacy else _special_nodes(c)
    nb = c.n if c.legacy else max(0, c.n - len(specials))
    n_hot = 0 if c.legacy else min(6, nb)

    u = rng.random(nb)
    working = rng.random(nb) < 0.05
    working[:n_hot] = False
    semantic = ~working
    ordinary = np.arange(nb) >= n_hot
    recent = (rng.random(nb) < 0.15) & semantic  # updated within the last 24 h
    # every scope gets a few guaranteed phase-2 cases among its recent nodes: two marker labels,
    # a near miss, a marker only in a property value, and one marker node already tagged
    forced = np.zeros(0, dtype=np.int64)
    if not c.legacy:
        spare = np.flatnonzero(semantic & ~recent & ordinary)
        recent[spare[: max(0, 5 - int((recent & ordinary).sum()))]] = True
        forced = np.flatnonzero(recent & ordinary)[:5]

    # labels
    prefix = rng.choice(len(PREFIXES), nb, p=_zipf_p(len(PREFIXES)))
    w1 = rng.integers(0, len(WORDS), nb)
    w2 = rng.integers(0, len(WORDS), nb)
    r = rng.random(nb)
    word2 = _pick(WORDS, w2)
    marker_lab = (r < 0.03) & semantic
    near_lab = (r >= 0.03) & (r < 0.04) & semantic
    marker_lab[:n_hot] = near_lab[:n_hot] = False
    marker_lab[forced], near_lab[forced] = False, False
    marker_lab[forced[:2]] = True
    if len(forced) >= 3:
        near_lab[forced[2]] = True
    if len(forced) == 5:
        marker_lab[forced[4]] = True
    word2 = pl.select(
        pl.when(_when(marker_lab)).then(_pick(MARKERS, rng.integers(0, len(MARKERS), nb)))
        .when(_when(near_lab)).then(_pick(NEAR_MISSES, rng.integers(0, len(NEAR_MISSES), nb)))
        .otherwise(word2)
    ).to_series()
    colon = rng.random(nb) < 0.7
    num = rng.integers(2, 99, nb)
    has_num = rng.random(nb) < 0.4
    head = pl.when(_when(working)).then(pl.lit("thought: ")).otherwise(
        _cat(_pick(PREFIXES, prefix), pl.when(_when(colon)).then(pl.lit(": ")).otherwise(pl.lit(" ")))
    )
    tail = pl.when(_when(has_num)).then(_cat(" ", pl.Series(num).cast(pl.String))).otherwise(pl.lit(""))
    label = pl.select(_cat(head, _pick(WORDS, w1), " ", word2, tail)).to_series()

    # importance: a mixture
    imp = np.clip(np.round(rng.normal(6.2, 1.6, nb), 1), 1.0, 10.0)
    imp = np.where(u < 0.05, 10.0, imp)
    imp = np.where((u >= 0.05) & (u < 0.20), np.round(rng.uniform(1.0, 4.0, nb), 1), imp)
    imp = np.where((u >= 0.20) & (u < 0.25), 5.0, imp)
    imp = np.where((u >= 0.25) & (u < 0.27), 1.0, imp)
    imp[:n_hot] = 9.0
    access = rng.geometric(0.25, nb) - 1 + np.where(imp >= 8.0, 5, 0)

    # timestamps: bursts in the last 24 h, the rest denser towards now
    n_recent = int(recent.sum())
    bursts = max(3, n_recent // 8)
    centers = now - rng.integers(5 * 60 * _US, _DAY - 5 * 60 * _US, bursts)
    t_recent = centers[rng.integers(0, bursts, nb)] + (rng.normal(0.0, 240.0, nb) * _US).astype(np.int64)
    age_recent = np.clip(now - t_recent, _US, _DAY - _US)
    age_old = _DAY + ((horizon - _DAY) * rng.random(nb) ** 1.6).astype(np.int64)
    age_work = rng.integers(60 * _US, 96 * _HOUR, nb)
    age = np.where(working, age_work, np.where(recent, age_recent, age_old))
    updated = now - age
    floor = now - horizon
    same = rng.random(nb) < 0.35
    created = np.where(same, updated, updated - ((updated - floor) * rng.random(nb) ** 2).astype(np.int64))
    old30 = semantic & (age > 30 * _DAY)
    d = rng.random(nb)
    decayed_recent = old30 & (d < 0.25)
    decayed_older = old30 & (d >= 0.25) & (d < 0.5)
    last_decayed = np.where(
        decayed_recent, now - rng.integers(_US, _DAY, nb),
        np.where(decayed_older, now - rng.integers(_DAY, 20 * _DAY, nb), 0),
    )
    last_decayed = np.maximum(last_decayed, updated)
    ld_null = ~(decayed_recent | decayed_older)

    # properties
    ttl = np.array([1, 4, 24, 72])[rng.integers(0, 4, nb)]
    t = rng.random(nb)
    note_marker = rng.random(nb) < 0.06
    if len(forced) >= 4:
        t[forced[3]], note_marker[forced[3]] = 0.7, True  # the "note" template, with a marker
    note_word = pl.select(
        pl.when(_when(note_marker)).then(_pick(MARKERS, rng.integers(0, len(MARKERS), nb)))
        .when(_when(rng.random(nb) < 0.03)).then(_pick(NEAR_MISSES, rng.integers(0, len(NEAR_MISSES), nb)))
        .otherwise(_pick(WORDS, rng.integers(0, len(WORDS), nb)))
    ).to_series()
    w3 = _pick(WORDS, rng.integers(0, len(WORDS), nb))
    w4 = _pick(WORDS, rng.integers(0, len(WORDS), nb))
    conf = pl.Series(np.round(rng.uniform(0.5, 0.99, nb), 2)).cast(pl.String)
    ttl_s = pl.Series(ttl).cast(pl.String)
    tagged = marker_lab & recent & (rng.random(nb) < 0.2)
    tagged[forced[:2]] = False
    if len(forced) == 5:
        tagged[forced[4]] = True
    tagged_at = _iso(now - 3 * _DAY)
    chat = _cat('{"source": "chat", "confidence": ', conf, "}")
    props = pl.select(
        pl.when(_when(working & (t < 0.8)))
        .then(_cat('{"ttl_hours": ', ttl_s, ', "thought": "check ', w3, " ", w4, '"}'))
        .when(_when(working)).then(_cat('{"thought": "remember ', w3, '"}'))
        .when(_when(tagged)).then(pl.lit(f'{{"risk_node": true, "risk_tagged_at": "{tagged_at}", "source": "chat"}}'))
        .when(_when(~ordinary)).then(chat)
        .when(_when(t < 0.25)).then(pl.lit("{}"))
        .when(_when(t < 0.60)).then(chat)
        .when(_when(t < 0.85)).then(_cat('{"note": "', w3, " ", note_word, '", "source": "import"}'))
        .when(_when(t < 0.98)).then(_cat('{"tags": ["', w3, '", "', w4, '"], "pinned": false}'))
        .otherwise(_cat('{"ttl_hours": ', ttl_s, ', "source": "tool"}'))
    ).to_series()

    emb = None
    if c.spec.embeddings:
        erng = c.rng("node-embeddings")
        pcenters = _unit_vectors(erng, len(PREFIXES))
        emb = _unit_vectors(erng, nb, pcenters, prefix)

    df = pl.DataFrame([
        *c.common(nb),
        pl.Series("layer", np.where(working, "working", "semantic")).cast(pl.String),
        label.alias("label"),
        props.alias("properties"),
        pl.Series("importance", imp.astype(np.float64)),
        pl.Series("access_count", access.astype(np.int64)),
        _ts(created, "created_at"),
        _ts(updated, "updated_at"),
        _ts(last_decayed, "last_decayed_at"),
        pl.Series("version", (1 + rng.geometric(0.6, nb) - 1).astype(np.int64)),
    ]).with_columns(pl.when(_when(ld_null)).then(None).otherwise(pl.col("last_decayed_at")).alias("last_decayed_at"))
    if c.spec.embeddings:
        df = df.with_columns(_emb_series(emb, nb))

    if specials:
        sp = pl.DataFrame(specials, schema={
            "layer": pl.String, "label": pl.String, "properties": pl.String, "importance": pl.Float64,
            "access_count": pl.Int64, "created_at": pl.Int64, "updated_at": pl.Int64,
        }, orient="row")
        m = sp.height
        sp = pl.DataFrame([
            *c.common(m), sp["layer"], sp["label"], sp["properties"], sp["importance"], sp["access_count"],
            _ts(sp["created_at"].to_numpy(), "created_at"), _ts(sp["updated_at"].to_numpy(), "updated_at"),
            pl.Series("last_decayed_at", [None] * m, dtype=pl.Datetime("us", "UTC")),
            pl.Series("version", [2] * m, dtype=pl.Int64),
        ])
        if c.spec.embeddings:
            sp = sp.with_columns(_emb_series(_unit_vectors(c.rng("special-embeddings"), m), m))
        df = pl.concat([df, sp], how="vertical")
        updated = np.concatenate([updated, sp["updated_at"].dt.epoch("us").to_numpy()])
        created = np.concatenate([created, sp["created_at"].dt.epoch("us").to_numpy()])
        working = np.concatenate([working, np.zeros(m, dtype=bool)])
        recent = np.concatenate([recent, np.zeros(m, dtype=bool)])
        imp = np.concatenate([imp, sp["importance"].to_numpy()])

    total = df.height
    df = df.with_columns(c.ids("memory_nodes", total).alias("id"))
    info = {
        "updated": updated, "created": created, "working": working, "recent": recent,
        "bulk": np.arange(total) < nb, "hot": np.arange(total) < n_hot, "importance": imp,
    }
    return df, info


def _special_nodes(c: ScopeCtx) -> list[tuple]:
    """Protected nodes (SOUL edits, recent; AGENT_IDENTITY facts) and one expired thinking note."""
    rng = c.rng("special")
    now = c.now
    h = _h64(c.spec.seed, c.key)
    persona = PERSONAS[h % len(PERSONAS)]
    old_persona = PERSONAS[(h + 1) % len(PERSONAS)]

    def soul(value: str) -> str:
        return f'{{"_last_edited_by": "user_manual_edit", "value": "{_json_str(value)}"}}'

    def ago(lo_h: float, hi_h: float) -> int:
        return now - int(rng.uniform(lo_h, hi_h) * _HOUR)

    rows = []
    t_old_name = ago(14, 20)
    rows.append(("semantic", "SOUL:name", soul(old_persona), 7.0, 3, t_old_name - 40 * _DAY, t_old_name))
    for label, value, imp in (
        ("SOUL:name", persona, 9.0),
        ("SOUL:role", ROLES[h % len(ROLES)], 8.5),
        ("SOUL:personality", PERSONALITIES[(h >> 8) % len(PERSONALITIES)], 6.0),
        ("SOUL:favorite_color", COLORS[(h >> 16) % len(COLORS)], 2.0),
    ):
        t = ago(0.5, 12)
        rows.append(("semantic", label, soul(value), imp, 4, t - 30 * _DAY, t))
    t = ago(30 * 24, 40 * 24)
    mission = '{"value": "help customers succeed"}'
    rows.append(("semantic", "AGENT_IDENTITY:mission", mission, 9.5, 12, t - 10 * _DAY, t))
    t = ago(50 * 24, 60 * 24)
    rows.append(("semantic", "AGENT_IDENTITY:core_values", '{"value": "honesty, care"}', 2.0, 0, t - _DAY, t))
    # every scope has at least one thinking note whose 24 h TTL has run out (phase 8 has work)
    t = ago(30, 40)
    rows.append(("working", "note: scratch from an earlier turn", '{"ttl_hours": 24, "kind": "thinking"}', 3.0, 0, t, t))
    horizon = now - c.spec.days * _DAY
    return [(*r[:5], max(r[5], horizon), max(r[6], horizon)) for r in rows]
