"""The apply contract on the real store: guarded writes, conflicts, archive, crash safety, idempotence, replay."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from deep_sleep.transforms.config import ConsolidationConfig

from deep_sleep.core.diff import Diff
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run import pipeline
from deep_sleep.run.apply import apply
from deep_sleep.run.transform import as_shard_diff, transform, write_diff
from deep_sleep.store.extract import extract
from tests.storeutil import dump, scalar, small_graph

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
# These tests are about the apply contract; two phases with exactly known effects suffice.
TWO = ("strengthen", "working_ttl")


def _planned(store, scope, tmp_path, as_of=NOW) -> tuple[pipeline.Context, pipeline.State]:
    """The night up to its apply (:data:`~deep_sleep.run.pipeline.PLAN`), files under ``tmp_path``."""
    ctx = pipeline.Context.of(as_of, ConsolidationConfig(), scopes=scope, store=store, base=tmp_path, phases=TWO)
    state = pipeline.run(pipeline.PLAN, ctx)
    assert state.report().status != "failed"
    return ctx, state


def _apply(ctx: pipeline.Context, state: pipeline.State) -> ConsolidationReport:
    return pipeline.run((pipeline.Apply(),), ctx, state).report()


def _consolidate(store, scope, runs_dir) -> ConsolidationReport:
    return pipeline.consolidate(store, scope, NOW, runs_dir=runs_dir, phases=TWO).report()


def test_run_applies_strengthen_and_ttl_and_archives(store, scope, runs_dir):
    ids = small_graph(store, scope, NOW)
    report = _consolidate(store, scope, runs_dir)
    assert report.status == "applied", report.errors
    assert report.counters["nodes_strengthened"] == 3
    assert report.counters["working_ttl_pruned"] == 1
    assert report.conflicts == 0
    assert report.rows_changed == {"memory_edges": {"deletes": 1}, "memory_nodes": {"deletes": 1, "updates": 3}}
    # read the store back
    assert scalar(store, "SELECT array_agg(importance ORDER BY id) FROM memory_nodes WHERE id = ANY(%s::uuid[])", ids["hot"]) == [5.5] * 3
    assert scalar(store, "SELECT importance FROM memory_nodes WHERE id = %s", ids["cold"][0]) == 5.0
    assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE id = %s", ids["expired"][0]) == 0
    assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE id = %s", ids["alive"][0]) == 1
    # consolidation bumps version but never updated_at
    assert scalar(store, "SELECT min(version) FROM memory_nodes WHERE id = ANY(%s::uuid[])", ids["hot"]) == 2
    assert scalar(store, "SELECT max(updated_at) FROM memory_nodes WHERE id = ANY(%s::uuid[])", ids["hot"]) == NOW - timedelta(hours=3)
    # deleted rows are archived whole, with the reason, under this run
    archived = scalar(store, "SELECT jsonb_agg(row ORDER BY table_name) FROM consolidation_archive WHERE run_id = %s", report.run_id)
    assert {a["id"] for a in archived} >= {ids["expired"][0]}
    assert len(archived) == 2  # the node and its edge
    ledger = scalar(store, "SELECT to_jsonb(r) FROM consolidation_runs r WHERE run_id = %s", report.run_id)
    assert ledger["status"] == "applied" and ledger["diff_hash"] == report.diff_hash
    assert ledger["counters"]["nodes_strengthened"] == 3


def test_live_write_between_extract_and_apply_survives_and_counts_one_conflict(store, scope, tmp_path):
    ids = small_graph(store, scope, NOW)
    planned = _planned(store, scope, tmp_path)
    target = ids["hot"][0]
    with store.pg() as live:  # a live turn, on its own connection, after the snapshot
        live.execute("UPDATE memory_nodes SET importance = 7.25, label = 'project: edited live' WHERE id = %s", (target,))
        live.commit()
    report = _apply(*planned)
    assert report.status == "applied"
    assert report.conflicts == 1
    assert report.rows_changed["memory_nodes"]["updates"] == 2
    assert scalar(store, "SELECT importance FROM memory_nodes WHERE id = %s", target) == 7.25
    assert scalar(store, "SELECT label FROM memory_nodes WHERE id = %s", target) == "project: edited live"
    assert scalar(store, "SELECT conflicts FROM consolidation_runs WHERE run_id = %s", report.run_id) == 1


def test_second_run_at_same_as_of_is_empty_and_replay_reproduces_the_hash(store, scope, runs_dir, tmp_path):
    small_graph(store, scope, NOW)
    first = _consolidate(store, scope, runs_dir)
    assert first.status == "applied" and first.rows_changed
    # replay the stored snapshot of the applied run: same diff, byte for byte
    replay = transform(Snapshot.read(first.snapshot_uri), ConsolidationConfig(), NOW, phases=TWO)
    assert replay.report.diff_hash == first.diff_hash
    assert replay.report.counters == first.counters
    second = _consolidate(store, scope, runs_dir)
    assert second.counters == dict.fromkeys(second.counters, 0)
    assert second.rows_changed == {}
    assert second.diff_hash == Diff.empty().content_hash()


def test_diff_files_round_trip_with_the_same_hash(store, scope, tmp_path):
    small_graph(store, scope, NOW)
    snap = extract(store, scope)
    result = transform(snap, ConsolidationConfig(), NOW, phases=TWO)
    write_diff(result.diff, result.shard.scope_paths, tmp_path / "d")  # a shard of one: the single-scope layout
    again = Diff.read(tmp_path / "d")
    assert again.content_hash() == result.report.diff_hash == result.scope_diff().content_hash()
    assert sorted(p.name for p in (tmp_path / "d").iterdir()) == [
        "memory_edges.deletes.parquet", "memory_nodes.deletes.parquet", "memory_nodes.updates.parquet"]
    assert set(pl.read_parquet(tmp_path / "d" / "memory_nodes.updates.parquet").columns) == {"id", "expected_version", "importance", "phase"}


CRASHER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    import deep_sleep.run.apply as ap
    from deep_sleep.run import pipeline
    from deep_sleep.store.db import Store

    dsn, scope, runs, marker, after = sys.argv[1], sys.argv[2], sys.argv[3], Path(sys.argv[4]), int(sys.argv[5])
    real = ap._write
    calls = []

    def pausing(cur, s, guarded, fast):
        got = real(cur, s, guarded, fast)
        calls.append(s.sql)
        if len(calls) == after:
            marker.write_text(s.sql[:60])
            time.sleep(600)  # inside the open transaction, until the test kills us
        return got

    ap._write = pausing
    pipeline.consolidate(Store(dsn), scope, "2026-11-20T03:00:00Z", runs_dir=runs, phases=("strengthen", "working_ttl"))
    """
)


@pytest.mark.parametrize("after", [1, 2, 3])
def test_sigkill_inside_apply_leaves_the_store_as_it_was_and_a_rerun_applies(store, scope, tmp_path, after):
    small_graph(store, scope, NOW)
    before = dump(store, scope)
    script = tmp_path / "crash.py"
    script.write_text(CRASHER)
    marker = tmp_path / "in-transaction"
    env = {**os.environ, "PYTHONPATH": str(Path.cwd())}
    proc = subprocess.Popen([sys.executable, str(script), store.dsn, scope.path, str(tmp_path / "runs"), str(marker),
                             str(after)], env=env)
    deadline = time.monotonic() + 120
    while not marker.exists():
        assert proc.poll() is None, "the applying process ended before reaching the pause point"
        assert time.monotonic() < deadline, "the applying process never reached the pause point"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    # Postgres notices the dead backend and rolls its transaction back; wait until it is gone
    deadline = time.monotonic() + 30
    while scalar(store, "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND state LIKE 'idle in transaction%%'") and time.monotonic() < deadline:
        time.sleep(0.05)
    assert dump(store, scope) == before  # the ledger too: no run was recorded
    assert scalar(store, "SELECT count(*) FROM consolidation_runs WHERE scope_path = %s", scope.path) == 0
    rerun = _consolidate(store, scope, tmp_path / "runs")
    assert rerun.status == "applied" and rerun.conflicts == 0
    assert dump(store, scope) != before
    assert rerun.rows_changed["memory_nodes"] == {"deletes": 1, "updates": 3}


def test_edge_deletes_without_node_deletes_apply(store, scope):
    """Supersession-free edge deletes (e.g. CLUSTERS edges a META node drops) stand alone in a diff."""
    ids = small_graph(store, scope, NOW)
    snap = extract(store, scope)
    edges = snap.table("memory_edges").select("id", "version")
    diff = Diff.of("memory_edges", "meta_nodes", deletes=edges, reason="member left the group")
    report = ConsolidationReport(scope_path=scope.path, as_of="2026-11-20T03:00:00Z", run_id=str(uuid.uuid4()))
    result = apply(store, as_shard_diff(diff, scope.path), {scope.path: report})[scope.path]
    assert result.status == "applied"
    assert result.applied == {"memory_edges": {"deletes": 1}} and result.conflicts == 0
    assert scalar(store, "SELECT count(*) FROM memory_edges WHERE source_id = %s", ids["hot"][0]) == 0


@pytest.mark.parametrize("small_rows", [2_000, 0], ids=["inline-json", "staging-tables"])
def test_an_edge_stays_when_its_nodes_delete_lost_to_a_live_write(store, scope, tmp_path, monkeypatch, small_rows):
    """The expired working node goes with its edge — unless a live turn touched the node after the
    snapshot: then the node's delete is a conflict and its edge must stay too (no dangling node).
    Both ways of feeding the statements (JSON parameters for small diffs, staging tables) are run."""
    import deep_sleep.run.apply

    monkeypatch.setattr(deep_sleep.run.apply, "SMALL_STAGE_ROWS", small_rows)
    ids = small_graph(store, scope, NOW)
    expired = ids["expired"][0]
    planned = _planned(store, scope, tmp_path)
    assert planned[1].tonight.row_counts()["memory_edges"]["deletes"] == 1
    with store.pg() as live:
        live.execute("UPDATE memory_nodes SET properties = properties || '{\"touched\": true}' WHERE id = %s", (expired,))
        live.commit()
    report = _apply(*planned)
    assert report.status == "applied"
    assert report.conflicts == 2  # the node's delete and its edge's
    assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE id = %s", expired) == 1
    assert scalar(store, "SELECT count(*) FROM memory_edges WHERE source_id = %s OR target_id = %s", expired, expired) == 1
    assert scalar(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s", report.run_id) == 0


def test_small_frames_stage_through_json_exactly_as_adbc_ingests_them(store):
    """The quick nap's staging path (one JSON parameter) gives the same column types and values as
    ADBC's COPY ingest, for every type a diff carries."""
    from deep_sleep.core import tables
    from deep_sleep.run.apply import stage
    from deep_sleep.run.statements import stage_sql

    emb = [[float(i) / 7 for i in range(tables.EMBEDDING_DIM)], [1e-30] * tables.EMBEDDING_DIM]
    body = pl.DataFrame(
        {
            "id": [str(uuid.uuid4()), "odd 'quote' \" \\ \u00e9\u6f22 \x01"],
            "expected_version": [1, None],
            "importance": [0.1, 1e-300],
            "label_score": pl.Series([0.5, None], dtype=pl.Float32),
            "when": [NOW + timedelta(microseconds=123457), None],
            "features": [[0.1, 2.5e10, -0.0], None],
            "embedding": emb,
            "flag": [True, None],
        },
        schema_overrides={"when": tables.TS, "embedding": pl.Array(pl.Float32(), tables.EMBEDDING_DIM)},
    )
    assert stage_sql("_x", body.schema) is not None  # every column type has a JSON path
    with store.transaction() as cur:
        stage(cur, "_by_json", body)
        cur.adbc_ingest("_by_copy", body.to_arrow(), mode="create", temporary=True)
        cur.execute("SELECT string_agg(format_type(atttypid, atttypmod), ',' ORDER BY attnum) FROM pg_attribute"
                    " WHERE attrelid = $1::regclass AND attnum > 0", parameters=("_by_json",))
        json_types = cur.fetch_arrow_table().column(0)[0].as_py()
        cur.execute("SELECT string_agg(format_type(atttypid, atttypmod), ',' ORDER BY attnum) FROM pg_attribute"
                    " WHERE attrelid = $1::regclass AND attnum > 0", parameters=("_by_copy",))
        assert json_types == cur.fetch_arrow_table().column(0)[0].as_py()
        cur.execute("SELECT count(*) FROM ((TABLE _by_json EXCEPT ALL TABLE _by_copy)"
                    " UNION ALL (TABLE _by_copy EXCEPT ALL TABLE _by_json)) d")
        assert cur.fetch_arrow_table().column(0)[0].as_py() == 0
        cur.execute("SELECT count(*) FROM _by_json")
        assert cur.fetch_arrow_table().column(0)[0].as_py() == 2
        cur.execute("DROP TABLE _by_json, _by_copy")


@pytest.mark.parametrize("small_rows", [2_000, 0], ids=["inline-json", "staging-tables"])
def test_the_golden_small_diff_lands_in_every_table_through_both_data_sources(store, scope, monkeypatch, small_rows):
    """The statements of ``tests/run/golden_sql/small_inline.sql`` (nodes, edges, events, soul and
    pending connections; updates, inserts, deletes) run on the store, inline and staged alike."""
    import deep_sleep.run.apply
    from tests.run.test_statements import RUN_ID, _ids, small_diff
    from tests.storeutil import insert

    monkeypatch.setattr(deep_sleep.run.apply, "SMALL_STAGE_ROWS", small_rows)
    ids = lambda table, n, start=0: _ids(table, n, start, scope=scope.path)  # noqa: E731
    base = {"scope_path": scope.path, "tenant_id": scope.tenant_id}
    nodes = ids("node", 4)
    insert(store, "memory_nodes", [{**base, "id": n, "label": f"project: {i}", "layer": "working" if i == 0 else "semantic"}
                                   for i, n in enumerate(nodes)])
    insert(store, "memory_edges", [{**base, "id": ids("edge", 1)[0], "source_id": nodes[1], "target_id": nodes[0],
                                    "relation": "RELATED_TO"}])
    insert(store, "episodic_events", [{**base, "id": e, "content": "said something"} for e in ids("event", 2)])
    insert(store, "soul_profiles", [{**base, "id": ids("soul", 1, 1)[0], "key": "register", "value": "casual"}])
    insert(store, "pending_connections", [{**base, "id": p, "source_label": "a", "target_label": "b", "relation": "RELATED_TO"}
                                          for p in ids("pending", 3)])
    report = ConsolidationReport(scope_path=scope.path, as_of="2026-11-20T03:00:00Z", run_id=str(uuid.uuid4()))
    result = apply(store, as_shard_diff(small_diff(scope.path), scope.path), {scope.path: report})[scope.path]
    assert result.status == "applied" and result.conflicts == 0
    assert result.applied == {
        "memory_nodes": {"deletes": 1, "updates": 3}, "memory_edges": {"deletes": 1, "inserts": 2},
        "pending_connections": {"deletes": 1, "updates": 2}, "episodic_events": {"updates": 2},
        "soul_profiles": {"updates": 1, "inserts": 1}}
    q = "SELECT jsonb_agg(jsonb_build_array({}) ORDER BY {}) FROM {} WHERE scope_path = %s"
    assert scalar(store, q.format("id, importance, last_decayed_at IS NOT NULL", "id", "memory_nodes"), scope.path) == sorted(
        [[nodes[1], 5.5, False], [nodes[2], 5.4, True], [nodes[3], 4.2, True]])
    assert scalar(store, q.format("source_id, target_id, relation", "source_id", "memory_edges"), scope.path) == [
        list(p) for p in sorted([(nodes[1], nodes[2], "CO_OCCURS"), (nodes[2], nodes[3], "CO_OCCURS")])]
    assert scalar(store, q.format("metadata", "id", "episodic_events"), scope.path) == [[{"summarised": True}]] * 2
    assert scalar(store, q.format("key, value", "key", "soul_profiles"), scope.path) == [["register", "formal"], ["tone", "brief"]]
    assert scalar(store, q.format("consumed_by_run, outcome", "outcome", "pending_connections"), scope.path) == [
        [RUN_ID, "created"], [RUN_ID, "rejected"]]
    assert scalar(store, "SELECT array_agg(table_name ORDER BY table_name) FROM consolidation_archive WHERE run_id = %s",
                  report.run_id) == ["memory_edges", "memory_nodes", "pending_connections"]
    assert scalar(store, "SELECT status FROM consolidation_runs WHERE run_id = %s", report.run_id) == "applied"
