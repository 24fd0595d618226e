"""A shard's diff is validated in one pandera pass per frame (SPEC §2 "Scale", §4), and each scope
gets its own verdict: for every scope S, the failures of ``validate_diff`` of the shard's diff with
scope_path S are those of ``validate_diff`` of S's own diff (``Diff.by_scope``) against a shard of
S alone — same checks, tables, kinds, phases, ids and columns — on real shard plans, with tight
caps, and with corruptions of some scopes' rows; a corrupted scope never fails the others."""

from __future__ import annotations

import functools
import uuid

import polars as pl
import pytest
from deep_sleep.transforms.config import ConsolidationConfig
from deep_sleep.validation import FAILURE_SCHEMA, failed_scopes, validate_diff
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deep_sleep.core.diff import Diff, TableDiff
from deep_sleep.core.errors import DiffError
from deep_sleep.core.shard import Shard
from deep_sleep.run.transform import as_shard_diff, transform
from tests.transforms.shard_cases import AS_OF, fleet

KEY = ["check", "table", "kind", "phase", "id", "column"]
TIGHT = ConsolidationConfig(cooccurrence={"max_neighbours": 2}, episodic_summary={"batch_size": 2, "max_batches": 1},
                            procedural_promotion={"max_per_run": 1}, synthetic_links={"max_pairs": 1})


@functools.cache
def planned(n: int = 6, seed: int = 5):
    shard = Shard.from_snapshots(fleet(n, seed=seed))
    result = transform(shard, ConsolidationConfig(), AS_OF)
    return result.shard, result.diff


def _verdicts(frame: pl.DataFrame) -> list[tuple]:
    return frame.select(KEY).unique().sort(KEY, nulls_last=True).rows()


def _column_values(frame: pl.DataFrame) -> list[tuple]:
    """(check, id, column, value) of the column checks (a frame-wide check's value is the whole row)."""
    mine = frame.filter(pl.col("column") != pl.concat_str("table", pl.lit("."), "kind"))
    return mine.select("check", "id", "column", "value").unique().sort("check", "id", "column", "value", nulls_last=True).rows()


def assert_each_scope_is_validated_as_alone(diff: Diff, shard: Shard, config: ConsolidationConfig | None = None) -> pl.DataFrame:
    got = validate_diff(diff, shard, config)
    assert got.columns == ["check", "table", "kind", "phase", "id", "column", "value", "scope_path"]
    assert dict(got.schema) == FAILURE_SCHEMA
    assert got.equals(validate_diff(diff, shard, config, precheck=False)) or \
        _verdicts(got) == _verdicts(validate_diff(diff, shard, config, precheck=False))
    parts = diff.by_scope()
    for s in shard.scope_paths:
        one = Shard.of(shard.scope(s))  # the scope alone: a shard of one
        alone = validate_diff(parts.get(s, Diff.empty()), one, config)  # its diff in the single-scope form
        assert set(alone.get_column("scope_path")) <= {s}, s
        assert _verdicts(validate_diff(as_shard_diff(parts.get(s, Diff.empty()), s), one, config)) == _verdicts(alone), s
        mine = got.filter(pl.col("scope_path") == s)
        assert _verdicts(mine) == _verdicts(alone), s
        assert _column_values(mine) == _column_values(alone), s
    return got


# -- corruptions of one scope's rows -----------------------------------------------------------------
def _with(diff: Diff, table: str, kind: str, rows: pl.DataFrame) -> Diff:
    """``diff`` with ``rows`` added to one of its frames."""
    td = diff.table(table)
    frames = td.frames()
    frames[kind] = pl.concat([frames[kind], rows], how="diagonal_relaxed") if frames[kind].height else rows
    return Diff({**diff.tables, table: TableDiff(**frames)})


def _node(shard: Shard, s: str, i: int = 0, label: str | None = None) -> dict:
    nodes = shard.scope(s).table("memory_nodes")
    if label is not None:
        nodes = nodes.filter(pl.col("label").str.starts_with(label))
    return nodes.sort("id").row(i % nodes.height, named=True)


def importance_11(diff, shard, s, other):
    n = _node(shard, s, 1)
    return _with(diff, "memory_nodes", "updates", pl.DataFrame({
        "id": [n["id"]], "expected_version": [n["version"]], "importance": [11.0], "phase": ["decay_importance"], "scope_path": [s]}))


def edge_to_a_missing_node(diff, shard, s, other):
    n = _node(shard, s, 2)
    return _with(diff, "memory_edges", "inserts", pl.DataFrame({
        "id": [str(uuid.uuid4())], "scope_path": [s], "tenant_id": [s.split("\x1f")[1]], "source_id": [n["id"]],
        "target_id": [str(uuid.uuid4())], "relation": ["RELATED_TO"], "weight": [1.0], "phase": ["pending_edges"]}))


def edge_into_another_scope(diff, shard, s, other):
    a, b = _node(shard, s, 3), _node(shard, other, 0)
    return _with(diff, "memory_edges", "inserts", pl.DataFrame({
        "id": [str(uuid.uuid4())], "scope_path": [s], "tenant_id": [s.split("\x1f")[1]], "source_id": [a["id"]],
        "target_id": [b["id"]], "relation": ["CO_OCCURRED"], "weight": [1.0], "phase": ["cooccurrence"]}))


def update_of_another_scopes_row(diff, shard, s, other):
    n = _node(shard, other, 4)
    return _with(diff, "memory_nodes", "updates", pl.DataFrame({
        "id": [n["id"]], "expected_version": [n["version"]], "importance": [6.0], "phase": ["strengthen"], "scope_path": [s]}))


def stale_version(diff, shard, s, other):
    n = _node(shard, s, 5)
    return _with(diff, "memory_nodes", "updates", pl.DataFrame({
        "id": [n["id"]], "expected_version": [n["version"] + 7], "importance": [6.0], "phase": ["tag_risk"], "scope_path": [s]}))


def tenant_rewrite(diff, shard, s, other):
    n = _node(shard, s, 6)
    return _with(diff, "memory_nodes", "updates", pl.DataFrame({
        "id": [n["id"]], "expected_version": [n["version"]], "tenant_id": ["intruder"], "phase": ["drift"], "scope_path": [s]}))


def delete_a_node_with_edges(diff, shard, s, other):
    edges = shard.scope(s).table("memory_edges")
    end = edges.get_column("source_id")[0]
    n = shard.scope(s).table("memory_nodes").filter(pl.col("id") == end).row(0, named=True)
    return _with(diff, "memory_nodes", "deletes", pl.DataFrame({
        "id": [n["id"]], "expected_version": [n["version"]], "reason": ["x"], "phase": ["working_ttl"], "scope_path": [s]}))


def insert_with_wrong_tenant(diff, shard, s, other):
    return _with(diff, "memory_nodes", "inserts", pl.DataFrame({
        "id": [str(uuid.uuid4())], "scope_path": [s], "tenant_id": ["intruder"], "layer": ["semantic"], "label": ["META:x"],
        "importance": [5.0], "phase": ["meta_nodes"]}))


def duplicate_row(diff, shard, s, other):
    n = _node(shard, s, 7)
    row = pl.DataFrame({"id": [n["id"]] * 2, "expected_version": [n["version"]] * 2, "importance": [6.0] * 2,
                        "phase": ["soul_corrections"] * 2, "scope_path": [s] * 2})
    return _with(diff, "memory_nodes", "updates", row)


def insert_of_another_scope(diff, shard, s, other):
    """An insert carrying another scope's scope_path is that scope's row (its diff holds it)."""
    return _with(diff, "memory_nodes", "inserts", pl.DataFrame({
        "id": [_node(shard, other, 0)["id"]], "scope_path": [other], "tenant_id": [other.split("\x1f")[1]], "layer": ["semantic"],
        "label": ["META:y"], "importance": [5.0], "phase": ["meta_nodes"]}))


CORRUPTIONS = [importance_11, edge_to_a_missing_node, edge_into_another_scope, update_of_another_scopes_row, stale_version,
               tenant_rewrite, delete_a_node_with_edges, insert_with_wrong_tenant, duplicate_row, insert_of_another_scope]


def test_a_real_shard_plan_is_valid_in_every_scope():
    shard, diff = planned()
    assert diff.has_changes
    got = assert_each_scope_is_validated_as_alone(diff, shard)
    assert got.height == 0


def test_tight_caps_are_counted_per_scope():
    shard, diff = planned()
    got = assert_each_scope_is_validated_as_alone(diff, shard, TIGHT)
    assert got.height and got.get_column("check").str.contains("cap|CO_OCCURRED").any()


@pytest.mark.parametrize("corrupt", CORRUPTIONS, ids=lambda f: f.__name__)
def test_one_corrupted_scope_fails_alone(corrupt):
    shard, diff = planned()
    s, other = shard.scope_paths[1], shard.scope_paths[3]
    bad = corrupt(diff, shard, s, other)
    got = assert_each_scope_is_validated_as_alone(bad, shard)
    assert got.height, corrupt.__name__
    owner = other if corrupt is insert_of_another_scope else s
    assert set(got.get_column("scope_path")) == {owner}
    assert failed_scopes(got, shard) == {owner}


def test_one_scope_with_several_corruptions_and_the_others_clean():
    shard, diff = planned()
    s, other = shard.scope_paths[2], shard.scope_paths[0]
    bad = diff
    for corrupt in (importance_11, edge_to_a_missing_node, update_of_another_scopes_row):
        bad = corrupt(bad, shard, s, other)
    got = assert_each_scope_is_validated_as_alone(bad, shard)
    assert set(got.get_column("check")) >= {"importance within [1, 10]", "edge ends are live nodes of the scope",
                                            "references a row of the snapshot"}
    assert set(got.get_column("scope_path")) == {s} and failed_scopes(got, shard) == {s}


def test_a_row_of_no_scope_of_the_shard_is_reported_and_fails_every_scope():
    shard, diff = planned()
    foreign = "org\x1fnobody"
    bad = _with(diff, "memory_nodes", "inserts", pl.DataFrame({
        "id": [str(uuid.uuid4())], "scope_path": [foreign], "tenant_id": ["nobody"], "layer": ["semantic"], "label": ["META:z"],
        "importance": [5.0], "phase": ["meta_nodes"]}))
    got = assert_each_scope_is_validated_as_alone(bad, shard)
    assert got.select("check", "scope_path").rows() == [("scope_path equals the run's scope", foreign)]
    assert failed_scopes(got, shard) == set(shard.scope_paths)


def test_a_diff_without_scope_paths_is_refused_on_a_shard_of_many():
    shard, _ = planned()
    with pytest.raises(DiffError, match="scope_path"):
        validate_diff(Diff.of("memory_nodes", "x", deletes=pl.DataFrame({"id": ["a"], "version": [1]}), reason="r"), shard)


def test_a_diff_without_scope_paths_is_the_scopes_own_on_a_shard_of_one():
    """A single scope's diff (no scope_path on its updates and deletes) is validated against a shard
    of that scope alone (or its Snapshot): each failure names that scope."""
    shard, _ = planned()
    s = shard.scope_paths[1]
    n = _node(shard, s, 1)
    diff = Diff.of("memory_nodes", "decay_importance", updates=pl.DataFrame({"id": [n["id"]], "version": [n["version"]],
                                                                            "importance": [11.0]}))
    for one in (Shard.of(shard.scope(s)), shard.scope(s)):
        got = validate_diff(diff, one)
        assert got.select("check", "table", "kind", "phase", "id", "scope_path").rows() == [
            ("importance within [1, 10]", "memory_nodes", "updates", "decay_importance", n["id"], s)]
        assert failed_scopes(got, Shard.of(shard.scope(s))) == {s}


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(st.lists(st.tuples(st.sampled_from(CORRUPTIONS), st.integers(0, 5), st.integers(1, 5)), min_size=1, max_size=6),
       st.booleans())
def test_random_corruptions_of_random_scopes(corruptions, tight):
    shard, diff = planned()
    paths = shard.scope_paths
    touched = set()
    for corrupt, i, j in corruptions:
        s, other = paths[i % len(paths)], paths[(i + j) % len(paths)]
        diff = corrupt(diff, shard, s, other)
        touched |= {s, other}
    got = assert_each_scope_is_validated_as_alone(diff, shard, TIGHT if tight else None)
    if not tight:
        assert set(got.get_column("scope_path")) <= touched


def test_a_failure_of_a_whole_frame_fails_the_scopes_whose_rows_hold_the_column():
    """A column of the wrong type, or a required column missing, is a failure of the frame, not of
    a row: it is every scope's whose own diff holds that column."""
    shard, diff = planned()
    nodes = diff.table("memory_nodes")
    f32 = Diff({**diff.tables, "memory_nodes": TableDiff(inserts=nodes.inserts, deletes=nodes.deletes,
                                                          updates=nodes.updates.with_columns(pl.col("importance").cast(pl.Float32)))})
    got = assert_each_scope_is_validated_as_alone(f32, shard)
    holding = set(nodes.updates.filter(pl.col("importance").is_not_null()).get_column("scope_path"))
    assert got.height and set(got.get_column("scope_path")) == holding
    events = diff.table("episodic_events")
    assert events.deletes.height
    no_reason = Diff({**diff.tables, "episodic_events": TableDiff(deletes=events.deletes.drop("reason"))})
    got = assert_each_scope_is_validated_as_alone(no_reason, shard)
    assert set(got.get_column("scope_path")) == set(events.deletes.get_column("scope_path"))
