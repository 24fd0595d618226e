"""label_recalls on a shard: a recall is labelled with the evidence of its own scope only."""

from __future__ import annotations

from datetime import timedelta

from deep_sleep.transforms.config import ConsolidationConfig
from deep_sleep.transforms.label_recalls import label_recalls
from tests.transforms.shard_cases import AC, ACME, AS_OF, NESTED, assert_each_scope_alone, interleaved_shard as shard_of, uid

T0 = AS_OF - timedelta(hours=6)


def _recall(scope: str, s: int, n: int, query: str, similarity: float, at=T0, **kw) -> dict:
    return {"id": uid(s, n), "scope_path": scope, "query": query, "node_id": uid(s, 900), "similarity": similarity,
            "features": [0.0] * 12, "score": similarity, "created_at": at, **kw}


def _fixture():
    recalls = [
        _recall(ACME, 2, 1, "rotate the signing keys", 0.3),
        _recall(AC, 1, 1, "billing invoice", 0.8),  # its words come back only in ACME: unused in AC
        _recall(AC, 1, 2, "pager rota", 0.6, at=T0 + timedelta(hours=2)),  # came back in AC
        _recall(ACME, 2, 2, "pager rota", 0.7, at=T0 + timedelta(hours=2)),  # ... but not in ACME
        _recall(ACME, 2, 3, "already told", 0.9, label=1.0, label_source="explicit"),
    ]
    nodes = [
        {"id": uid(2, 10), "scope_path": ACME, "layer": "working", "label": "billing invoice sent", "created_at": T0 + timedelta(hours=1)},
        {"id": uid(1, 10), "scope_path": AC, "layer": "working", "label": "pager handover", "created_at": T0 + timedelta(hours=3)},
        {"id": uid(3, 10), "scope_path": NESTED, "layer": "working", "label": "rotate keys", "created_at": T0 + timedelta(hours=1)},
    ]
    events = [
        {"id": uid(2, 20), "scope_path": ACME, "session_id": "s", "content": "I will rotate them now", "created_at": T0 + timedelta(minutes=30)},
        {"id": uid(1, 20), "scope_path": AC, "session_id": "s", "content": "billing", "created_at": T0 - timedelta(hours=1)},  # before
    ]
    return shard_of({"recall_events": recalls, "memory_nodes": nodes, "episodic_events": events}, (AC, ACME, NESTED))


def test_recalls_are_labelled_with_their_own_scopes_evidence():
    shard, snaps = _fixture()
    result = label_recalls(shard, ConsolidationConfig().phase("label_recalls"), AS_OF, 24.0)
    labels = dict(result.diff.tables["recall_events"].updates.select("id", "label").iter_rows())
    assert labels == {
        uid(1, 1): 0.4,  # AC's "billing" came back in ACME, and before the recall in AC: unused
        uid(1, 2): 0.6,  # AC's pager came back in AC: max(0.6, 0.5)
        uid(2, 1): 0.5,  # ACME's "rotate" came back in ACME: max(0.3, 0.5)
        uid(2, 2): 0.35,  # ACME's pager came back only in AC: unused
    }
    assert result.skipped_scopes == {NESTED: "missing input: no recall events"}
    assert dict(result.by_scope.select("scope_path", "recalls_labelled").iter_rows()) == {AC: 2, ACME: 2}
    reports = assert_each_scope_alone(shard, snaps, ("label_recalls",))
    assert reports[NESTED].phases_skipped == {"label_recalls": "missing input: no recall events"}


def test_a_scope_with_nothing_to_label_runs_and_counts_zero():
    shard, snaps = _fixture()
    recalls = shard.table("recall_events")
    shard = shard.with_frames({"recall_events": recalls.filter(recalls["scope_path"] != AC)
                               .vstack(recalls.filter(recalls["scope_path"] == AC).with_columns(label=0.2))})
    snaps = [s if s.scope_path != AC else s.with_frames({"recall_events": s.table("recall_events").with_columns(label=0.2)})
             for s in snaps]
    reports = assert_each_scope_alone(shard, snaps, ("label_recalls",))
    assert reports[AC].phases_run == ["label_recalls"] and reports[AC].counters["recalls_labelled"] == 0
    assert reports[ACME].counters["recalls_labelled"] == 2
