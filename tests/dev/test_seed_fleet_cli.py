"""``deep-sleep seed --fleet N``: the fleet generator through the command line, into a fresh store."""

from __future__ import annotations

import uuid

from deep_sleep.cli import main
from deep_sleep.dev.fleet import FleetSpec, fleet_scope, generate_fleet
from deep_sleep.store.db import create_database, drop_database

NOW = "2026-11-30T03:00:00+00:00"


def test_seed_fleet_loads_every_table_of_every_scope(admin_dsn, capsys):
    name = f"ds_fleet_{uuid.uuid4().hex[:8]}"
    db = create_database(admin_dsn, name)
    try:
        assert main(["--dsn", db.dsn, "seed", "--fleet", "7", "--nodes", "30", "--seed", "5", "--now", NOW, "--recalls"]) == 0
        out = capsys.readouterr().out
        from datetime import datetime

        expected = generate_fleet(FleetSpec(scopes=7, nodes=30, seed=5, recalls=True, now=datetime.fromisoformat(NOW)))
        with db.pg() as con:
            for table, frame in expected.items():
                n = con.execute(f"SELECT count(*) FROM {table}").fetchone()[0]
                assert n == frame.height, table
            scopes = {r[0] for r in con.execute("SELECT DISTINCT scope_path FROM memory_nodes").fetchall()}
            embedded = con.execute("SELECT count(*) FROM memory_nodes WHERE embedding IS NOT NULL").fetchone()[0]
        assert scopes == {fleet_scope(i).path for i in range(7)}
        assert embedded == expected["memory_nodes"].height and expected["recall_events"].height > 0
        assert f"memory_nodes: {expected['memory_nodes'].height:,} rows" in out
        assert "fleet of 7 scopes" in out
    finally:
        drop_database(admin_dsn, name)


def test_seed_fleet_refuses_zero_scopes(admin_dsn, capsys):
    assert main(["--dsn", "postgresql://nobody@127.0.0.1:1/x?connect_timeout=1", "seed", "--fleet", "0"]) == 2
    err = capsys.readouterr().err
    assert "FleetSpec.scopes must be >= 1" in err and "Traceback" not in err
