"""``validate_diff``'s fast paths give exactly the answers of the plain ones beside them in
:mod:`deep_sleep.validation.diff_checks`: the pre-check never vouches for a diff pandera would
reject (``precheck=False`` is the plain path; the bad-diff corpus is in test_diff_checks.py), and
the annotations (:func:`_annotate`, hash probes and edges narrowed to the ids asked about) are
exactly :func:`_annotate_plain`'s, on generated shard diffs.

The shards hold one to three scopes among the string-prefix siblings ``org/ac`` and ``org/acme`` and
a scope nested in ``org/acme``; the diffs' rows name their own scope, another scope of the shard, a
scope of no shard or none, and reference rows of their own scope or of another one (and, in some
shards, a node id that two scopes share), so every lookup keyed by (scope_path, id) is exercised."""

from __future__ import annotations

import contextlib
from datetime import UTC, datetime, timedelta

import polars as pl
from deep_sleep.validation import diff_checks as dc
from deep_sleep.validation.quarantine import _Scopes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deep_sleep.core import lookup, tables
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
AC, ACME, NESTED = "org\x1fac", "org\x1facme", "org\x1facme\x1fbrand\x1fb1"  # prefix siblings, and a nested scope
SCOPES = (AC, ACME, NESTED)
FOREIGN = "org\x1felse"  # a scope of no shard here
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


def _tenant(scope: str) -> str:
    return scope.split("\x1f")[1]


def _good_snapshot(scope: str, k: int, shared: str | None = None) -> Snapshot:
    """Scope ``scope``'s clean rows: 8 nodes (ids numbered by ``k``; the last one ``shared`` if given,
    an id another scope's snapshot holds too), 4 edges, 5 events."""
    ids = [_uuid(k * 1000 + i) for i in range(8)]
    if shared is not None:
        ids[7] = shared
    nodes = tables.conform("memory_nodes", pl.DataFrame({
        "id": ids, "scope_path": scope, "tenant_id": _tenant(scope), "layer": "semantic",
        "label": ["SOUL:name", "AGENT_IDENTITY: me"] + [f"project: {i}" for i in range(6)], "properties": "{}",
        "importance": 5.0, "updated_at": NOW - timedelta(days=1), "version": [1, 2, 3, 1, 1, 1, 2, k],
    }))
    edges = tables.conform("memory_edges", pl.DataFrame({
        "id": [_uuid(k * 1000 + 100 + i) for i in range(4)], "scope_path": scope, "tenant_id": _tenant(scope),
        "source_id": [ids[2], ids[3], ids[4], ids[2]], "target_id": [ids[3], ids[4], ids[7], ids[6]],
        "relation": ["RELATED_TO", "CO_OCCURRED", "CO_OCCURRED", "RELATED_TO"], "weight": 1.0, "version": 1,
    }))
    events = tables.conform("episodic_events", pl.DataFrame({
        "id": [_uuid(k * 1000 + 200 + i) for i in range(5)], "scope_path": scope, "tenant_id": _tenant(scope),
        "content": "said", "metadata": "{}", "created_at": NOW - timedelta(days=2), "version": 1}))
    return Snapshot(scope_path=scope, taken_at=NOW, frames={"memory_nodes": nodes, "memory_edges": edges, "episodic_events": events})


def _deletes(table: str, phase: str, rows: pl.DataFrame, scope: str, reason: str):
    """``Diff.of`` deletes of ``rows`` (id, version), each naming ``scope`` (a shard diff's form)."""
    from deep_sleep.core.diff import Diff, TableDiff

    td = Diff.of(table, phase, deletes=rows, reason=reason).table(table)
    return Diff({table: TableDiff(deletes=td.deletes.with_columns(scope_path=pl.lit(scope, pl.String)))})


@st.composite
def diffs(draw):
    """(a shard's diff, the shard): every frame of the diff has a ``scope_path`` column."""
    from deep_sleep.core.diff import Diff

    scopes = draw(st.lists(st.sampled_from(SCOPES), min_size=1, max_size=3, unique=True))
    shared = _uuid(7) if draw(st.booleans()) else None  # one node id in every scope (a hand-written shard)
    shard = Shard.from_snapshots(_good_snapshot(s, k + 1, shared) for k, s in enumerate(sorted(scopes)))
    pick = lambda xs: draw(st.sampled_from(xs))  # noqa: E731

    def own() -> str:  # the scope a part's rows name: mostly a scope of the shard
        return pick(tuple(scopes) * 3 + (FOREIGN,))

    def rows_of(table: str, s: str) -> pl.DataFrame:  # the rows referenced: mostly the part's own scope's
        at = s if s in scopes and draw(st.integers(0, 3)) else pick(tuple(scopes))
        return shard.rows_of(table, at)

    parts = []
    for _ in range(draw(st.integers(1, 2))):
        if draw(st.booleans()):  # node updates
            s = own()
            rows = rows_of("memory_nodes", s).sample(draw(st.integers(1, 4)), seed=draw(st.integers(0, 99)))
            rows = rows.select("id", pl.Series("version", [v + pick((0, 0, 0, 1)) for v in rows["version"]]),
                               importance=pl.Series([pick((5.5, 1.0, 10.0, None, 11.0, 0.0, float("nan"))) for _ in range(rows.height)]))
            rows = rows.with_columns(scope_path=pl.lit(pick((s, s, s, None)), pl.String))
            if draw(st.booleans()):
                rows = rows.with_columns(pl.col("importance").cast(pl.Float32))
            if not draw(st.integers(0, 4)):  # a scope rewrite
                rows = rows.with_columns(tenant_id=pl.lit(pick((None, "intruder")), pl.String))
            parts.append(Diff.of("memory_nodes", pick(("strengthen", "decay_importance")), updates=rows))
        if draw(st.booleans()):  # node deletes
            s = own()
            rows = rows_of("memory_nodes", s).sample(draw(st.integers(1, 3)), seed=draw(st.integers(0, 99))).select("id", "version")
            parts.append(_deletes("memory_nodes", "prune_orphans", rows, s, "orphan"))
        if draw(st.booleans()):  # node inserts
            n = draw(st.integers(1, 3))
            known = shard.table("memory_nodes").get_column("id").to_list()
            parts.append(Diff.of("memory_nodes", "meta_nodes", inserts=pl.DataFrame({
                "id": [pick([_uuid(300 + i) for i in range(3)] + known[:3]) for _ in range(n)],
                "scope_path": [pick(tuple(scopes) * 2 + (FOREIGN, None)) for _ in range(n)],
                "tenant_id": [pick(("ac", "acme", "acme", "other")) for _ in range(n)], "layer": "semantic",
                "label": "META:x", "importance": [pick((5.0, 12.0, None)) for _ in range(n)]},
                schema_overrides={"scope_path": pl.String, "importance": pl.Float64})))
        if draw(st.booleans()):  # edge inserts: ends of its own scope, of another scope, or of none
            n = draw(st.integers(1, 3))
            s = own()
            mine = rows_of("memory_nodes", s).get_column("id").to_list()
            ends = mine + mine + shard.table("memory_nodes").get_column("id").to_list() + [_uuid(999)]
            parts.append(Diff.of("memory_edges", pick(("synthetic_links", "cooccurrence")), inserts=pl.DataFrame({
                "id": [_uuid(400 + 10 * len(parts) + i) for i in range(n)], "scope_path": s, "tenant_id": _tenant(s),
                "source_id": [pick(ends) for _ in range(n)], "target_id": [pick(ends) for _ in range(n)],
                "relation": [pick(("CO_OCCURRED", "RELATED_TO")) for _ in range(n)],
                "weight": [pick((1.0, -1.0, float("inf"))) for _ in range(n)]})))
        if draw(st.booleans()):  # edge deletes
            s = own()
            rows = rows_of("memory_edges", s).sample(draw(st.integers(1, 2)), seed=draw(st.integers(0, 99))).select("id", "version")
            parts.append(_deletes("memory_edges", "prune_orphans", rows, s, "orphan (incident edge)"))
        if draw(st.booleans()):  # event deletes
            s = own()
            rows = rows_of("episodic_events", s).sample(draw(st.integers(1, 5)), seed=draw(st.integers(0, 99))).select("id", "version")
            parts.append(_deletes("episodic_events", "episodic_summary", rows, s, "summarised"))
        if draw(st.booleans()):  # skill inserts
            s = own()
            parts.append(Diff.of("procedural_skills", "procedural_promotion", inserts=pl.DataFrame({
                "id": [_uuid(500 + len(parts))], "scope_path": s, "tenant_id": _tenant(s), "name": "deploy",
                "status": [pick(("draft", "active", None))]}, schema_overrides={"status": pl.String})))
    return Diff.combine(parts), shard


@FAST
@given(diffs())
def test_validate_diff_with_and_without_the_precheck_agree(case):
    from deep_sleep.transforms.config import ConsolidationConfig
    from deep_sleep.validation import validate_diff

    diff, shard = case
    config = ConsolidationConfig(cooccurrence={"max_neighbours": 2}, episodic_summary={"batch_size": 2, "max_batches": 1})
    fast = validate_diff(diff, shard, config)
    slow = validate_diff(diff, shard, config, precheck=False)
    assert fast.to_dicts() == slow.to_dicts()
    assert fast.schema == slow.schema


@FAST
@given(diffs())
def test_validation_annotations_agree_with_the_plain_ones(case):
    diff, shard = case
    scopes = _Scopes(shard.scope_paths)
    for small in (0, lookup.SMALL):  # the hash paths, then the plain lookups small inputs take
        with _small(small):
            for table, td in diff.tables.items():
                for kind, frame in td.frames().items():
                    if frame.height:
                        got = dc._annotate(table, kind, frame, diff, shard, scopes)
                        plain = dc._annotate_plain(table, kind, frame, diff, shard, scopes)
                        assert got.columns == plain.columns and got.schema == plain.schema, (table, kind)
                        assert got.equals(plain), (table, kind)


def test_the_generated_shards_reach_the_prefix_siblings_and_cross_scope_rows():
    """The generator's reach: shards of several scopes with org/ac beside org/acme, and diffs whose
    rows name another scope's rows (the case a lookup by id alone would get wrong)."""
    seen = {"siblings": False, "cross": False}

    @settings(max_examples=60, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
    @given(diffs())
    def look(case):
        diff, shard = case
        seen["siblings"] |= {AC, ACME} <= set(shard.scope_paths)
        nodes = shard.table("memory_nodes").select("scope_path", "id")
        for f in diff.table("memory_nodes").frames().values():
            if f.height and len(shard.scope_paths) > 1:
                mine = f.select("scope_path", "id").join(nodes, on=["scope_path", "id"], how="semi").height
                known = f.filter(pl.col("id").is_in(nodes.get_column("id").implode())).height
                seen["cross"] |= known > mine

    look()
    assert seen == {"siblings": True, "cross": True}
