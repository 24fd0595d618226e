"""Co-occurrence numbers edge ends by id hash as the plain join on the ids
(:func:`_number_ends_by_id`) does, and counts distinct neighbours as a unique over (node,
neighbour id) does."""

from __future__ import annotations

import numpy as np
import polars as pl
from deep_sleep.transforms.cooccurrence import (
    _distinct_neighbours,
    _number_ends,
    _number_ends_by_id,
)
from hypothesis import given, settings
from hypothesis import strategies as st


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
