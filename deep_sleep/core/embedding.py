"""Text embeddings: one embedder, named by the configuration, everywhere (SPEC §5 as amended).

``embedding.model`` in the configuration names it (:class:`EmbeddingConfig`); :func:`embedder`
builds it (once per process and name).  ``record_turn`` and ``recall``, every phase that compares
texts (12: skill names), the recall-quality gate and the apply (the vectors of the nodes a night
creates or relabels) all take it from there.  Each stored vector records the model that made it
(``embedding_model``: the provider's ``name``), and comparing vectors of two models is an error
(:class:`EmbeddingModelError`), never a silent score.  The models:

- ``hashing`` (:class:`HashingEmbedder`): no model, no network, no state.
- ``wordllama`` (:class:`WordLlamaEmbedder`): WordLlama's 256-d model bundled in its wheel
  (``pip install 'deep-sleep[wordllama]'``), loaded from the package directory with downloads off.
- ``package.module:attribute``: any provider by import path (an object with ``dim``, ``name`` and
  ``embed``, or a callable returning one).

An :class:`EmbeddingProvider` turns texts into an ``(n, dim)`` float32 matrix with
L2-normalised rows (an all-zero row for a text with nothing to embed), so a dot product is a
cosine.  :class:`HashingEmbedder` needs no model, no network and no state: it
hashes the character trigrams of each word (``<deploy>`` → ``<de``, ``dep``, …, ``oy>``) of
the casefolded, whitespace-normalised text into ``dim`` signed buckets with BLAKE2b, so the
same text gives the same vector in every process, on every machine, in every replay (Python's
``hash()`` is salted per process and is never used).  It measures spelling overlap, not
meaning: "deploy billing service" is close to "Deploy the billing service", far from
"rotate api keys".

    >>> e = default_embedder()
    >>> v = e.embed(["deploy billing service", "Deploy the billing service", "rotate api keys"])
    >>> v.shape, bool(v[0] @ v[1] > 0.65 > v[0] @ v[2])
    ((3, 256), True)

Plugging in a real model: write a class with ``dim``, ``name`` and ``embed`` (any object that
satisfies :class:`EmbeddingProvider` — no subclassing), whose ``dim`` is
:data:`deep_sleep.core.tables.EMBEDDING_DIM` (the store's ``vector(256)``; project a bigger model's
output down, e.g. with a fixed random projection or Matryoshka truncation, then re-normalise),
and name it by import path in ``embedding.model``.  Keep it deterministic (same text → same
vector, no sampling, a pinned model version in ``name``): replay and the idempotence guarantee
depend on it.  Changing the model of a store that holds vectors is ``deep-sleep reembed``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from functools import lru_cache
from typing import Protocol, runtime_checkable

import numpy as np
import polars as pl

from deep_sleep.core.errors import InputError
from deep_sleep.core.tables import EMBEDDING_DIM

__all__ = ["EmbeddingProvider", "HashingEmbedder", "WordLlamaEmbedder", "EmbeddingModelError", "as_provider", "embedder",
           "embedder_for", "default_embedder", "given", "node_text", "MODELS"]


@runtime_checkable
class EmbeddingProvider(Protocol):
    """Anything that embeds texts: ``embed(texts)`` → ``(len(texts), dim)`` float32, rows of norm 1 (or 0)."""

    dim: int
    name: str

    def embed(self, texts: Sequence[str]) -> np.ndarray: ...


class HashingEmbedder:
    """Signed feature hashing of per-word character n-grams; deterministic and dependency-free.

    dim: number of buckets (the vector's length).
    ngram: n-gram length in characters; words shorter than ``ngram - 2`` still give one n-gram
        (the whole marked word, e.g. ``<a>``).
    """

    def __init__(self, dim: int = EMBEDDING_DIM, ngram: int = 3) -> None:
        if dim < 2:
            raise InputError(f"HashingEmbedder: dim must be >= 2, got {dim}")
        if ngram < 1:
            raise InputError(f"HashingEmbedder: ngram must be >= 1, got {ngram}")
        self.dim = dim
        self.ngram = ngram
        self.name = f"hashing-char{ngram}gram-blake2b-{dim}"

    def __repr__(self) -> str:
        return f"HashingEmbedder(dim={self.dim}, ngram={self.ngram})"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts), dim)`` float32, L2-normalised rows; an empty or blank text gives a zero row.

        A few short texts (a live turn's, a recall's query: up to :data:`SMALL_CHARS` characters in
        all) take a plain-Python path; more take a Polars pipeline.  Both give bit-identical
        vectors (tests/core/test_embedding.py compares them).  A lone surrogate (ill-formed text, e.g.
        from ``json.loads('"\\ud800"')``) embeds as U+FFFD, the replacement character."""
        n = len(texts)
        if not n:
            return np.zeros((n, self.dim), dtype=np.float32)
        folded = fold(texts)
        if sum(map(len, folded)) <= SMALL_CHARS:
            return self._embed_small(folded)
        return self._embed_polars(folded)

    def _embed_small(self, folded: list[str]) -> np.ndarray:
        """The Python path: the same words, n-grams, buckets and sums as :meth:`_embed_polars`."""
        k, dim = self.ngram, self.dim
        rows: list[int] = []
        codes: list[int] = []
        for row, text in enumerate(folded):
            for word in _WORD.findall(text):
                word = f"<{word}>"
                for at in range(max(len(word) - k + 1, 1)):
                    rows.append(row)
                    codes.append(_bucket(word[at : at + k], dim))
        return self._finish(len(folded), np.asarray(rows, dtype=np.int64), np.asarray(codes, dtype=np.int64))

    def _embed_polars(self, folded: list[str]) -> np.ndarray:
        n = len(folded)
        out = np.zeros((n, self.dim), dtype=np.float32)
        k = self.ngram
        grams = (
            pl.DataFrame({"text": pl.Series("text", folded, dtype=pl.String)})
            .with_row_index("row")
            .select("row", pl.col("text").str.extract_all(r"\S+"))
            .explode("text")
            .drop_nulls("text")
            .select("row", pl.concat_str([pl.lit("<"), pl.col("text"), pl.lit(">")]).alias("word"))
            .with_columns(pl.col("word").str.len_chars().alias("_len"))
            .with_columns(pl.int_ranges(0, pl.max_horizontal(pl.col("_len") - k + 1, pl.lit(1))).alias("_at"))
            .explode("_at")
            .select("row", pl.col("word").str.slice(pl.col("_at"), k).alias("gram"))
        )
        if not grams.height:
            return out
        vocab = grams.get_column("gram").unique(maintain_order=True)
        codes = np.array([_bucket(g, self.dim) for g in vocab.to_list()], dtype=np.int64)
        index = grams.join(
            pl.DataFrame({"gram": vocab, "code": codes}), on="gram", how="left", maintain_order="left"
        )
        rows = index.get_column("row").to_numpy().astype(np.int64)
        code = index.get_column("code").to_numpy()
        return self._finish(n, rows, code)

    def _finish(self, n: int, rows: np.ndarray, code: np.ndarray) -> np.ndarray:
        """Sum the signed buckets (``code`` = ±(bucket + 1)) of each row and L2-normalise."""
        out = np.zeros((n, self.dim), dtype=np.float32)
        if not len(code):
            return out
        bucket, sign = np.abs(code) - 1, np.sign(code).astype(np.float64)
        flat = np.bincount(rows * self.dim + bucket, weights=sign, minlength=n * self.dim)
        mat = flat.reshape(n, self.dim)
        norms = np.linalg.norm(mat, axis=1, keepdims=True)
        np.divide(mat, norms, out=mat, where=norms > 0)
        out[:] = mat
        return out


# Up to this many characters (all texts of one call together) embed in plain Python.
SMALL_CHARS = 4_000
# A word is a run of characters that are not Unicode White_Space — what Polars' (Rust regex) ``\S+``
# matches.  Python's ``\s`` is not the same set: it also holds U+001C–U+001F.
_WORD = re.compile("[^\t\n\x0b\x0c\r \x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]+")


_SURROGATE = re.compile("[\ud800-\udfff]")


def well_formed(text: str) -> str:
    """``text`` with every lone surrogate replaced by U+FFFD (UTF-8 — Polars, PostgreSQL — cannot hold one)."""
    return _SURROGATE.sub("\ufffd", text) if not text.isascii() and _SURROGATE.search(text) else text


def fold(texts: Sequence[str]) -> list[str]:
    """Caseless, well-formed texts: ``str.casefold`` (the Unicode caseless form, ß → ss; Polars has
    only lowercase), lone surrogates replaced by U+FFFD (UTF-8 — and so Polars — cannot hold them),
    anything that is not a string treated as empty."""
    out = []
    for t in texts:
        if not isinstance(t, str):
            out.append("")
            continue
        out.append(well_formed(t.casefold()))
    return out


@lru_cache(maxsize=1 << 16)
def _bucket(gram: str, dim: int) -> int:
    """``±(bucket + 1)``: BLAKE2b-64 of the UTF-8 n-gram; low bits pick the bucket, the top bit the sign."""
    h = int.from_bytes(hashlib.blake2b(gram.encode("utf-8"), digest_size=8).digest(), "little")
    bucket = (h & 0x7FFF_FFFF_FFFF_FFFF) % dim
    return -(bucket + 1) if h >> 63 else bucket + 1


class EmbeddingModelError(InputError):
    """Vectors of two models met: a stored vector of one model and a query or a night of another."""


class WordLlamaEmbedder:
    """WordLlama's 256-d model (``l2_supercat``), bundled in the ``wordllama`` wheel: loaded from the
    package directory with downloads disabled (its default loader looks for the tokenizer in the wrong
    folder and then tries the network), rows L2-normalised, a blank text a zero row (the model gives
    whitespace a vector; a text with nothing to embed must have none, as with :class:`HashingEmbedder`).
    Deterministic: a lookup of token vectors and a mean, no sampling."""

    dim = EMBEDDING_DIM

    def __init__(self) -> None:
        import logging
        from pathlib import Path

        root = logging.getLogger()
        level = root.level
        try:
            import wordllama
            from wordllama import WordLlama
        except ImportError:
            raise InputError("embedding.model = 'wordllama' needs the wordllama package: "
                             "pip install 'deep-sleep[wordllama]' (19 MB; its model ships in the wheel)") from None
        finally:
            root.setLevel(level)  # importing wordllama sets the root logger to INFO
        self._model = WordLlama.load(dim=self.dim, cache_dir=Path(wordllama.__file__).parent, disable_download=True)
        self.name = f"wordllama-{getattr(wordllama, '__version__', '0')}-l2_supercat-{self.dim}"

    def __repr__(self) -> str:
        return "WordLlamaEmbedder()"

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        n = len(texts)
        out = np.zeros((n, self.dim), dtype=np.float32)
        folded = [well_formed(t) if isinstance(t, str) else "" for t in texts]
        rows = [i for i, t in enumerate(folded) if t.strip()]
        if not rows:
            return out
        vec = np.asarray(self._model.embed([folded[i] for i in rows], norm=False), dtype=np.float32)
        norms = np.linalg.norm(vec, axis=1, keepdims=True)
        np.divide(vec, norms, out=vec, where=norms > 0)
        out[rows] = vec
        return out


#: The models :func:`embedder` knows by name (besides ``package.module:attribute``).
MODELS = {"hashing": lambda: HashingEmbedder(EMBEDDING_DIM), "wordllama": WordLlamaEmbedder}


#: Providers handed to a call as objects (``record_turn(…, embedder=E)``), by their ``name``: a run
#: that must embed as that call did (the turn's quick nap) names it in ``embedding.model``.
_GIVEN: dict[str, EmbeddingProvider] = {}


def given(provider: EmbeddingProvider) -> str:
    """Make ``provider`` (an object a caller built) resolvable by its ``name`` in ``embedding.model`` for
    this process, and return that name: a configuration naming it embeds with this very object."""
    _GIVEN[as_provider(provider).name] = provider
    return provider.name


def as_provider(value, what: str = "embedder") -> EmbeddingProvider:
    """``value`` as an embedder: an :class:`EmbeddingProvider` (``dim``, ``name``, ``embed``) as it is, a
    string as :func:`embedder` names it; anything else — or a provider whose ``name`` is not a
    non-empty string or whose ``dim`` is not the store's — is an :class:`~deep_sleep.core.errors.InputError`
    naming ``what``."""
    if isinstance(value, str):
        return embedder(value)
    if not isinstance(value, EmbeddingProvider) or isinstance(value, type):
        raise InputError(f"{what} must be an embedding provider (an object with dim, name and embed) or the name of "
                         f"one ({', '.join(MODELS)}, or 'package.module:attribute'), got {type(value).__name__}")
    if not isinstance(value.name, str) or not value.name:
        raise InputError(f"{what} {type(value).__name__}: its name must be a non-empty string (stored with every "
                         f"vector), got {value.name!r}")
    if value.dim != EMBEDDING_DIM:
        raise InputError(f"{what} {value.name!r} gives {value.dim!r}-d vectors; the store holds vector({EMBEDDING_DIM})")
    return value


def embedder(model: str = "hashing") -> EmbeddingProvider:
    """The embedder named ``model``: a key of :data:`MODELS`, ``package.module:attribute`` (a provider,
    or a callable returning one), or the name of a provider a call was given (:func:`given`).  One
    instance per name and process.  Its ``dim`` must be the store's
    :data:`~deep_sleep.core.tables.EMBEDDING_DIM`; whatever the name resolves to must be a provider —
    anything else, or an import or a call that fails (``sys:exit`` raises SystemExit), is an
    :class:`~deep_sleep.core.errors.InputError` naming ``embedding.model``."""
    if not isinstance(model, str):
        raise InputError(f"embedding.model must be a string, got {type(model).__name__}")
    if model in _GIVEN:
        return _GIVEN[model]
    return _built(model)


@lru_cache(maxsize=8)
def _built(model: str) -> EmbeddingProvider:
    if model in MODELS:
        provider = MODELS[model]()
    elif ":" in model:
        import importlib

        module, _, attr = model.partition(":")
        try:
            found = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError, ValueError) as exc:
            raise InputError(f"embedding.model {model!r}: cannot import {attr} from {module} ({exc})") from None
        except (Exception, SystemExit) as exc:  # importing the module ran code that failed
            raise InputError(f"embedding.model {model!r}: importing {module} raised {type(exc).__name__}: {exc}") from None
        provider = found
        if callable(found) and not isinstance(found, EmbeddingProvider):
            try:
                provider = found()
            except TypeError as exc:
                raise InputError(f"embedding.model {model!r}: {attr} is neither a provider (dim, name, embed) nor "
                                 f"a callable that builds one without arguments ({exc})") from None
            except (Exception, SystemExit) as exc:  # sys:exit, os:abort-like callables: never let them end the process
                raise InputError(f"embedding.model {model!r}: calling {attr}() to build the provider raised "
                                 f"{type(exc).__name__}: {exc}; name a provider, or a callable that returns one") from None
    else:
        raise InputError(f"embedding.model {model!r} is not a known model ({', '.join(MODELS)}) nor an import path "
                         "'package.module:attribute'")
    if not isinstance(provider, EmbeddingProvider) or isinstance(provider, type):
        raise InputError(f"embedding.model {model!r} gave {type(provider).__name__}, which has no dim, name and embed")
    return as_provider(provider, f"embedding.model {model!r}:")


def embedder_for(config) -> EmbeddingProvider:
    """The embedder a configuration names (its ``embedding.model``)."""
    return embedder(config.embedding.model)


#: The longest text a live node's vector embeds (its label and property values together).
NODE_TEXT_CHARS = 2000
REDACTED = "[REDACTED]"


def _strings(value) -> list[str]:
    if isinstance(value, dict):
        return [s for k, v in value.items() if not str(k).startswith("_") for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) and value != REDACTED else []


def node_text(label: str, properties: dict | None) -> str:
    """What a node's vector embeds — the live path, the night and ``deep-sleep reembed`` alike: a
    ``META:`` node's label, its text (``properties.summary``: a summary's digest, a cluster's list) and a
    summary's word key (``properties.keywords``: every folded turn's words);
    any other node's label and its string property values at any depth (keys starting with ``_``
    and redacted values skipped), cut at :data:`NODE_TEXT_CHARS`.

    >>> node_text("project: billing", {"owner": "Ada", "_x": "hidden", "tags": ["q4"], "n": 3})
    'project: billing Ada q4'
    >>> node_text("META:episodic_summary", {"summary": "Ada: hi", "source_ids": ["e1"]})
    'META:episodic_summary Ada: hi'
    """
    props = properties if isinstance(properties, dict) else {}
    if label.startswith("META:"):
        keywords = props.get("keywords") or ""
        return f"{label} {props.get('summary') or ''}" + (f" {keywords}" if isinstance(keywords, str) and keywords else "")
    return " ".join([label, *_strings(props)])[:NODE_TEXT_CHARS]


def default_embedder() -> EmbeddingProvider:
    """The embedder of the default configuration (``embedding.model``'s default)."""
    from deep_sleep.core.config import EmbeddingConfig

    return embedder(EmbeddingConfig().model)
