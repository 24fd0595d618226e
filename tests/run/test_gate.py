"""The recall-quality gate (deep_sleep/run/gate.py, SPEC §9, issue 16 item 3): a scope whose used
memories are weak and old (prune and decay take them) fails it and the report and ledger keep
recall@k before/after; a scope where nothing used is touched passes unchanged; a hand-built scope
with known ranks (seeds, a spread hop, the model's capped adjustment with new importance); an
empty diff never drops; the shard version equals the per-scope one; and on the real store the
gate's ranking is the live recall's."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import pytest

from deep_sleep.core import tables
from deep_sleep.core.config import GateConfig
from deep_sleep.core.diff import Diff
from deep_sleep.core.embedding import default_embedder
from deep_sleep.core.scope import Scope
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.core.tables import EMBEDDING_DIM
from deep_sleep.dev.generate import generate
from deep_sleep.dev.spec import SeedSpec
from deep_sleep.run import gate as gate_mod
from deep_sleep.run.gate import ranked_hits
from deep_sleep.run.transform import as_shard_diff, transform
from deep_sleep.transforms.config import ConsolidationConfig

AS_OF = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
SCOPE = Scope.root("org", "gate").child("agent", "a1")


def _id(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012d}"


def _node(n: int, label: str, *, importance: float = 5.0, age_days: float = 1.0, scope: Scope = SCOPE) -> dict:
    at = AS_OF - timedelta(days=age_days)
    return {"id": _id(n), "scope_path": scope.path, "tenant_id": scope.tenant_id, "layer": "semantic", "label": label,
            "properties": "{}", "importance": importance, "access_count": 0, "created_at": at, "updated_at": at,
            "last_decayed_at": None, "version": 1}


def _edge(n: int, source: int, target: int, weight: float = 1.0, scope: Scope = SCOPE) -> dict:
    at = AS_OF - timedelta(days=1)
    return {"id": _id(1000 + n), "scope_path": scope.path, "tenant_id": scope.tenant_id, "source_id": _id(source),
            "target_id": _id(target), "relation": "RELATED_TO", "weight": weight, "properties": "{}", "created_at": at,
            "updated_at": at, "valid_from": at, "valid_to": None, "version": 1}


def _recall(n: int, query: str, node: int, label: float | None, source: str | None = "explicit", scope: Scope = SCOPE) -> dict:
    return {"id": _id(5000 + n), "scope_path": scope.path, "tenant_id": scope.tenant_id, "query": query,
            "node_id": _id(node), "similarity": 0.5, "features": [0.0] * 12, "score": 0.5, "label": label,
            "label_source": source, "trained_at": None, "created_at": AS_OF - timedelta(hours=2), "version": 1}


def _snapshot(nodes: list[dict], edges: list[dict], recalls: list[dict], models: list[dict] | None = None,
              scope: Scope = SCOPE) -> Snapshot:
    rows = {"memory_nodes": nodes, "memory_edges": edges, "recall_events": recalls, "reranker_models": models or []}
    frames = {name: tables.conform(name, pl.DataFrame(r, schema_overrides={c.name: c.dtype for c in tables.TABLES[name]}))
              if r else tables.empty(name) for name, r in rows.items()}
    return Snapshot(scope.path, AS_OF, None, frames)


def _label_embeddings(snap: Snapshot) -> pl.DataFrame:
    """Each node's embedding as the online path writes it: the embedder's vector of its label."""
    nodes = snap.table("memory_nodes")
    vec = default_embedder().embed(nodes.get_column("label").to_list())
    return pl.DataFrame({"id": nodes.get_column("id"), "embedding": vec}).with_columns(
        pl.col("embedding").cast(pl.Array(pl.Float32, EMBEDDING_DIM)))


STRONG = [f"deploy pipeline stage {w} checklist" for w in ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot",
                                                            "golf", "hotel", "india", "juliet", "kilo", "lima")]


def _scope_with(used_weak: bool) -> Snapshot:
    """Twelve strong, recent, connected nodes and one weak, old orphan ("billing invoice retry
    policy").  ``used_weak``: the agent used the orphan for "billing invoice retry"; else it used a
    strong node for "deploy pipeline stage alpha"."""
    nodes = [_node(i, label, importance=7.0) for i, label in enumerate(STRONG)]
    nodes.append(_node(50, "billing invoice retry policy", importance=2.0, age_days=60))
    edges = [_edge(i, i, i + 1) for i in range(len(STRONG) - 1)]
    if used_weak:
        recalls = [_recall(0, "billing invoice retry", 50, 1.0), _recall(1, "billing invoice retry", 3, 0.0)]
    else:
        recalls = [_recall(0, "deploy pipeline stage alpha", 0, 1.0)]
    return _snapshot(nodes, edges, recalls)


def recall_gate(snap: Snapshot | Shard, diff: Diff, config, embeddings=None, **kw):
    """One scope's verdict (a Snapshot); a shard's verdicts (a Shard)."""
    got = gate_mod.recall_gate(snap, diff, config, embeddings, **kw)
    return got if isinstance(snap, Shard) else got[snap.scope_path]


def _subset(report: dict, **want) -> bool:
    return {k: report.get(k) for k in want} == want


def _planned(snap: Snapshot):
    result = transform(snap, ConsolidationConfig(), AS_OF, phases=("decay_importance", "prune_orphans"))
    deleted = result.diff.table("memory_nodes").deletes.get_column("id").to_list()
    return result, deleted


def test_weak_old_used_memories_that_prune_removes_fail_the_gate():
    snap = _scope_with(used_weak=True)
    result, deleted = _planned(snap)
    assert deleted == [_id(50)]  # prune takes the weak old orphan the agent used
    gate = recall_gate(result.scope_snapshot(), result.diff, ConsolidationConfig(), _label_embeddings(snap), now=AS_OF)
    assert (gate.queries, gate.recall_before, gate.recall_after) == (1, 1.0, 0.0)
    assert gate.drop_pp == pytest.approx(100.0) and gate.failed
    report = gate.to_report()
    # the probes (deep_sleep/run/probes.py) see the same prune: 1 of the scope's 13 rows, 7.7 pp, within their limit
    assert report.pop("probes")["drop_pp"] == pytest.approx(100 / 13, abs=1e-3)
    assert report == {"status": "measured", "detail": gate.detail, "queries": 1, "recall_before": 1.0,
                      "recall_after": 0.0, "drop_pp": 100.0, "failed": True}
    assert "FAILED" in gate.detail


def test_a_scope_where_nothing_used_is_touched_passes_unchanged():
    snap = _scope_with(used_weak=False)
    result, deleted = _planned(snap)
    assert deleted == [_id(50)]  # the diff still deletes, but nothing the agent used
    gate = recall_gate(result.scope_snapshot(), result.diff, ConsolidationConfig(), _label_embeddings(snap), now=AS_OF)
    assert (gate.queries, gate.recall_before, gate.recall_after, gate.drop_pp, gate.failed) == (1, 1.0, 1.0, 0.0, False)


def test_a_small_drop_within_the_threshold_passes_and_a_larger_one_fails():
    snap = _scope_with(used_weak=True)
    result, _ = _planned(snap)
    emb = _label_embeddings(snap)
    assert not recall_gate(result.scope_snapshot(), result.diff, GateConfig(max_drop_pp=100.0), emb).failed
    assert recall_gate(result.scope_snapshot(), result.diff, GateConfig(max_drop_pp=99.0), emb).failed


class _Fixed:
    """An embedder that maps each query text to a given vector."""

    dim, name = EMBEDDING_DIM, "fixed"

    def __init__(self, vectors: dict[str, np.ndarray]) -> None:
        self.vectors = vectors

    def embed(self, texts):
        return np.stack([self.vectors[t] for t in texts]).astype(np.float32)


def _unit(*coords: float) -> np.ndarray:
    v = np.zeros(EMBEDDING_DIM, dtype=np.float32)
    v[: len(coords)] = coords
    return v / np.linalg.norm(v)


def _golden() -> tuple[Snapshot, pl.DataFrame, _Fixed]:
    """A (sim 1), B (0.707), E (0.447), C (0), D (no embedding; A → D, weight 1: spread 0.5)."""
    nodes = [_node(1, "A"), _node(2, "B"), _node(3, "C"), _node(4, "D"), _node(5, "E")]
    emb = pl.DataFrame({"id": [_id(1), _id(2), _id(3), _id(5)],
                        "embedding": [_unit(1), _unit(1, 1), _unit(0, 1), _unit(1, 2)]}).with_columns(
        pl.col("embedding").cast(pl.Array(pl.Float32, EMBEDDING_DIM)))
    recalls = [_recall(0, "q", 2, 1.0), _recall(1, "q", 4, 0.9, "implicit"), _recall(2, "q", 3, 0.2, "implicit")]
    return _snapshot(nodes, [_edge(0, 1, 4, 1.0)], recalls), emb, _Fixed({"q": _unit(1)})


def test_golden_ranks_of_a_hand_built_scope():
    snap, emb, embedder = _golden()
    for k, expected in ((2, [1, 2]), (4, [1, 2, 4, 5]), (10, [1, 2, 4, 5, 3])):
        got = ranked_hits(snap, GateConfig(k=k), emb, now=AS_OF, embedder=embedder)
        assert got.get_column("node_id").to_list() == [_id(n) for n in expected], k
        assert got.get_column("rank").to_list() == list(range(1, len(expected) + 1))
    # used, by default: B (explicit feedback) only — an implicit label says the query's words came back, not
    # that the agent used the memory
    gate = recall_gate(snap, Diff.empty(), GateConfig(k=2), emb, embedder=embedder)
    assert (gate.queries, gate.recall_before, gate.recall_after, gate.drop_pp) == (1, 1.0, 1.0, 0.0)
    # with implicit labels: B and D (implicit 0.9 ≥ min_label); C's 0.2 is not used
    gate = recall_gate(snap, Diff.empty(), GateConfig(k=2, implicit=True), emb, embedder=embedder)
    assert (gate.queries, gate.recall_before, gate.recall_after, gate.drop_pp) == (1, 0.5, 0.5, 0.0)
    # without A, D is reached from no top hit: recall@3 goes from 2/2 to 1/2
    diff = Diff.of("memory_nodes", "prune_orphans", deletes=pl.DataFrame({"id": [_id(1)], "version": [1]}), reason="test")
    gate = recall_gate(snap, diff, GateConfig(k=3, implicit=True), emb, embedder=embedder)
    assert (gate.recall_before, gate.recall_after, gate.drop_pp, gate.failed) == (1.0, 0.5, 50.0, True)


def test_new_importance_moves_ranks_through_the_model():
    snap, emb, embedder = _golden()
    # the model: 2 × importance/10 − 1, capped at ±0.25 — 0 at importance 5
    weights = [0.0, 2.0] + [0.0] * 10
    snap = snap.with_frames({"reranker_models": tables.conform("reranker_models", pl.DataFrame(
        [{"id": _id(9000), "scope_path": SCOPE.path, "tenant_id": SCOPE.tenant_id, "weights": weights, "bias": -1.0,
          "steps": 3, "updated_at": AS_OF, "version": 1}]))})
    assert ranked_hits(snap, GateConfig(k=2), emb, embedder=embedder).get_column("node_id").to_list() == [_id(1), _id(2)]
    # decay takes B to importance 1: adjustment −0.25, 0.457 < D's 0.5
    diff = Diff.of("memory_nodes", "decay_importance",
                   updates=pl.DataFrame({"id": [_id(2)], "version": [1], "importance": [1.0]}))
    after = ranked_hits(diff.fold(snap), GateConfig(k=2), emb, embedder=embedder)
    assert after.get_column("node_id").to_list() == [_id(1), _id(4)]
    gate = recall_gate(snap, diff, GateConfig(k=2, implicit=True), emb, embedder=embedder)
    assert (gate.recall_before, gate.recall_after) == (0.5, 0.5)  # B lost, D gained
    assert recall_gate(snap, diff, GateConfig(k=1, implicit=True), emb, embedder=embedder).drop_pp == 0.0  # A stays first


def test_a_gate_that_cannot_measure_says_why_and_never_reads_as_passed():
    """SPEC §9 as amended: no used query, no vectors, recall@k of zero before the diff, or switched off —
    each by its status, never failed, never "measured"."""
    snap, emb, embedder = _golden()
    unused = snap.with_frames({"recall_events": snap.table("recall_events").with_columns(pl.lit(0.0).alias("label"))})
    # the query finds none of its used memories before the diff (E, not B or D, is the only used one; k = 1)
    far = snap.with_frames({"recall_events": snap.table("recall_events").with_columns(
        pl.when(pl.col("node_id") == _id(3)).then(1.0).otherwise(0.0).alias("label"))})
    cases = {
        "no_used_query": recall_gate(unused, Diff.empty(), GateConfig(), emb, embedder=embedder),
        "no_vectors": recall_gate(snap, Diff.empty(), GateConfig(), None, embedder=embedder),
        "disabled": recall_gate(snap, Diff.empty(), GateConfig(enabled=False), emb, embedder=embedder),
        "zero_before": recall_gate(far, Diff.empty(), GateConfig(k=1, implicit=True), emb, embedder=embedder),
    }
    for status, result in cases.items():
        assert result.status == status and not result.measured and not result.failed, status
        report = result.to_report()
        assert report["status"] == status and report["failed"] is False and report["detail"] == gate_mod.UNMEASURED[status]
    assert cases["no_used_query"].queries == 0 and cases["no_used_query"].recall_before is None
    assert (cases["zero_before"].queries, cases["zero_before"].recall_before) == (1, 0.0)  # the figures are kept
    # a diff that would take the used memory away cannot fail a gate that saw nothing before
    drop = Diff.of("memory_nodes", "prune_orphans", deletes=pl.DataFrame({"id": [_id(3)], "version": [1]}), reason="t")
    assert recall_gate(far, drop, GateConfig(k=1, implicit=True), emb, embedder=embedder).status == "zero_before"


def _fleet_snapshots(seed: int, scopes: int = 3) -> list[Snapshot]:
    frames = generate(SeedSpec(tenants=1, scopes_per_tenant=scopes - 1, nodes_per_scope=120, seed=seed, now=AS_OF))
    out = []
    for path in frames["memory_nodes"].get_column("scope_path").unique().sort().to_list():
        mine = {n: tables.conform(n, f.filter(pl.col("scope_path") == path)).select([c.name for c in tables.TABLES[n]])
                for n, f in frames.items() if n in tables.TABLES}
        # every recall of the scope "used" — queries with real overlap with the labels
        mine["recall_events"] = mine["recall_events"].with_columns(pl.lit(1.0).alias("label"), pl.lit("explicit").alias("label_source"))
        out.append(Snapshot(path, AS_OF, None, mine))
    return out


@pytest.mark.parametrize("seed", [3, 11, 29])
def test_an_empty_diff_never_drops(seed):
    for snap in _fleet_snapshots(seed):
        gate = recall_gate(snap, Diff.empty(), ConsolidationConfig(), _label_embeddings(snap))
        assert gate.queries > 0
        assert gate.recall_before == gate.recall_after and gate.drop_pp == 0.0 and not gate.failed


def test_the_shard_gate_is_each_scopes_gate():
    snaps = _fleet_snapshots(5, scopes=4)
    shard = Shard.from_snapshots(snaps)
    planned = transform(shard, ConsolidationConfig(), AS_OF)
    emb = pl.concat([_label_embeddings(s) for s in snaps])
    together = recall_gate(planned.shard, planned.diff, ConsolidationConfig(), emb, now=AS_OF)
    assert set(together) == set(shard.scope_paths)
    assert any(r.queries for r in together.values())
    for s in shard.scope_paths:
        alone = recall_gate(planned.scope_snapshot(s), planned.scope_diff(s), ConsolidationConfig(), emb, now=AS_OF)
        assert together[s] == alone, s


# -- on the real store -------------------------------------------------------------------------

def test_plan_scope_gate_ranks_as_live_recall_and_report_and_ledger_keep_the_figures(store, scope, runs_dir):
    from deep_sleep.online.recall import feedback, recall
    from deep_sleep.online.turn import record_turn
    from deep_sleep.run import pipeline
    from deep_sleep.store.extract import extract
    from deep_sleep.store.vectors import node_embeddings
    from tests.online.helpers import rows

    now = AS_OF
    ops = [{"op": "upsert_node", "label": label, "importance": 7.0} for label in STRONG]
    ops.append({"op": "upsert_node", "label": "billing invoice retry policy", "importance": 2.0})
    record_turn(store, scope, ops, now=now - timedelta(days=60), nap=False)
    with store.pg() as con, con.transaction():  # the strong ones are fresh and connected; the billing node is an old orphan
        con.execute("UPDATE memory_nodes SET updated_at = %s WHERE scope_path = %s AND label LIKE 'deploy%%'",
                    (now - timedelta(days=1), scope.path))
        ids = [r[0] for r in con.execute("SELECT id::text FROM memory_nodes WHERE scope_path = %s AND label LIKE 'deploy%%'"
                                         " ORDER BY label", (scope.path,))]
        for a, b in zip(ids, ids[1:]):
            con.execute("INSERT INTO memory_edges (id, scope_path, tenant_id, source_id, target_id, relation, weight)"
                        " VALUES (%s, %s, %s, %s, %s, 'RELATED_TO', 1.0)", (str(uuid.uuid4()), scope.path, scope.tenant_id, a, b))
    # the gate replays the vector part of live recall (nodes, similarity, spreading, the model), not its
    # word matching or its events: the live recall compared is that part alone
    vector_only = ConsolidationConfig(recall={"lexical": False, "events": False})
    hits = recall(store, scope, "billing invoice retry", k=10, now=now, config=vector_only)
    weak = next(h for h in hits if h.label.startswith("billing"))
    assert feedback(store, weak.recall_id, used=True)

    # the gate's replay ranks exactly as the live (vector) recall did
    snap = extract(store, scope)
    replayed = ranked_hits(snap, GateConfig(k=10), node_embeddings(store, [scope]), now=now)
    # (up to float32 cosine rounding: pgvector sums in its own order, so labels whose similarities agree to
    # ~1e-7 — here "stage charlie/delta/foxtrot checklist" — may swap places; scores and the hit set are the same)
    assert set(replayed.get_column("node_id").to_list()) == {h.node_id for h in hits}
    assert replayed.get_column("node_id")[:2].to_list() == [h.node_id for h in hits[:2]]
    got = ranked_hits(snap, GateConfig(k=10), node_embeddings(store, [scope]), now=now, with_scores=True)
    assert got.get_column("score").to_list() == pytest.approx([h.score for h in hits], abs=1e-6)

    ctx = pipeline.Context.of(now + timedelta(hours=1), ConsolidationConfig(), scopes=scope, store=store, base=runs_dir / "r")
    planned = pipeline.run(pipeline.PLAN, ctx)
    assert weak.node_id in pl.read_parquet(ctx.diff_dir / "memory_nodes.deletes.parquet").get_column("id").to_list()
    gate = planned.report().gate
    assert _subset(gate, status="measured", queries=1, recall_before=1.0, recall_after=0.0, drop_pp=100.0, failed=True)
    assert '"gate"' in (ctx.diff_dir / "report.json").read_text()
    # the weak node's delete waits for approval (the agent used it: used_node names it, ahead of gate_failed)
    assert planned.report().held["reasons"] == {"used_node": 1}
    assert any("recall-quality gate failed" in w for w in planned.report().held["why"])
    applied = pipeline.run((pipeline.Apply(),), ctx, planned).report()
    assert applied.gate == gate
    assert rows(store, "SELECT count(*) FROM memory_nodes WHERE id = %s", weak.node_id) == [(1,)]
    assert rows(store, "SELECT recall_before, recall_after FROM consolidation_runs WHERE run_id = %s",
                applied.run_id) == [(1.0, 0.0)]


def test_nodes_without_embeddings_are_never_seeds():
    snap, emb, embedder = _golden()
    none = emb.clear()  # the store has no embedding for any node: the live recall would find nothing either
    gate = recall_gate(snap, Diff.empty(), GateConfig(k=2), none, embedder=embedder)
    assert (gate.status, gate.queries, gate.recall_before, gate.failed) == ("no_vectors", 1, None, False)
    # only A has one: B and E are not seeds; D is reached from A by spreading, C and E never
    only_a = emb.filter(pl.col("id") == _id(1))
    got = ranked_hits(snap, GateConfig(k=10), only_a, embedder=embedder).get_column("node_id").to_list()
    assert got == [_id(1), _id(4)]


def test_the_shard_gate_on_a_fleet_with_prefix_sibling_scopes_is_each_scopes_gate():
    """A fleet shard (the fleet generator's embeddings and used recalls; copies of one template share
    labels and query texts) whose scopes include org/ac beside org/acme and org/acme's child: each
    scope's figures are those of its gate alone, and some scopes fail."""
    from deep_sleep.dev.fleet import FleetSpec, fleet_scope, generate_fleet

    spec = FleetSpec(scopes=20, nodes=100, templates=16, now=AS_OF, recalls=True, feedback_share=1.0)
    # scopes 3 and 19 copy template 3 (whose weak used memory phase 3 prunes), 4 another template
    rename = {fleet_scope(3).path: "org\x1fac", fleet_scope(19).path: "org\x1facme",
              fleet_scope(4).path: "org\x1facme\x1fagent\x1fa1"}
    frames = generate_fleet(spec)
    emb = frames["memory_nodes"].select("id", "embedding")
    path = pl.col("scope_path").replace(rename)
    snap = {n: tables.conform(n, f.drop("tenant_id", "embedding", "embedding_model", strict=False).with_columns(path))
            for n, f in frames.items()}
    paths = sorted({rename.get(fleet_scope(i).path, fleet_scope(i).path) for i in range(20)}, key=str.encode)
    shard = Shard.from_frames(dict.fromkeys(paths), AS_OF, snap)
    planned = transform(shard, ConsolidationConfig(), AS_OF)
    together = recall_gate(planned.shard, planned.diff, ConsolidationConfig(), emb, now=AS_OF)
    alone = {s: recall_gate(planned.scope_snapshot(s), planned.scope_diff(s), ConsolidationConfig(), emb, now=AS_OF)
             for s in paths}
    assert together == alone
    assert {"org\x1fac", "org\x1facme"} <= {s for s, g in together.items() if g.queries}
    assert sum(g.queries for g in together.values()) > 40
    assert together["org\x1fac"].failed and together["org\x1facme"].failed


def test_the_vectorized_reranker_adjustment_is_phase_d3s_scope_by_scope():
    from deep_sleep.run.gate import _adjustments, _adjustments_by_scope

    rng = np.random.default_rng(4)
    paths = ["org\x1fac", "org\x1facme", "org\x1facme\x1fagent\x1fa1", "org\x1fnomodel"]
    models = pl.DataFrame({"scope_path": paths[:3], "weights": [rng.normal(0, 0.3, 12).tolist() for _ in range(3)],
                           "bias": [0.01, -0.2, 0.3]})
    models = models.vstack(pl.DataFrame({"scope_path": ["org\x1fbad"], "weights": [[1.0] * 5], "bias": [9.0]}))
    state = Shard(("org\x1fac",), AS_OF, {}, {"reranker_models": models})
    cand = pl.Series("scope_path", [paths[i] for i in rng.integers(0, 4, 500)] + ["org\x1fbad"] * 3)
    x = rng.random((cand.len(), 12)) * 3
    fast, plain = _adjustments(state, cand, x), _adjustments_by_scope(state, cand, x)
    assert fast == pytest.approx(plain, abs=1e-14, rel=0)
    assert (fast[(cand == "org\x1fnomodel").to_numpy()] == 0).all() and (fast[-3:] == 0).all()  # no model / unreadable
    assert (np.abs(fast) == 0.25).any() and (np.abs(fast) < 0.25).any()  # the cap bites on some rows only
    # a row's value does not depend on the rows computed with it
    assert (_adjustments(state, cand[:7], x[:7]) == fast[:7]).all()
