"""Planning an undo, with no store: the guarded statements come out in order, with their parameters."""

from __future__ import annotations

import polars as pl

from deep_sleep.jobs.undo_plan import Staged, undo_steps
from deep_sleep.jobs.undo_sql import (
    not_restored_sql,
    reinsert_deletes_sql,
    remove_inserts_sql,
    restore_updates_sql,
)

RUN, UNDO, SCOPE = "11111111-1111-1111-1111-111111111111", "22222222-2222-2222-2222-222222222222", "org\x1facme"
EDGE_COLUMNS = ["id", "source_id", "target_id", "relation", "weight", "version"]


def test_steps_remove_inserts_then_restore_updates_then_reinsert_deletes_graph_whole_after_each():
    """Removals take edges before nodes, re-inserts nodes before edges (issue 31)."""
    staged = {
        "memory_edges": Staged(inserts=pl.DataFrame({c: ["x"] for c in EDGE_COLUMNS})),
        "memory_nodes": Staged(inserts=pl.DataFrame({"id": ["n1"], "label": ["a"], "version": [1]}),
                               updates=pl.DataFrame({"id": ["n2"], "expected_version": [3], "importance": [5.0]}),
                               changed=("importance",), unchanged=("label",), missing=("n3",)),
        "soul_profiles": Staged(updates=pl.DataFrame(schema={"id": pl.String})),  # every id missing: nothing to run
    }
    steps = undo_steps(RUN, SCOPE, UNDO, staged, archived=["memory_edges", "episodic_events", "memory_nodes"])
    assert [(s.table, s.kind) for s in steps] == [
        ("memory_edges", "inserts"), ("memory_nodes", "inserts"), ("memory_nodes", "updates"),
        ("memory_nodes", "deletes"), ("episodic_events", "deletes"), ("memory_edges", "deletes"),
    ]
    _, removed, restored, reinserted = steps[0], steps[1], steps[2], steps[3]
    assert removed.sql == remove_inserts_sql("memory_nodes", ["id", "label", "version"])
    assert removed.params == (SCOPE, UNDO, f"inserted by run {RUN}, removed by its undo")
    assert (removed.not_restored_sql, removed.not_restored_params) == (not_restored_sql("memory_nodes", "inserts"), (SCOPE,))
    assert restored.sql == restore_updates_sql("memory_nodes", ["importance"], ["label"]) and restored.params == (SCOPE,)
    assert "SET importance = " in restored.sql and "t.version = s.expected_version + 1" in restored.sql
    assert reinserted.sql == reinsert_deletes_sql("memory_nodes") and reinserted.params == (SCOPE, RUN)
    assert reinserted.not_restored_params == (SCOPE, RUN)


def test_a_run_with_nothing_staged_and_nothing_archived_has_no_steps():
    assert undo_steps(RUN, SCOPE, UNDO, {}, archived=[]) == ()
