"""``validate_diff``'s fast paths give exactly the answers of the plain ones beside them in
:mod:`deep_sleep.validation.diff_checks`: the pre-check never vouches for a diff pandera would
reject (``precheck=False`` is the plain path; the bad-diff corpus is in test_diff_checks.py), and
the annotations (:func:`_annotate`, hash probes and edges narrowed to the ids asked about) are
exactly :func:`_annotate_plain`'s, on generated diffs."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta

import polars as pl
from deep_sleep.validation import diff_checks as dc
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deep_sleep.core import lookup, tables
from deep_sleep.core.snapshot import Snapshot

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
SCOPE = "org\x1ffast\x1fbrand\x1fb1"
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _uuid(i: int) -> str:
    return f"00000000-0000-4000-8000-{i:012x}"


@contextlib.contextmanager
def _small(value: int):
    saved, lookup.SMALL = lookup.SMALL, value
    try:
        yield
    finally:
        lookup.SMALL = saved


def _good_snapshot() -> Snapshot:
    ids = [_uuid(i) for i in range(8)]
    nodes = tables.conform("memory_nodes", pl.DataFrame({
        "id": ids, "scope_path": SCOPE, "tenant_id": "fast", "layer": "semantic",
        "label": ["SOUL:name", "AGENT_IDENTITY: me"] + [f"project: {i}" for i in range(6)], "properties": "{}",
        "importance": 5.0, "updated_at": NOW - timedelta(days=1), "version": [1, 2, 3, 1, 1, 1, 2, 1],
    }))
    edges = tables.conform("memory_edges", pl.DataFrame({
        "id": [_uuid(100 + i) for i in range(4)], "scope_path": SCOPE, "tenant_id": "fast",
        "source_id": [ids[2], ids[3], ids[4], ids[2]], "target_id": [ids[3], ids[4], ids[5], ids[6]],
        "relation": ["RELATED_TO", "CO_OCCURRED", "CO_OCCURRED", "RELATED_TO"], "weight": 1.0, "version": 1,
    }))
    events = tables.conform("episodic_events", pl.DataFrame({
        "id": [_uuid(200 + i) for i in range(5)], "scope_path": SCOPE, "tenant_id": "fast", "content": "said",
        "metadata": "{}", "created_at": NOW - timedelta(days=2), "version": 1}))
    return Snapshot(scope_path=SCOPE, taken_at=NOW, frames={"memory_nodes": nodes, "memory_edges": edges, "episodic_events": events})


@st.composite
def diffs(draw):
    from deep_sleep.core.diff import Diff

    snap = _good_snapshot()
    nodes, edges, events = (snap.table(t) for t in ("memory_nodes", "memory_edges", "episodic_events"))
    pick = lambda xs: draw(st.sampled_from(xs))  # noqa: E731
    parts = []
    if draw(st.booleans()):  # node updates
        rows = nodes.sample(draw(st.integers(1, 4)), seed=draw(st.integers(0, 99)))
        rows = rows.select("id", pl.Series("version", [v + pick((0, 0, 0, 1)) for v in rows["version"]]),
                           importance=pl.Series([pick((5.5, 1.0, 10.0, None, 11.0, 0.0, float("nan"))) for _ in range(rows.height)]))
        if draw(st.booleans()):
            rows = rows.with_columns(scope_path=pl.lit(pick((None, SCOPE, "org\x1felse")), pl.String))
        if draw(st.booleans()):
            rows = rows.with_columns(pl.col("importance").cast(pl.Float32))
        parts.append(Diff.of("memory_nodes", pick(("strengthen", "decay_importance")), updates=rows))
    if draw(st.booleans()):  # node deletes
        rows = nodes.sample(draw(st.integers(1, 3)), seed=draw(st.integers(0, 99))).select("id", "version")
        parts.append(Diff.of("memory_nodes", "prune_orphans", deletes=rows, reason="orphan"))
    if draw(st.booleans()):  # node inserts
        n = draw(st.integers(1, 3))
        parts.append(Diff.of("memory_nodes", "meta_nodes", inserts=pl.DataFrame({
            "id": [pick([_uuid(300 + i) for i in range(3)] + [_uuid(2)]) for _ in range(n)],
            "scope_path": [pick((SCOPE, SCOPE, "org\x1felse", None)) for _ in range(n)],
            "tenant_id": [pick(("fast", "fast", "other")) for _ in range(n)], "layer": "semantic", "label": "META:x",
            "importance": [pick((5.0, 12.0, None)) for _ in range(n)]}, schema_overrides={"scope_path": pl.String, "importance": pl.Float64})))
    if draw(st.booleans()):  # edge inserts
        n = draw(st.integers(1, 3))
        ends = [_uuid(i) for i in range(8)] + [_uuid(999)]
        parts.append(Diff.of("memory_edges", pick(("synthetic_links", "cooccurrence")), inserts=pl.DataFrame({
            "id": [_uuid(400 + i) for i in range(n)], "scope_path": SCOPE, "tenant_id": "fast",
            "source_id": [pick(ends) for _ in range(n)], "target_id": [pick(ends) for _ in range(n)],
            "relation": [pick(("CO_OCCURRED", "RELATED_TO")) for _ in range(n)], "weight": [pick((1.0, -1.0, float("inf"))) for _ in range(n)]})))
    if draw(st.booleans()):  # edge deletes
        rows = edges.sample(draw(st.integers(1, 2)), seed=draw(st.integers(0, 99))).select("id", "version")
        parts.append(Diff.of("memory_edges", "prune_orphans", deletes=rows, reason="orphan (incident edge)"))
    if draw(st.booleans()):  # event deletes
        rows = events.sample(draw(st.integers(1, 5)), seed=draw(st.integers(0, 99))).select("id", "version")
        parts.append(Diff.of("episodic_events", "episodic_summary", deletes=rows, reason="summarised"))
    if draw(st.booleans()):  # skill inserts
        parts.append(Diff.of("procedural_skills", "procedural_promotion", inserts=pl.DataFrame({
            "id": [_uuid(500)], "scope_path": SCOPE, "tenant_id": "fast", "name": "deploy", "status": [pick(("draft", "active", None))]},
            schema_overrides={"status": pl.String})))
    return Diff.combine(parts), snap


@FAST
@given(diffs())
def test_validate_diff_with_and_without_the_precheck_agree(case):
    from deep_sleep.transforms.config import ConsolidationConfig
    from deep_sleep.validation import validate_diff

    diff, snap = case
    config = ConsolidationConfig(cooccurrence={"max_neighbours": 2}, episodic_summary={"batch_size": 2, "max_batches": 1})
    fast = validate_diff(diff, snap, config)
    slow = validate_diff(diff, snap, config, precheck=False)
    assert fast.to_dicts() == slow.to_dicts()
    assert fast.schema == slow.schema


# The annotations validate_diff computed before they were rewritten to probe hashes first (frozen
@FAST
@given(diffs())
def test_validation_annotations_agree_with_the_plain_ones(case):
    diff, snap = case
    for small in (0, lookup.SMALL):  # the hash paths, then the plain lookups small inputs take
        with _small(small):
            for table, td in diff.tables.items():
                for kind, frame in td.frames().items():
                    if frame.height:
                        got = dc._annotate(table, kind, frame, diff, snap)
                        plain = dc._annotate_plain(table, kind, frame, diff, snap)
                        assert got.columns == plain.columns and got.schema == plain.schema, (table, kind)
                        assert got.equals(plain), (table, kind)
