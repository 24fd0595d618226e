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

