"""``deep-sleep seed --fleet N``: the fleet generator through the command line, into a fresh store."""

from __future__ import annotations

import uuid

from deep_sleep.cli import main
from deep_sleep.core.embedding import default_embedder
from deep_sleep.dev.fleet import FleetSpec, fleet_scope, generate_fleet
from deep_sleep.store.db import create_database, drop_database

NOW = "2026-11-30T03:00:00+00:00"


def test_seed_fleet_loads_every_table_of_every_scope(admin_dsn, capsys):
    name = f"ds_fleet_{uuid.uuid4().hex[:8]}"
    db = create_database(admin_dsn, name)
    try:
        assert main(["--dsn", db.dsn, "seed", "--fleet", "7", "--nodes", "30", "--seed", "5", "--now", NOW]) == 0
        out = capsys.readouterr().out
        from datetime import datetime

        expected = generate_fleet(FleetSpec(scopes=7, nodes=30, seed=5, recalls=True, now=datetime.fromisoformat(NOW)))
        with db.pg() as con:
            for table, frame in expected.items():
                n = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                assert n == frame.height, table
            scopes = {r[0] for r in con.execute("SELECT DISTINCT scope_path FROM memory_nodes").fetchall()}
            # every node and event with the configured (default: hashing) embedder's vector, some recalls labelled
            embedded = {t: con.execute(f"SELECT count(*) FILTER (WHERE embedding IS NOT NULL AND embedding_model = %s),"
                                       f" count(*) FROM {t}", (default_embedder().name,)).fetchone()
                        for t in ("memory_nodes", "episodic_events")}
            labels = con.execute("SELECT count(*) FROM recall_events WHERE label_source = 'explicit'").fetchone()[0]
        assert scopes == {fleet_scope(i).path for i in range(7)}
        assert all(n == total > 0 for n, total in embedded.values()), embedded
        assert labels >= 7 and expected["recall_events"].height > labels
        assert f"memory_nodes: {expected['memory_nodes'].height:,} rows" in out
        assert "fleet of 7 scopes" in out
    finally:
        drop_database(admin_dsn, name)


def test_seed_fleet_refuses_zero_scopes(admin_dsn, capsys):
    assert main(["--dsn", "postgresql://nobody@127.0.0.1:1/x?connect_timeout=1", "seed", "--fleet", "0"]) == 2
    err = capsys.readouterr().err
    assert "FleetSpec.scopes must be >= 1" in err and "Traceback" not in err


def test_seed_fleet_in_chunks_loads_the_whole_fleet_and_rebuilds_the_indexes_once(admin_dsn, monkeypatch):
    from datetime import datetime

    from deep_sleep.dev import load as loader
    from deep_sleep.dev.fleet import seed_fleet

    name = f"ds_fleet_{uuid.uuid4().hex[:8]}"
    db = create_database(admin_dsn, name)
    catalog = """SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'
                 UNION ALL SELECT conrelid::regclass::text, conname, pg_get_constraintdef(oid) FROM pg_constraint
                 WHERE connamespace = 'public'::regnamespace ORDER BY 1, 2, 3"""
    executed: list[str] = []
    try:
        with db.pg() as con:
            before = con.execute(catalog).fetchall()
        monkeypatch.setattr(loader, "REBUILD_MIN_ROWS", 200)  # the big tables take the detach/rebuild path
        real = loader._detach_indexes
        monkeypatch.setattr(loader, "_detach_indexes", lambda cur, table: executed.append(table) or real(cur, table))
        spec = FleetSpec(scopes=7, nodes=30, seed=5, templates=3, now=datetime.fromisoformat(NOW))
        lines: list[str] = []
        counts = seed_fleet(db, spec, progress=lines.append, scopes_per_chunk=3)
        expected = generate_fleet(spec)
        assert counts == {t: f.height for t, f in expected.items()}
        assert sum(line.startswith("chunk ") for line in lines) == 3 and any("indexes rebuilt" in x for x in lines)
        # each big table detached once (on its first chunk), not per chunk; the catalog restored exactly
        assert sorted(executed) == sorted(set(executed)) and "memory_edges" in executed
        with db.pg() as con:
            assert con.execute(catalog).fetchall() == before
            for table, frame in expected.items():
                if "id" in frame.columns and frame.height:
                    ids = sorted(r[0] for r in con.execute(f"SELECT id::text FROM {table}").fetchall())
                    assert ids == sorted(frame["id"].to_list()), table
    finally:
        drop_database(admin_dsn, name)
