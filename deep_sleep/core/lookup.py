"""Exact lookups of string ids in big frames, through 64-bit hashes.

A diff touches a few hundred thousand rows of tables with millions: "which rows of this table
have these ids" and "is this id among those" come up in the fold, the quarantine and the
validation.  Hashing a million 36-character ids into a string hash table for every such question
costs ~0.1–0.5 s; hashing them to integers (``Series.hash``, ~15 ms a million) and probing an
integer set is several times cheaper.  Every answer is then confirmed by comparing the ids
themselves, so a hash collision can never pass for a match: the results are exactly those of
``is_in`` / a join on the strings.

Each fast path sits beside its plain version (``member`` / ``member_plain``, ``unique`` /
``unique_plain``, ``text_order`` / ``text_order_plain``), and tests/core/test_lookup.py checks
them against each other.  ``matches`` and ``without`` are plain: their hash paths saved under 1 %
of the stage they run in and were removed under the fast-path policy (docs/testing.md, "Fast
paths"; the timings are in benchmarks/README.md).

    >>> member(pl.Series(["a", "x", None]), pl.Series(["a", "b"])).to_list()
    [True, False, False]
    >>> matches(pl.Series(["a", "b", "c"]), pl.Series(["c", "a"])).sort("_pos").rows()
    [(0, 1), (2, 0)]
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

SEED = 0
SMALL = 50_000  # below this many ids a plain string lookup is cheaper than the hashing round


def matches(ids: pl.Series, wanted: pl.Series) -> pl.DataFrame:
    """``(_pos, _w)``: every pair of a position in ``ids`` and a position in ``wanted`` holding the
    same (non-null) id, in no particular order: a plain join on the ids.

    (A 64-bit-hash join confirmed by id saved well under 1 % of the transform stage it runs in and
    was removed under the fast-path policy: docs/testing.md, "Fast paths".)"""
    left = pl.DataFrame({"_id": ids}).with_row_index("_pos")
    right = pl.DataFrame({"_id": wanted}).with_row_index("_w")
    return left.join(right, on="_id", how="inner").select("_pos", "_w")


def without(frame: pl.DataFrame, gone: pl.Series, on: str = "id") -> pl.DataFrame:
    """``frame`` minus the rows whose ``on`` is in ``gone`` (order kept; rows with a null ``on`` stay)."""
    if not gone.len():
        return frame
    return frame.filter(~pl.col(on).is_in(gone.implode()).fill_null(False))


def unique(ids: pl.Series) -> bool:
    """No id repeats: decided from the 64-bit hashes when they all differ, else exactly
    (:func:`unique_plain`).  Equal ids hash equally, so distinct hashes prove distinct ids."""
    return ids.hash(SEED).n_unique() == ids.len() or unique_plain(ids)


def unique_plain(ids: pl.Series) -> bool:
    """The rule :func:`unique` implements: no id repeats (Polars ``is_unique``)."""
    return bool(ids.is_unique().all())


def member(values: pl.Series, among: pl.Series, *, few: bool = False) -> pl.Series:
    """``values.is_in(among)``, with null values answered False.

    ``few``: most values are expected *not* to be among (ids a diff inserts, ends of edges that
    should not touch a deleted node): their hashes are probed against ``among``'s first, and only
    the candidates are confirmed by id.  Otherwise every value is confirmed through one join.
    """
    if values.len() + among.len() <= SMALL:
        return member_plain(values, among)
    if few:
        probe, hashes = values.hash(SEED), among.hash(SEED)
        candidates = probe.is_in(hashes.implode()).arg_true()
        out = np.zeros(values.len(), dtype=bool)
        if candidates.len():
            # the ids of ``among`` whose hash a candidate has: usually as few as the candidates
            near = among.filter(hashes.is_in(probe.gather(candidates).implode()))
            out[candidates.to_numpy()] = values.gather(candidates).is_in(near.implode()).fill_null(False).to_numpy()
        return pl.Series(values.name, out)
    hashes = among.hash(SEED)
    if hashes.n_unique() != among.len():
        among = among.drop_nulls().unique()
        hashes = among.hash(SEED)
        if hashes.n_unique() != among.len():  # a hash collision: the plain set lookup
            return member_plain(values, among)
    by_hash = pl.DataFrame({"_h": hashes, "_id": among})
    found = pl.DataFrame({"_h": values.hash(SEED), "_v": values}).join(by_hash, on="_h", how="left", maintain_order="left")
    return (found.get_column("_id") == found.get_column("_v")).fill_null(False).alias(values.name)


def member_plain(values: pl.Series, among: pl.Series) -> pl.Series:
    """The rule :func:`member` implements: ``values.is_in(among)``, null values answered False."""
    return values.is_in(among.implode()).fill_null(False)


def text_order(ids: pl.Series) -> np.ndarray:
    """``ids.arg_sort()`` for distinct non-null ids: the permutation that puts them in text order.

    Sorting 142k 36-character strings costs Polars ~50 ms.  When all ids have one length (UUIDs),
    their bytes form an ``(n, L)`` matrix, and its columns read as big-endian 64-bit words order the
    rows as the text does (byte order, as Polars compares strings): one integer sort of the first
    word (~10 ms), then the few rows whose first words tie are ordered by all their words.

        >>> text_order(pl.Series(["b2", "a9", "b1"])).tolist()
        [1, 2, 0]
    """
    arr = ids.to_arrow()
    n = len(arr)
    if ids.null_count() or n < 2 or not isinstance(arr, pa.LargeStringArray):
        return text_order_plain(ids)
    offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64, count=n + 1, offset=arr.offset * 8)
    width = int(offsets[1] - offsets[0])
    if width == 0 or not (np.diff(offsets) == width).all():
        return text_order_plain(ids)
    text = np.zeros((n, -(-width // 8) * 8), dtype=np.uint8)  # zero-padded to whole words
    text[:, :width] = np.frombuffer(arr.buffers()[2], dtype=np.uint8)[offsets[0] : offsets[0] + width * n].reshape(n, width)
    words = text.view(">u8").astype(np.uint64)  # (n, words), native byte order for the sorts
    order = np.argsort(words[:, 0])
    first = words[order, 0]
    tie = np.zeros(n, dtype=bool)
    same = first[1:] == first[:-1]
    tie[1:] |= same
    tie[:-1] |= same
    if tie.any():  # tied runs keep their places; within them, all words decide
        sub = order[tie]
        order[tie] = sub[np.lexsort(words[sub].T[::-1])]
    return order


def text_order_plain(ids: pl.Series) -> np.ndarray:
    """The rule :func:`text_order` implements: Polars' ``arg_sort`` of the ids."""
    return ids.arg_sort().to_numpy()


__all__ = ["matches", "member", "member_plain", "text_order", "text_order_plain", "unique", "unique_plain", "without"]
