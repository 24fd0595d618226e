"""recall and feedback on the real store (SPEC §5): one hop of spreading activation within the
visible paths, the reranker's cap, a tenant root's legacy rows, bad arguments, the log of a query
PostgreSQL could not store as given, and feedback that keeps a model training."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from deep_sleep.core.errors import DeepSleepError
from deep_sleep.core.scope import Scope
from deep_sleep.online.errors import OnlineArgumentError
from deep_sleep.online.recall import feedback, recall
from deep_sleep.online.turn import record_turn
from deep_sleep.run.pipeline import consolidate
from deep_sleep.transforms.config import load_config
from tests.online.helpers import NOW, rows, sibling
from tests.storeutil import edge, insert, node, scalar


def test_feedback_keeps_training_an_existing_model(store, scope, runs_dir):
    receipt = record_turn(store, scope, [{"op": "upsert_node", "label": "topic: garden roses"}], now=NOW, nap=False)
    first = recall(store, scope, "garden roses", k=1, now=NOW)
    feedback(store, first[0].recall_id, used=True)
    consolidate(store, scope, NOW + timedelta(hours=1), runs_dir=runs_dir).report()
    w1 = scalar(store, "SELECT weights FROM reranker_models WHERE scope_path = %s", scope.path)
    second = recall(store, scope, "garden roses", k=1, now=NOW + timedelta(hours=2))
    feedback(store, second[0].recall_id, used=False)
    report = consolidate(store, scope, NOW + timedelta(hours=3), runs_dir=runs_dir).report()
    assert report.conflicts == 0 and report.counters["reranker_steps"] == 1
    w2, steps = rows(store, "SELECT weights, steps FROM reranker_models WHERE scope_path = %s", scope.path)[0]
    assert steps == 2 and w2 != w1
    assert receipt.ids()


#: Vector similarity and spreading alone (no word matching, no events): the base is the similarity.
VECTOR_ONLY = load_config(overrides={"recall": {"lexical": False, "events": False}})


def test_recall_spreads_one_hop_within_visible_paths_and_caps_the_reranker(store, scope):
    hub = record_turn(store, scope, [{"op": "upsert_node", "label": "alpha topic one"}], now=NOW, nap=False).ids()[0]
    near = node(scope, "zzz unrelated words", NOW)                   # no embedding: reachable only by the edge
    sib = sibling(scope, "b9")
    far = node(sib, "alpha topic one in a sibling", NOW)
    insert(store, "memory_nodes", [near, far])
    insert(store, "memory_edges", [edge(scope, hub, near["id"]), edge(sib, hub, far["id"])])

    hits = recall(store, scope, "alpha topic one", k=3, now=NOW, config=VECTOR_ONLY)
    by_id = {h.node_id: h for h in hits}
    assert set(by_id) == {hub, near["id"]}                            # the sibling's node never appears
    hop = by_id[near["id"]]
    assert hop.via == hub and hop.features[5] == 1.0 and hop.similarity == 0.0
    assert hop.features[6] == pytest.approx(0.5 * by_id[hub].similarity)
    assert by_id[hub].features[4] > 0                                 # degree counts the visible edge
    assert all(h.score == pytest.approx(h.similarity if h.via is None else h.features[6]) for h in hits)  # no model: no adjustment

    for weight, bound in ((100.0, 0.25), (-100.0, -0.25)):
        with store.pg() as con:
            con.execute("DELETE FROM reranker_models WHERE scope_path = %s", (scope.path,))
            con.execute("INSERT INTO reranker_models (id, scope_path, tenant_id, weights, bias) VALUES (%s, %s, %s, %s, %s)",
                        (str(uuid.uuid4()), scope.path, scope.tenant_id, [weight] * 12, weight))
            con.commit()
        capped = recall(store, scope, "alpha topic one", k=1, now=NOW, config=VECTOR_ONLY)
        assert capped[0].score - capped[0].similarity == pytest.approx(bound)

    n = scalar(store, "SELECT count(*) FROM recall_events WHERE scope_path = %s", scope.path)
    assert n == len(hits) + 2
    assert scalar(store, "SELECT count(*) FROM memory_access_log WHERE node_id = %s AND kind = 'read'", near["id"]) == 1


def test_recall_on_a_tenant_root_sees_that_tenants_legacy_rows(store):
    tid = f"t{uuid.uuid4().hex[:8]}"
    tenant = Scope.root("tenant", tid)
    nid = record_turn(store, tenant, [{"op": "upsert_node", "label": "legacy fact about kiwis"}], now=NOW, nap=False).ids()[0]
    with store.pg() as con:
        con.execute("UPDATE memory_nodes SET scope_path = NULL WHERE id = %s", (nid,))
        con.commit()
    assert nid in [h.node_id for h in recall(store, tenant.child("conversation", "c1"), "kiwis", now=NOW)]
    assert nid not in [h.node_id for h in recall(store, Scope.root("tenant", tid + "x"), "kiwis", now=NOW)]
    assert nid not in [h.node_id for h in recall(store, Scope.root("org", tid), "kiwis", now=NOW)]


def test_recall_rejects_bad_arguments_and_blank_queries(store, scope):
    with pytest.raises(ValueError, match="k must be an integer from 1 to 1000, got 0"):
        recall(store, scope, "x", k=0)
    with pytest.raises(TypeError):
        recall(store, scope, None)  # type: ignore[arg-type]
    assert recall(store, scope, "   ") == []


def test_bad_arguments_are_input_errors_of_ours(store, scope):
    for call in (lambda: recall(store, scope, "x", k=True), lambda: recall(store, scope, 7),
                 lambda: feedback(store, str(uuid.uuid4()), used=1), lambda: feedback(store, "not-a-uuid", used=True)):
        with pytest.raises(OnlineArgumentError) as caught:
            call()
        assert isinstance(caught.value, DeepSleepError)


def test_recall_logs_a_query_with_a_lone_surrogate_or_nul_as_well_formed_text(store, scope):
    record_turn(store, scope, [{"op": "upsert_node", "label": "surrogate probe", "properties": {"note": "probe"}}])
    hits = [h for h in recall(store, scope, "surrogate\ud800 pro\x00be", k=3) if h.kind == "node"]
    assert hits and hits[0].label == "surrogate probe"
    logged = scalar(store, "SELECT query FROM recall_events WHERE id = %s", hits[0].recall_id)
    assert logged == "surrogate\ufffd probe"


def test_a_use_from_a_child_scope_counts_for_the_nodes_own_scope(store, scope, runs_dir):
    """Issue 31 (7): a parent's node used through recall from a child scope is "used" for the parent's
    holds too: the label is also recorded under the node's scope (one row, replaced by a later verdict),
    and the parent's night holds the node's prune for approval instead of archiving it silently."""
    from deep_sleep.run import pipeline

    parent = Scope.from_path(scope.levels[:1])
    child = scope.child("conversation", "c1")
    old = node(parent, "fact: the vault code is in the red binder", NOW - timedelta(days=40), importance=1.0)
    insert(store, "memory_nodes", [old])
    hit = next(h for h in recall(store, child, "vault code red binder", k=3, now=NOW) if h.node_id == old["id"])
    assert hit.scope_path == parent.path
    assert feedback(store, hit.recall_id, used=True)
    own = rows(store, "SELECT scope_path, label, label_source FROM recall_events WHERE node_id = %s ORDER BY scope_path", old["id"])
    assert own == [(parent.path, 1.0, "explicit"), (child.path, 1.0, "explicit")]
    assert feedback(store, hit.recall_id, used=False) and feedback(store, hit.recall_id, used=True)
    assert scalar(store, "SELECT count(*) FROM recall_events WHERE node_id = %s AND scope_path = %s", old["id"], parent.path) == 1

    ctx = pipeline.Context.of(NOW + timedelta(hours=1), load_config(), scopes=parent, store=store,
                              base=runs_dir / "p", phases=("prune_orphans",))
    planned = pipeline.run(pipeline.PLAN, ctx).report()
    assert planned.held["reasons"] == {"used_node": 1}
