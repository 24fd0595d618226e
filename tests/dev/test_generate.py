"""The synthetic store generator (deep_sleep.dev.generate, from a deep_sleep.dev.spec.SeedSpec): pure, deterministic, realistic."""

from __future__ import annotations

import json
import re
import time
import uuid
from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import pytest

from deep_sleep.core.errors import InputError
from deep_sleep.core.scope import Scope
from deep_sleep.core.tables import EMBEDDING_DIM, TABLES, schema
from deep_sleep.dev.seed import SeedSpec, generate, scopes_of
from deep_sleep.dev.spec import NEAR_MISSES, PREFIXES, RELATIONS, WORDS

NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
DAY = timedelta(days=1)
SPEC = SeedSpec(now=NOW, legacy_rows=30)
UUID_RE = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
# SPEC §3 phase 2: marker words matched case-insensitively at a word start
MARKER_RE = re.compile(r"\b(risk|danger|failure|loss|negative|decline|warning|critical|error|threat)", re.I)
PROTECTED = ("SOUL:", "AGENT_IDENTITY:")


@pytest.fixture(scope="module")
def frames() -> dict[str, pl.DataFrame]:
    return generate(SPEC)


# A database of its own on the session's test server (conftest's `admin_dsn`), not the shared


def _prefix(label: str) -> str:
    head = label.split(":", 1)[0] if ":" in label else label.split()[0]
    return head.casefold()


# -- generation ---------------------------------------------------------------------------------


def test_generate_is_deterministic(frames):
    again = generate(SeedSpec(now=NOW, legacy_rows=30))
    assert frames.keys() == again.keys() == TABLES.keys()
    for table in frames:
        assert frames[table].equals(again[table]), table
    other = generate(SeedSpec(now=NOW, legacy_rows=30, seed=8))
    assert set(other["memory_nodes"]["id"]).isdisjoint(frames["memory_nodes"]["id"])


def test_spec_now_defaults_to_the_wall_clock_and_must_be_aware():
    spec = SeedSpec()
    assert spec.now.tzinfo is not None and spec.now.microsecond == 0
    assert abs(datetime.now(UTC) - spec.now) < timedelta(minutes=1)
    with pytest.raises(ValueError, match="timezone-aware"):
        SeedSpec(now=datetime(2025, 1, 1))
    with pytest.raises(InputError, match=r"SeedSpec.nodes_per_scope must be >= 1, got 0"):  # SeedError: of the family
        SeedSpec(nodes_per_scope=0)


def test_frames_have_the_snapshot_schema(frames):
    for table, df in frames.items():
        expected = dict(schema(table))
        if table == "memory_access_log":
            del expected["id"]
            expected["tenant_id"] = pl.String()
        assert dict(df.schema) == expected, table
        assert "embedding" not in df.columns or table == "procedural_skills"
    for table in ("memory_nodes", "memory_edges", "episodic_events", "procedural_skills"):
        ids = frames[table]["id"]
        assert ids.n_unique() == len(ids)
        assert ids.str.contains(UUID_RE.pattern).all()
        assert str(uuid.UUID(ids[0])) == ids[0]
    for table, df in frames.items():
        for col in TABLES[table]:
            if col.kind == "json" and col.name in df.columns:
                for text in df[col.name]:
                    json.loads(text)


def test_scopes_and_tenants(frames):
    scopes = scopes_of(SPEC)
    assert len(scopes) == SPEC.tenants * (1 + SPEC.scopes_per_tenant)
    assert sum(s.depth == 1 for s in scopes) == SPEC.tenants
    leaf = next(s for s in scopes if s.depth > 1)
    assert leaf.parent.parent.path in {s.path for s in scopes}
    paths = {s.path for s in scopes}
    for table, df in frames.items():
        rows = df.filter(pl.col("scope_path").is_not_null())
        assert set(rows["scope_path"]) <= paths, table
        for path, tenant in rows.select("scope_path", "tenant_id").unique().iter_rows():
            assert Scope.parse(path).tenant_id == tenant
    nodes = frames["memory_nodes"]
    assert set(nodes["scope_path"].drop_nulls()) == paths  # every scope, org scopes too, holds nodes
    legacy = nodes.filter(pl.col("scope_path").is_null())
    assert legacy.height == SPEC.legacy_rows
    assert set(legacy["tenant_id"]) == {s.tenant_id for s in scopes}
    assert frames["memory_edges"].filter(pl.col("scope_path").is_null()).height > 0
    one = scopes_of(SeedSpec(now=NOW, tenants=1, scopes_per_tenant=0, nodes_per_scope=500))
    assert [s.depth for s in one] == [1]
    single = generate(SeedSpec(now=NOW, tenants=1, scopes_per_tenant=0, nodes_per_scope=500))
    assert single["memory_nodes"].height == 500


def test_nodes_are_realistic(frames):
    nodes = frames["memory_nodes"].filter(pl.col("scope_path").is_not_null())
    sem = nodes.filter(pl.col("layer") == "semantic")
    assert nodes["importance"].is_between(1.0, 10.0).all()
    assert 0.02 < (sem["importance"] == 10.0).mean() < 0.1
    assert (sem["importance"] < 4).mean() > 0.08
    assert (nodes["created_at"] <= nodes["updated_at"]).all()
    assert (nodes["updated_at"] <= NOW).all() and (nodes["created_at"] >= NOW - SPEC.days * DAY).all()
    assert (nodes["last_decayed_at"].is_null()).mean() > 0.5
    assert ((nodes["last_decayed_at"] > NOW - DAY) & (nodes["last_decayed_at"] <= NOW)).sum() > 0

    for path, group in sem.group_by("scope_path"):
        recent = (group["updated_at"] > NOW - DAY).mean()
        assert 0.08 < recent < 0.45, (path, recent)
        ordinary = group.filter(~pl.any_horizontal(pl.col("label").str.starts_with(p) for p in PROTECTED))
        sizes = ordinary["label"].map_elements(_prefix, return_dtype=pl.String).value_counts()
        assert (sizes["count"] >= 3).sum() >= (3 if Scope.parse(path[0]).depth > 1 else 1), path
        labels = set(group["label"])
        assert {"SOUL:name", "SOUL:role", "SOUL:personality", "SOUL:favorite_color"} <= labels
        assert any(label.startswith("AGENT_IDENTITY:") for label in labels)

    # recent nodes close in time exist (phase 1.5 input)
    recent = sem.filter(pl.col("updated_at") > NOW - DAY).sort("scope_path", "updated_at")
    gaps = recent.group_by("scope_path").agg(pl.col("updated_at").diff().dt.total_seconds().alias("gap")).explode("gap")
    assert (gaps["gap"] <= 900).sum() > 20

    labels = sem["label"].to_list()
    assert sum(bool(MARKER_RE.search(x)) for x in labels) > 5
    assert any(w in x for x in labels for w in ("terror", "asterisk", "brisket", "nonnegative"))
    assert sum(bool(MARKER_RE.search(x)) for x in sem["properties"]) > 5
    assert not any(MARKER_RE.search(w) for w in WORDS + PREFIXES)
    assert not any(MARKER_RE.search(w) for w in NEAR_MISSES)

    soul = sem.filter(pl.col("label").str.starts_with("SOUL:"))
    props = [json.loads(p) for p in soul["properties"]]
    assert all(p["_last_edited_by"] == "user_manual_edit" and p["value"] for p in props)
    assert (soul["updated_at"] > NOW - DAY).all()

    semantic_ttl = sem.filter(pl.col("properties").str.contains('"ttl_hours"'))
    assert semantic_ttl.height > 0

    working = nodes.filter(pl.col("layer") == "working").with_columns(
        ttl=pl.col("properties").str.json_path_match("$.ttl_hours").cast(pl.Int64)
    )
    assert 0.02 < working.height / nodes.height < 0.1
    assert set(working["ttl"].drop_nulls()) <= {1, 4, 24, 72}
    expired = working.filter(pl.col("ttl").is_not_null()).select(
        (pl.col("updated_at") + pl.duration(hours=pl.col("ttl")) <= NOW).alias("x")
    )["x"]
    assert expired.sum() > 0 and (~expired).sum() > 0 and working["ttl"].null_count() > 0


def test_access_log_is_realistic(frames):
    log = frames["memory_access_log"]
    nodes = frames["memory_nodes"].select("id", "layer", "created_at", pl.col("scope_path").alias("node_scope"))
    joined = log.join(nodes, left_on="node_id", right_on="id", how="left")
    assert joined["layer"].null_count() == 0
    assert (joined["scope_path"] == joined["node_scope"]).all()
    assert (joined["accessed_at"] <= NOW).all() and (joined["accessed_at"] >= joined["created_at"]).all()
    assert set(log["kind"]) == {"read", "write"}
    recent = joined.filter((pl.col("accessed_at") > NOW - DAY) & (pl.col("layer") == "semantic"))
    per_node = recent.group_by("node_id").len()
    assert (per_node["len"] >= 2).sum() > 20 and (per_node["len"] == 1).sum() > 5
    semantic = frames["memory_nodes"].filter(pl.col("layer") == "semantic").height
    assert 0.05 < per_node.height / semantic < 0.2
    assert (joined["accessed_at"] <= NOW - DAY).sum() > 0


def test_edges_are_realistic(frames):
    edges = frames["memory_edges"]
    nodes = frames["memory_nodes"]
    assert 1.3 < edges.height / nodes.height < 1.7
    assert set(edges["relation"]) == set(RELATIONS)
    assert (edges["source_id"] != edges["target_id"]).all()
    assert edges.select("scope_path", "source_id", "target_id", "relation").is_unique().all()
    assert (edges["weight"] >= 0).all() and edges["valid_to"].is_null().all()
    ends = nodes.select("id", "layer", "created_at", pl.col("scope_path").alias("node_scope"))
    for end in ("source_id", "target_id"):
        j = edges.join(ends, left_on=end, right_on="id", how="left")
        assert j["layer"].null_count() == 0
        assert (j["layer"] == "semantic").all()
        assert (j["scope_path"].eq_missing(j["node_scope"])).all()
        assert (j["created_at_right"] <= j["created_at"]).all()
    assert ((edges["created_at"] <= edges["updated_at"]) & (edges["updated_at"] <= NOW)).all()
    functional = (
        edges.filter(pl.col("relation").is_in(["is", "lives_in"]))
        .group_by("scope_path", "source_id", "relation")
        .agg(pl.col("target_id").n_unique())
    )
    assert (functional["target_id"] >= 2).sum() >= 2 * SPEC.tenants * SPEC.scopes_per_tenant
    degree = pl.concat([edges.select(n="source_id"), edges.select(n="target_id")]).group_by("n").len()
    sem = nodes.filter(pl.col("layer") == "semantic").join(degree, left_on="id", right_on="n", how="left")
    assert (sem["len"].fill_null(0) <= 1).mean() > 0.1  # orphans for phase 3


def test_episodic_events_are_realistic(frames):
    events = frames["episodic_events"].filter(pl.col("scope_path").is_not_null())
    nodes = frames["memory_nodes"]
    per_scope = events.group_by("scope_path").len()
    assert per_scope.height == len(scopes_of(SPEC)) and (per_scope["len"] > 100).all()
    assert (events["created_at"] <= NOW).all()
    assert 12 <= events["session_id"].n_unique() / per_scope.height <= 60
    week = events.filter(pl.col("created_at") > NOW - 7 * DAY)
    found = 0
    for path, group in week.group_by("scope_path"):
        labels = set(nodes.filter(pl.col("scope_path") == path[0])["label"])
        pairs: dict[tuple[str, ...], int] = {}
        for content in group["content"]:
            refs = re.findall(r"\[semantic:([^\]]+)\]", content)
            if len(refs) >= 2 and all(r in labels for r in refs):
                key = tuple(sorted(refs))
                pairs[key] = pairs.get(key, 0) + 1
        found += any(v > 2 for v in pairs.values())
    assert found == per_scope.height
    text = " ".join(events["content"])
    assert "[SOUL:name]" in text and "I deployed the billing service." in text and "Then I ran the migration." in text
    assert "[semantic:ghost " in text
    meta = events["metadata"].str.json_path_match("$.action_type").drop_nulls()
    assert "deploy_service" in set(meta) and meta.value_counts()["count"].max() >= 3


def test_small_tables(frames):
    scopes = len(scopes_of(SPEC))
    skills = frames["procedural_skills"]
    assert set(skills["status"]) >= {"active", "draft"} and skills.height >= 2 * scopes
    assert frames["prospective_triggers"].height >= scopes
    souls = frames["soul_profiles"]
    assert set(souls["key"]) == {"name", "role"} and 0 < souls["scope_path"].n_unique() < scopes
    pending = frames["pending_connections"]
    assert pending["consumed_by_run"].is_null().all()
    assert (pending["source_label"] == pending["target_label"]).any()
    labels = set(frames["memory_nodes"]["label"])
    assert not set(pending["target_label"]) <= labels and set(pending["target_label"]) & labels
    recalls = frames["recall_events"]
    assert (recalls["features"].list.len() == 12).all()
    assert recalls["label"].null_count() > recalls.height / 2 and recalls["label"].drop_nulls().len() > 0
    assert set(recalls["node_id"]) <= set(frames["memory_nodes"]["id"])
    assert 0 < frames["reranker_models"].height <= scopes
    assert (frames["reranker_models"]["weights"].list.len() == 12).all()


def test_embeddings_are_deterministic_unit_vectors():
    spec = SeedSpec(now=NOW, tenants=1, scopes_per_tenant=1, nodes_per_scope=60, embeddings=True)
    a, b = generate(spec), generate(spec)
    for table in ("memory_nodes", "episodic_events", "procedural_skills"):
        emb = a[table]["embedding"]
        assert emb.dtype == pl.Array(pl.Float32, EMBEDDING_DIM) and emb.null_count() == 0
        norms = np.linalg.norm(emb.to_numpy(), axis=1)
        assert np.allclose(norms, 1.0, atol=1e-4)
        assert a[table].equals(b[table])


def test_100k_nodes_generate_quickly():
    spec = SeedSpec(now=NOW, tenants=1, scopes_per_tenant=0, nodes_per_scope=100_000)
    start = time.perf_counter()
    out = generate(spec)
    took = time.perf_counter() - start
    print(f"\ngenerate 100k nodes in one scope: {took:.2f}s; " + ", ".join(f"{t}={df.height}" for t, df in out.items()))
    assert out["memory_nodes"].height == 100_000
    assert out["memory_nodes"]["id"].n_unique() == 100_000
    assert out["episodic_events"].height == 20_000


def test_every_scope_has_phase_two_cases(frames):
    recent = frames["memory_nodes"].filter(
        pl.col("scope_path").is_not_null() & (pl.col("layer") == "semantic") & (pl.col("updated_at") > NOW - DAY)
    )
    for path, group in recent.group_by("scope_path"):
        labels, props = group["label"].to_list(), group["properties"].to_list()
        untagged = [lab for lab, p in zip(labels, props) if MARKER_RE.search(lab) and '"risk_node"' not in p]
        assert len(untagged) >= 2, path
        assert any(MARKER_RE.search(lab) and '"risk_node": true' in p for lab, p in zip(labels, props)), path
        assert any(w in lab for lab in labels for w in NEAR_MISSES), path
        assert any(not MARKER_RE.search(lab) and MARKER_RE.search(p) for lab, p in zip(labels, props)), path
