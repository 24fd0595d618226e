"""Quarantine of a whole shard in one pass (SPEC §2 "Scale", §4) is every scope's own quarantine:
for shards made of single-scope snapshots with broken rows (NaN importance, dangling and
cross-scope edges, bad JSON, wrong tenants, duplicate ids and soul keys, rows of no scope of the
shard…), each scope's clean rows, quarantined rows and held nodes are exactly those of
``quarantine`` on that scope alone (a shard of one, or its Snapshot); the fast path equals the plain
rules; ``plan`` calls it once per shard."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import polars as pl
from deep_sleep.validation import quarantine as q
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deep_sleep.core import tables
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run import transform as transform_module
from deep_sleep.run.transform import transform
from deep_sleep.transforms.config import ConsolidationConfig

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
# nested scopes, a string-prefix sibling (org/fa beside org/fast) and a second tenant
SCOPES = ("org\x1ffast\x1fbrand\x1fb1", "org\x1ffast", "org\x1ffa", "org\x1fslow\x1fbrand\x1fb1", "org\x1ffast\x1fbrand\x1fb2")
FOREIGN = ("org\x1fother", "org\x1ffast\x1fbrand")  # scopes of no shard here
FAST = settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)


def _uuid(i: int) -> str:
    return f"00000000-0000-4000-8000-{i:012x}"


def _tenant(scope: str) -> str:
    return scope.split("\x1f")[1]


LABELS = ("project: a", "b", "", "  ", "x\x07y", None, "ok\u00a0", "SOUL:name", "zero\u200bwidth")
PROPS = ("{}", '{"k": 1}', "[1]", '"s"', "{bad", None, '{"a": NaN}', " {}")
STEPS = ("[]", '["a"]', "{}", None, "nope")
IMPORTANCE = (5.0, 1.0, 10.0, 0.5, 11.0, float("nan"), float("inf"), None)
WEIGHTS = (1.0, 0.0, -1.0, float("nan"), None)
TIMES = (NOW - timedelta(days=1), NOW + timedelta(minutes=4), NOW + timedelta(minutes=6), None)
KEYS = ("name", "role", "name", "", None, "language")


def corrupt_snapshot(draw, scope: str, k: int) -> Snapshot:
    """One scope's snapshot of broken rows; its ids are its own (``k``-th pool: ids are unique in the
    store), its edges point into its own pool and sometimes at a node of another scope's pool."""
    pick = lambda xs: draw(st.sampled_from(xs))  # noqa: E731
    tenant = _tenant(scope)
    pool = [_uuid(k * 1000 + i) for i in range(10)]
    own = lambda n: [pick((scope, scope, scope, scope, *FOREIGN, None)) for _ in range(n)]  # noqa: E731
    tenants = lambda n: [pick((tenant, tenant, tenant, "intruder", None)) for _ in range(n)]  # noqa: E731
    n = draw(st.integers(0, 10))
    ids = [pick(pool + [None]) for _ in range(n)]
    nodes = pl.DataFrame({
        "id": ids, "scope_path": own(n), "tenant_id": tenants(n),
        "layer": [pick(("semantic", "semantic", "working", "episodic")) for _ in ids],
        "label": [pick(LABELS) for _ in ids], "properties": [pick(PROPS) for _ in ids],
        "importance": [pick(IMPORTANCE) for _ in ids], "created_at": [pick(TIMES) for _ in ids],
        "updated_at": [pick(TIMES) for _ in ids], "version": 1,
    }, schema_overrides={"created_at": tables.TS, "updated_at": tables.TS, "importance": pl.Float64, "id": pl.String,
                         "scope_path": pl.String, "tenant_id": pl.String, "layer": pl.String, "label": pl.String,
                         "properties": pl.String})
    m = draw(st.integers(0, 10))
    neighbour = _uuid(((k + 1) % len(SCOPES)) * 1000 + 1)  # a node id of the next scope's pool: a cross-scope edge
    ends = pool + [None, neighbour]
    edges = pl.DataFrame({
        "id": [pick(pool[:3]) if draw(st.booleans()) else _uuid(k * 1000 + 100 + j) for j in range(m)],
        "scope_path": [pick((scope, scope, scope, FOREIGN[0])) for _ in range(m)], "tenant_id": tenants(m),
        "source_id": [pick(ends) for _ in range(m)], "target_id": [pick(ends) for _ in range(m)], "relation": "R",
        "weight": [pick(WEIGHTS) for _ in range(m)], "properties": [pick(PROPS) for _ in range(m)],
        "created_at": [pick(TIMES) for _ in range(m)], "version": 1,
    }, schema_overrides={"created_at": tables.TS, "weight": pl.Float64, "source_id": pl.String, "target_id": pl.String,
                         "properties": pl.String, "scope_path": pl.String, "tenant_id": pl.String})
    e = draw(st.integers(0, 5))
    events = pl.DataFrame({
        "id": [_uuid(k * 1000 + 200 + draw(st.integers(0, 4))) for _ in range(e)], "scope_path": own(e), "tenant_id": tenant,
        "content": [pick(("said x", "", " ", None)) for _ in range(e)],
        "metadata": [pick(PROPS) for _ in range(e)], "created_at": [pick(TIMES) for _ in range(e)], "version": 1,
    }, schema_overrides={"created_at": tables.TS, "content": pl.String, "metadata": pl.String, "scope_path": pl.String})
    j = draw(st.integers(0, 3))
    skills = pl.DataFrame({"id": [_uuid(k * 1000 + 300 + i) for i in range(j)], "scope_path": scope, "tenant_id": tenants(j),
                           "name": [pick(LABELS) for _ in range(j)], "steps": [pick(STEPS) for _ in range(j)], "version": 1},
                          schema_overrides={"name": pl.String, "steps": pl.String, "tenant_id": pl.String})
    s = draw(st.integers(0, 4))  # soul keys: unique per scope (the same keys in every scope are no duplicates)
    souls = pl.DataFrame({"id": [_uuid(k * 1000 + 400 + i) for i in range(s)], "scope_path": scope, "tenant_id": tenants(s),
                          "key": [pick(KEYS) for _ in range(s)], "value": "v", "version": 1},
                         schema_overrides={"key": pl.String, "tenant_id": pl.String})
    a = draw(st.integers(0, 4))
    access = pl.DataFrame({"id": list(range(k * 100, k * 100 + a)), "scope_path": own(a),
                           "node_id": [pick(pool) for _ in range(a)], "accessed_at": [pick(TIMES) for _ in range(a)], "kind": "read"},
                          schema_overrides={"accessed_at": tables.TS, "scope_path": pl.String})
    frames = {"memory_nodes": nodes, "memory_edges": edges, "episodic_events": events, "procedural_skills": skills,
              "soul_profiles": souls, "memory_access_log": access}
    frames = {t: tables.conform(t, f) for t, f in frames.items() if draw(st.booleans()) or t == "memory_nodes"}
    return Snapshot(scope_path=scope, taken_at=NOW, frames=frames)


@st.composite
def corrupt_shards(draw) -> list[Snapshot]:
    chosen = draw(st.lists(st.sampled_from(range(len(SCOPES))), min_size=1, max_size=len(SCOPES), unique=True))
    return [corrupt_snapshot(draw, SCOPES[k], k) for k in chosen]


def _rows(frame: pl.DataFrame) -> list[dict]:
    """The rows in (table, id, reason, row) order: rows of equal (table, id, reason) — duplicates —
    come in no particular order from either sort."""
    return frame.sort("table", "id", "reason", "row").to_dicts()


def _row_scope() -> pl.Expr:
    return pl.col("row").str.json_path_match("$.scope_path")


def assert_shard_is_its_scopes(snaps: list[Snapshot], small_rows: int = q.SMALL_ROWS) -> None:
    shard = Shard.from_snapshots(snaps)
    clean, found = q.quarantine(shard, NOW, small_rows=small_rows)
    assert isinstance(clean, Shard) and clean.scope_paths == shard.scope_paths
    assert found.columns == [*q.QUARANTINE_SCHEMA, "scope_path"]
    for snap in snaps:
        alone_clean, alone_found = q.quarantine(snap, NOW)
        s = snap.scope_path
        # a Snapshot is checked as a shard of one: the same rows, which name their own scope
        one_clean, one_found = q.quarantine(Shard.of(snap), NOW)
        assert _rows(one_found.drop("scope_path")) == _rows(alone_found), s
        assert (one_found["scope_path"].fill_null("") == one_found["row"].str.json_path_match("$.scope_path").fill_null("")).all()
        assert one_clean.scope_paths == (s,) and one_clean.held_nodes == alone_clean.held_nodes, s
        mine = clean.scope(s)  # raises if a row of no scope of the shard was left in it
        for t, frame in mine.frames.items():
            expected = alone_clean.frames.get(t, tables.empty(t).head(0))
            assert frame.height == expected.height and (not frame.height or frame.equals(expected.select(frame.columns),
                                                                                          null_equal=True)), (s, t)
        assert mine.held_nodes == alone_clean.held_nodes, s
        ours = found.filter(pl.col("scope_path") == s).drop("scope_path")
        assert _rows(ours) == _rows(alone_found.filter(_row_scope() == s)), s
    # rows of no scope of the shard (each snapshot's rows of another scope or none): found once, in their own scope_path
    stray = found.filter(~pl.col("scope_path").is_in(list(shard.scope_paths)).fill_null(False) | pl.col("scope_path").is_null())
    expected = pl.concat([q.quarantine(snap, NOW)[1].filter((_row_scope() != snap.scope_path).fill_null(True)) for snap in snaps])
    key = ["table", "id", "reason", "row"]
    assert stray.drop("scope_path").sort(key).to_dicts() == expected.sort(key).to_dicts()
    assert (stray["scope_path"].fill_null("") == stray["row"].str.json_path_match("$.scope_path").fill_null("")).all()
    # the plain rules say the same
    plain_clean, plain_found = q.quarantine_plain(shard, NOW)
    assert plain_found.to_dicts() == found.to_dicts()
    assert plain_clean.held_nodes == clean.held_nodes
    for t in shard.frames:
        assert plain_clean.frames[t].equals(clean.frames[t], null_equal=True), t


@FAST
@given(corrupt_shards())
def test_every_scope_of_a_corrupt_shard_gets_its_own_quarantine(snaps):
    assert_shard_is_its_scopes(snaps)


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(corrupt_shards())
def test_both_json_paths_on_a_shard(snaps):
    assert_shard_is_its_scopes(snaps, small_rows=0)


def _node(i: int, scope: str, **kw) -> dict:
    return {"id": _uuid(i), "scope_path": scope, "tenant_id": _tenant(scope), "layer": "semantic", "label": f"project: {i}",
            "properties": "{}", "importance": 5.0, "updated_at": NOW - timedelta(days=1), "version": 1, **kw}


def _edge(i: int, scope: str, source: str, target: str, **kw) -> dict:
    return {"id": _uuid(i), "scope_path": scope, "tenant_id": _tenant(scope), "source_id": source, "target_id": target,
            "relation": "R", "weight": 1.0, "properties": "{}", "version": 1, **kw}


def _shard(nodes: list[dict], edges: list[dict] = (), souls: list[dict] = ()) -> Shard:
    frames = {"memory_nodes": pl.DataFrame(nodes), "memory_edges": pl.DataFrame(list(edges) or None),
              "soul_profiles": pl.DataFrame(list(souls) or None)}
    frames = {t: tables.conform(t, f) for t, f in frames.items() if f.height}
    return Shard.from_frames({s: None for s in {n["scope_path"] for n in nodes}}, NOW, frames)


def test_each_scope_rule_reads_the_rows_own_scope():
    a, b = SCOPES[0], SCOPES[3]  # tenants fast and slow
    shard = _shard(
        [_node(1, a), _node(2, a), _node(3, b), _node(4, b, tenant_id="fast"), _node(5, b, importance=float("nan"))],
        [_edge(10, a, _uuid(1), _uuid(2)), _edge(11, a, _uuid(1), _uuid(3)),  # 11: into scope b
         _edge(12, b, _uuid(3), _uuid(5)), _edge(13, a, _uuid(1), _uuid(5))],  # 12: a quarantined end; 13: b's, from a
        [{"scope_path": a, "tenant_id": "fast", "key": "name", "value": "x", "version": 1},
         {"scope_path": b, "tenant_id": "slow", "key": "name", "value": "y", "version": 1},
         {"scope_path": b, "tenant_id": "slow", "key": "role", "value": "y", "version": 1},
         {"scope_path": b, "tenant_id": "slow", "key": "role", "value": "z", "version": 1}],
    )
    clean, found = q.quarantine(shard, NOW)
    got = sorted((r["scope_path"], r["table"], r["id"], r["reason"]) for r in found.iter_rows(named=True))
    assert got == sorted([
        (b, "memory_nodes", _uuid(4), "tenant_id differs from the scope's root"),
        (b, "memory_nodes", _uuid(5), "importance is not a finite number"),
        (a, "memory_edges", _uuid(11), "dangling edge: endpoint not a node of this scope"),
        (b, "memory_edges", _uuid(12), "edge endpoint is quarantined"),
        (a, "memory_edges", _uuid(13), "dangling edge: endpoint not a node of this scope"),
        (b, "soul_profiles", None, "duplicate key"), (b, "soul_profiles", None, "duplicate key"),
    ])
    assert clean.scope(a).held_nodes == {_uuid(1)} and clean.scope(b).held_nodes == {_uuid(3)}
    assert clean.table("soul_profiles").get_column("key").to_list() == ["name", "name"]


def test_an_id_in_two_scopes_is_quarantined_in_both():
    """Ids are unique in the whole store: a shard that holds one id twice (only a hand-written one
    can) sets both rows aside, whichever scopes they are in."""
    a, b = SCOPES[0], SCOPES[1]
    clean, found = q.quarantine(_shard([_node(1, a), _node(1, b), _node(2, b)]), NOW)
    assert sorted(found.select("scope_path", "id", "reason").rows()) == sorted([(a, _uuid(1), "duplicate id"), (b, _uuid(1), "duplicate id")])
    assert clean.table("memory_nodes").get_column("id").to_list() == [_uuid(2)]


def test_a_clean_shard_is_passed_on_as_it_is_and_a_shard_of_one_is_the_snapshot():
    shard = _shard([_node(1, SCOPES[0]), _node(2, SCOPES[1])], [_edge(3, SCOPES[0], _uuid(1), _uuid(1))])
    clean, found = q.quarantine(shard, NOW)
    assert clean is shard and found.height == 0 and found.columns == [*q.QUARANTINE_SCHEMA, "scope_path"]
    snap = Snapshot(SCOPES[0], NOW, frames={"memory_nodes": tables.conform("memory_nodes", pl.DataFrame(
        [_node(1, SCOPES[0]), _node(2, SCOPES[0], label=""), _node(3, SCOPES[0], properties="[]")]))})
    one_clean, one = q.quarantine(Shard.of(snap), NOW)
    alone_clean, alone = q.quarantine(snap, NOW)
    assert one.drop("scope_path").to_dicts() == alone.to_dicts() and set(one["scope_path"]) == {SCOPES[0]}
    assert one_clean.scope(SCOPES[0]).table("memory_nodes").equals(alone_clean.table("memory_nodes"))
    assert json.loads(one.get_column("row")[0])["scope_path"] == SCOPES[0]


def test_plan_quarantines_the_shard_in_one_call_and_every_scope_plans_as_alone(monkeypatch):
    from tests.transforms.shard_cases import AS_OF, SAME, fleet

    snaps = fleet(6, seed=7)
    broken = []
    for i, snap in enumerate(snaps):  # every other scope gets a few bad rows
        nodes = snap.table("memory_nodes")
        if i % 2:
            bad = nodes.head(3).with_columns(pl.Series("importance", [float("nan"), 11.0, 5.0]),
                                             pl.Series("properties", ["{}", "{}", "[oops"]))
            nodes = pl.concat([bad, nodes.slice(3)])
        broken.append(Snapshot(snap.scope_path, snap.taken_at, snap.previous_run_as_of, {**snap.frames, "memory_nodes": nodes}))
    calls = []
    real = transform_module.quarantine

    def counted(source, *a, **kw):
        calls.append(type(source).__name__)
        return real(source, *a, **kw)

    monkeypatch.setattr(transform_module, "quarantine", counted)
    got = transform(Shard.from_snapshots(broken), ConsolidationConfig(), AS_OF)
    assert calls == ["Shard"]
    assert set(got.quarantined["scope_path"]) == {s.scope_path for i, s in enumerate(broken) if i % 2}
    for i, snap in enumerate(broken):
        calls.clear()
        alone = transform(Shard.of(snap), ConsolidationConfig(), AS_OF)
        assert calls == ["Shard"]
        for field in SAME:
            assert getattr(got.reports[snap.scope_path], field) == getattr(alone.report, field), (snap.scope_path, field)
        assert got.scope_quarantined(snap.scope_path).equals(alone.scope_quarantined())
        assert got.scope_diff(snap.scope_path).content_hash() == alone.scope_diff().content_hash()
        assert got.scope_snapshot(snap.scope_path).held_nodes == alone.scope_snapshot().held_nodes
        if i % 2:  # the NaN importance, the importance of 11 and the bad JSON, and the edges to those nodes
            mine = alone.scope_quarantined()
            assert sorted(mine.filter(pl.col("table") == "memory_nodes").get_column("reason").to_list()) == [
                "importance is not a finite number", "importance outside [1, 10]", "properties is not a JSON object"]
            assert set(mine.filter(pl.col("table") != "memory_nodes").get_column("reason")) <= {"edge endpoint is quarantined"}
        else:
            assert alone.quarantined.height == 0
    calls.clear()
    transform(broken[1], ConsolidationConfig(), AS_OF)  # a Snapshot is planned as a shard of one
    assert calls == ["Shard"]
