"""The node embeddings the gate reads (deep_sleep/store/vectors.py): the contiguous fast decode is
the extract's decode_vectors wherever it applies, and declines (None) where it does not."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from deep_sleep.store.extract import decode_vectors
from deep_sleep.store.vectors import decode_contiguous


def _binary(rows: np.ndarray, dims: list[int] | None = None) -> list[bytes]:
    dims = dims or [rows.shape[1]] * len(rows)
    return [np.array([d, 0], dtype=">i2").tobytes() + r[:d].astype(">f4").tobytes() for r, d in zip(rows, dims)]


@pytest.mark.parametrize("dim", [1, 4, 256])
def test_the_contiguous_decode_is_decode_vectors(dim):
    rng = np.random.default_rng(dim)
    rows = rng.standard_normal((40, dim)).astype(np.float32)
    rows[3] = 0.0
    rows[5, 0] = np.float32(1e-38)
    arr = pa.array(_binary(rows), type=pa.binary())
    for case in (arr, arr.slice(7, 20), pa.chunked_array([arr.slice(0, 11), arr.slice(11)])):
        fast, plain = decode_contiguous(case, dim), decode_vectors(case, dim)
        assert fast is not None and fast.equals(plain)
    got = np.asarray(decode_contiguous(arr, dim).flatten()).reshape(-1, dim)
    assert (got == rows).all()


def test_it_declines_what_it_cannot_read_in_one_view():
    rng = np.random.default_rng(0)
    rows = rng.standard_normal((6, 4)).astype(np.float32)
    assert decode_contiguous(pa.array(_binary(rows)[:3] + [None], type=pa.binary()), 4) is None  # a null
    assert decode_contiguous(pa.array(_binary(rows, [4, 4, 3, 4, 4, 4]), type=pa.binary()), 4) is None  # a bad dim
    assert decode_contiguous(pa.array([], type=pa.binary()), 4) is None
    with pytest.raises(Exception, match="dimensions"):  # the fallback names the bad row
        decode_vectors(pa.array(_binary(rows, [4, 4, 3, 4, 4, 4]), type=pa.binary()), 4)
