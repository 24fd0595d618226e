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
