"""A seeded store as the live path writes it (issue 38 item 3): every node, event and skill with the
configured embedder's vector, the recall log with explicit feedback on a tenth of each scope's recalls."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import numpy as np
import polars as pl
import pytest

from deep_sleep.core.embedding import default_embedder, node_text
from deep_sleep.dev.errors import SeedError
from deep_sleep.dev.live import FEEDBACK_SHARE, RECALL_K, embed_texts, queries_per_scope
from deep_sleep.dev.seed import SeedSpec, generate

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
SPEC = SeedSpec(now=NOW, tenants=2, scopes_per_tenant=3, nodes_per_scope=100, embedding_model="hashing")


@pytest.fixture(scope="module")
def frames():
    return generate(SPEC)


def test_every_node_event_and_skill_has_the_models_vector(frames):
    import json

    model = default_embedder()
    for table in ("memory_nodes", "episodic_events", "procedural_skills"):
        f = frames[table]
        assert f.height and f["embedding"].null_count() == 0 and (f["embedding_model"] == model.name).all(), table
    nodes = frames["memory_nodes"].head(40)
    want = model.embed([node_text(label, json.loads(p)) for label, p in nodes.select("label", "properties").iter_rows()])
    assert np.array_equal(nodes["embedding"].to_numpy(), want)  # what record_turn (and reembed) would store
    events = frames["episodic_events"].tail(40)
    assert np.array_equal(events["embedding"].to_numpy(), model.embed(events["content"].to_list()))
    skills = frames["procedural_skills"].head(3)
    assert np.array_equal(skills["embedding"].to_numpy(),
                          model.embed([f"{n} {d}" for n, d in skills.select("name", "description").iter_rows()]))


def test_the_recall_log_is_the_live_recalls_with_feedback_on_a_tenth(frames):
    nodes, recalls = frames["memory_nodes"], frames["recall_events"]
    sizes = nodes.group_by("scope_path").len()
    per_query = recalls.group_by("scope_path", "query", "created_at").agg(
        pl.len().alias("hits"), pl.col("label").is_not_null().all().alias("fed"),
        pl.col("label").is_null().all().alias("unfed"), (pl.col("label") == 1.0).sum().alias("used"))
    assert recalls["id"].n_unique() == recalls.height and (per_query["hits"] == RECALL_K).all()
    # per scope max(20, nodes // 5) recalls, a tenth of them (at least one) labelled on every hit, one used
    got = per_query.group_by("scope_path").agg(pl.len().alias("q"), pl.col("fed").sum().alias("fed"))
    want = sizes.with_columns(pl.col("len").map_elements(queries_per_scope, return_dtype=pl.Int64).alias("q"))
    assert got.join(want, on="scope_path").filter(pl.col("q") != pl.col("q_right")).height == 0
    assert (got["fed"] == (got["q"] * FEEDBACK_SHARE).round(0).cast(pl.Int64).clip(lower_bound=1)).all()
    assert (per_query["fed"] ^ per_query["unfed"]).all() and (per_query.filter("fed")["used"] == 1).all()
    labelled = recalls.filter(pl.col("label").is_not_null())
    assert set(labelled["label"].unique()) == {0.0, 1.0} and (labelled["label_source"] == "explicit").all()
    assert 0.08 < labelled.height / recalls.height < 0.12
    # every hit is a node of the recall's own scope, created within the 48 h before now
    keyed = nodes.select("scope_path", pl.col("id").alias("node_id"))
    assert recalls.join(keyed, on=["scope_path", "node_id"], how="anti").height == 0
    assert recalls["created_at"].max() < NOW and recalls["created_at"].min() >= NOW.replace(day=18)


def test_a_recalls_hits_are_its_scopes_nearest_nodes_and_the_used_one_is_what_it_asked_about(frames):
    nodes, recalls = frames["memory_nodes"], frames["recall_events"]
    model = default_embedder()
    one = recalls.filter(pl.col("label") == 1.0).row(0, named=True)
    mine = nodes.filter(pl.col("scope_path") == one["scope_path"])
    sim = mine["embedding"].to_numpy() @ model.embed([one["query"]])[0]
    best = set(mine["id"].gather(np.argsort(-sim, kind="stable")[:RECALL_K]).to_list())
    hits = recalls.filter((pl.col("scope_path") == one["scope_path"]) & (pl.col("query") == one["query"])
                          & (pl.col("created_at") == one["created_at"]))
    assert set(hits["node_id"]) == best
    assert hits["similarity"].to_list() == sorted(hits["similarity"].to_list(), reverse=True)
    used = mine.filter(pl.col("id") == one["node_id"])["label"].item()
    assert one["query"].removeprefix("what about ") in used  # "what about alpha billing" ← "project: alpha billing 42"


def test_the_gate_measures_every_seeded_scope(frames):
    from deep_sleep.core import tables
    from deep_sleep.core.shard import Shard
    from deep_sleep.run.gate import recall_gate
    from deep_sleep.run.transform import transform
    from deep_sleep.transforms.config import ConsolidationConfig

    emb = frames["memory_nodes"].select("id", "embedding")
    snap = {n: tables.conform(n, f.drop("tenant_id", "embedding", "embedding_model", strict=False)) for n, f in frames.items()}
    shard = Shard.from_frames(dict.fromkeys(frames["memory_nodes"]["scope_path"].unique().sort().to_list()), NOW, snap)
    planned = transform(shard, ConsolidationConfig(), NOW)
    gates = recall_gate(planned.shard, planned.diff, ConsolidationConfig(), emb, now=NOW)
    assert len(gates) == 8 and {g.status for g in gates.values()} == {"measured"}


def test_embed_texts_embeds_each_distinct_text_once_in_chunks(monkeypatch):
    from deep_sleep.dev import live

    calls: list[list[str]] = []

    class Spy:
        dim, name = default_embedder().dim, "spy"

        def embed(self, texts):
            calls.append(list(texts))
            return default_embedder().embed(texts)

    monkeypatch.setattr(live, "EMBED_CHUNK", 2)
    texts = pl.Series(["b a", "a", None, "b a", "c", "a"])
    got = embed_texts(Spy(), texts)
    assert calls == [["b a", "a"], ["", "c"]]
    assert np.array_equal(got, default_embedder().embed(["b a", "a", "", "b a", "c", "a"]))


def test_the_seed_is_deterministic_and_refuses_two_kinds_of_vectors():
    small = SeedSpec(now=NOW, tenants=1, scopes_per_tenant=1, nodes_per_scope=60, embedding_model="hashing")
    a, b = generate(small), generate(small)
    assert all(a[t].equals(b[t]) for t in a)
    with pytest.raises(SeedError, match="exclude each other"):
        SeedSpec(now=NOW, embeddings=True, embedding_model="hashing")


def test_seed_tenants_writes_vectors_and_feedback_into_the_store(admin_dsn, capsys):
    from deep_sleep.cli import main
    from deep_sleep.store.db import create_database, drop_database

    name = f"ds_seed_{uuid.uuid4().hex[:8]}"
    db = create_database(admin_dsn, name)
    try:
        assert main(["--dsn", db.dsn, "seed", "--tenants", "2", "--scopes-per-tenant", "2", "--nodes", "60",
                     "--now", NOW.isoformat()]) == 0
        out = capsys.readouterr().out
        model = default_embedder().name
        with db.pg() as con:
            for table in ("memory_nodes", "episodic_events"):
                missing = con.execute(f"SELECT count(*) FROM {table} WHERE embedding IS NULL OR embedding_model <> %s",
                                      (model,)).fetchone()[0]
                assert missing == 0, table
            fed = con.execute("SELECT count(DISTINCT scope_path) FROM recall_events WHERE label = 1.0"
                              " AND label_source = 'explicit'").fetchone()[0]
        assert fed == 6
        assert "6 scopes (org/acme, org/acme/brand/core/conversation/support" in out and "vectors of hashing" in out
        assert len(out.splitlines()) < 15  # a summary, not one line per scope
    finally:
        drop_database(admin_dsn, name)
