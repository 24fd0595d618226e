"""``nightly --plan`` (issue 16 item 1, SPEC §9 "Plan"): the nightly's shards without their apply stage.
Through the real flow on a store of its own: nothing changes in the store, the night's artifact and
the CLI show the records (an id, its label, before → after), every shard's diff directory holds
every record in ``preview.parquet`` with the rows the apply would hold, and a night without
``--plan`` at the same ``as_of`` then applies exactly that (the same diff hash per scope)."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest

from deep_sleep.core.diff import KINDS
from deep_sleep.core.scope import Scope
from deep_sleep.run.preview import PREVIEW_FILE
from tests.storeutil import (
    create_database,
    drop_database,
    dump,
    insert,
    node,
    scalar,
    small_graph,
)

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def fleet(admin_dsn):
    """Four scopes on a database of their own: three due — ``a`` with a weak old node (pruned: 1 of
    its 6 semantic nodes, so the holds policy holds it) and a stale one (decayed), ``b`` and ``c``
    with the small graph — and ``d``, consolidated an hour ago (not due)."""
    store = create_database(admin_dsn, f"ds_plan_{os.getpid()}")
    a, b, c, d = (Scope.root("org", "planco").child("brand", x) for x in "abcd")
    ids = {s.display(): small_graph(store, s, NOW) for s in (a, b, c, d)}
    weak = node(a, "trivia: old weak fact", NOW - timedelta(days=10), importance=2.0)
    stale = node(a, "project: stale plan", NOW - timedelta(days=40), importance=5.0)
    insert(store, "memory_nodes", [weak, stale])
    with store.pg() as con:
        con.execute("INSERT INTO consolidation_runs (run_id, scope_path, mode, as_of, started_at, status) "
                    "VALUES (gen_random_uuid(), %s, 'nightly', %s, %s, 'applied')", (d.path, NOW - timedelta(hours=1), NOW))
        con.commit()
    yield store, (a, b, c, d), {"weak": weak["id"], "stale": stale["id"], **ids}
    drop_database(admin_dsn, f"ds_plan_{os.getpid()}")


def _diff_rows(diff_dir: Path) -> int:
    """Rows of a diff directory's own ``<table>.<kind>.parquet`` files (not those under ``held/``)."""
    return sum(pl.scan_parquet(f).select(pl.len()).collect().item() for kind in KINDS
               for f in diff_dir.glob(f"*.{kind}.parquet"))


def _artifact(key: str) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey
    from prefect.client.schemas.sorting import ArtifactSort

    with get_client(sync_client=True) as client:
        found = client.read_artifacts(artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=[key])),
                                      sort=ArtifactSort.CREATED_DESC, limit=1)
    assert found, f"no {key} artifact"
    return found[0].data


@pytest.mark.flow
def test_nightly_plan_shows_every_record_applies_nothing_and_the_night_applies_it(prefect_harness, fleet, tmp_path,
                                                                                  capsys, monkeypatch):
    from deep_sleep.flows.nightly import NightlyParameters, run_nightly

    from deep_sleep.cli import main

    store, (a, b, c, d), ids = fleet
    scopes = (a, b, c, d)
    before = {s: dump(store, s) for s in scopes}
    params = NightlyParameters(as_of=NOW, dsn=store.dsn, runs_dir=str(tmp_path / "runs"), data_quality=False,
                               shard_scopes=2, plan=True)  # shards [a, b] and [c]: both directory layouts
    summary = run_nightly(params)

    # nothing applied: every table of every scope as before, no ledger row but d's old one
    assert {s: dump(store, s) for s in scopes} == before
    assert scalar(store, "SELECT count(*) FROM consolidation_runs") == 1
    assert (summary["due"], summary["planned"], summary["failed"], summary["skipped"]) == (3, 3, 0, 1)

    # the artifact is the summary's text: the fleet, then the records, an id with its label and before → after
    text = _artifact("deep-sleep-night-plan")
    assert text == summary["markdown"]
    assert "4 scope(s): 3 due (3 planned, 0 failed), 1 skipped" in text and "nothing was applied" in text
    assert "| strengthen | memory_nodes | update | 9 | 0 |" in text  # 3 hot nodes in each of 3 scopes
    assert f"| {ids['stale'][:8]} | project: stale plan | importance 5.0 → 4.5; " in text
    assert f"| {ids['weak'][:8]} | trivia: old weak fact | deleted (archived) |" in text
    assert f"| prune_orphans | nodes delete | {ids['weak'][:8]} | trivia: old weak fact | delete_share |" in text
    assert text.index(a.display()) < text.index(b.display())  # most records first
    hot = ids[b.display()]["hot"][0]
    assert f"| {hot[:8]} | project: hot 0 | importance 5.0 → 5.5 |" in text

    # every record of every diff, complete, in each shard's diff directory
    rows = {r["scope"]: r for r in summary["rows"]}
    shard_dir, single_dir = Path(rows[a.display()]["diff_uri"]), Path(rows[c.display()]["diff_uri"])
    assert rows[b.display()]["diff_uri"] == str(shard_dir) != str(single_dir)
    shard, single = pl.read_parquet(shard_dir / PREVIEW_FILE), pl.read_parquet(single_dir / PREVIEW_FILE)
    assert shard.height == _diff_rows(shard_dir) and single.height == _diff_rows(single_dir) > 0
    assert set(shard.get_column("scope_path")) == {a.path, b.path} and "scope_path" not in single.columns
    assert summary["records"] == shard.height + single.height == sum(rows[s.display()]["records"] for s in (a, b, c))
    weak = shard.filter(pl.col("id") == ids["weak"]).row(0, named=True)
    assert (weak["scope_path"], weak["kind"], weak["held"], weak["label"]) == (a.path, "delete", "delete_share",
                                                                               "trivia: old weak fact")
    # held: a's prune (1 of its 6 semantic nodes) only — identity drift's soul_profiles inserts (5 traits a
    # scope) are not held by default any more (HoldsConfig.drift_changes = False): they are planned to apply
    assert rows[a.display()]["held"] == 1 and rows[b.display()]["held"] == rows[c.display()]["held"] == 0
    assert shard.get_column("held").drop_nulls().len() == 1 and summary["held_rows"] == 1
    drift = shard.filter((pl.col("table") == "soul_profiles") & (pl.col("phase") == "drift"))
    assert drift.height == 10 and drift.get_column("held").null_count() == 10  # a's and b's 5 traits each, not held

    # the CLI prints the same renderer's text
    monkeypatch.delenv("DEEP_SLEEP_DSN", raising=False)  # the CLI hands its DSN to the flow through it
    code = main(["--dsn", store.dsn, "nightly", "--plan", "--as-of", NOW.isoformat(), "--runs-dir", str(tmp_path / "cli"),
                 "--no-data-quality", "--shard-scopes", "2", "--per-phase", "3"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "# Deep Sleep night plan" in out and "## Over the fleet" in out
    assert f"| {ids['weak'][:8]} | trivia: old weak fact | deleted (archived) |" in out
    assert "3 due, 3 planned, 0 failed, 1 skipped" in out and "nothing was applied" in out
    assert {s: dump(store, s) for s in scopes} == before

    # the night without --plan applies exactly what the plan listed: the same diff per scope
    applied = run_nightly(params.model_copy(update={"plan": False}))
    assert applied["applied"] == 3 and applied["skipped"] == 1, applied["rows"]
    with store.pg() as con:
        ledger = dict(con.execute("SELECT scope_path, diff_hash FROM consolidation_runs WHERE status = 'applied' "
                                  "AND as_of = %s", (NOW,)).fetchall())
        held = con.execute("SELECT hold_status FROM consolidation_runs WHERE scope_path = %s AND as_of = %s",
                           (a.path, NOW)).fetchone()[0]
    assert ledger == {s.path: rows[s.display()]["diff_hash"] for s in (a, b, c)}
    assert held == "pending"  # the delete the plan marked held waits for approval
    assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE id = %s", ids["weak"]) == 1
    assert scalar(store, "SELECT importance FROM memory_nodes WHERE id = %s", ids["stale"]) == 4.5
    assert scalar(store, "SELECT importance FROM memory_nodes WHERE id = %s", hot) == 5.5
