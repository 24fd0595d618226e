"""The seed's own end-to-end scenario (issue: "capability is not occurrence"): a realistic scope —
40+ nodes, 120 episodic entries, timestamps backdated over 90 days — plus one live turn recorded
through the online path, goes through the real ``deep_sleep`` Prefect flow on real Postgres.
Every phase of the roster must run (none skipped, for any reason), and each leaves an exact effect
that the test reads back from the store, row by row, against what it worked out from the rows
before the run (not from the run's own diff)."""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime, timedelta

import pytest

from deep_sleep.core.report import ConsolidationReport
from deep_sleep.dev.seed import MARKERS, SeedSpec, scopes_of, seed_store
from deep_sleep.online.turn import record_turn
from deep_sleep.transforms import ROSTER
from tests.storeutil import create_database, drop_database, edge, insert

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
WINDOW = NOW - timedelta(hours=24)
PROTECTED = ("SOUL:", "AGENT_IDENTITY:")
# a live turn's working note: "thanks" (warmth), "please" (formality), "verify"/"backup" (caution)
NOTE = "thanks, please verify the backup"
RISK = re.compile(r"(?:^|[^\w]|_)(?i:" + "|".join(sorted({m.lower() for m in
                  ("risk danger failure loss negative decline warning critical error threat".split())})) + ")")
KEYS = {"soul_profiles": "key", "reranker_models": "scope_path"}
TABLES = ("memory_nodes", "memory_edges", "episodic_events", "soul_profiles", "pending_connections", "recall_events",
          "reranker_models", "procedural_skills")


@pytest.fixture
def seeded(admin_dsn):
    name = f"ds_e2e_{os.getpid()}"
    store = create_database(admin_dsn, name)
    spec = SeedSpec(tenants=1, scopes_per_tenant=1, nodes_per_scope=40, seed=9, now=NOW, days=90)
    seed_store(store, spec)
    yield store, scopes_of(spec)[-1]
    drop_database(admin_dsn, name)


def _ts(value: str | None) -> datetime | None:
    return None if value is None else datetime.fromisoformat(value)


def _state(store, p: str) -> dict[str, dict[str, dict]]:
    """Every row of the scope, table → key → row (jsonb: timestamps as ISO text)."""
    out = {}
    with store.pg() as con:
        for t in TABLES:
            out[t] = {r[KEYS.get(t, "id")]: r for (r,) in con.execute(f"SELECT to_jsonb(x) FROM {t} x WHERE scope_path = %s", (p,))}
    return out


def _access_counts(store, p: str) -> dict[str, int]:
    with store.pg() as con:
        return dict(con.execute("SELECT node_id::text, count(*) FROM memory_access_log WHERE scope_path = %s "
                                "AND accessed_at > %s AND accessed_at <= %s GROUP BY 1", (p, WINDOW, NOW)).fetchall())


def _archived(store, run_id: str) -> dict[str, set[str]]:
    with store.pg() as con:
        rows = con.execute("SELECT table_name, row_id::text FROM consolidation_archive WHERE run_id = %s", (run_id,)).fetchall()
    out: dict[str, set[str]] = {}
    for table, rid in rows:
        out.setdefault(table, set()).add(rid)
    return out


def _props(row: dict) -> dict:
    p = row["properties"]
    return p if isinstance(p, dict) else json.loads(p or "{}")


def _recent(n: dict) -> bool:
    return n["layer"] == "semantic" and WINDOW < _ts(n["updated_at"]) <= NOW


@pytest.mark.flow
def test_seed_scenario_through_the_real_flow(prefect_harness, seeded, tmp_path):
    from deep_sleep.flows.consolidate import DeepSleepParameters, deep_sleep

    store, scope = seeded
    p = scope.path
    # live turns through the online path: drift's input (working memory of the window), and two
    # facts noted together whose CO_OCCURRED edge (the seed's pairs lose theirs to pruning) is reinforced
    receipt = record_turn(store, scope, [], now=NOW - timedelta(hours=1), thinking=[NOTE], nap=False)
    note_id = receipt.ids("thinking")[0]
    pair = record_turn(store, scope, [{"op": "upsert_node", "label": f"chess club: {w}"} for w in ("monday", "friday")],
                       now=NOW - timedelta(hours=2), nap=False).ids("upsert_node")
    insert(store, "memory_edges", [edge(scope, min(pair), max(pair), "CO_OCCURRED", at=NOW - timedelta(days=3))])
    before, hits = _state(store, p), _access_counts(store, p)
    nodes, edges, events = before["memory_nodes"], before["memory_edges"], before["episodic_events"]
    assert len(nodes) >= 30 and len(events) >= 120
    assert min(_ts(n["updated_at"]) for n in nodes.values()) <= NOW - timedelta(days=60)
    assert nodes[note_id]["layer"] == "working"

    report = ConsolidationReport.from_dict(
        # holds off: this test reads back every phase's effect (the holds of issue 16 have their own tests)
        deep_sleep(DeepSleepParameters(scope=scope.display(), as_of=NOW, dsn=store.dsn, runs_dir=str(tmp_path / "runs"),
                                       config={"holds": {"enabled": False}})))
    assert report.status == "applied" and report.errors == [] and report.conflicts == 0
    # every phase of the roster ran: none skipped, whatever the reason (disabled, missing input, gated)
    assert report.phases_skipped == {}
    assert report.phases_run == [ph.name for ph in ROSTER]
    by = report.counters_by_phase
    assert all(any(by.get(ph.name, {}).values()) for ph in ROSTER), {ph.name: by.get(ph.name) for ph in ROSTER}

    after, archived = _state(store, p), _archived(store, report.run_id)
    a_nodes, a_edges, a_events = after["memory_nodes"], after["memory_edges"], after["episodic_events"]
    semantic = {i: n for i, n in nodes.items() if n["layer"] == "semantic"}
    new_edges = {i: e for i, e in a_edges.items() if i not in edges}

    # phase 1 strengthen: exactly the semantic nodes read twice in the window (below the cap) gained 0.5
    strengthened = {i for i, n in semantic.items() if hits.get(i, 0) >= 2 and n["importance"] < 10}
    assert by["strengthen"]["nodes_strengthened"] == len(strengthened) > 0
    # phase 9 decay: exactly the stale, unprotected nodes between floor and exemption, not decayed in 24 h
    mid = {i: min(10.0, n["importance"] + 0.5) if i in strengthened else n["importance"] for i, n in semantic.items()}
    decayed = {i for i, n in semantic.items() if i in a_nodes and _ts(n["updated_at"]) < NOW - timedelta(days=30)
               and 1.0 < mid[i] < 8.0 and not n["label"].startswith(PROTECTED)
               and (n["last_decayed_at"] is None or _ts(n["last_decayed_at"]) <= NOW - timedelta(hours=24))}
    assert {i for i, n in a_nodes.items() if _ts(n["last_decayed_at"]) == NOW} == decayed
    assert by["decay_importance"]["nodes_decayed"] == len(decayed) > 0
    for i in semantic.keys() & a_nodes.keys():  # every surviving node's importance, row by row
        assert a_nodes[i]["importance"] == pytest.approx(max(1.0, mid[i] - 0.5) if i in decayed else mid[i]), a_nodes[i]["label"]

    # phase 1.5 cooccurrence: each CO_OCCURRED edge between recent nodes <= 900 s apart gained exactly 1
    # (or went with a pruned node); new edges join such pairs
    def close(a: dict, b: dict) -> bool:
        return _recent(a) and _recent(b) and abs((_ts(a["updated_at"]) - _ts(b["updated_at"])).total_seconds()) <= 900
    due = {i for i, e in edges.items() if e["relation"] == "CO_OCCURRED" and close(nodes[e["source_id"]], nodes[e["target_id"]])}
    reinforced = {i for i in due if i in a_edges}
    assert by["cooccurrence"]["edges_reinforced"] == len(due) and due - reinforced <= archived["memory_edges"]
    assert all(a_edges[i]["weight"] == edges[i]["weight"] + 1 for i in reinforced)
    assert any(e["source_id"] == min(pair) and e["target_id"] == max(pair) for i, e in edges.items() if i in reinforced)
    assert all(a_edges[i]["weight"] == e["weight"] for i, e in edges.items() if i in a_edges and i not in reinforced)
    co = [e for e in new_edges.values() if e["relation"] == "CO_OCCURRED"]
    assert by["cooccurrence"]["edges_created"] == len(co) > 0
    for e in co:
        assert e["source_id"] < e["target_id"] and e["weight"] == 1 and close(nodes[e["source_id"]], nodes[e["target_id"]])

    # phase 2 tag_risk: exactly the untagged recent nodes with a marker at a word start
    def marked(n: dict) -> bool:
        return bool(RISK.search(n["label"])) or any(isinstance(v, str) and RISK.search(v) for v in _props(n).values())
    tagged = {i for i, n in nodes.items() if _recent(n) and marked(n) and "risk_tagged_at" not in _props(n)}
    assert {i for i, n in a_nodes.items() if _props(n).get("risk_tagged_at") == "2026-11-20T03:00:00Z"} == tagged
    assert by["tag_risk"]["risk_nodes_tagged"] == len(tagged) > 0
    assert all(_props(a_nodes[i])["risk_node"] is True for i in tagged)
    assert any(m.lower() in ("risky", "errors", "declined") for m in MARKERS)  # the seed's inflections are in play

    # phase 2.5 pending_edges: every open pending row is consumed by this run with an outcome
    pending = [i for i, r in before["pending_connections"].items() if r["consumed_by_run"] is None]
    assert pending and all(after["pending_connections"][i]["consumed_by_run"] and after["pending_connections"][i]["outcome"]
                           for i in pending)
    created = [i for i in pending if after["pending_connections"][i]["outcome"] == "created"]
    plain = [e for e in new_edges.values() if e["relation"] not in ("CO_OCCURRED", "SYNTHETIC_LINK", "CLUSTERS")]
    assert by["pending_edges"]["edges_created"] == len(created) == len(plain) > 0

    # D1 supersession: each newly closed edge points at the next newer edge of its (source, relation)
    closed = [i for i, e in edges.items() if e["valid_to"] is None and i in a_edges and a_edges[i]["valid_to"] is not None]
    assert by["supersession"]["facts_superseded"] == len(closed) > 0
    for i in closed:
        newer = a_edges[_props(a_edges[i])["superseded_by"]]
        assert (newer["source_id"], newer["relation"]) == (edges[i]["source_id"], edges[i]["relation"])
        assert _ts(a_edges[i]["valid_to"]) == _ts(newer["created_at"]) > _ts(edges[i]["created_at"]) - timedelta(microseconds=1)

    # phase 3 prune_orphans and phase 8 working_ttl: the deleted nodes, each archived by the run
    gone = nodes.keys() - a_nodes.keys()
    assert gone <= archived["memory_nodes"]
    assert edges.keys() - a_edges.keys() <= archived["memory_edges"]  # incident edges went with their nodes
    assert all(e["source_id"] in gone or e["target_id"] in gone for i, e in edges.items() if i not in a_edges)
    expired = {i for i, n in nodes.items() if n["layer"] == "working" and "ttl_hours" in _props(n)
               and _ts(n["updated_at"]) + timedelta(hours=float(_props(n)["ttl_hours"])) <= NOW}
    assert {i for i in gone if nodes[i]["layer"] == "working"} == expired
    assert by["working_ttl"]["working_ttl_pruned"] == len(expired) > 0
    pruned = [nodes[i] for i in gone if nodes[i]["layer"] == "semantic"]
    assert by["prune_orphans"]["nodes_pruned"] == len(pruned) > 0
    for n in pruned:
        ttl = _props(n).get("ttl_hours")
        weak = n["importance"] < 4 and _ts(n["updated_at"]) < NOW - timedelta(days=7)
        assert not n["label"].startswith(PROTECTED) and (weak or (ttl is not None and _ts(n["updated_at"]) + timedelta(hours=float(ttl)) <= NOW))
    assert note_id in a_nodes  # the live note (24 h TTL) survives

    # phase 4 meta_nodes: each new META node clusters min(10, member_count) members
    metas = {i: n for i, n in a_nodes.items() if i not in nodes and n["label"].startswith("META:") and n["label"] != "META:episodic_summary"}
    assert by["meta_nodes"]["meta_nodes_created"] == len(metas) > 0
    for i, m in metas.items():
        clusters = [e for e in new_edges.values() if e["source_id"] == i and e["relation"] == "CLUSTERS"]
        assert _props(m)["member_count"] >= 3 and len(clusters) == min(10, _props(m)["member_count"])

    # phase 5 soul_corrections: the latest manual edit per canonical key wins; favorite_color is rejected by name
    edits = sorted((n for n in nodes.values() if n["label"].startswith("SOUL:") and _recent(n)
                    and _props(n).get("_last_edited_by") == "user_manual_edit"), key=lambda n: (n["updated_at"], n["id"]))
    latest = {n["label"][5:]: _props(n)["value"] for n in edits}
    honoured = {k: v for k, v in latest.items() if k in ("name", "role", "personality", "language")}
    assert len(edits) > len(latest) and "name" in honoured  # two edits of SOUL:name: the newer must win
    assert {k: after["soul_profiles"][k]["value"] for k in honoured} == honoured
    assert "favorite_color" not in after["soul_profiles"]
    assert any("favorite_color" in note for note in report.notes.get("soul_corrections", []))
    assert by["soul_corrections"]["soul_rejected"] == len(latest.keys() - honoured) > 0

    # phase 10 episodic_summary: the 50 oldest events are deleted, archived and listed by the summary node
    oldest = {e["id"] for e in sorted(events.values(), key=lambda e: (_ts(e["created_at"]), e["id"]))[:50]}
    assert events.keys() - a_events.keys() == oldest == archived["episodic_events"]
    (summary,) = [n for i, n in a_nodes.items() if i not in nodes and n["label"] == "META:episodic_summary"]
    assert set(_props(summary)["source_ids"]) == oldest and by["episodic_summary"]["episodes_summarized"] == 50

    # phase 11 synthetic_links
    links = [e for e in new_edges.values() if e["relation"] == "SYNTHETIC_LINK"]
    assert by["synthetic_links"]["synthetic_edges_created"] == len(links) > 0
    assert all(e["weight"] == 0.1 and _props(e)["provenance"] == "synthetic" and 0 < len(_props(e)["source_episodic_ids"]) <= 20
               and set(_props(e)["source_episodic_ids"]) <= events.keys() for e in links)

    # phase 12 procedural_promotion: drafts only
    skills = [s for i, s in after["procedural_skills"].items() if i not in before["procedural_skills"]]
    assert by["procedural_promotion"]["draft_skills_promoted"] == len(skills) > 0
    assert all(s["status"] == "draft" and s["source"] == "consolidation" and _ts(s["created_at"]) == NOW for s in skills)
    assert [s for s in after["procedural_skills"].values() if s["source"] == "consolidation" and s["status"] == "active"] == []

    # D2 label_recalls: each newly labelled recall got max(similarity, 0.5) or similarity / 2; explicit labels kept
    labelled = [i for i, r in before["recall_events"].items() if r["label"] is None and after["recall_events"][i]["label"] is not None]
    assert by["label_recalls"]["recalls_labelled"] == len(labelled) > 0
    for i in labelled:
        sim = before["recall_events"][i]["similarity"]
        assert after["recall_events"][i]["label"] in (pytest.approx(max(sim, 0.5)), pytest.approx(sim / 2))
    assert all(after["recall_events"][i]["label"] == r["label"] for i, r in before["recall_events"].items() if r["label"] is not None)

    # D3 train_reranker: one more step, persisted
    steps_before = before["reranker_models"].get(p, {}).get("steps", 0)
    assert after["reranker_models"][p]["steps"] == steps_before + 1 and by["train_reranker"]["reranker_steps"] == 1

    # D4 drift: one EMA step (0.05) of each trait from 0.5 towards the live note's share (1 or 0)
    traits = {k: r["value"] for k, r in after["soul_profiles"].items() if k.startswith("trait:")}
    assert not any(k.startswith("trait:") for k in before["soul_profiles"])
    assert traits == {"trait:caution": "0.5250", "trait:formality": "0.5250", "trait:warmth": "0.5250",
                      "trait:curiosity": "0.4750", "trait:directness": "0.4750"}
    assert by["drift"]["identity_drifts"] == 5
