"""The default embedder: deterministic everywhere, normalised, and closer for similar strings."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deep_sleep.core.embedding import (
    EmbeddingProvider,
    HashingEmbedder,
    default_embedder,
    fold,
)
from deep_sleep.core.tables import EMBEDDING_DIM

# Computed once with HashingEmbedder(256): bucket → sign of every non-zero component (all
# components of a row have the same magnitude here, 1/sqrt(count)).  A change means every stored
# skill embedding and every replay of phase 12 changes too.
KNOWN = {
    "deploy billing service": {3: -1, 11: 1, 46: 1, 59: -1, 81: -1, 84: -1, 96: -1, 130: 1, 148: 1, 151: 1, 160: 1,
                               166: 1, 173: 1, 175: 1, 178: -1, 195: 1, 240: 1, 250: -1},
    # casefolded (ß → ss), accents kept
    "Ünïcode straße": {38: -1, 54: -1, 55: 1, 65: -1, 83: -1, 88: -1, 113: -1, 133: -1, 157: 1, 160: -1, 168: 1,
                       193: -1, 218: -1, 238: 1},
    "a": {16: -1},
}


def _expected(signs: dict[int, int]) -> np.ndarray:
    v = np.zeros(EMBEDDING_DIM, dtype=np.float32)
    for bucket, sign in signs.items():
        v[bucket] = sign
    return v / np.linalg.norm(v)


def test_known_vectors():
    got = HashingEmbedder().embed(list(KNOWN))
    for row, signs in zip(got, KNOWN.values(), strict=True):
        np.testing.assert_allclose(row, _expected(signs), rtol=0, atol=1e-6)


def test_same_vectors_in_another_process_with_another_hash_seed():
    code = (
        "import sys, hashlib; from deep_sleep.core.embedding import HashingEmbedder; "
        "v = HashingEmbedder().embed(['deploy billing service', 'Ünïcode straße', 'rotate the api keys']); "
        "sys.stdout.write(hashlib.sha256(v.tobytes()).hexdigest())"
    )
    here = HashingEmbedder().embed(["deploy billing service", "Ünïcode straße", "rotate the api keys"])
    env = {**os.environ, "PYTHONHASHSEED": "4242"}  # this process runs with another (random) seed
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert out.stdout == hashlib.sha256(here.tobytes()).hexdigest()


def test_shape_dtype_and_norms():
    texts = ["deploy billing service", "", "   \t\n", "!", "x" * 5000, "a b c"]
    v = HashingEmbedder().embed(texts)
    assert v.shape == (len(texts), EMBEDDING_DIM) and v.dtype == np.float32
    norms = np.linalg.norm(v, axis=1)
    np.testing.assert_allclose(norms[[0, 3, 4, 5]], 1.0, atol=1e-6)
    assert norms[1] == 0 and norms[2] == 0  # nothing to embed: a zero row, never NaN
    assert HashingEmbedder().embed([]).shape == (0, EMBEDDING_DIM)


def test_case_and_whitespace_do_not_matter():
    v = HashingEmbedder().embed(["Deploy  Billing\tService", "deploy billing service"])
    np.testing.assert_array_equal(v[0], v[1])


def test_similar_strings_are_closer_than_unrelated_ones():
    e = HashingEmbedder()
    v = e.embed(["Deploy billing service", "Deploy the billing services", "Billing deploy", "Rotate api keys", "Send invoice"])
    cos = v @ v.T
    assert cos[0, 1] > 0.8 and cos[0, 2] > 0.65
    assert cos[0, 3] < 0.3 and cos[0, 4] < 0.3
    assert cos[0, 1] > cos[0, 2] > cos[0, 3]


def test_protocol_and_default():
    e = default_embedder()
    assert isinstance(e, EmbeddingProvider)
    assert e is default_embedder()  # one shared instance
    assert e.dim == EMBEDDING_DIM and "blake2b" in e.name
    with pytest.raises(ValueError, match="dim"):
        HashingEmbedder(dim=1)


_SPACES = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2005\u200a\u2028\u2029\u202f\u205f\u3000"
_NOT_SPACES = "\x1c\x1d\x1e\x1f\u180e\u200b\ufeff\x00"  # whitespace to Python's str.isspace / \s but not to Unicode


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from(_SPACES + _NOT_SPACES + "abcßÜİﬁ<>😀 ") | st.characters(), max_size=40),
                min_size=1, max_size=8))
def test_python_and_polars_paths_give_bit_identical_vectors(texts):
    e = HashingEmbedder()
    folded = fold(texts)
    small, big = e._embed_small(folded), e._embed_polars(folded)
    assert small.dtype == big.dtype == np.float32
    assert np.array_equal(small, big)
    assert np.array_equal(e.embed(texts), small)


def test_a_lone_surrogate_embeds_as_the_replacement_character_on_both_paths():
    e = HashingEmbedder()
    assert fold(["A\ud800b", "\udfff"]) == ["a\ufffdb", "\ufffd"]
    assert np.array_equal(e.embed(["deploy\ud800 x"]), e.embed(["deploy\ufffd x"]))
    long = ["deploy\ud800 " * 500]  # > SMALL_CHARS: the Polars path, which cannot hold a surrogate
    assert np.array_equal(e.embed(long), e.embed(["deploy\ufffd " * 500]))


def test_every_kind_of_space_splits_words_the_same_way_on_both_paths():
    e = HashingEmbedder(ngram=2)
    texts = [f"ab{c}cd" for c in _SPACES + _NOT_SPACES] + ["x" * 5000, "deploy billing service"]
    folded = [t.casefold() for t in texts]
    assert np.array_equal(e._embed_small(folded), e._embed_polars(folded))
    assert len(e.embed(texts)) == len(texts)  # over SMALL_CHARS: the polars path


# -- one embedder, named by the configuration (issue 30) -------------------------------------------

def test_the_configuration_names_the_embedder_and_a_bad_name_says_what_is_known():
    from deep_sleep.core.embedding import EmbeddingProvider, MODELS, embedder, embedder_for
    from deep_sleep.core.errors import InputError
    from deep_sleep.transforms.config import load_config

    assert embedder("hashing") is embedder_for(load_config()) and embedder("hashing").name == "hashing-char3gram-blake2b-256"
    assert set(MODELS) == {"hashing", "wordllama"}
    for bad, words in (("bert", "not a known model"), ("no_such_mod:x", "cannot import"),
                       ("deep_sleep.core.embedding:fold", "neither a provider"), ("deep_sleep.core.embedding:MODELS", "no dim, name and embed")):
        with pytest.raises(InputError, match=words):
            embedder(bad)

    class Small:
        dim, name = 8, "small"

        def embed(self, texts):
            return np.zeros((len(texts), 8), dtype=np.float32)

    import sys
    import types

    sys.modules["_ds_small_model"] = types.SimpleNamespace(MODEL=Small())
    try:
        with pytest.raises(InputError, match="8-d vectors; the store holds vector"):
            embedder("_ds_small_model:MODEL")
    finally:
        del sys.modules["_ds_small_model"]
    assert isinstance(Small(), EmbeddingProvider)


def test_wordllama_loads_offline_from_its_wheel_and_is_deterministic(monkeypatch):
    """The optional model (the ``wordllama`` extra; the dev extra installs it): loaded from the package
    directory with the network unreachable, unit rows, a blank text a zero row, meaning over spelling."""
    import socket

    from deep_sleep.core.embedding import WordLlamaEmbedder

    def no_network(*_a, **_k):
        raise AssertionError("wordllama tried the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    model = WordLlamaEmbedder()
    v = model.embed(["my dog chewed the sneakers", "the puppy bit my shoes", "quarterly tax filing", "   "])
    assert v.shape == (4, 256) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v[:3], axis=1), 1.0, atol=1e-5) and not v[3].any()
    assert v[0] @ v[1] > v[0] @ v[2]
    assert np.array_equal(v, model.embed(["my dog chewed the sneakers", "the puppy bit my shoes", "quarterly tax filing", "   "]))
    assert model.name.startswith("wordllama-") and model.name.endswith("-l2_supercat-256")
