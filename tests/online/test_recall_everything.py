"""Issue 30 on the real store: recall over everything remembered (events, the summaries and clusters a
night writes), one embedder everywhere (a night refuses another model's vectors; ``reembed`` rewrites
them; the gate ranks with the configured embedder), word matching fused with vectors, and the public
entry point on a scope and on a shard."""

from __future__ import annotations

import importlib
from datetime import timedelta

import numpy as np
import pytest

from deep_sleep.core.embedding import EmbeddingModelError, HashingEmbedder, embedder
from deep_sleep.online.recall import feedback, recall
from deep_sleep.online.turn import record_turn
from deep_sleep.transforms.config import load_config
from tests.online.helpers import NOW, rows, sibling
from tests.storeutil import scalar

HASHING = HashingEmbedder().name
RECALL_MODULE = importlib.import_module("deep_sleep.online.recall")  # the package exports a function of that name


class Mirrored:
    """A second model for the tests: the hashing embedder of each text's words reversed — a different
    vector space, deterministic, named by import path (``tests.online.test_recall_everything:MIRRORED``)."""

    dim, name = 256, "mirrored-hashing-test"

    def embed(self, texts):
        return HashingEmbedder().embed([" ".join(w[::-1] for w in t.split()) for t in texts])


MIRRORED = Mirrored()
MIRRORED_CONFIG = load_config(overrides={"embedding": {"model": "tests.online.test_recall_everything:MIRRORED"}})


def test_an_event_is_recalled_with_its_metadata_and_its_own_id_as_provenance(store, scope):
    receipt = record_turn(store, scope, [{"op": "create_event", "content": "Melanie: I ran a charity race for mental health",
                                          "metadata": {"dia_id": "D2:1", "speaker": "Melanie"}}], now=NOW, nap=False)
    record_turn(store, scope, [{"op": "upsert_node", "label": "Caroline likes painting sunsets"}], now=NOW, nap=False)
    event_id = receipt.ids("create_event")[0]
    hits = recall(store, scope, "When did Melanie run a charity race?", k=3, now=NOW + timedelta(hours=1))
    ev = next(h for h in hits if h.node_id == event_id)
    assert ev.kind == "event" and ev.properties == {"dia_id": "D2:1", "speaker": "Melanie"}
    assert ev.text == "Melanie: I ran a charity race for mental health" and ev.source_ids == (event_id,)
    assert hits[0] is ev  # its words and its vector both put it first
    # logged as an event; no access-log read (that log is the nodes')
    assert rows(store, "SELECT item_kind FROM recall_events WHERE id = %s", ev.recall_id) == [("event",)]
    assert scalar(store, "SELECT count(*) FROM memory_access_log WHERE node_id = %s", event_id) == 0
    assert feedback(store, ev.recall_id, used=True)
    # never across scopes
    assert event_id not in [h.node_id for h in recall(store, sibling(scope, "b2"), "charity race", k=5, now=NOW)]


def test_a_summary_the_night_writes_has_a_vector_and_is_recalled_with_its_source_events(store, scope, runs_dir):
    from deep_sleep import consolidate

    # each filler turn has a word of its own: turns that share every word are told apart by their random
    # ids alone, and so would be the gate's probes of them (deep_sleep/run/probes.py)
    ops = [[{"op": "create_event", "content": f"Ada: filler talk about the weather, {chr(97 + i // 26)}{chr(97 + i % 26)}zz"}]
           for i in range(104)]
    ops[3] = [{"op": "create_event", "content": "Ada: my puppy Biscuit chewed the red sneakers"}]
    ids = [record_turn(store, scope, o, now=NOW + timedelta(seconds=i), nap=False).ids("create_event")[0]
           for i, o in enumerate(ops)]
    report = consolidate(store, scope, NOW + timedelta(hours=2), runs_dir=runs_dir).report()
    assert report.status == "applied" and report.counters["episodes_summarized"] == 50
    assert report.gate["status"] == "measured" and not report.gate["failed"] and not report.held
    summary_id, model, text, keywords = rows(
        store, "SELECT id::text, embedding_model, properties->>'summary', properties->>'keywords' FROM memory_nodes"
               " WHERE scope_path = %s AND label = 'META:episodic_summary'", scope.path)[0]
    assert model == HASHING and "biscuit" in keywords.split()
    # its vector is the one the configured embedder gives its text and word key (computed in the transform,
    # written by the apply)
    stored = rows(store, "SELECT embedding::text FROM memory_nodes WHERE id = %s", summary_id)[0][0]
    want = HashingEmbedder().embed([f"META:episodic_summary {text} {keywords}"])[0]
    assert np.allclose(np.array(stored.strip("[]").split(","), dtype=np.float32), want, atol=1e-6)
    hits = recall(store, scope, "what did Biscuit chew?", k=5, now=NOW + timedelta(hours=3))
    summary = next(h for h in hits if h.kind == "summary")
    assert summary.node_id == summary_id and summary.source_ids == tuple(ids[:50])
    # its passage: the gist, then the matching turn with its own event id (SPEC §5 as amended 2026-12-06)
    assert summary.lines[0].source_id == ids[3] and summary.lines[0].text == "Ada: my puppy Biscuit chewed the red sneakers"
    assert summary.text.split("\n")[0] == NOW.date().isoformat()  # its gist: the dates its turns span
    assert ids[3] not in [h.node_id for h in hits]  # the event itself left the hot table; the summary carries it


@pytest.mark.parametrize("big", [False, True], ids=["one-pass", "big-scope"])
def test_word_matching_weighs_a_rare_word_above_a_common_one(store, scope, monkeypatch, big):
    """Golden: "Biscuit" is in one memory of five, "Ada" in all: the memory holding the rare word ranks
    first though another holds the common one twice; without word matching the vector order decides.
    ``big``: every scope counts as big (the word match enumerates each word's rows apart)."""
    if big:
        monkeypatch.setattr(RECALL_MODULE, "BIG_SCOPE", 1)
    for label in ("Ada Ada went hiking with Ada", "Ada bought a red kite", "Ada cooked pasta", "Ada reads a novel"):
        record_turn(store, scope, [{"op": "upsert_node", "label": label}], now=NOW, nap=False)
    rare = record_turn(store, scope, [{"op": "upsert_node", "label": "Ada's dog is named Biscuit"}], now=NOW,
                       nap=False).ids()[0]
    hits = recall(store, scope, "Ada Biscuit", k=5, now=NOW, config=load_config(overrides={"recall": {"events": False}}))
    assert hits[0].node_id == rare


def test_a_night_refuses_vectors_of_another_model_until_reembed(store, scope, runs_dir):
    from deep_sleep import consolidate
    from deep_sleep.jobs.reembed import reembed

    turn = record_turn(store, scope, [{"op": "upsert_node", "label": "project: billing migration"},
                                      {"op": "create_event", "content": "Ada moved billing to the new cluster"}],
                       now=NOW, nap=False)
    before = rows(store, "SELECT id::text, version FROM memory_nodes WHERE scope_path = %s ORDER BY id", scope.path)
    # the configured model is another one: recall and the night refuse, naming both models and the fix
    with pytest.raises(EmbeddingModelError, match="deep-sleep reembed"):
        recall(store, scope, "billing", now=NOW, config=MIRRORED_CONFIG)
    report = consolidate(store, scope, NOW + timedelta(hours=1), MIRRORED_CONFIG, runs_dir=runs_dir).report()
    assert report.status == "failed" and report.gate["status"] == "model_mismatch"
    assert any(HASHING in e and MIRRORED.name in e and "deep-sleep reembed" in e for e in report.errors)
    assert rows(store, "SELECT id::text, version FROM memory_nodes WHERE scope_path = %s ORDER BY id", scope.path) == before

    done = reembed(store, MIRRORED_CONFIG, [scope], batch_size=1, progress=lambda _: None)
    assert (done.model, done.rewritten["memory_nodes"], done.rewritten["episodic_events"]) == (MIRRORED.name, 1, 1)
    assert rows(store, "SELECT DISTINCT embedding_model FROM memory_nodes WHERE scope_path = %s", scope.path) == [(MIRRORED.name,)]
    stored = rows(store, "SELECT embedding::text FROM episodic_events WHERE id = %s", turn.ids("create_event")[0])[0][0]
    assert np.allclose(np.array(stored.strip("[]").split(","), dtype=np.float32),
                       MIRRORED.embed(["Ada moved billing to the new cluster"])[0], atol=1e-6)
    again = reembed(store, MIRRORED_CONFIG, [scope], progress=lambda _: None)
    assert sum(again.rewritten.values()) == sum(again.skipped.values()) == 0  # idempotent
    assert recall(store, scope, "billing migration", now=NOW, config=MIRRORED_CONFIG)[0].node_id == turn.ids("upsert_node")[0]
    assert consolidate(store, scope, NOW + timedelta(hours=1), MIRRORED_CONFIG, runs_dir=runs_dir).report().status == "applied"


def test_reembed_leaves_a_row_a_live_turn_changed_meanwhile(store, scope):
    from deep_sleep.jobs import reembed as job

    nid = record_turn(store, scope, [{"op": "upsert_node", "label": "topic: kites"}], now=NOW, nap=False).ids()[0]
    version = scalar(store, "SELECT version FROM memory_nodes WHERE id = %s", nid)
    with store.pg() as con:  # the job read the row at `version`; a live write bumped it since
        con.execute("UPDATE memory_nodes SET importance = 6 WHERE id = %s", (nid,))
        landed = con.execute(job._update_sql("memory_nodes", 1), [nid, version, None, MIRRORED.name]).fetchall()
        con.commit()
    assert landed == [] and scalar(store, "SELECT embedding_model FROM memory_nodes WHERE id = %s", nid) == HASHING


def test_the_gate_ranks_with_the_configured_embedder(store, scope, runs_dir):
    """Turns written and recalled with another model, the night configured with it: the gate embeds the
    replayed query with that model and finds the used memory before the diff (with the hashing model
    it would compare vectors of two spaces and find nothing)."""
    from deep_sleep.run import pipeline

    labels = [f"deploy checklist step {w}" for w in ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf")]
    labels.append("billing invoice retry policy")
    record_turn(store, scope, [{"op": "upsert_node", "label": label} for label in labels], now=NOW,
                config=MIRRORED_CONFIG, nap=False)
    hits = recall(store, scope, "billing invoice retry", k=3, now=NOW, config=MIRRORED_CONFIG)
    used = next(h for h in hits if h.label.startswith("billing"))
    assert feedback(store, used.recall_id, used=True)
    config = MIRRORED_CONFIG.model_copy(update={"gate": MIRRORED_CONFIG.gate.model_copy(update={"k": 1})})
    ctx = pipeline.Context.of(NOW + timedelta(hours=1), config, scopes=scope, store=store, base=runs_dir / "r")
    gate = pipeline.run(pipeline.PLAN, ctx).report().gate
    assert gate["status"] == "measured" and gate["recall_before"] == 1.0, gate


def test_the_public_entry_point_runs_a_scope_and_a_shard(store, scope, runs_dir):
    import deep_sleep
    from deep_sleep import connect_store, consolidate

    other = sibling(scope, "b2")
    for s in (scope, other):
        record_turn(store, s, [{"op": "upsert_node", "label": "project: apollo"}], now=NOW, nap=False)
    assert set(deep_sleep.PUBLIC) <= set(dir(deep_sleep)) | set(deep_sleep.__all__)
    same = connect_store(store.dsn)
    one = consolidate(same, scope, NOW + timedelta(hours=1), runs_dir=runs_dir)
    assert list(one.reports) == [scope.path] and one.report().status == "applied"
    both = consolidate(same, [scope.display(), other], NOW + timedelta(hours=2), runs_dir=runs_dir, embedder="hashing")
    assert sorted(both.reports) == sorted([scope.path, other.path])
    assert {r.status for r in both.reports.values()} <= {"applied", "skipped"}
    assert rows(store, "SELECT count(DISTINCT scope_path) FROM consolidation_runs WHERE scope_path = ANY(%s) AND as_of = %s",
                [scope.path, other.path], NOW + timedelta(hours=2)) == [(2,)]


def test_the_embedder_is_named_by_the_configuration(store, scope):
    assert embedder("tests.online.test_recall_everything:MIRRORED") is MIRRORED
    receipt = record_turn(store, scope, [{"op": "upsert_node", "label": "x topic"}], now=NOW, config=MIRRORED_CONFIG,
                          nap=False)
    assert scalar(store, "SELECT embedding_model FROM memory_nodes WHERE id = %s", receipt.ids()[0]) == MIRRORED.name


def _meta_node(store, scope, label: str, props: dict) -> str:
    """A META node as a night writes it (its word key from the trigger), with no vector: found by words only."""
    import json
    import uuid

    nid = str(uuid.uuid4())
    with store.pg() as con:
        con.execute("INSERT INTO memory_nodes (id, scope_path, tenant_id, label, properties, created_at, updated_at)"
                    " VALUES (%s, %s, %s, %s, %s, %s, %s)", (nid, scope.path, scope.tenant_id, label, json.dumps(props), NOW, NOW))
    return nid


@pytest.mark.parametrize("big", [False, True], ids=["one-pass", "big-scope"])
def test_summaries_take_word_seats_of_their_own_and_leave_the_facts_theirs(store, scope, monkeypatch, big):
    """Golden (SPEC §5): a summary's word key holds every folded turn's words, so it out-scores a fact
    holding one of the query's words; twelve such summaries took all ten of the nodes' word seats and
    the fact was no candidate.  Summaries have ``n_seed`` seats of their own: the fact is one of the
    nodes' ten, and ten of the twelve summaries theirs — in a small scope's one pass over the matching
    rows and in a big scope's word-by-word enumeration alike (``big``: every scope counts as big)."""
    from deep_sleep.online.recall import _lexical_words, candidate_params, candidates_sql

    if big:
        monkeypatch.setattr(RECALL_MODULE, "BIG_SCOPE", 1)
    fact = record_turn(store, scope, [{"op": "upsert_node", "label": "a zebra grazes"}], now=NOW, nap=False).ids()[0]
    summaries = {_meta_node(store, scope, "META:episodic_summary",
                            {"summary": f"digest {i}", "keywords": "zebra quill savanna"}) for i in range(12)}
    words = _lexical_words("zebra quill savanna")
    with store.pg() as con:  # the word match alone (no query vector)
        cands = con.execute(candidates_sql(False, len(words), True), candidate_params(scope, words, None, 5)).fetchall()
    nodes = {r[1]: r[9] for r in cands if r[0] == "node"}
    assert nodes[fact] > 0
    assert len(summaries & set(nodes)) == 10 and min(nodes[s] for s in summaries & set(nodes)) > nodes[fact]


def test_a_cluster_hit_quotes_its_best_matching_member(store, scope):
    """Golden (SPEC §5): a cluster's passage is its label and member count and the one member sharing
    the most of the query's words, with that member's id; its other members are nodes recall ranks on
    their own, and all of them are its ``source_ids``."""
    import uuid

    labels = ["Quill the zebra races at dawn", "a zebra eats grass", "zebra stripes are unique"]
    members = [record_turn(store, scope, [{"op": "upsert_node", "label": x}], now=NOW, nap=False).ids()[0] for x in labels]
    cluster = _meta_node(store, scope, "META:zebra", {"member_count": 3})
    with store.pg() as con:
        for m in members:
            con.execute("INSERT INTO memory_edges (id, scope_path, tenant_id, source_id, target_id, relation)"
                        " VALUES (%s, %s, %s, %s, %s, 'CLUSTERS')", (str(uuid.uuid4()), scope.path, scope.tenant_id, cluster, m))
    hits = recall(store, scope, "zebra Quill dawn", k=5, now=NOW, config=load_config(overrides={"recall": {"events": False}}))
    hit = next(h for h in hits if h.kind == "cluster")
    assert hit.node_id == cluster
    assert [(ln.source_id, ln.text) for ln in hit.lines] == [(members[0], labels[0])]
    assert hit.text == f"META:zebra (3 members)\n{labels[0]}"
    assert set(hit.source_ids) == set(members)
