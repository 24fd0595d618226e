"""Tenant isolation is a security boundary: a run for one scope never reads or writes another's rows,
including siblings and scopes whose paths are string prefixes of each other."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deep_sleep.core.diff import Diff
from deep_sleep.core.scope import Scope
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run.pipeline import consolidate
from tests.storeutil import access, dump, edge, insert, node

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


def _family(tag: str) -> list[Scope]:
    """Scopes whose storage paths are string prefixes of one another, plus siblings and children."""
    roots = [Scope.root("org", f"{tag}ac"), Scope.root("org", f"{tag}acme"), Scope.root("org", f"{tag}acme2")]
    out = list(roots)
    for r in roots[:2]:
        out += [r.child("brand", "b"), r.child("brand", "b1"), r.child("brand", "b1").child("conv", "c")]
    return out


def _populate(store, scope: Scope, n: int, rng_seed: int) -> None:
    """A small graph with work for most phases: hot nodes, stale nodes, expired working memory, a
    prefix group, SOUL edits, events with markers."""
    t = NOW - timedelta(hours=2)
    nodes = [node(scope, f"topic: n{i}", t - timedelta(days=(i * 7 + rng_seed) % 60), importance=1.0 + (i * 3 + rng_seed) % 9) for i in range(n)]
    nodes.append(node(scope, "note: scratch", t - timedelta(hours=30), layer="working", properties={"ttl_hours": 1}))
    nodes.append(node(scope, "SOUL:name", t, properties={"_last_edited_by": "user_manual_edit", "value": f"N{rng_seed}"}))
    insert(store, "memory_nodes", nodes)
    insert(store, "memory_access_log", [access(scope, x["id"], NOW - timedelta(minutes=k)) for x in nodes[:3] for k in (1, 2)])
    insert(store, "memory_edges", [edge(scope, nodes[i]["id"], nodes[i + 1]["id"], at=t) for i in range(0, n - 1, 2)])
    events = [{"id": str(uuid.uuid4()), "scope_path": scope.path, "tenant_id": scope.tenant_id, "session_id": "s",
               "content": f"[semantic:topic: n0] [semantic:topic: n1] I deployed the api {k}", "created_at": t - timedelta(minutes=k)}
              for k in range(4)]
    insert(store, "episodic_events", events)


# Every one of the nine scopes of the family is the target once (a prefix, a sibling, a child, a root ...);
# hypothesis draws the sizes and the data around it.
@pytest.mark.parametrize("target_index", range(len(_family("x"))))
@settings(max_examples=1, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(sizes=st.lists(st.integers(2, 8), min_size=9, max_size=9), seed=st.integers(0, 50))
def test_a_run_touches_only_its_own_scope(store, tmp_path_factory, target_index, sizes, seed):
    family = _family(uuid.uuid4().hex[:6])
    for scope, n in zip(family, sizes, strict=True):
        _populate(store, scope, n, seed)
    target = family[target_index]
    before = {s.path: dump(store, s) for s in family}
    report = consolidate(store, target, NOW, runs_dir=tmp_path_factory.mktemp("runs")).report()
    assert report.status == "applied", report.errors
    assert any(report.counters.values())
    # every other scope is byte-for-byte as it was (rows, ledger, archive)
    for s in family:
        if s != target:
            assert dump(store, s) == before[s.path], f"run for {target} changed {s}"
    assert dump(store, target) != before[target.path]
    # the snapshot held only the target's rows, and every diff row is the target's
    snap = Snapshot.read(report.snapshot_uri)
    for name, frame in snap.frames.items():
        if frame.height and "scope_path" in frame.columns:
            assert set(frame.get_column("scope_path").unique()) == {target.path}, name
    diff = Diff.read(report.diff_uri)
    snap_ids = {t: set(f.get_column("id").to_list()) for t, f in snap.frames.items() if f.height}
    for name, td in diff.tables.items():
        if td.inserts.height:
            assert set(td.inserts.get_column("scope_path").unique()) == {target.path}
        for kind in ("updates", "deletes"):
            frame = getattr(td, kind)
            assert set(frame.get_column("id").to_list()) <= snap_ids.get(name, set()), (name, kind)
