"""The fast paths of the online path's validation give the same answers as the slow ones.

- quarantine's JSON shape check: the small-frame path (Python ``json.loads``, unsure texts handed
  to DuckDB) and the big-frame path (DuckDB ``json_valid`` + first character) both agree with the
  DuckDB expression quarantine used before (``json_valid(c) AND json_type(c::JSON) = …``) on a
  corpus of bad JSON and bad shapes and on generated texts;
- the whole of ``quarantine`` (either path) agrees with the earlier implementation, frozen below
  as :func:`_reference_quarantine`, on generated corrupt snapshots (the earlier code raised on a
  text that is not valid JSON at all: see :func:`_ref_json_shape_flags`);
- ``lookup.text_order`` (an integer sort of the ids' bytes) orders ids as Polars' string sort does,
  and the diff hash's row order built from it (``diff._by_phase_and_id``) is ``sort(["phase", "id"])``;
- co-occurrence numbers edge ends by id hash as a join on the ids does, and counts distinct
  neighbours as a unique over (node, neighbour id) does;
- ``validate_diff``'s pre-check never vouches for a diff pandera would reject (the bad-diff corpus
  of tests/validation/test_diff_checks.py lives there; here: generated diffs, with and without the pre-check).
"""

from __future__ import annotations

import contextlib
import json
from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
import pytest
from deep_sleep.transforms.cooccurrence import (
    _distinct_neighbours,
    _number_ends,
    _number_ends_by_id,
)
from deep_sleep.validation import diff_checks as dc
from deep_sleep.validation import quarantine as q
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deep_sleep.core import diff as diff_module
from deep_sleep.core import lookup, tables
from deep_sleep.core.diff import _by_phase_and_id
from deep_sleep.core.duck import registered
from deep_sleep.core.snapshot import Snapshot, utc

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
SCOPE = "org\x1ffast\x1fbrand\x1fb1"
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ---------------------------------------------------------------------------------------------
# the reference: quarantine as it was before the fast paths (validation/quarantine.py @ 1053a49)


def _ref_json_shape_flags(table: str, frame: pl.DataFrame) -> dict[str, pl.Series]:
    kinds = tables.columns(table)
    cols = [c for c in q.JSON_SHAPE if c in frame.columns and c in kinds and kinds[c].kind == "json"]
    if not cols or not frame.height:
        return {}
    # The one change to the frozen code: DuckDB does not short-circuit ``AND``, so the earlier
    # ``coalesce(NOT (json_valid(c) AND json_type(c::JSON) = …), true)`` raised a ConversionException
    # on the first text that is not valid JSON instead of flagging it; CASE evaluates the cast only
    # for valid texts, which is what the expression meant.
    exprs = ", ".join(
        f"coalesce(NOT CASE WHEN json_valid({c}) THEN json_type({c}::JSON) = '{q.JSON_SHAPE[c]}' END, true) AS {c}" for c in cols
    )
    with registered(frame.select(cols).to_arrow()) as (con, name):
        flags = con.sql(f"SELECT {exprs} FROM {name}").pl()
    return {c: flags.get_column(c) for c in cols}


def _ref_reasons(table: str, frame: pl.DataFrame, scope_path: str, as_of: datetime) -> pl.Expr:
    rules: list[tuple[str, pl.Expr]] = []
    if table in tables.MUTABLE:
        rules += [("null id", pl.col("id").is_null()), ("duplicate id", pl.col("id").is_duplicated())]
    if "scope_path" in frame.columns:
        rules.append(("scope_path differs from the run's scope", pl.col("scope_path").fill_null("") != scope_path))
    if "importance" in frame.columns:
        rules += [
            ("importance is not a finite number", pl.col("importance").is_null() | ~pl.col("importance").is_finite()),
            ("importance outside [1, 10]", ~pl.col("importance").is_between(1.0, 10.0)),
        ]
    for label in ("label", "source_label", "target_label", "name"):
        if label in frame.columns and frame.schema[label] == pl.String:
            rules += [
                ("empty label", pl.col(label).is_null() | (pl.col(label).str.strip_chars() == "")),
                ("control characters in label", pl.col(label).str.contains(q.CONTROL)),
            ]
    if "layer" in frame.columns:
        rules.append(("unknown layer", ~pl.col("layer").is_in(["semantic", "working"])))
    for column, flag in (("properties", "_bad_properties"), ("metadata", "_bad_metadata"), ("steps", "_bad_steps")):
        if flag in frame.columns:
            rules.append((f"{column} is not a JSON {'array' if column == 'steps' else 'object'}", pl.col(flag)))
    if "weight" in frame.columns:
        rules.append(("weight is negative or not finite", pl.col("weight").is_null() | ~pl.col("weight").is_finite() | (pl.col("weight") < 0)))
    if table == "episodic_events":
        rules.append(("empty content", pl.col("content").is_null() | (pl.col("content").str.strip_chars() == "")))
    if table == "recall_events":
        rules.append(("features must have 12 values", pl.col("features").list.len().fill_null(0) != 12))
    limit = utc(as_of) + q.FUTURE_TOLERANCE
    future = [pl.col(c) > limit for c in q.TIMESTAMPS if c in frame.columns]
    if future:
        rules.append(("timestamp in the future", pl.any_horizontal(future).fill_null(False)))
    expr = pl.lit(None, dtype=pl.String)
    for reason, test in reversed(rules):
        expr = pl.when(test.fill_null(False)).then(pl.lit(reason)).otherwise(expr)
    return expr.alias("_reason")


def _reference_quarantine(snapshot: Snapshot, as_of: datetime) -> tuple[Snapshot, pl.DataFrame]:
    clean: dict[str, pl.DataFrame] = {}
    found = [pl.DataFrame(schema=q.QUARANTINE_SCHEMA)]
    order = sorted(snapshot.frames, key=lambda t: t == "memory_edges")
    bad_nodes = pl.Series("id", [], dtype=pl.String)
    for table in order:
        frame = snapshot.frames[table]
        if not frame.height:
            clean[table] = frame
            continue
        flags = _ref_json_shape_flags(table, frame)
        work = frame.with_columns(*(s.alias(f"_bad_{c}") for c, s in flags.items()))
        work = work.with_columns(_ref_reasons(table, work, snapshot.scope_path, as_of))
        if table == "memory_edges":
            nodes = clean.get("memory_nodes", snapshot.table("memory_nodes"))
            live = nodes.get_column("id").implode()
            touched = pl.col("source_id").is_in(bad_nodes.implode()) | pl.col("target_id").is_in(bad_nodes.implode())
            # deliberate change since the frozen copy: a null endpoint is dangling (not a node)
            dangling = ~(pl.col("source_id").is_in(live).fill_null(False) & pl.col("target_id").is_in(live).fill_null(False))
            work = work.with_columns(pl.coalesce(
                pl.col("_reason"),
                pl.when(touched).then(pl.lit("edge endpoint is quarantined")),
                pl.when(dangling).then(pl.lit("dangling edge: endpoint not a node of this scope")),
            ).alias("_reason"))
        bad = work.filter(pl.col("_reason").is_not_null())
        if bad.height:
            found.append(bad.select(
                pl.lit(table).alias("table"), pl.col("id").cast(pl.String) if "id" in bad.columns else pl.lit(None, pl.String).alias("id"),
                pl.col("_reason").alias("reason"), q._row_json(bad),
            ))
            if table == "memory_nodes":
                bad_nodes = bad.get_column("id")
        clean[table] = work.filter(pl.col("_reason").is_null()).select(frame.columns)
    return snapshot.with_frames(clean), pl.concat(found).sort("table", "id", "reason")


# ---------------------------------------------------------------------------------------------
# JSON shape: small path == big path == the reference expression

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


def _reference_flags(values: list[str | None], shape: str) -> list[bool]:
    column = "steps" if shape == "ARRAY" else "properties"
    table = "procedural_skills" if shape == "ARRAY" else "memory_nodes"
    frame = pl.DataFrame({column: values}, schema={column: pl.String})
    return _ref_json_shape_flags(table, frame)[column].to_list()


@pytest.mark.parametrize("shape", ["OBJECT", "ARRAY"])
def test_json_shape_small_and_big_paths_agree_with_the_reference_on_the_corpus(shape):
    values = pl.Series("v", [*JSON_CORPUS, None], dtype=pl.String)
    expected = _reference_flags(values.to_list(), shape)
    big = q.bad_json(values, shape, small_rows=0).to_list()
    small = q.bad_json(values, shape, small_rows=10**9).to_list()
    assert big == expected
    assert small == expected
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
    expected = _reference_flags(texts, shape)
    assert q.bad_json(values, shape, small_rows=0).to_list() == expected
    assert q.bad_json(values, shape, small_rows=10**9).to_list() == expected


# ---------------------------------------------------------------------------------------------
# the whole quarantine: both paths == the reference, on generated corrupt snapshots


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
def test_quarantine_small_and_big_paths_agree_with_the_reference(snap):
    expected = _reference_quarantine(snap, NOW)
    _same(q.quarantine(snap, NOW), expected)
    _same(q.quarantine(snap, NOW, small_rows=0), expected)


def test_duplicate_ids_found_however_they_hash():
    ids = pl.Series("id", [_uuid(i) for i in range(5000)] + [_uuid(17), None, None])
    frame = tables.conform("memory_nodes", pl.DataFrame({"id": ids, "scope_path": SCOPE, "label": "x", "properties": "{}",
                                                         "importance": 5.0, "layer": "semantic"}))
    snap = Snapshot(scope_path=SCOPE, taken_at=NOW, frames={"memory_nodes": frame})
    _same(q.quarantine(snap, NOW), _reference_quarantine(snap, NOW))
    assert q.quarantine(snap, NOW)[1].get_column("reason").value_counts().sort("reason").rows() == [
        ("duplicate id", 2), ("null id", 2)]


def test_a_clean_frame_is_passed_on_as_it_is():
    frame = tables.conform("memory_nodes", pl.DataFrame({"id": [_uuid(1)], "scope_path": SCOPE, "label": "x",
                                                         "properties": "{}", "importance": 5.0, "layer": "semantic"}))
    snap = Snapshot(scope_path=SCOPE, taken_at=NOW, frames={"memory_nodes": frame})
    clean, found = q.quarantine(snap, NOW)
    assert clean.frames["memory_nodes"] is frame and found.height == 0
    assert np.array_equal(q.bad_json(pl.Series(["{}", None]), "OBJECT").to_numpy(), [False, True])


# ---------------------------------------------------------------------------------------------
# validate_diff: the pre-check only skips pandera where pandera finds nothing


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
    from deep_sleep.validation import validate_diff

    from deep_sleep.core.config import ConsolidationConfig

    diff, snap = case
    config = ConsolidationConfig(cooccurrence={"max_neighbours": 2}, episodic_summary={"batch_size": 2, "max_batches": 1})
    fast = validate_diff(diff, snap, config)
    slow = validate_diff(diff, snap, config, precheck=False)
    assert fast.to_dicts() == slow.to_dicts()
    assert fast.schema == slow.schema


# The annotations validate_diff computed before they were rewritten to probe hashes first (frozen
# here as the reference the current ones must reproduce exactly).
def _ref_annotate(table: str, kind: str, frame: pl.DataFrame, diff, snapshot) :
    snap = snapshot.table(table)
    out = frame.with_row_index("_row").with_columns(pl.len().over("phase").alias("_phase_rows"))
    if kind in ("updates", "deletes"):
        ref = snap.select("id", pl.col("version").alias("_snapshot_version"), pl.lit(True).alias("_in_snapshot_row"),
                          *([pl.col("label").alias("_label")] if "label" in snap.columns else []))
        out = out.join(ref, on="id", how="left", maintain_order="left")
    if kind == "updates":
        gone = diff.table(table).deletes.get_column("id").implode()
        out = out.with_columns(pl.col("id").is_in(gone).alias("_deleted"))
        rewrites = [pl.col(c).is_not_null() for c in dc.IMMUTABLE[1:] if c in out.columns]
        out = out.with_columns((pl.any_horizontal(rewrites) if rewrites else pl.lit(False)).alias("_rewrites_scope"))
    if kind == "deletes" and table == "memory_nodes":
        surviving = _ref_surviving_edges(diff, snapshot)
        ends = pl.concat([surviving.get_column("source_id"), surviving.get_column("target_id")]).alias("id")
        counts = ends.filter(lookup.member(ends, out.get_column("id"))).to_frame().group_by("id").len("_dangling_edges")
        out = out.join(counts, on="id", how="left", maintain_order="left").with_columns(pl.col("_dangling_edges").fill_null(0))
    if kind == "inserts":
        out = out.with_columns(lookup.member(out.get_column("id"), snap.get_column("id")).alias("_in_snapshot"))
        if table == "memory_edges":
            live = _ref_live_node_ids(diff, snapshot)
            exist = lookup.member(out.get_column("source_id"), live) & lookup.member(out.get_column("target_id"), live)
            out = out.with_columns(exist.alias("_ends_exist"))
            out = _ref_co_degree(out, diff, snapshot)
    return out


def _ref_co_degree(inserts: pl.DataFrame, diff, snapshot) :
    """For inserted CO_OCCURRED edges: the larger final CO_OCCURRED degree of its two ends."""
    co = pl.col("relation") == "CO_OCCURRED"
    edges = diff.table("memory_edges")
    final = lookup.without(snapshot.table("memory_edges").filter(co), edges.deletes.get_column("id"))
    final = pl.concat([final.select("source_id", "target_id"), inserts.filter(co).select("source_id", "target_id")])
    pairs = pl.concat([final.select(a=pl.col("source_id"), b=pl.col("target_id")), final.select(a=pl.col("target_id"), b=pl.col("source_id"))])
    # only the degrees of the inserted edges' ends are needed: keep every pair of those nodes
    ends = pl.concat([inserts.filter(co).get_column("source_id"), inserts.filter(co).get_column("target_id")])
    pairs = pairs.filter(lookup.member(pairs.get_column("a"), ends))
    degree = pairs.filter(pl.col("a") != pl.col("b")).unique().group_by("a").len("deg")
    out = inserts.join(degree.rename({"a": "source_id", "deg": "_d_src"}), on="source_id", how="left", maintain_order="left")
    out = out.join(degree.rename({"a": "target_id", "deg": "_d_tgt"}), on="target_id", how="left", maintain_order="left")
    return out.with_columns(
        pl.when(co).then(pl.max_horizontal("_d_src", "_d_tgt")).otherwise(None).alias("_co_degree")
    ).drop("_d_src", "_d_tgt")


def _ref_live_node_ids(diff, snapshot) :
    nodes = diff.table("memory_nodes")
    ids = snapshot.table("memory_nodes").get_column("id")
    ids = ids.filter(~lookup.member(ids, nodes.deletes.get_column("id")))
    return pl.concat([ids, nodes.inserts.get_column("id")]) if nodes.inserts.height else ids


def _ref_surviving_edges(diff, snapshot) :
    edges = diff.table("memory_edges")
    kept = lookup.without(snapshot.table("memory_edges").select("id", "source_id", "target_id"), edges.deletes.get_column("id"))
    kept = kept.select("source_id", "target_id")
    if edges.inserts.height:
        kept = pl.concat([kept, edges.inserts.select("source_id", "target_id")])
    return kept



@FAST
@given(diffs())
def test_validation_annotations_agree_with_the_reference(case):
    diff, snap = case
    for small in (0, lookup.SMALL):  # the hash paths, then the plain lookups small inputs take
        with _small(small):
            for table, td in diff.tables.items():
                for kind, frame in td.frames().items():
                    if frame.height:
                        got = dc._annotate(table, kind, frame, diff, snap)
                        ref = _ref_annotate(table, kind, frame, diff, snap)
                        assert got.columns == ref.columns and got.schema == ref.schema, (table, kind)
                        assert got.equals(ref), (table, kind)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f"]), min_size=0, max_size=8),
       st.lists(st.sampled_from(["a", "b", "c", "x", "y"]), min_size=0, max_size=20))
def test_live_endpoints_match_is_in_with_and_without_the_hash_path(ids, ends):
    """The dangling-edge lookup by hash (node ids unique) and by set (ids repeat) agree with is_in."""
    ids_s, ends_s = pl.Series("id", ids, dtype=pl.String), pl.Series("end", ends, dtype=pl.String)
    for small in (0, lookup.SMALL):  # the hash path, then the plain lookup small inputs take
        with _small(small):
            for few in (False, True):
                assert lookup.member(ends_s, ids_s, few=few).to_list() == ends_s.is_in(ids_s.implode()).to_list()


@contextlib.contextmanager
def _small(value: int):
    saved, lookup.SMALL = lookup.SMALL, value
    try:
        yield
    finally:
        lookup.SMALL = saved


def test_an_edge_with_a_null_endpoint_is_dangling():
    ids = pl.Series("id", ["a", "b"])
    for small in (0, lookup.SMALL):
        with _small(small):
            for few in (False, True):
                assert lookup.member(pl.Series("end", ["a", None]), ids, few=few).to_list() == [True, False]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), min_size=0, max_size=12, unique=True),
       st.lists(st.sampled_from(["a", "c", "e", "x"]), min_size=0, max_size=6))
def test_hash_lookups_agree_with_string_lookups(table_ids, wanted):
    """matches / without / member (hash probe + id check) give what a string join / is_in gives."""
    ids = pl.Series("id", table_ids, dtype=pl.String)
    want = pl.Series("id", wanted, dtype=pl.String)
    frame = pl.DataFrame({"id": ids, "v": list(range(len(table_ids)))})
    expected_rows = frame.with_row_index("_pos").filter(pl.col("id").is_in(want.implode()))
    for small in (0, lookup.SMALL):
        with _small(small):
            pairs = frame.with_row_index("_pos").join(want.to_frame().with_row_index("_w"), on="id").select("_pos", "_w")
            assert sorted(lookup.matches(ids, want).rows()) == sorted(pairs.rows())
            assert sorted(set(lookup.matches(ids, want).get_column("_pos"))) == expected_rows.get_column("_pos").to_list()
            assert lookup.without(frame, want).equals(frame.filter(~pl.col("id").is_in(want.implode())))
            for few in (False, True):
                assert lookup.member(want, ids, few=few).to_list() == want.is_in(ids.implode()).to_list()


_ID_CHARS = st.sampled_from(["0", "1", "a", "f", "-", "é", "\x00"])


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 20), st.lists(st.lists(_ID_CHARS, min_size=0, max_size=20).map("".join), min_size=0, max_size=40),
       st.booleans())
def test_text_order_is_the_string_sort(width, texts, same_width):
    """Equal-width ids (the integer path; a shared prefix longer than a word forces the tie-break)
    and ragged ones (the fallback) are put in the order of Polars' ``arg_sort``."""
    if same_width:  # pad/cut to one byte length, with a long common prefix so first words tie
        texts = [("00000000" + t.encode("utf-8")[:width].decode("utf-8", "ignore")).ljust(8 + width, "z") for t in texts]
        texts = [t for t in texts if len(t.encode("utf-8")) == 8 + width]
    ids = pl.Series("id", sorted(set(texts)), dtype=pl.String).shuffle(seed=len(texts))
    order = lookup.text_order(ids)
    assert ids.gather(order).to_list() == ids.sort().to_list()


@st.composite
def _phase_frames(draw):
    phases = draw(st.lists(st.sampled_from(["strengthen", "decay_importance", "cooccurrence", "tag_risk"]),
                           min_size=1, max_size=4, unique=True))
    rows = []
    for phase in phases:
        ids = draw(st.lists(st.uuids().map(str), min_size=1, max_size=15, unique=not draw(st.booleans()) or len(phases) > 2))
        rows += [(phase, i, n) for n, i in enumerate(ids)]
    if draw(st.booleans()):  # phases interleaved: no longer one run each
        rows = draw(st.permutations(rows))
    return pl.DataFrame(rows, schema={"phase": pl.String, "id": pl.String, "v": pl.Int64}, orient="row")


@settings(max_examples=80, deadline=None)
@given(_phase_frames())
def test_canonical_row_order_is_the_sort_by_phase_and_id(frame):
    saved, diff_module.SORT_ROWS = diff_module.SORT_ROWS, 0  # the run-by-run path even for small frames
    try:
        got = _by_phase_and_id(frame)
    finally:
        diff_module.SORT_ROWS = saved
    want = frame.sort(["phase", "id"])
    assert got.select("phase", "id").equals(want.select("phase", "id"))
    if frame.select("phase", "id").is_unique().all():  # with repeated keys the order among them is not defined
        assert got.equals(want)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from("abcdefgh"), min_size=0, max_size=6, unique=True),
       st.lists(st.tuples(st.sampled_from("abcdefghxy"), st.sampled_from("abcdefghxy")), min_size=0, max_size=25))
def test_cooccurrence_end_numbers_and_degrees_agree_with_plain_joins(recent, pairs):
    """Edges in both directions, repeated edges and ends that are not recent (x, y)."""
    ids = pl.Series("id", recent, dtype=pl.String)
    edges = pl.DataFrame({"source_id": [a for a, _ in pairs], "target_id": [b for _, b in pairs]},
                         schema={"source_id": pl.String, "target_id": pl.String}).with_row_index("_row")
    edges = edges.with_columns(pl.col("source_id").hash().alias("sh"), pl.col("target_id").hash().alias("th"))
    fast, plain = _number_ends(edges, ids), _number_ends_by_id(edges, ids)
    assert fast.equals(plain)
    neighbours = pl.concat([
        plain.filter(pl.col("si").is_not_null()).select(pl.col("si").alias("i"), pl.col("target_id").alias("nbr")),
        plain.filter(pl.col("ti").is_not_null()).select(pl.col("ti").alias("i"), pl.col("source_id").alias("nbr")),
    ]).unique()
    expected = np.bincount(neighbours.get_column("i").to_numpy(), minlength=len(recent)) if neighbours.height else np.zeros(len(recent), int)
    assert _distinct_neighbours(fast, len(recent)).tolist() == expected.tolist()
