"""Quarantine's fast paths give exactly the answers of the plain rules beside them in
:mod:`deep_sleep.validation.quarantine`:

- the JSON shape check's small path (Python ``json.loads``, unsure texts handed to DuckDB) and big
  path (DuckDB ``json_valid`` + first character) agree with :func:`bad_json_plain` (DuckDB
  ``json_valid`` and ``json_type``) on a corpus of bad JSON and bad shapes and on generated texts;
- :func:`quarantine` (either JSON path) agrees with :func:`quarantine_plain` (the same rules as
  whole-frame Polars expressions) on generated corrupt snapshots.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import pytest
from deep_sleep.validation import quarantine as q
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deep_sleep.core import tables
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
SCOPE = "org\x1ffast\x1fbrand\x1fb1"
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------------------------------------
# JSON shape: small path == big path == the plain rule

JSON_CORPUS = [
    "{}", "[]", "[ ]", "{\n}", ' {"a": 1} ', '\t{"a":1}\r\n', '\n[1, 2]\n', '{"a": [1, {"b": null}]}', "[{}]",
    '{"a":1, "a":2}', '{"a": -0}', '{"a": 1e999}', '{"a": -1E-999}', '{"a": 123456789012345678901234567890}',
    '{"a": ' + "9" * 5000 + "}", '{"a": 0.' + "1" * 5000 + "}",
    '{"a": "\\u0000"}', '{"a": "\\ud83d\\ude00"}', '{"a": "\\uD83D\\uDE00"}', '{"a": "\\ud800"}', '{"a": "\\udc00x"}',
    '{"a": "\\\\ud800"}', '{"\\ud800": 1}', '{"a": "\x7f"}', '{"a": "\u2028"}', '{"a": "😀"}', '{"a": "\\/"}',
    '{"a": NaN}', '{"a": Infinity}', '{"a": -Infinity}', '{"a": nan}', '{"a": inf}', '{"a": -inf}', '{"a": INF}',
    "NaN", "Infinity", '{"a": 1,}', "[1,]", "[,]", "{,}", '{"a": 1,,}',
    '{"a": "\x01"}', '{"a": 01}', '{"a": 1.}', '{"a": .5}', '{"a": +1}', '{"a": 0x10}', '{"a": "\\x41"}', "{'a': 1}",
    '{"a": 1}{', '{"a": 1} x', '{"a": 1}]', "", " ", "\t\n", "null", "true", "false", "0", "-1.5e3", '"str"', '"{}"',
    "[" * 3000 + "]" * 3000, '{"a":' * 3000 + "1" + "}" * 3000, "[" * 3000, "\ufeff{}", "\u00a0{}", "\u3000[]",
    "/*c*/{}", "{} //x", '{"a":1}\x00', '{"a": tru}', '{"a": True}', '{"a": None}', '{a: 1}', '{"a" 1}', '{"a":}',
    '{"a": [1 2]}', "[1, 2", "{", "}", "]", "[", '"unterminated', '{"a": "b\\"}', '{"a": "\\q"}', '{"a": "\\u12"}',
]



@pytest.mark.parametrize("shape", ["OBJECT", "ARRAY"])
def test_json_shape_small_and_big_paths_agree_with_the_plain_rule_on_the_corpus(shape):
    values = pl.Series("v", [*JSON_CORPUS, None], dtype=pl.String)
    expected = q.bad_json_plain(values, shape).to_list()
    assert expected[JSON_CORPUS.index("{}")] is (shape != "OBJECT") and expected[-1] is True  # the rule itself
    assert q.bad_json(values, shape, small_rows=0).to_list() == expected
    assert q.bad_json(values, shape, small_rows=10**9).to_list() == expected
    # and one text at a time (no batch effects in the small path's DuckDB fallback)
    assert [q.bad_json(values.slice(i, 1), shape).item() for i in range(values.len())] == expected


_TOKENS = ['{', '}', '[', ']', ',', ':', ' ', '\n', '"a"', '"\\ud800"', '"\\ud83d\\ude00"', '"x\\"y"', '1', '-0.5e3', '01', 'NaN',
           'Infinity', 'inf', 'true', 'null', 'nul', '"\x01"', '\ufeff', '/', '\\', "'"]


@FAST
@given(st.lists(st.one_of(st.lists(st.sampled_from(_TOKENS), max_size=12).map("".join)
                           | st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) | st.text(max_size=4),
                                          lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c, max_size=3),
                                          max_leaves=6).map(lambda v: json.dumps(v, allow_nan=True))), min_size=1, max_size=30),
       st.sampled_from(["OBJECT", "ARRAY"]))
def test_json_shape_paths_agree_on_generated_texts(texts, shape):
    values = pl.Series("v", texts, dtype=pl.String)
    expected = q.bad_json_plain(values, shape).to_list()
    assert q.bad_json(values, shape, small_rows=0).to_list() == expected
    assert q.bad_json(values, shape, small_rows=10**9).to_list() == expected


# ---------------------------------------------------------------------------------------------
# the whole quarantine: both paths == the plain rules, on generated corrupt snapshots


def _uuid(i: int) -> str:
    return f"00000000-0000-4000-8000-{i:012x}"


LABELS = ("project: a", "b", "", "  ", "x\x07y", "tab\there", None, "\x1c", "ok\u00a0", "SOUL:name")
PROPS = ("{}", '{"k": 1}', "[1]", '"s"', "{bad", None, '{"a": NaN}', '{"a": 1,}', " {}", '{"a": "\\ud800"}', "[" * 1200 + "]" * 1200)
STEPS = ("[]", '["a"]', "{}", "[1,]", None, "nope")
IMPORTANCE = (5.0, 1.0, 10.0, 0.5, 11.0, float("nan"), float("inf"), None)
WEIGHTS = (1.0, 0.0, -1.0, float("nan"), None, 2.5)
TIMES = (NOW - timedelta(days=1), NOW + timedelta(minutes=4), NOW + timedelta(minutes=6), None)


@st.composite
def corrupt_snapshots(draw) -> Snapshot:
    pick = lambda xs: draw(st.sampled_from(xs))  # noqa: E731
    n = draw(st.integers(0, 12))
    pool = [_uuid(i) for i in range(16)]
    ids = [draw(st.sampled_from(pool + [None])) for _ in range(n)]
    nodes = pl.DataFrame({
        "id": ids, "scope_path": [pick((SCOPE, SCOPE, SCOPE, "org\x1fother", None)) for _ in ids], "tenant_id": "fast",
        "layer": [pick(("semantic", "semantic", "working", "episodic", None)) for _ in ids],
        "label": [pick(LABELS) for _ in ids], "properties": [pick(PROPS) for _ in ids],
        "importance": [pick(IMPORTANCE) for _ in ids], "created_at": [pick(TIMES) for _ in ids],
        "updated_at": [pick(TIMES) for _ in ids], "version": 1,
    }, schema_overrides={"created_at": tables.TS, "updated_at": tables.TS, "importance": pl.Float64, "id": pl.String,
                         "scope_path": pl.String, "layer": pl.String, "label": pl.String, "properties": pl.String})
    m = draw(st.integers(0, 12))
    ends = pool + [None]
    edges = pl.DataFrame({
        "id": [draw(st.sampled_from(pool)) if draw(st.booleans()) else _uuid(100 + k) for k in range(m)],
        "scope_path": SCOPE, "tenant_id": "fast",
        "source_id": [pick(ends) for _ in range(m)], "target_id": [pick(ends) for _ in range(m)], "relation": "R",
        "weight": [pick(WEIGHTS) for _ in range(m)], "properties": [pick(PROPS) for _ in range(m)],
        "created_at": [pick(TIMES) for _ in range(m)], "version": 1,
    }, schema_overrides={"created_at": tables.TS, "weight": pl.Float64, "source_id": pl.String, "target_id": pl.String,
                         "properties": pl.String})
    k = draw(st.integers(0, 6))
    events = pl.DataFrame({
        "id": [_uuid(200 + draw(st.integers(0, 5))) for _ in range(k)], "scope_path": SCOPE, "tenant_id": "fast",
        "content": [pick(("said x", "", " ", None, "a\x00b")) for _ in range(k)],
        "metadata": [pick(PROPS) for _ in range(k)], "created_at": [pick(TIMES) for _ in range(k)], "version": 1,
    }, schema_overrides={"created_at": tables.TS, "content": pl.String, "metadata": pl.String})
    j = draw(st.integers(0, 4))
    skills = pl.DataFrame({"id": [_uuid(300 + i) for i in range(j)], "scope_path": SCOPE, "tenant_id": "fast",
                           "name": [pick(LABELS) for _ in range(j)], "steps": [pick(STEPS) for _ in range(j)], "version": 1},
                          schema_overrides={"name": pl.String, "steps": pl.String})
    r = draw(st.integers(0, 3))
    recalls = pl.DataFrame({"id": [_uuid(400 + i) for i in range(r)], "scope_path": SCOPE, "tenant_id": "fast",
                            "node_id": _uuid(1), "features": [pick(([0.1] * 12, [0.1] * 11, None)) for _ in range(r)],
                            "label": [pick((None, 1.0)) for _ in range(r)]},
                           schema_overrides={"features": pl.List(pl.Float64), "label": pl.Float64})
    p = draw(st.integers(0, 3))
    pending = pl.DataFrame({"id": [_uuid(500 + i) for i in range(p)], "scope_path": SCOPE, "tenant_id": "fast",
                            "source_label": [pick(LABELS) for _ in range(p)], "target_label": [pick(LABELS) for _ in range(p)],
                            "relation": "R", "weight": [pick(WEIGHTS) for _ in range(p)]},
                           schema_overrides={"source_label": pl.String, "target_label": pl.String, "weight": pl.Float64})
    a = draw(st.integers(0, 4))
    access = pl.DataFrame({"id": list(range(a)), "scope_path": [pick((SCOPE, "org\x1fother")) for _ in range(a)],
                           "node_id": [pick(pool) for _ in range(a)], "accessed_at": [pick(TIMES) for _ in range(a)], "kind": "read"},
                          schema_overrides={"accessed_at": tables.TS, "scope_path": pl.String})
    frames = {"memory_nodes": nodes, "memory_edges": edges, "episodic_events": events, "procedural_skills": skills,
              "recall_events": recalls, "pending_connections": pending, "memory_access_log": access}
    frames = {t: tables.conform(t, f) for t, f in frames.items() if draw(st.booleans()) or t == "memory_nodes"}
    return Snapshot(scope_path=SCOPE, taken_at=NOW, frames=frames)


def _same(a: tuple[Snapshot, pl.DataFrame], b: tuple[Snapshot, pl.DataFrame]) -> None:
    assert a[1].to_dicts() == b[1].to_dicts()
    assert set(a[0].frames) == set(b[0].frames)
    for t in a[0].frames:
        assert a[0].frames[t].equals(b[0].frames[t], null_equal=True), t
        assert a[0].frames[t].schema == b[0].frames[t].schema, t



@FAST
@given(corrupt_snapshots())
def test_quarantine_small_and_big_paths_agree_with_the_plain_rules(snap):
    expected = q.quarantine_plain(snap, NOW)
    _same(q.quarantine(snap, NOW), expected)
    _same(q.quarantine(snap, NOW, small_rows=0), expected)


def test_duplicate_ids_found_however_they_hash():
    ids = pl.Series("id", [_uuid(i) for i in range(5000)] + [_uuid(17), None, None])
    frame = tables.conform("memory_nodes", pl.DataFrame({"id": ids, "scope_path": SCOPE, "label": "x", "properties": "{}",
                                                         "importance": 5.0, "layer": "semantic"}))
    snap = Snapshot(scope_path=SCOPE, taken_at=NOW, frames={"memory_nodes": frame})
    _same(q.quarantine(snap, NOW), q.quarantine_plain(snap, NOW))
    assert q.quarantine(snap, NOW)[1].get_column("reason").value_counts().sort("reason").rows() == [
        ("duplicate id", 2), ("null id", 2)]


def test_a_clean_frame_is_passed_on_as_it_is():
    frame = tables.conform("memory_nodes", pl.DataFrame({"id": [_uuid(1)], "scope_path": SCOPE, "label": "x",
                                                         "properties": "{}", "importance": 5.0, "layer": "semantic"}))
    snap = Snapshot(scope_path=SCOPE, taken_at=NOW, frames={"memory_nodes": frame})
    shard = Shard.of(snap)
    clean, found = q.quarantine(shard, NOW)  # nothing flagged: the shard (and its frame) go on as they are
    assert clean is shard and clean.frames["memory_nodes"] is frame and found.height == 0
    clean, found = q.quarantine(snap, NOW)  # a Snapshot is that shard of one's scope: the same rows
    assert clean.frames["memory_nodes"].equals(frame) and found.height == 0 and not clean.held_nodes
    assert np.array_equal(q.bad_json(pl.Series(["{}", None]), "OBJECT").to_numpy(), [False, True])



@pytest.mark.parametrize("paths", [
    [SCOPE] * 3,  # a shard of one whose rows are its own: the repeat
    [],
    [SCOPE, "org\x1fother\x1fbrand\x1fb1", None, SCOPE],  # some of no scope of the shard, or none: the replace table
    [None],
])
def test_the_tenant_of_rows_of_a_shard_of_one_is_the_replace_tables(paths):
    series = pl.Series("scope_path", paths, dtype=pl.String)
    got = q._Scopes((SCOPE,)).tenant_of_rows(series)
    assert got.name == "scope_path" and got.dtype == pl.String
    assert got.to_list() == ["fast" if p == SCOPE else None for p in paths]
    assert got.equals(series.replace_strict([SCOPE], ["fast"], default=None, return_dtype=pl.String))


# ---------------------------------------------------------------------------------------------
# (scope, id) membership: the one-scope shortcut == the join == the plain struct is_in

def test_pair_member_reads_the_scope_even_when_the_ids_match():
    a, b = "org\x1fa", "org\x1fb"
    among_s, among_i = pl.Series([a, a]), pl.Series(["x", "y"])
    # one scope on both sides: the ids decide (the shortcut)
    assert q._pair_member(pl.Series([a, a, a]), pl.Series(["x", "z", None]), among_s, among_i).to_list() == [True, False, False]
    # an id of the right node under another scope, or under no scope, is no member
    assert q._pair_member(pl.Series([a, b, None]), pl.Series(["x", "x", "y"]), among_s, among_i).to_list() == [True, False, False]
    # the nodes of two scopes: the pair decides
    assert q._pair_member(pl.Series([b, a]), pl.Series(["x", "x"]), pl.Series([a, b]), pl.Series(["y", "x"])).to_list() == [True, False]
    assert q._pair_member(pl.Series([a]), pl.Series(["x"]), pl.Series([None], dtype=pl.String), pl.Series(["x"])).to_list() == [False]


@FAST
@given(st.data())
def test_pair_member_agrees_with_the_plain_rule(data):
    scopes = st.sampled_from(["org\x1fa", "org\x1fb", None]) if data.draw(st.booleans()) else st.just("org\x1fa")
    ids = st.sampled_from(["x", "y", "z", None])
    n, m = data.draw(st.integers(0, 30)), data.draw(st.integers(0, 30))
    values_s = pl.Series([data.draw(scopes) for _ in range(n)], dtype=pl.String)
    values_i = pl.Series([data.draw(ids) for _ in range(n)], dtype=pl.String)
    among_s = pl.Series([data.draw(scopes) for _ in range(m)], dtype=pl.String)
    among_i = pl.Series([data.draw(ids) for _ in range(m)], dtype=pl.String)
    want = q._pair_member_plain(values_s, values_i, among_s, among_i).to_list()
    for few in (False, True):
        assert q._pair_member(values_s, values_i, among_s, among_i, few=few).to_list() == want
