"""The building blocks of every table generator: ids, timestamps, picks and masks as numpy/polars
columns, seeded random generators, and the per-scope context.

Package-private (underscored names): only the generator modules of :mod:`deep_sleep.dev` use them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from functools import lru_cache
from datetime import UTC, datetime

import numpy as np
import polars as pl
import pyarrow as pa

from deep_sleep.core.tables import EMBEDDING_DIM
from deep_sleep.dev.spec import SeedSpec

_US = 1_000_000
_HOUR = 3600 * _US
_DAY = 24 * _HOUR
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

_M64 = (1 << 64) - 1
# byte -> its two lowercase hex digits, as one little-endian uint16 (so a gather writes both)
_HEX = np.frombuffer(b"".join(f"{i:02x}".encode() for i in range(256)), dtype="<u2").copy()


def _h64(*parts: object) -> int:
    text = "\x1e".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "big")


def _rng(*parts: object) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([_h64(*parts) & 0xFFFFFFFF, _h64(*parts) >> 32]))


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64 finalizer (a bijection of uint64), wrapping arithmetic."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _fixed_strings(mat: np.ndarray, name: str) -> pl.Series:
    """An (n, k) uint8 matrix of ASCII as a String series, zero-copy through Arrow buffers."""
    n, k = mat.shape
    data = np.ascontiguousarray(mat).reshape(-1)
    offsets = np.arange(0, (n + 1) * k, k, dtype=np.int64)
    arr = pa.LargeStringArray.from_buffers(n, pa.py_buffer(offsets), pa.py_buffer(data))
    return pl.Series(name, arr)


def _ids(seed: int, key: str, tag: str, count: int) -> pl.Series:
    """``count`` UUID-shaped ids derived from (seed, key, tag, index), as canonical text."""
    base_hi, base_lo = _h64(seed, key, tag, "hi"), _h64(seed, key, tag, "lo")
    idx = np.arange(count, dtype=np.uint64)
    with np.errstate(over="ignore"):
        hi = _mix64(idx * np.uint64(0x9E3779B97F4A7C15) + np.uint64(base_hi))
        lo = _mix64((idx ^ np.uint64(base_lo)) * np.uint64(0xD1B54A32D192ED03) + np.uint64(0x632BE59BD9B4E019))
    return _uuid_text(hi, lo)


def _uuid_text(hi: np.ndarray, lo: np.ndarray) -> pl.Series:
    """UUID text (version 8, RFC variant) of 128-bit values given as two uint64 words, no Python loop.

    The version and variant bits overwrite 4 bits of ``hi`` and the top 2 bits of ``lo``."""
    count = len(hi)
    hi = (hi & np.uint64(_M64 ^ 0xF000)) | np.uint64(0x8000)  # version 8 (custom)
    lo = (lo & np.uint64(0x3FFFFFFFFFFFFFFF)) | np.uint64(0x8000000000000000)  # RFC variant
    raw = np.empty((count, 2), dtype=">u8")
    raw[:, 0], raw[:, 1] = hi, lo
    hexs = _HEX[raw.view(np.uint8).reshape(count, 16)].view(np.uint8)  # (count, 32) ASCII
    out = np.empty((count, 36), dtype=np.uint8)
    out[:, [8, 13, 18, 23]] = ord("-")
    out[:, 0:8], out[:, 9:13], out[:, 14:18] = hexs[:, 0:8], hexs[:, 8:12], hexs[:, 12:16]
    out[:, 19:23], out[:, 24:36] = hexs[:, 16:20], hexs[:, 20:32]
    return _fixed_strings(out, "id")


def _ts(us: np.ndarray, name: str) -> pl.Series:
    return pl.Series(name, np.asarray(us, dtype=np.int64)).cast(pl.Datetime("us", "UTC"))


def _pick(vocab: list[str] | tuple[str, ...], idx: np.ndarray) -> pl.Series:
    return _vocab(tuple(vocab)).gather(np.asarray(idx, dtype=np.int64))


@lru_cache(maxsize=512)
def _vocab(words: tuple[str, ...]) -> pl.Series:
    """A vocabulary as a String series, built once (a generator picks from the same few per scope)."""
    return pl.Series(list(words), dtype=pl.String)


def _cat(*parts: str | pl.Series | pl.Expr) -> pl.Expr:
    """Concatenate literals (str) and columns (Series/Expr) row-wise."""
    return pl.concat_str([pl.lit(p) if isinstance(p, str) else p for p in parts])


def _when(mask: np.ndarray) -> pl.Expr:
    return pl.lit(pl.Series(mask, dtype=pl.Boolean))


def _zipf_p(k: int, s: float = 1.07) -> np.ndarray:
    p = 1.0 / np.arange(1, k + 1) ** s
    return p / p.sum()


def _unit_vectors(rng: np.random.Generator, n: int, centers: np.ndarray | None = None,
                  which: np.ndarray | None = None) -> np.ndarray:
    v = rng.standard_normal((n, EMBEDDING_DIM), dtype=np.float32)
    if centers is not None and which is not None:
        v *= np.float32(0.6)
        v += centers[which]
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v


def _emb_series(v: np.ndarray | None, n: int) -> pl.Series:
    dtype = pl.Array(pl.Float32, EMBEDDING_DIM)
    if v is None:
        return pl.Series("embedding", [None] * n, dtype=dtype)
    return pl.Series("embedding", v).cast(dtype)


def _iso(us: int) -> str:
    return datetime.fromtimestamp(us / _US, UTC).strftime("%Y-%m-%dT%H:%M:%S+00:00")


def _json_str(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"')


# --------------------------------------------------------------------------------------------
# one scope


@dataclass
class ScopeCtx:
    """One scope being generated: its rows' scope columns, size and clock, and its seeded ids and generators."""

    spec: SeedSpec
    scope_path: str | None  # None for legacy rows
    tenant_id: str
    key: str  # stable text identifying the scope (the path, or "legacy␟<tenant>")
    n: int
    now: int  # microseconds since the epoch
    legacy: bool

    def ids(self, tag: str, count: int) -> pl.Series:
        return _ids(self.spec.seed, self.key, tag, count)

    def rng(self, tag: str) -> np.random.Generator:
        return _rng(self.spec.seed, self.key, tag)

    def common(self, height: int) -> list[pl.Series]:
        # one value repeated (new_from_index: ~15x cheaper than pl.repeat on a scope's ~100 rows)
        return [
            pl.Series("scope_path", [self.scope_path], dtype=pl.String).new_from_index(0, height),
            pl.Series("tenant_id", [self.tenant_id], dtype=pl.String).new_from_index(0, height),
        ]
