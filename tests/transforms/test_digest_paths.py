"""Phase 10's digest has two paths: the Polars pass over every batch of a shard and, for a few batches
of ASCII text (the quick nap's), the same rules in plain Python (:func:`deep_sleep.transforms.episodic_summary.plain_digests`).

Both give the golden cases' expected rows; both give the same frame on random batches made to meet
every rule (speakers in the text and in the metadata, names, numbers, repeated and long turns, Rust's
whitespace and characters Python alone calls whitespace, several scopes and batches, tight bounds);
the plain path declines what it does not decide; and turns of the same words tie, so the earliest
is quoted, whichever order a run adds their weights in."""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import pytest
from deep_sleep.transforms import episodic_summary
from deep_sleep.transforms.config import load_config
from deep_sleep.transforms.episodic_summary import IDF_SCALE, EpisodicSummaryConfig, _digests
from hypothesis import given, settings
from hypothesis import strategies as st

from deep_sleep.core.snapshot import Snapshot, utc
from deep_sleep.run.transform import transform
from tests.transforms.test_golden import SCOPE, _frame, _rows

GOLDEN = sorted((Path(__file__).parent / "golden" / "episodic_summary").glob("*.json"))
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


def _chosen(batches: list[tuple[str, list[tuple[str | None, str | None]]]], spacing: int = 61) -> pl.DataFrame:
    """The frame ``_digests`` takes: per (scope, turns) one batch, each turn (content, metadata)."""
    rows, batch_of = [], {}
    for path, turns in batches:
        batch = batch_of[path] = batch_of.get(path, -1) + 1
        for pos, (content, metadata) in enumerate(turns):
            rows.append({"scope_path": path, "_batch": batch, "_pos": pos + 50 * batch, "content": content,
                         "metadata": metadata, "created_at": T0 + timedelta(seconds=spacing * (pos + 50 * batch))})
    return pl.DataFrame(rows, schema={"scope_path": pl.String, "_batch": pl.UInt32, "_pos": pl.UInt32, "content": pl.String,
                                      "metadata": pl.String, "created_at": pl.Datetime("us", "UTC")})


def _both(chosen: pl.DataFrame, config: EpisodicSummaryConfig) -> tuple[pl.DataFrame, pl.DataFrame]:
    key = ["scope_path", "_batch"]
    polars = _digests(chosen, config, plain=False).sort(key)
    plain = episodic_summary.plain_digests(chosen, config.max_chars, config.max_keywords)
    assert plain is not None
    return polars, plain.sort(key)


@pytest.mark.parametrize("plain", [True, False], ids=["plain", "polars"])
@pytest.mark.parametrize("path", GOLDEN, ids=[p.stem for p in GOLDEN])
def test_both_paths_give_the_golden_rows(path: Path, plain: bool, monkeypatch):
    case = json.loads(path.read_text())
    taken = []
    real = episodic_summary.plain_digests
    monkeypatch.setattr(episodic_summary, "plain_digests", lambda *a: taken.append(1) or (real(*a) if plain else None))
    snap = Snapshot(scope_path=SCOPE, taken_at=utc(case["as_of"]), previous_run_as_of=None,
                    frames={t: _frame(t, rows) for t, rows in case["input"].items()})
    result = transform(snap, load_config(overrides=case.get("config")), utc(case["as_of"]), phases=["episodic_summary"], embed=False)
    diff = result.scope_diff()
    got = {t: {k: _rows(f) for k, f in td.frames().items() if f.height} for t, td in diff.tables.items()}
    assert got == case["expected"], case["title"]
    assert bool(taken) == bool(case["counters"].get("episodes_summarized")), "the digest ran (or not) as the case says"


NAMES = ("Ada", "Bruno", "Clara", "Lisbon", "Porto", "March", "Biscuit", "Thanks", "Paris", "The", "Wow")
WORDS = ("paris", "the", "trip", "budget", "flight", "hotel", "and", "about", "dinner", "ok", "nice", "zq",
         "ticket", "3rd", "v2", "10", "5pm", "2026-03-01", "12:30", "7%", "1,200", "x9y", "ab")
SPACES = (" ", " ", " ", "  ", "\t", "\n", "\x0b", "\x0c", "\r", "\x1c", "\x1f")
PUNCT = ("", "", ".", "!", "?", ",", ":", "'", "-")


@st.composite
def turns(draw):
    parts = []
    for _ in range(draw(st.integers(0, 9))):
        parts.append(draw(st.sampled_from(NAMES + WORDS)) + draw(st.sampled_from(PUNCT)))
        parts.append(draw(st.sampled_from(SPACES)))
    text = "".join(parts)
    if draw(st.booleans()):
        text = draw(st.sampled_from(("Ada", "Bruno", "Mr. Smith", "Dr O'Neil", "x", "Ada Lovelace-King"))) + draw(
            st.sampled_from((": ", ":\t", ":x", " : "))) + text
    if draw(st.integers(0, 9)) == 0:
        text = (text + " ") * draw(st.integers(5, 30))  # long: cut at TURN_CHARS
    content = draw(st.sampled_from((None, "", "   ", text, text, text, text)))
    metadata = draw(st.sampled_from((None, "{}", "{}", '{"speaker": "Clara"}', '{"speaker": " Ada "}', '{"speaker": ""}',
                                     '{"role": "user"}', '{"speaker": "Bruno", "x": 1}')))
    return content, metadata


@st.composite
def batches(draw):
    out = []
    for path in ("org\x1fa", "org\x1fb"):
        for _ in range(draw(st.integers(0, 2))):
            base = draw(st.lists(turns(), min_size=1, max_size=12))
            repeat = draw(st.integers(0, 3))  # repeated turns: a turn said twice is quoted once
            out.append((path, base + base[:repeat]))
    return out or [("org\x1fa", [("Ada: hello Paris", None)])]


@settings(max_examples=150, deadline=None)
@given(batches(), st.sampled_from((120, 200, 400, 1000)), st.sampled_from((0, 3, 1000)), st.sampled_from((1, 61, 3600)))
def test_the_plain_path_is_the_polars_pass(batch, max_chars, max_keywords, spacing):
    config = EpisodicSummaryConfig(max_chars=max_chars, max_keywords=max_keywords)
    polars, plain = _both(_chosen(batch, spacing), config)
    assert plain.schema == polars.schema
    assert plain.to_dicts() == polars.to_dicts()


def test_the_plain_paths_weights_are_the_polars_passs():
    """Every ``ln((n + 1) / df)`` the plain path can meet (n ≤ PLAIN_MAX_ROWS turns), in the fixed point both sum."""
    pairs = pl.DataFrame({"n": [n for n in range(1, episodic_summary.PLAIN_MAX_ROWS + 1) for _ in range(n)],
                          "df": [df for n in range(1, episodic_summary.PLAIN_MAX_ROWS + 1) for df in range(1, n + 1)]},
                         schema={"n": pl.UInt32, "df": pl.UInt32})
    q = pairs.select((((pl.col("n") + 1) / pl.col("df")).log() * IDF_SCALE).floor().cast(pl.Int64)).to_series().to_list()
    assert q == [math.floor(math.log((n + 1) / df) * IDF_SCALE) for n, df in pairs.iter_rows()]


@pytest.mark.parametrize("turn", [
    ("Zoë said hello", None),  # not ASCII
    ("hello", '{"speaker": 7}'),  # a speaker that is not a string
    ("hello", '{"speaker": null}'),
    ("hello", '{"speaker": "Zoë"}'),
    ("hello", "not json"),
    ("hello", '{"speaker": "A", "speaker": "B"}'),
    ("hello", '["speaker"]'),
    ("hello", '{"speaker": "A", "n": NaN}'),  # not JSON (Python would read it)
])
def test_the_plain_path_declines_what_it_does_not_decide(turn):
    chosen = _chosen([("org\x1fa", [("Ada: fine", None), turn])])
    assert episodic_summary.plain_digests(chosen, 1000, 1000) is None
    assert _digests(chosen, EpisodicSummaryConfig()).height == 1  # the Polars pass answers


def test_a_shards_many_batches_take_the_polars_pass():
    chosen = _chosen([("org\x1fa", [("hello", None)] * 50)] * (episodic_summary.PLAIN_MAX_ROWS // 50 + 1))
    assert chosen.height > episodic_summary.PLAIN_MAX_ROWS and episodic_summary.plain_digests(chosen, 1000, 1000) is None


@pytest.mark.parametrize("plain", [True, False], ids=["plain", "polars"])
def test_turns_of_the_same_words_tie_and_the_earliest_is_quoted(plain):
    """50 turns "The user talked about <a> and <b>." with words no other turn has: every turn weighs the
    same, so the digest quotes the earliest ones, as many as fit, in time order — every run (the weights
    were float sums in whatever order the words came, and which equal turn was quoted changed from run
    to run)."""
    letters = "bcdfghjklmnpqrstvwxz"
    word = lambda i: "".join(letters[(i // 20 ** k) % 20] for k in range(3)) + "o"  # noqa: E731 - 4 letters, no stop word
    texts = [f"The user talked about {word(2 * i)} and {word(2 * i + 1)}." for i in range(50)]
    chosen = _chosen([("org\x1fa", [(t, None) for t in texts])], spacing=60)
    summary = _digests(chosen, EpisodicSummaryConfig(max_chars=400), plain=plain).item(0, "summary")
    head = "2026-03-01 09:00 – 2026-03-01 09:49 UTC · 50 turns"
    room = 400 - len(head)
    fit = [t for i, t in enumerate(texts) if sum(len(x) + 3 for x in texts[: i + 1]) <= room]
    assert summary == head + "\n" + "\n".join(f"- {t}" for t in fit)
    assert len(fit) == 8
