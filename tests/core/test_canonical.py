"""The canonical byte encoding behind diff hashes: equal values → equal bytes, whatever the storage
type or chunking; any change of a value, a null or a boundary between values → different bytes."""

from __future__ import annotations

import hashlib
import itertools
from datetime import UTC, datetime, timedelta

import numpy as np
import polars as pl
from hypothesis import given, settings
from hypothesis import strategies as st

from deep_sleep.core.canonical import columns_bytes, digest_frame, series_bytes
from deep_sleep.core.diff import Diff


def digest(frame: pl.DataFrame) -> str:
    h = hashlib.sha256()
    digest_frame(h, frame)
    return h.hexdigest()


T0 = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
BASE = pl.DataFrame({
    "i": pl.Series([1, None, 3], dtype=pl.Int64),
    "f": [1.5, float("nan"), None],
    "s": ["a", None, "ccc"],
    "t": [T0, None, T0 + timedelta(seconds=1)],
    "l": pl.Series([[1.0, 2.0], [], None], dtype=pl.List(pl.Float64)),
    "b": [True, None, False],
    "n": pl.Series([None, None, None], dtype=pl.Null),
})


def test_equal_values_in_other_storage_types_and_chunks_encode_alike():
    same = [
        BASE.with_columns(pl.col("i").cast(pl.Int32), pl.col("f").cast(pl.Float32), pl.col("n").cast(pl.String)),
        pl.concat([BASE.head(1), BASE.tail(2)], rechunk=False),  # two chunks
        BASE.with_columns(pl.col("t").dt.convert_time_zone("Europe/Berlin")),  # same instants
        BASE.with_columns(pl.col("t").dt.cast_time_unit("ns")),
        BASE.with_columns(pl.col("f").fill_nan(float("-nan"))),  # another NaN bit pattern
        BASE.with_columns(pl.col("s").cast(pl.Categorical)),
    ]
    for frame in same:
        assert digest(frame) == digest(BASE), frame.schema


def test_every_kind_of_change_changes_the_bytes():
    changed = [
        BASE.with_columns(pl.col("i").fill_null(0)),  # a null becomes the zero its slot holds
        BASE.with_columns(pl.col("s").fill_null("")),  # a null string becomes empty
        BASE.with_columns(pl.Series("s", ["ac", None, "cc"])),  # same bytes, other boundaries
        BASE.with_columns(pl.Series("l", [[1.0], [2.0], None], dtype=pl.List(pl.Float64))),
        BASE.with_columns(pl.Series("l", [[1.0, 2.0], None, None], dtype=pl.List(pl.Float64))),  # [] vs null
        BASE.with_columns(pl.col("f").fill_nan(0.0)),
        BASE.with_columns(pl.col("t").dt.replace_time_zone(None)),  # naive vs UTC
        BASE.with_columns(pl.col("b").fill_null(False)),
        BASE.rename({"i": "j"}),
        BASE.select(list(reversed(BASE.columns))),
        BASE.head(2),
        BASE.with_columns(pl.Series("s", ["a", None, "ccc"], dtype=pl.String).str.replace("a", "á")),
    ]
    digests = {digest(f) for f in changed}
    assert len(digests) == len(changed) and digest(BASE) not in digests


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.one_of(st.none(), st.integers(-2**63, 2**63 - 1)),
                          st.one_of(st.none(), st.text(max_size=6)),
                          st.one_of(st.none(), st.lists(st.floats(allow_nan=True), max_size=3))), max_size=12),
       st.integers(0, 12))
def test_rows_split_anywhere_into_chunks_encode_alike_and_a_single_edit_does_not(rows, cut):
    frame = pl.DataFrame(rows, schema={"i": pl.Int64, "s": pl.String, "l": pl.List(pl.Float64)}, orient="row")
    cut = min(cut, frame.height)
    chunked = pl.concat([frame.head(cut), frame.tail(frame.height - cut)], rechunk=False)
    assert digest(chunked) == digest(frame)
    if frame.height:
        edited = frame.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(pl.col("s") + "x").otherwise(pl.col("s")).alias("s"))
        assert (digest(edited) == digest(frame)) == (frame.item(0, "s") is None)


def test_diff_hash_ignores_row_order_and_storage_type():
    ids = [f"00000000-0000-0000-0000-00000000000{i}" for i in range(3)]
    a = Diff.of("memory_nodes", "strengthen", updates=pl.DataFrame({"id": ids, "version": [1, 2, 3], "importance": [5.5, 6.0, 7.0]}))
    b = Diff.of("memory_nodes", "strengthen", updates=pl.DataFrame(
        {"id": ids[::-1], "version": pl.Series([3, 2, 1], dtype=pl.Int32), "importance": [7.0, 6.0, 5.5]}))
    assert a.content_hash() == b.content_hash() != Diff.empty().content_hash()
    c = Diff.of("memory_nodes", "strengthen", updates=pl.DataFrame({"id": ids, "version": [1, 2, 3], "importance": [5.5, 6.0, 7.5]}))
    assert c.content_hash() != a.content_hash()
    assert a.ndjson_content_hash() != c.ndjson_content_hash()


def test_a_frame_encodes_as_its_columns_one_by_one():
    """columns_bytes evaluates all columns in two selects; each column alone gives the same bytes."""
    frames = [BASE, BASE.head(0), BASE.with_columns(pl.col("s").cast(pl.Categorical)),
              pl.concat([BASE.head(1), BASE.tail(2)], rechunk=False)]
    for frame in frames:
        whole = b"".join(bytes(p) for p in columns_bytes(frame))
        alone = b"".join(bytes(p) for c in frame.columns for p in series_bytes(c, frame.get_column(c)))
        assert whole == alone
        reordered = list(reversed(frame.columns))
        assert b"".join(bytes(p) for p in columns_bytes(frame, reordered)) == b"".join(
            bytes(p) for p in columns_bytes(frame.select(reordered)))


_COLUMN_VALUES = {  # dtype → values (None: null) hypothesis draws a column from
    pl.Int64: st.one_of(st.none(), st.integers(-2**63, 2**63 - 1)),
    pl.Int32: st.one_of(st.none(), st.integers(-2**31, 2**31 - 1)),
    pl.Float64: st.one_of(st.none(), st.floats()),
    pl.Boolean: st.one_of(st.none(), st.booleans()),
    pl.String: st.one_of(st.none(), st.text(max_size=6)),
    pl.Binary: st.one_of(st.none(), st.binary(max_size=4)),
    pl.Datetime("us", "UTC"): st.one_of(st.none(), st.datetimes(timezones=st.just(UTC))),
    pl.List(pl.Float64): st.one_of(st.none(), st.lists(st.one_of(st.none(), st.floats(allow_nan=False)), max_size=3)),
    pl.Struct({"a": pl.Int64}): st.one_of(st.none(), st.fixed_dictionaries({"a": st.integers(-5, 5)})),
}


@st.composite
def _column_and_runs(draw):
    dtype = draw(st.sampled_from(list(_COLUMN_VALUES)))
    values = draw(st.lists(_COLUMN_VALUES[dtype], min_size=1, max_size=30))
    if draw(st.booleans()):  # whole runs of nulls, and runs without one
        values = [None] * draw(st.integers(0, 5)) + values
    cuts = sorted(set(draw(st.lists(st.integers(1, len(values) - 1), max_size=6)))) if len(values) > 1 else []
    return pl.Series("c", values, dtype=dtype), [0, *cuts, len(values)]


@settings(max_examples=300, deadline=None)
@given(_column_and_runs())
def test_run_streams_are_the_pieces_of_each_run(case):
    """SlicedColumn.run_streams (every scope's run at once) gives each run's bytes as pieces(lo, hi),
    and nothing exactly for the runs without a value."""
    from deep_sleep.core.canonical import SlicedColumn

    s, bounds = case
    col = SlicedColumn("c", s)
    streams = col.run_streams(np.array(bounds))
    assert all(len(stream) == len(bounds) - 1 for stream in streams)
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        got = b"".join(stream[i] for stream in streams)
        if not col.has_value(lo, hi):
            assert got == b""
        else:
            assert got == b"".join(col.pieces(lo, hi)) == b"".join(series_bytes("c", s.slice(lo, hi - lo)))


@settings(max_examples=100, deadline=None)
@given(st.lists(_column_and_runs(), min_size=1, max_size=5), st.data())
def test_of_frame_encodes_every_column_as_sliced_column_does(cases, data):
    """SlicedColumn.of_frame (one select for a frame's flat columns, one for their texts) gives every
    column the bytes SlicedColumn gives it alone, run by run."""
    from deep_sleep.core.canonical import SlicedColumn

    n = min(len(s) for s, _ in cases)
    frame = pl.DataFrame({f"c{i}": s.head(n) for i, (s, _) in enumerate(cases)})
    cuts = sorted(set(data.draw(st.lists(st.integers(1, n - 1), max_size=4)))) if n > 1 else []
    bounds = np.array([0, *cuts, n])
    cols = list(frame.columns)
    for col, name in zip(SlicedColumn.of_frame(frame, cols), cols, strict=True):
        alone = SlicedColumn(name, frame.get_column(name))
        assert col.kind == alone.kind
        assert [[bytes(p) for p in stream] for stream in col.run_streams(bounds)] == \
               [[bytes(p) for p in stream] for stream in alone.run_streams(bounds)]
