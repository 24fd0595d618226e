"""The fleet generator: many scopes, each a realistic copy of a template with its own ids, loadable."""

from __future__ import annotations

from datetime import UTC, datetime

import polars as pl

from deep_sleep.dev.fleet import FleetSpec, fleet_scope, generate_fleet, iter_fleet
from deep_sleep.dev.seed import load

NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
SPEC = FleetSpec(scopes=45, nodes=40, templates=4, now=NOW)


def test_every_scope_has_its_own_rows_ids_and_references():
    frames = generate_fleet(SPEC)
    nodes, edges = frames["memory_nodes"], frames["memory_edges"]
    assert nodes["scope_path"].n_unique() == 45
    assert set(nodes["scope_path"].unique()) == {fleet_scope(i).path for i in range(45)}
    assert (nodes["tenant_id"] == nodes["scope_path"].str.split("\x1f").list.get(1)).all()
    for table, frame in frames.items():
        if "id" in frame.columns and frame.height:
            assert frame["id"].n_unique() == frame.height, table
    # every edge end, access and recall points at a node of its own scope
    keyed = nodes.select("scope_path", pl.col("id").alias("ref"))
    for table, cols in (("memory_edges", ("source_id", "target_id")), ("memory_access_log", ("node_id",)),
                        ("recall_events", ("node_id",))):
        for col in cols:
            refs = frames[table].filter(pl.col(col).is_not_null()).select("scope_path", pl.col(col).alias("ref"))
            assert refs.height and refs.join(keyed, on=["scope_path", "ref"], how="anti").height == 0, (table, col)
    # scopes 0 and 4 copy the same template: the same rows but for scope and ids
    a = nodes.filter(pl.col("scope_path") == fleet_scope(0).path)
    b = nodes.filter(pl.col("scope_path") == fleet_scope(4).path)
    assert a.drop("id", "scope_path", "tenant_id").equals(b.drop("id", "scope_path", "tenant_id"))
    assert not set(a["id"]) & set(b["id"])
    assert edges.height > nodes.height  # ~1.5 edges per node, as the seed makes them


def test_deterministic_and_chunks_add_up():
    whole = generate_fleet(SPEC)
    again = generate_fleet(SPEC)
    chunks = list(iter_fleet(SPEC, scopes_per_chunk=20))
    assert len(chunks) == 3
    for table in whole:
        assert whole[table].equals(again[table]), table
        assert pl.concat([c[table] for c in chunks]).equals(whole[table]), table


def test_fleet_loads_into_the_store(store):
    frames = generate_fleet(FleetSpec(scopes=6, nodes=30, templates=2, now=NOW, seed=99))
    counts = load(store, frames)
    assert counts["memory_nodes"] == frames["memory_nodes"].height
    with store.pg() as con:
        n = con.execute("SELECT count(DISTINCT scope_path) FROM memory_nodes WHERE scope_path LIKE %s",
                        ("org\x1ff000000\x1fagent%",)).fetchone()[0]
    assert n >= 6


# -- recalls: embeddings and recall events with feedback (the gate's inputs) -------------------

RECALLS = FleetSpec(scopes=48, nodes=60, templates=4, now=NOW, recalls=True)


def test_recalls_give_every_node_the_online_embedding_and_log_hits_with_feedback():
    from deep_sleep.core.embedding import default_embedder
    from deep_sleep.core.tables import EMBEDDING_DIM

    frames = generate_fleet(RECALLS)
    nodes, recalls = frames["memory_nodes"], frames["recall_events"]
    name = default_embedder().name
    for table in ("memory_nodes", "episodic_events", "procedural_skills"):  # every row's vector, of the model
        f = frames[table]
        assert f["embedding"].dtype == pl.Array(pl.Float32, EMBEDDING_DIM) and f["embedding"].null_count() == 0, table
        assert (f["embedding_model"] == name).all(), table
    events = frames["episodic_events"].head(3)
    assert (events["embedding"].to_numpy() == default_embedder().embed(events["content"].to_list())).all()
    plain = nodes.filter(pl.col("properties") == "{}").head(3)  # no strings in the properties: the label's vector
    want = default_embedder().embed(plain["label"].to_list())
    assert plain.height and (plain["embedding"].to_numpy() == want).all()
    # one row per hit (the live default k = 5), every hit a node of its own scope, ids distinct
    assert recalls["id"].n_unique() == recalls.height
    per_query = recalls.group_by("scope_path", "query").agg(pl.len().alias("n"), (pl.col("label") == 1.0).sum().alias("used"),
                                                          pl.col("label").is_null().all().alias("none"),
                                                          pl.col("label").is_null().any().alias("some_null"))
    assert per_query["n"].max() == 5 and per_query["scope_path"].n_unique() == 48
    # a query has feedback on all its hits (exactly one used) or on none
    assert ((per_query["used"] == 1) ^ per_query["none"]).all() and ((per_query["used"] == 0) | ~per_query["some_null"]).all()
    labelled = recalls.filter(pl.col("label").is_not_null())
    assert set(labelled["label"].unique()) == {0.0, 1.0} and (labelled["label_source"] == "explicit").all()
    assert recalls.filter(pl.col("label").is_null())["label_source"].null_count() == recalls.height - labelled.height
    # feedback is drawn per (scope, query): two copies of one template differ; a tenth of each scope's queries
    # (at least one) have it, so every scope has a used memory for the gate
    a, b = (recalls.filter(pl.col("scope_path") == fleet_scope(i).path)["label"] for i in (0, 4))
    by_scope = [recalls.filter(pl.col("scope_path") == fleet_scope(i).path)["label"].to_list() for i in range(0, 48, 4)]
    assert len({tuple(x) for x in by_scope}) > 1 and a.len() == b.len()
    fed = per_query.group_by("scope_path").agg(pl.len().alias("queries"), (~pl.col("none")).sum().alias("fed"))
    assert (fed["fed"] == (fed["queries"] * 0.1).round(0).cast(pl.Int64).clip(lower_bound=1)).all()
    assert 0.05 < labelled.height / recalls.height < 0.15


def test_recalls_are_deterministic_and_chunks_add_up():
    whole = generate_fleet(RECALLS)
    again = generate_fleet(RECALLS)
    chunks = list(iter_fleet(RECALLS, scopes_per_chunk=20))
    for table in whole:
        assert whole[table].equals(again[table]), table
        assert pl.concat([c[table] for c in chunks]).equals(whole[table]), table
    off = generate_fleet(SPEC)
    assert "embedding" not in off["memory_nodes"].columns


def test_some_fleet_scopes_fail_the_gate_because_prune_takes_a_used_memory():
    from deep_sleep.core import tables
    from deep_sleep.core.shard import Shard
    from deep_sleep.run.gate import recall_gate
    from deep_sleep.run.transform import transform
    from deep_sleep.transforms.config import ConsolidationConfig

    frames = generate_fleet(FleetSpec(scopes=48, nodes=100, templates=16, now=NOW, recalls=True))
    emb = frames["memory_nodes"].select("id", "embedding")
    snap = {n: tables.conform(n, f.drop("tenant_id", "embedding", "embedding_model", strict=False)) for n, f in frames.items()}
    shard = Shard.from_frames({fleet_scope(i).path: None for i in range(48)}, NOW, snap)
    planned = transform(shard, ConsolidationConfig(), NOW)
    gates = recall_gate(planned.shard, planned.diff, ConsolidationConfig(), emb, now=NOW)
    gated = [g for g in gates.values() if g.queries]
    assert all(g.status == "measured" for g in gated)  # a gate that replayed queries measured them
    failed = [s for s, g in gates.items() if g.failed]
    assert len(gated) > 36 and all(g.recall_before > 0.5 for g in gated)  # the used memories are found before
    assert 0 < len(failed) < 16
    deleted = set(planned.diff.tables["memory_nodes"].deletes["id"])
    used = frames["recall_events"].filter(pl.col("label") == 1.0)
    for s in failed:  # each failure is a used memory the diff deletes (or ranks out of the top k)
        mine = used.filter(pl.col("scope_path") == s)
        assert set(mine["node_id"]) & deleted or gates[s].drop_pp < 50, s


def test_a_fleet_with_recalls_loads_its_embeddings(store):
    from deep_sleep.store.vectors import node_embeddings

    spec = FleetSpec(scopes=3, nodes=30, templates=2, now=NOW, seed=98, recalls=True)
    # under a tenant of its own (the session's store may hold another test's fleet at the same paths)
    frames = {n: f.with_columns(pl.col("scope_path").str.replace("f000000", "frecalls", literal=True),
                                pl.lit("frecalls").alias("tenant_id"))
              for n, f in generate_fleet(spec).items()}
    counts = load(store, frames)
    assert counts["recall_events"] == frames["recall_events"].height
    got = node_embeddings(store, frames["memory_nodes"]["scope_path"].unique()).sort("id")
    want = frames["memory_nodes"].select("id", "embedding").sort("id")
    assert got["id"].equals(want["id"])
    assert (got["embedding"].to_numpy() == want["embedding"].to_numpy()).all()
