"""A canonical byte encoding of frames, for content hashes that do not depend on library versions.

:func:`digest_frame` feeds a hash object the frame's columns in the order given, each as

    <name> NUL <kind> NUL <validity> <values>

where ``kind`` is a logical type, not a storage type — ``int`` (every integer width, as
little-endian int64), ``float`` (float64; every NaN the same), ``bool``, ``ts`` (microseconds
since the epoch, UTC; ``ts-naive`` without a time zone), ``date``, ``str`` / ``bin`` (the
little-endian int64 byte length of each value, then the bytes), ``list`` (the length of each
list, then the flattened values encoded the same way) or ``null`` (a column with no value at
all, whatever its storage type).  ``validity`` is ``A`` when no value is null, else ``N`` and
one bit per row (numpy ``packbits``, big bit order).  A null value's slot holds zero or empty
bytes.  Any other type (a struct, a decimal) is written as newline-delimited JSON of that one
column, tagged ``json``.

So equal values give equal bytes whether a column is ``Int32`` or ``Int64``, chunked or not,
and whatever Polars' or Arrow's in-memory layout — and the encoding is a few memcpy-speed
passes instead of text rendering (≈ 10× faster than newline-delimited JSON of the same frame).
"""

from __future__ import annotations

import io
from typing import Protocol

import numpy as np
import polars as pl


class _Hash(Protocol):
    def update(self, data: bytes | memoryview, /) -> None: ...


def digest_frame(h: _Hash, frame: pl.DataFrame) -> None:
    """Feed ``h`` the canonical bytes of ``frame`` (its columns in the given order, then its height)."""
    for name in frame.columns:
        for part in series_bytes(name, frame.get_column(name)):
            h.update(part)
    h.update(b"rows %d\n" % frame.height)


def series_bytes(name: str, s: pl.Series) -> list[bytes | memoryview]:
    """The canonical bytes of one column, in pieces (see the module docstring)."""
    head = name.encode("utf-8", "surrogatepass") + b"\x00"
    nulls = s.null_count()
    if nulls == s.len() and s.len():
        return [head, b"null\x00%d" % s.len()]
    kind, values = _values(s)
    validity = b"N" + np.packbits(s.is_not_null().to_numpy()).tobytes() if nulls else b"A"
    return [head, kind.encode() + b"\x00", validity, *values]


def _values(s: pl.Series) -> tuple[str, list[bytes | memoryview]]:
    dtype = s.dtype
    if dtype.is_integer():
        return "int", [_le(s.cast(pl.Int64).fill_null(0), "<i8")]
    if dtype.is_float():
        a = s.cast(pl.Float64).fill_null(0.0).to_numpy().astype("<f8", copy=True)
        a[np.isnan(a)] = np.nan  # one bit pattern for every NaN
        return "float", [a.data]
    if dtype == pl.Boolean:
        return "bool", [_le(s.cast(pl.UInt8).fill_null(0), "u1")]
    if isinstance(dtype, pl.Datetime):
        kind = "ts" if dtype.time_zone else "ts-naive"
        if dtype.time_zone and dtype.time_zone != "UTC":
            s = s.dt.convert_time_zone("UTC")
        return kind, [_le(s.dt.cast_time_unit("us").to_physical().fill_null(0), "<i8")]
    if dtype == pl.Date:
        return "date", [_le(s.to_physical().cast(pl.Int64).fill_null(0), "<i8")]
    if dtype in (pl.String, pl.Categorical) or isinstance(dtype, pl.Enum):
        s = s.cast(pl.String).fill_null("")
        return "str", [_le(s.str.len_bytes(), "<i8"), s.str.join("").item().encode("utf-8", "surrogatepass")]
    if dtype == pl.Binary:
        s = s.fill_null(b"")
        return "bin", [_le(s.bin.size(), "<i8"), b"".join(s.to_list())]
    if isinstance(dtype, (pl.List, pl.Array)):
        if isinstance(dtype, pl.Array):
            s = s.cast(pl.List(dtype.inner))
        s = s.fill_null([])
        lengths = s.list.len()
        flat = s.filter(lengths > 0).explode()  # explode would turn an empty list into a null
        return "list", [_le(lengths, "<i8"), *series_bytes("", flat)]
    buf = io.BytesIO()
    s.to_frame("v").write_ndjson(buf)
    return "json", [buf.getbuffer()]


def _le(s: pl.Series, dtype: str) -> memoryview:
    return s.to_numpy().astype(dtype, copy=False).data


__all__ = ["digest_frame", "series_bytes"]
