"""One scope's small tables: procedural skills, prospective triggers, soul profiles, pending
connections, recall events and reranker models (a few rows each, up to ~n/50 for recall events)."""

from __future__ import annotations

import numpy as np
import polars as pl

from deep_sleep.dev.arrays import (
    _DAY,
    _HOUR,
    _US,
    ScopeCtx,
    _emb_series,
    _h64,
    _pick,
    _ts,
    _unit_vectors,
    _when,
)
from deep_sleep.dev.spec import PERSONAS, RELATION_P, RELATIONS, ROLES, WORDS


def gen_small(c: ScopeCtx, nodes: pl.DataFrame, info: dict[str, np.ndarray], index: int) -> dict[str, pl.DataFrame]:
    """The small per-scope tables (a few rows each, up to ~n/50 for recall events)."""
    rng = c.rng("small")
    now = c.now
    ts = pl.Datetime("us", "UTC")
    out: dict[str, pl.DataFrame] = {}

    # procedural skills
    skills = [
        ("deploy service", "Deploy the billing service safely", '["check the build", "deploy", "verify health"]',
         "active", "user", "deploy_service", 7),
        ("run migration", "Run the database migration", '["back up the database", "run the migration"]',
         "draft", "consolidation", "run_migration", 3),
        ("send weekly report", "Send the weekly report", '["collect metrics", "send email"]',
         "archived", "agent", None, 1),
    ]
    m = len(skills)
    created = now - rng.integers(10 * _DAY, 60 * _DAY, m)
    df = pl.DataFrame(skills, schema=["name", "description", "steps", "status", "source", "pattern_key", "occurrences"],
                      orient="row")
    out["procedural_skills"] = pl.DataFrame([
        c.ids("procedural_skills", m), *c.common(m), *df.iter_columns(),
        _emb_series(_unit_vectors(c.rng("skill-embeddings"), m) if c.spec.embeddings else None, m),
        _ts(created, "created_at"), _ts(created + rng.integers(0, 5 * _DAY, m), "updated_at"),
        pl.Series("version", [1] * m, dtype=pl.Int64),
    ]).with_columns(pl.col("occurrences").cast(pl.Int64))

    # prospective triggers
    trig = [
        ("when the user mentions the renewal", "remind about the discount offer", now - 2 * _HOUR, "pending"),
        ("every friday morning", "send the weekly summary", now + 3 * _DAY, "pending"),
        ("after the billing deploy", "check the error dashboard", now - 5 * _DAY, "fired"),
    ]
    m = len(trig)
    tc = np.array([t[2] for t in trig]) - 6 * _DAY
    out["prospective_triggers"] = pl.DataFrame([
        c.ids("prospective_triggers", m), *c.common(m),
        pl.Series("condition", [t[0] for t in trig]), pl.Series("action", [t[1] for t in trig]),
        _ts(np.array([t[2] for t in trig]), "due_at"), pl.Series("status", [t[3] for t in trig]),
        _ts(tc, "created_at"), _ts(tc, "updated_at"), pl.Series("version", [1] * m, dtype=pl.Int64),
    ])

    # soul profiles on every other scope
    if index % 2 == 0:
        h = _h64(c.spec.seed, c.key)
        kv = [("name", PERSONAS[(h + 3) % len(PERSONAS)]), ("role", ROLES[(h + 1) % len(ROLES)])]
        m = len(kv)
        out["soul_profiles"] = pl.DataFrame([
            c.ids("soul_profiles", m), *c.common(m),
            pl.Series("key", [k for k, _ in kv]), pl.Series("value", [v for _, v in kv]),
            _ts(now - rng.integers(2 * _DAY, 20 * _DAY, m), "updated_at"),
            pl.Series("version", [1] * m, dtype=pl.Int64),
        ])

    # pending connections: resolvable, unresolvable, self-loops
    sem = np.flatnonzero(info["bulk"] & ~info["working"])
    labels = nodes["label"]
    if len(sem):
        m = max(6, c.n // 100)
        s_lab = labels.gather(sem[rng.integers(0, len(sem), m)])
        t_lab = labels.gather(sem[rng.integers(0, len(sem), m)])
        r = rng.random(m)
        r[0], r[1] = 0.05, 0.2  # at least one unresolvable and one self-loop
        ghost = pl.concat_str([pl.lit("ghost: "), _pick(WORDS, rng.integers(0, len(WORDS), m))], separator="")
        t_lab = pl.select(pl.when(_when(r < 0.15)).then(ghost).when(_when(r < 0.25)).then(s_lab).otherwise(t_lab))
        t_lab = t_lab.to_series()
        out["pending_connections"] = pl.DataFrame([
            c.ids("pending_connections", m), *c.common(m),
            s_lab.alias("source_label"), t_lab.alias("target_label"),
            _pick(RELATIONS, rng.choice(len(RELATIONS), m, p=RELATION_P)).alias("relation"),
            pl.Series("weight", np.round(rng.uniform(0.5, 2.0, m), 2)),
            _ts(now - rng.integers(_US, _DAY, m), "created_at"),
            pl.Series("consumed_by_run", [None] * m, dtype=pl.String),
            pl.Series("outcome", [None] * m, dtype=pl.String),
            pl.Series("version", [1] * m, dtype=pl.Int64),
        ])

        # recall events: 12 features, mostly unlabelled, some explicit feedback
        m = max(10, c.n // 50)
        feats = np.round(rng.random((m, 12)), 4)
        sim = np.round(rng.uniform(0.3, 0.95, m), 4)
        fb = rng.random(m)
        label = np.where(fb < 0.1, 1.0, 0.0)
        explicit = fb < 0.2
        q = pl.concat_str([pl.lit("what about "), _pick(WORDS, rng.integers(0, len(WORDS), m)), pl.lit(" "),
                           _pick(WORDS, rng.integers(0, len(WORDS), m))])
        out["recall_events"] = pl.DataFrame([
            c.ids("recall_events", m), *c.common(m),
            pl.select(q).to_series().alias("query"),
            nodes["id"].gather(sem[rng.integers(0, len(sem), m)]).alias("node_id"),
            pl.Series("similarity", sim),
            pl.Series("features", feats).cast(pl.List(pl.Float64)),
            pl.Series("score", np.round(sim + rng.normal(0, 0.05, m), 4)),
            pl.Series("label", label).set(pl.Series(~explicit), None),
            pl.Series("label_source", ["explicit"] * m, dtype=pl.String).set(pl.Series(~explicit), None),
            pl.Series("trained_at", [None] * m, dtype=ts),
            _ts(now - rng.integers(_US, 48 * _HOUR, m), "created_at"),
            pl.Series("version", [1] * m, dtype=pl.Int64),
        ])

    # a reranker on every other scope
    if index % 2 == 1:
        out["reranker_models"] = pl.DataFrame([
            c.ids("reranker_models", 1), *c.common(1),
            pl.Series("weights", [np.round(rng.normal(0, 0.1, 12), 4).tolist()], dtype=pl.List(pl.Float64)),
            pl.Series("bias", [0.01]), pl.Series("steps", [int(rng.integers(1, 30))], dtype=pl.Int64),
            _ts(np.array([now - 2 * _DAY]), "updated_at"), pl.Series("version", [1], dtype=pl.Int64),
        ])
    return out
