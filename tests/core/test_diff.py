"""The diff hash's row order: the run-by-run order :func:`deep_sleep.core.diff._by_phase_and_id`
builds from :func:`deep_sleep.core.lookup.text_order` is the plain ``sort(["phase", "id"])`` it
falls back to."""

from __future__ import annotations

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from deep_sleep.core import diff as diff_module
from deep_sleep.core.diff import _by_phase_and_id


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



def test_a_diff_of_deletes_only_combines_to_its_deletes_without_null_ids():
    """Nothing to net when a table has only deletes (a nap's folded events): combine keeps them in
    order, less the rows with a null id, as the general netting does."""
    from deep_sleep.core.diff import Diff, TableDiff

    deletes = pl.DataFrame({"id": ["b", None, "a"], "expected_version": [1, 1, 2], "reason": ["r"] * 3, "phase": ["p"] * 3})
    got = Diff.combine([Diff({"episodic_events": TableDiff(deletes=deletes)})]).table("episodic_events")
    assert got.deletes.to_dicts() == [deletes.row(0, named=True), deletes.row(2, named=True)]
    assert not got.inserts.height and not got.updates.height
    whole = deletes.filter(pl.col("id").is_not_null())
    assert Diff.combine([Diff({"episodic_events": TableDiff(deletes=whole)})]).table("episodic_events").deletes.equals(whole)
    general = diff_module._normalise(TableDiff(deletes=deletes, inserts=pl.DataFrame(
        {"id": ["z"], "phase": ["p"]}, schema={"id": pl.String, "phase": pl.String})))  # an insert: the general netting
    assert general.deletes.equals(got.deletes)


@st.composite
def _scope_frames(draw):
    """A shard diff's frame: one scope (most often) or a few, phases in runs or not, ids repeated or not."""
    scopes = draw(st.sampled_from([["org\x1fa"], ["org\x1fa", "org\x1fb"], ["org\x1fb", "org\x1fa", "org\x1fc"]]))
    frame = draw(_phase_frames())
    paths = [draw(st.sampled_from(scopes)) for _ in range(frame.height)]
    return frame.with_columns(pl.Series("scope_path", paths, dtype=pl.String))


@settings(max_examples=80, deadline=None)
@given(_scope_frames())
def test_shard_row_order_is_the_stable_sort_by_scope_phase_and_id(frame):
    saved, diff_module.SORT_ROWS = diff_module.SORT_ROWS, 0  # the run-by-run path even for small frames
    try:
        got = diff_module._by_scope_phase_and_id(frame)
    finally:
        diff_module.SORT_ROWS = saved
    assert got.equals(diff_module._by_scope_phase_and_id_plain(frame))
    assert got.equals(frame.sort("scope_path", "phase", "id", maintain_order=True))  # the rule, as Polars states it


def test_shard_row_order_of_one_scope_on_an_example():
    frame = pl.DataFrame({"scope_path": ["s"] * 5, "phase": ["tag_risk", "tag_risk", "decay", "decay", "decay"],
                          "id": ["b", "a", "c", "a", "a"], "v": [1, 2, 3, 4, 5]})
    saved, diff_module.SORT_ROWS = diff_module.SORT_ROWS, 0
    try:
        got = diff_module._by_scope_phase_and_id(frame)  # "decay" repeats id "a": the stable sort keeps 4 before 5
    finally:
        diff_module.SORT_ROWS = saved
    assert got.get_column("v").to_list() == [4, 5, 3, 2, 1]
