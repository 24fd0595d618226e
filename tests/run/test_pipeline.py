"""The pipeline's stages over a shard, against the real store (issue 12, "what must be shown").

One shard holds a scope whose validation fails, one with quarantined rows, one whose apply raises,
one with a live-write conflict and healthy scopes (among them string-prefix siblings): each is
recorded as it should be and every other scope of the shard applies.  And a shard run leaves the
store exactly as running each scope alone does.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta


from deep_sleep.core.scope import Scope
from deep_sleep.run import layout, pipeline
from deep_sleep.transforms.config import ConsolidationConfig
from tests.storeutil import dump, insert, node, scalar, small_graph

NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)


def _scopes(tag: str) -> dict[str, Scope]:
    org = Scope.root("org", f"p{tag}")
    return {name: org.child("brand", name) for name in ("bad", "quarantined", "raises", "conflict", "ok", "ok2")} | {
        "ac": Scope.root("org", f"p{tag}ac"), "acme": Scope.root("org", f"p{tag}acme")}


def _ledger(store, scope: Scope) -> list[tuple]:
    with store.pg() as con:
        return con.execute("SELECT status, conflicts, errors::text FROM consolidation_runs WHERE scope_path = %s "
                           "ORDER BY started_at", (scope.path,)).fetchall()


def test_a_bad_scope_never_blocks_the_others(store, tmp_path):
    tag = uuid.uuid4().hex[:8]
    s = _scopes(tag)
    ids = {name: small_graph(store, scope, NOW) for name, scope in s.items()}
    # validation fails: working memory labelled SOUL: whose TTL ran out (phase 8 deletes it; a protected label)
    insert(store, "memory_nodes", [node(s["bad"], "SOUL:name", NOW - timedelta(hours=5), layer="working",
                                        properties={"ttl_hours": 1})])
    # quarantined: a NaN importance (left in the store, reported)
    insert(store, "memory_nodes", [node(s["quarantined"], "project: broken", NOW - timedelta(hours=1),
                                        importance=float("nan"))])
    with store.pg() as con:  # the apply of one scope raises inside its transaction
        con.execute(
            "CREATE FUNCTION fail_pipeline_%s() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
            "IF NEW.scope_path = %s THEN RAISE EXCEPTION 'simulated fault'; END IF; RETURN NEW; END $$"
            % (tag, "'" + s["raises"].path.replace("\x1f", "' || chr(31) || '") + "'"))
        con.execute(f"CREATE TRIGGER fail_pipeline_{tag} BEFORE UPDATE ON memory_nodes FOR EACH ROW "
                    f"EXECUTE FUNCTION fail_pipeline_{tag}()")
        con.commit()
    try:
        ctx = pipeline.Context.of(NOW, ConsolidationConfig(), scopes=list(s.values()), store=store, base=tmp_path,
                                  started_at=NOW)
        planned = pipeline.run(pipeline.PLAN, ctx)
        assert len(planned.shard.scope_paths) == len(s)
        # a live write after the snapshot: the conflict scope's hot node changes under the run
        hot = ids["conflict"]["hot"][0]
        with store.pg() as con:
            con.execute("UPDATE memory_nodes SET importance = 2.5, version = version + 1 WHERE id = %s", (hot,))
            con.commit()
        applied = pipeline.run((pipeline.Apply(),), ctx, planned)
    finally:
        with store.pg() as con:
            con.execute(f"DROP TRIGGER fail_pipeline_{tag} ON memory_nodes")
            con.commit()

    reports = applied.reports
    bad = reports[s["bad"].path]
    assert bad.status == "failed" and any("protected labels" in e for e in bad.errors)
    assert _ledger(store, s["bad"])[0][0] == "failed"
    raises = reports[s["raises"].path]
    assert raises.status == "failed" and any("simulated fault" in e for e in raises.errors)
    assert _ledger(store, s["raises"])[0][0] == "failed"
    assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE scope_path = %s AND importance <> 5.0",
                  s["raises"].path) == 0  # nothing of it landed
    q = reports[s["quarantined"].path]
    assert q.status == "applied" and sum(n for r in q.quarantined.values() for n in r.values()) == 1
    assert scalar(store, "SELECT count(*) FROM consolidation_quarantine WHERE run_id = %s", q.run_id) == 1
    c = reports[s["conflict"].path]
    assert c.status == "applied" and c.conflicts >= 1
    assert scalar(store, "SELECT importance FROM memory_nodes WHERE id = %s", hot) == 2.5  # the live value survives
    for name in ("ok", "ok2", "ac", "acme", "quarantined", "conflict"):
        r = reports[s[name].path]
        assert r.status == "applied", (name, r.errors)
        assert _ledger(store, s[name])[0][0] == "applied"
        # the expired working node of each applied scope is gone, the hot nodes were strengthened
        assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE id = %s", ids[name]["expired"][0]) == 0
    assert scalar(store, "SELECT importance FROM memory_nodes WHERE id = %s", ids["ok"]["hot"][1]) == 5.5
    # the shard's files: one reports row per scope, every diff row with its scope
    import polars as pl

    rows = pl.read_parquet(tmp_path / "diff" / layout.REPORTS_FILE)
    assert sorted(rows["scope_path"]) == sorted(sc.path for sc in s.values())
    assert json.loads(rows.filter(pl.col("scope_path") == s["raises"].path)["report"][0])["status"] == "failed"
    one = layout.read_scope_diff(tmp_path / "diff", s["ok"].path)
    assert one.content_hash() == reports[s["ok"].path].diff_hash
    assert layout.read_scope_report(tmp_path / "diff", s["ok"].path).run_id == reports[s["ok"].path].run_id
    snap = layout.read_scope_snapshot(tmp_path / "snapshot", s["acme"].path)
    assert set(snap.table("memory_nodes")["scope_path"]) == {s["acme"].path}  # org/…ac never sees org/…acme


def _rows(store, scopes: list[Scope]) -> dict:
    """Every row of the scopes' tables, the archive and the ledger's counters, run ids left out."""
    out = {}
    with store.pg() as con:
        for sc in scopes:
            d = dump(store, sc)
            d.pop("consolidation_runs")
            d["runs"] = con.execute("SELECT mode, status, counters::text, rows_changed::text, conflicts, diff_hash, "
                                    "phases_run::text, phases_skipped::text FROM consolidation_runs WHERE scope_path = %s",
                                    (sc.path,)).fetchall()
            out[sc.path] = d
    return out


def test_a_shard_run_leaves_the_store_as_scope_by_scope_runs(admin_dsn, tmp_path):
    """The same rows in two databases: every scope run alone in one, the whole shard in the other;
    every row of every table, the archive and the ledger's figures are equal."""
    from deep_sleep.store.db import create_database, drop_database

    tag = uuid.uuid4().hex[:8]
    org = Scope.root("org", f"d{tag}")
    scopes = [org, org.child("brand", "b1"), org.child("brand", "b1").child("conversation", "c"),
              Scope.root("org", f"d{tag}x"), Scope.root("org", f"d{tag}xy")]
    rows = []
    for i, sc in enumerate(scopes):
        rows.append(node(sc, f"project: weak {i}", NOW - timedelta(days=40), importance=1.5))
        rows.extend(node(sc, f"task: t{j}", NOW - timedelta(hours=j + 1), importance=3.0 + j) for j in range(4))
    stores = [create_database(admin_dsn, f"ds_pipe_{tag}_{side}") for side in ("alone", "shard")]
    try:
        config = ConsolidationConfig()
        for st in stores:
            insert(st, "memory_nodes", rows)
            insert(st, "memory_access_log", [{"scope_path": r["scope_path"], "tenant_id": r["tenant_id"], "node_id": r["id"],
                                             "accessed_at": NOW - timedelta(minutes=m)} for r in rows[1::3] for m in (5, 9)])
        for sc in scopes:
            assert pipeline.consolidate(stores[0], sc, NOW, config, runs_dir=tmp_path / "alone").report().status == "applied"
        shard = pipeline.consolidate(stores[1], scopes, NOW, config, runs_dir=tmp_path / "shard")
        assert len(shard.reports) == len(scopes) and all(r.status == "applied" for r in shard.reports.values())
        assert any(r.rows_changed for r in shard.reports.values())
        assert _rows(stores[0], scopes) == _rows(stores[1], scopes)
    finally:
        for side in ("alone", "shard"):
            drop_database(admin_dsn, f"ds_pipe_{tag}_{side}")
