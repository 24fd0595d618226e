"""Issue 37: the embedder of an online call is an embedder, named by its error when it is not; and the
store knows each tenant's embedding model (``embedding_models``): a writer or reader of another
model is refused before anything is stored, a turn's quick nap embeds with the turn's embedder, and
``deep-sleep reembed`` moves the tenant to the new model."""

from __future__ import annotations

import uuid
from datetime import timedelta

import polars as pl
import pytest

from deep_sleep.core.diff import Diff
from deep_sleep.core.embedding import EmbeddingModelError, HashingEmbedder, embedder
from deep_sleep.online.errors import OnlineArgumentError
from deep_sleep.online.recall import recall
from deep_sleep.online.turn import record_turn
from deep_sleep.transforms.config import load_config
from tests.online.helpers import NOW, rows, sibling
from tests.storeutil import scalar

HASHING = HashingEmbedder().name


class Mirrored:
    """Another model: the hashing embedder of each text's words reversed."""

    dim, name = 256, "mirrored-hashing-model-test"

    def embed(self, texts):
        return HashingEmbedder().embed([" ".join(w[::-1] for w in t.split()) for t in texts])


MIRRORED = Mirrored()
OP = [{"op": "upsert_node", "label": "project: billing"}]


def _stored(store, scope) -> tuple:
    return (scalar(store, "SELECT count(*) FROM memory_nodes WHERE scope_path = %s", scope.path),
            scalar(store, "SELECT count(*) FROM episodic_events WHERE scope_path = %s", scope.path),
            scalar(store, "SELECT coalesce(max(turns), 0) FROM scope_turns WHERE scope_path = %s", scope.path))


@pytest.mark.parametrize(("given", "message"), [
    ("nosuch", "embedding.model 'nosuch' is not a known model (hashing, wordllama) nor an import path"),
    ("sys:exit", "embedding.model 'sys:exit': calling exit() to build the provider raised SystemExit"),
    (object(), "embedder must be an embedding provider (an object with dim, name and embed) or the name of one"),
    (HashingEmbedder(dim=8), "embedder 'hashing-char3gram-blake2b-8' gives 8-d vectors; the store holds vector(256)"),
])
def test_an_embedder_that_is_none_is_an_argument_error_naming_the_call_and_nothing_is_stored(store, scope, given, message):
    with pytest.raises(OnlineArgumentError) as turn:
        record_turn(store, scope, OP, now=NOW, nap=False, embedder=given)
    assert str(turn.value).startswith("record_turn: ") and message in str(turn.value)
    with pytest.raises(OnlineArgumentError) as read:
        recall(store, scope, "billing", now=NOW, embedder=given)
    assert str(read.value).startswith("recall: ") and message in str(read.value)
    assert _stored(store, scope) == (0, 0, 0)


def test_an_embedder_may_be_named_as_embedding_model_names_it(store, scope):
    receipt = record_turn(store, scope, OP, now=NOW, nap=False, embedder="hashing")
    assert scalar(store, "SELECT embedding_model FROM memory_nodes WHERE id = %s", receipt.ids()[0]) == HASHING
    assert receipt.ids()[0] in [h.node_id for h in recall(store, scope, "billing", now=NOW, embedder="hashing")]


@pytest.mark.parametrize("k", [0, 1001, 10**9, True, 2.0])
def test_recall_bounds_k_by_name(store, scope, k):
    with pytest.raises(OnlineArgumentError, match=f"recall: k must be an integer from 1 to 1000, got {k!r}"):
        recall(store, scope, "billing", k=k, now=NOW)


def test_recall_of_the_most_hits_allowed_answers(store, scope):
    record_turn(store, scope, OP, now=NOW, nap=False)
    assert len(recall(store, scope, "billing", k=1000, now=NOW)) >= 1


def test_a_turn_of_another_model_than_its_tenants_is_refused_and_stores_nothing(store, scope):
    """Issue 37: the turn was accepted, and from then on every recall of the scope refused."""
    first = record_turn(store, scope, OP, now=NOW, nap=False)
    assert rows(store, "SELECT model FROM embedding_models WHERE tenant_id = %s", scope.tenant_id) == [(HASHING,)]
    before = _stored(store, scope)
    other = sibling(scope, "b2")  # the same tenant, another scope: a recall of a child would see both
    for target in (scope, other, scope.child("agent", "a1")):
        with pytest.raises(EmbeddingModelError) as caught:
            record_turn(store, target, [{"op": "create_event", "content": "Ada moved billing"}], now=NOW, nap=False,
                        embedder=MIRRORED)
        assert str(caught.value) == (
            f"record_turn: tenant {scope.tenant_id!r} holds vectors of model {HASHING} (embedding_models) and record_turn "
            f"embeds with {MIRRORED.name}; vectors of two models cannot be compared, so nothing was stored. Use the "
            f"tenant's model (embedding.model, or the embedder passed), or switch the tenant to {MIRRORED.name} with "
            "`deep-sleep reembed`, which re-embeds its vectors")
    assert _stored(store, scope) == before and _stored(store, other) == (0, 0, 0)
    with pytest.raises(EmbeddingModelError, match="recall: tenant .* holds vectors of model"):
        recall(store, scope, "billing", now=NOW, embedder=MIRRORED)
    # the tenant's recalls still answer, with its own model
    # (the node and the turn's summary event hold the same words: either may come first)
    assert first.ids()[0] in [h.node_id for h in recall(store, scope, "billing", now=NOW)]
    # another tenant is free to use another model
    stranger = sibling(scope, "b1").__class__.root("org", f"t{uuid.uuid4().hex[:10]}")
    record_turn(store, stranger, OP, now=NOW, nap=False, embedder=MIRRORED)
    assert rows(store, "SELECT model FROM embedding_models WHERE tenant_id = %s", stranger.tenant_id) == [(MIRRORED.name,)]


def test_the_quick_nap_of_a_turn_embeds_with_the_turns_embedder(store, scope):
    """Issue 37: ``record_turn(…, embedder=E)`` without ``config=`` napped with the configuration's model
    and wrote another model's vectors into the scope.  The nap that summarises the turns' events
    writes its summary with E's vector."""
    config = load_config(overrides={"quick_nap_interval": 20, "episodic_summary": {"threshold": 10, "batch_size": 5}})
    receipts = [record_turn(store, scope, [{"op": "create_event", "content": f"Ada: note {i} about the billing move"}],
                            now=NOW + timedelta(minutes=i), embedder=MIRRORED, config=config) for i in range(20)]
    nap = receipts[-1].quick_nap
    assert nap is not None and nap.status == "applied", nap and nap.errors
    models = rows(store, "SELECT DISTINCT embedding_model FROM memory_nodes WHERE scope_path = %s AND embedding IS NOT NULL",
                  scope.path)
    assert models == [(MIRRORED.name,)]
    assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE scope_path = %s AND label = 'META:episodic_summary'",
                  scope.path) >= 1


def test_an_apply_that_would_write_another_models_vectors_fails_the_scope_and_writes_nothing(store, scope):
    """The night's writer: its new nodes' vectors are checked against the tenant's model (the gate only
    sees the vectors a scope already holds)."""
    from deep_sleep.run.apply import apply, vector_conflicts
    from deep_sleep.transforms import new_report

    record_turn(store, scope, OP, now=NOW, nap=False)  # the tenant's model: hashing
    other = sibling(scope, "b3")
    node = {"id": str(uuid.uuid4()), "scope_path": other.path, "tenant_id": other.tenant_id, "layer": "semantic",
            "label": "META:cluster", "properties": "{}", "importance": 5.0, "access_count": 0,
            "embedding_model": MIRRORED.name, "created_at": NOW, "updated_at": NOW}
    diff = Diff({"memory_nodes": Diff.of("memory_nodes", "meta_nodes", inserts=pl.DataFrame([node])).tables["memory_nodes"]})
    assert list(vector_conflicts(store, diff)) == [other.path]
    report = new_report(other.path, NOW.isoformat(), run_id=str(uuid.uuid4()))
    got = apply(store, diff, {other.path: report})[other.path]
    assert got.status == "failed" and f"holds vectors of model {HASHING}" in got.error
    assert scalar(store, "SELECT count(*) FROM memory_nodes WHERE id = %s", node["id"]) == 0
    assert rows(store, "SELECT status FROM consolidation_runs WHERE run_id = %s", report.run_id) == [("failed",)]


def test_reembed_moves_the_tenant_to_the_new_model(store, scope):
    from deep_sleep.jobs.reembed import reembed

    record_turn(store, scope, OP, now=NOW, nap=False)
    config = load_config(overrides={"embedding": {"model": "tests.online.test_embedder_model:MIRRORED"}})
    assert embedder(config.embedding.model) is MIRRORED
    reembed(store, config, [scope], progress=lambda _: None)
    assert rows(store, "SELECT model FROM embedding_models WHERE tenant_id = %s", scope.tenant_id) == [(MIRRORED.name,)]
    record_turn(store, scope, OP, now=NOW, nap=False, config=config)  # the new model writes
    with pytest.raises(EmbeddingModelError):  # the old one no more
        record_turn(store, scope, OP, now=NOW, nap=False)


def test_claim_models_reads_each_tenants_model_and_claims_only_a_missing_one(store, scope):
    """The apply's check (vector_conflicts → claim_models): a tenant's recorded model is read, never
    overwritten; a tenant without one is given the writer's."""
    from deep_sleep.store.vectors import claim_models

    record_turn(store, scope, OP, now=NOW, nap=False)  # the tenant's model: hashing
    newcomer = sibling(scope, "b1").__class__.root("org", f"t{uuid.uuid4().hex[:10]}").tenant_id
    assert claim_models(store, {scope.tenant_id: MIRRORED.name}) == {scope.tenant_id: HASHING}
    assert claim_models(store, {scope.tenant_id: MIRRORED.name, newcomer: MIRRORED.name}) == {
        scope.tenant_id: HASHING, newcomer: MIRRORED.name}
    assert claim_models(store, {newcomer: HASHING}) == {newcomer: MIRRORED.name}
    assert rows(store, "SELECT tenant_id, model FROM embedding_models WHERE tenant_id = ANY(%s) ORDER BY model",
                [scope.tenant_id, newcomer]) == [(scope.tenant_id, HASHING), (newcomer, MIRRORED.name)]
