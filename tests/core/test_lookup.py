"""The hash lookups give exactly the answers of the plain lookups beside them in
:mod:`deep_sleep.core.lookup` (``member`` / ``member_plain``, ``unique`` / ``unique_plain``,
``text_order`` / ``text_order_plain``), on both sides of :data:`lookup.SMALL`."""

from __future__ import annotations

import contextlib

import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from deep_sleep.core import lookup


@contextlib.contextmanager
def _small(value: int):
    """Force the hash paths (0) or keep the plain path small inputs take."""
    saved, lookup.SMALL = lookup.SMALL, value
    try:
        yield
    finally:
        lookup.SMALL = saved


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", "d", "e", "f"]), min_size=0, max_size=8),
       st.lists(st.sampled_from(["a", "b", "c", "x", "y"]), min_size=0, max_size=20))
def test_member_agrees_with_member_plain_with_and_without_the_hash_path(ids, ends):
    """The dangling-edge lookup by hash (node ids unique) and by set (ids repeat) agree with is_in."""
    ids_s, ends_s = pl.Series("id", ids, dtype=pl.String), pl.Series("end", ends, dtype=pl.String)
    plain = lookup.member_plain(ends_s, ids_s).to_list()
    assert plain == ends_s.is_in(ids_s.implode()).to_list()
    for small in (0, lookup.SMALL):
        with _small(small):
            for few in (False, True):
                assert lookup.member(ends_s, ids_s, few=few).to_list() == plain


def test_an_edge_with_a_null_endpoint_is_dangling():
    ids = pl.Series("id", ["a", "b"])
    assert lookup.member_plain(pl.Series("end", ["a", None]), ids).to_list() == [True, False]
    for small in (0, lookup.SMALL):
        with _small(small):
            for few in (False, True):
                assert lookup.member(pl.Series("end", ["a", None]), ids, few=few).to_list() == [True, False]


@settings(max_examples=80, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", "d", "e"]), min_size=0, max_size=12, unique=True),
       st.lists(st.sampled_from(["a", "c", "e", "x"]), min_size=0, max_size=6))
def test_lookups_agree_with_string_lookups(table_ids, wanted):
    """matches / without / member / unique give what a string join / is_in / is_unique gives."""
    ids = pl.Series("id", table_ids, dtype=pl.String)
    want = pl.Series("id", wanted, dtype=pl.String)
    frame = pl.DataFrame({"id": ids, "v": list(range(len(table_ids)))})
    pairs = frame.with_row_index("_pos").join(want.to_frame().with_row_index("_w"), on="id").select("_pos", "_w")
    assert sorted(lookup.matches(ids, want).rows()) == sorted(pairs.rows())
    assert lookup.without(frame, want).equals(frame.filter(~pl.col("id").is_in(want.implode())))
    for small in (0, lookup.SMALL):
        with _small(small):
            for few in (False, True):
                assert lookup.member(want, ids, few=few).to_list() == lookup.member_plain(want, ids).to_list()
    for series in (ids, want):
        assert lookup.unique(series) == lookup.unique_plain(series) == (series.n_unique() == series.len())


def test_without_keeps_rows_with_a_null_id():
    frame = pl.DataFrame({"id": ["a", None, "b"], "v": [1, 2, 3]})
    assert lookup.without(frame, pl.Series(["a", None])).rows() == [(None, 2), ("b", 3)]


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
    assert order.tolist() == lookup.text_order_plain(ids).tolist()
    assert ids.gather(order).to_list() == ids.sort().to_list()

