"""Phase 10's digest and word key in plain Python, for a few batches of ASCII text (the quick nap's).

:func:`deep_sleep.transforms.episodic_summary._digests` computes them in Polars, one vectorized pass
over every batch of a shard; on one 50-turn batch that pass is ~60 Polars calls of fixed cost, about
half of a quick nap's transform.  :func:`plain_digests` gives the same frame row for row (the same
rules, step by step, in the same order; tests/transforms/test_digest_paths.py checks both against
the golden cases and against each other on random batches) when every turn's text is ASCII, where the
regular expressions of Rust's engine and of Python's ``re`` (spelt here with explicit ASCII classes)
match the same text, and every ``metadata.speaker`` is absent or a string; otherwise it returns
None and the Polars pass runs.

Whitespace is Rust's (Unicode ``White_Space``; in ASCII ``\\t \\n \\v \\f \\r`` and the space): Python's
``str.isspace`` and ``re``'s ``\\s`` also count ``\\x1c``–``\\x1f``, so they are not used.
"""

from __future__ import annotations

import json
import math
import re
from datetime import datetime

import polars as pl

from deep_sleep.transforms.episodic_summary import DIGEST_TERMS, IDF_SCALE, TURN_CHARS
from deep_sleep.transforms.label_recalls import STOP_WORDS

__all__ = ["MAX_ROWS", "plain_digests"]

#: Up to this many chosen events (every batch of the shard together) the plain path is taken.
MAX_ROWS = 1_000

_WS = "\t\n\x0b\x0c\r "
_SPACES = re.compile(f"[{_WS}]+")
# episodic_summary's patterns on ASCII text: \p{L} = [A-Za-z], \p{Lu} = [A-Z], \p{Ll} = [a-z], \d = [0-9],
# \w = [A-Za-z0-9_], \s = _WS (\b is the same on ASCII text in both engines)
_SPEAKER = re.compile(f"([A-Za-z][A-Za-z'. -]{{0,39}}):[{_WS}]")
_LETTERS = re.compile(r"[A-Za-z]+")
_NAME = re.compile(f"[^.!?{_WS}][{_WS}]+[A-Z][a-z]+\\b")
_NAME_END = re.compile(r"([A-Z][a-z]+)\Z")
_NUMBER = re.compile(r"\b[0-9][0-9,.:/-]*[0-9]\b|\b[0-9]\b|\b[0-9]+(?:st|nd|rd|th|s|am|pm|%)")
_WORD = re.compile(r"[a-z]{3,}")  # on lower-cased text
_KEY_WORD = re.compile(r"[a-z0-9]*[0-9][a-z0-9]*|[a-z]{3,}")  # on lower-cased text
_NOT_GIVEN = object()


class _Declined(Exception):
    """A metadata text this path leaves to the Polars pass (an internal signal, never raised out)."""


def _speaker_of(metadata: str | None) -> object:
    """``metadata.speaker`` as ``json_path_match("$.speaker")`` gives it: None when absent, the string;
    ``_NOT_GIVEN`` for what this path does not decide (not JSON, not an object, a speaker that is not a
    string, or not ASCII), which sends the batch to the Polars pass."""
    if metadata is None:
        return None
    try:
        value = json.loads(metadata, object_pairs_hook=_no_repeats, parse_constant=_not_json)
    except (ValueError, RecursionError, _Declined):  # not JSON (JSONDecodeError is a ValueError), or declined
        return _NOT_GIVEN
    if not isinstance(value, dict):
        return _NOT_GIVEN
    speaker = value.get("speaker")
    if speaker is None:
        return None if "speaker" not in value else _NOT_GIVEN
    return speaker if isinstance(speaker, str) and speaker.isascii() else _NOT_GIVEN


def _no_repeats(pairs: list[tuple[str, object]]) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise _Declined("a repeated key")  # which one a JSON path reads is the engine's choice
    return dict(pairs)


def _not_json(constant: str) -> object:
    raise _Declined(f"{constant} is not JSON")


def _minute(at: datetime | None) -> str:
    return "?" if at is None else f"{at.year:04d}-{at.month:02d}-{at.day:02d} {at.hour:02d}:{at.minute:02d}"


def _digest(rows: list[tuple[str, str | None, datetime | None]], max_chars: int, max_keywords: int) -> tuple[str, str]:
    """One batch's (summary, keywords); ``rows``: (text, speaker, created_at) in the batch's order."""
    n = len(rows)
    turns = []  # (position, text, speaker, said)
    for pos, (text, speaker, _) in enumerate(rows):
        said = text[len(speaker) + 2:] if speaker is not None and text.startswith(speaker + ": ") else text
        turns.append((pos, text, speaker, said))
    # header: participants, span, size
    who: list[str] = []
    for _, _, speaker, _ in turns:
        if speaker and speaker not in who:
            who.append(speaker)
    stamps = [at for _, _, at in rows if at is not None]
    head = ((", ".join(who[:6]) + " · ") if who else "") + (
        f"{_minute(min(stamps) if stamps else None)} – {_minute(max(stamps) if stamps else None)} UTC · {n} turns")
    # names: capitalised words inside a sentence, never written in lower case in the batch
    lower = {w for _, _, _, said in turns for w in _LETTERS.findall(said) if w == w.lower()}
    lower_titled = {w[:1].upper() + w[1:] for w in lower}
    speakers = {s for _, _, s, _ in turns if s is not None}
    counts: dict[str, int] = {}
    for _, _, _, said in turns:
        for match in _NAME.findall(said):
            name = _NAME_END.search(match).group(1)
            if name.lower() in STOP_WORDS or name in lower_titled or name in speakers:
                continue
            counts[name] = counts.get(name, 0) + 1  # dicts keep first-seen order: ties go to the first seen
    names = sorted(counts, key=lambda w: -counts[w])[:DIGEST_TERMS]
    numbers: list[str] = []
    for _, _, _, said in turns:
        for number in _NUMBER.findall(said):
            if number not in numbers:
                numbers.append(number)
    # distinctive turns: the sum of the words' inverse batch frequencies over the root of their number
    words = {pos: {w for w in _WORD.findall(said.lower()) if w not in STOP_WORDS} for pos, _, _, said in turns}
    df: dict[str, int] = {}
    for ws in words.values():
        for w in ws:
            df[w] = df.get(w, 0) + 1
    q = {w: math.floor(math.log((n + 1) / d) * IDF_SCALE) for w, d in df.items()}
    lines, seen = [], set()
    for pos, text, _, _ in turns:
        ws = words[pos]
        weight = sum(q[w] for w in ws) / IDF_SCALE / math.sqrt(len(ws)) if ws else 0.0
        line = text if len(text) <= TURN_CHARS else text[: TURN_CHARS - 1] + "…"
        if line:
            lines.append((-weight, pos, line))
    lines.sort()
    used, picked = 0, []
    top = head + (f"\nNames: {', '.join(names)}" if names else "") + (f"\nNumbers: {', '.join(numbers[:DIGEST_TERMS])}" if numbers else "")
    top = top[:max_chars]
    room = max_chars - len(top)
    for _, pos, line in lines:
        if line in seen:  # a turn said twice is quoted once
            continue
        seen.add(line)
        used += len(line) + 3
        if used <= room:
            picked.append((pos, line))
    picked.sort()
    summary = top + "\n" + "\n".join("- " + line for _, line in picked) if picked else top
    keys: list[str] = []
    known: set[str] = set()
    for _, _, _, said in turns:
        for w in _KEY_WORD.findall(said.lower()):
            if w not in STOP_WORDS and w not in known:
                known.add(w)
                keys.append(w)
    return summary, " ".join(keys[:max_keywords])


def plain_digests(chosen: pl.DataFrame, max_chars: int, max_keywords: int) -> pl.DataFrame | None:
    """:func:`~deep_sleep.transforms.episodic_summary._digests` of ``chosen`` (its ``scope_path``,
    ``_batch``, ``summary``, ``keywords``), or None when a turn's text is not ASCII, a ``metadata.speaker``
    is not a string, or ``chosen`` holds more than :data:`MAX_ROWS` rows."""
    if chosen.height > MAX_ROWS:
        return None
    contents = chosen.get_column("content").to_list()
    if not all(c is None or c.isascii() for c in contents):
        return None
    metadata = chosen.get_column("metadata").to_list() if "metadata" in chosen.columns else [None] * chosen.height
    given = [_speaker_of(m) for m in metadata]
    if any(s is _NOT_GIVEN for s in given):
        return None
    groups: dict[tuple, list[tuple[str, str | None, datetime | None]]] = {}
    for path, batch, content, speaker, at in zip(chosen.get_column("scope_path").to_list(), chosen.get_column("_batch").to_list(),
                                                  contents, given, chosen.get_column("created_at").to_list(), strict=True):
        raw = content or ""
        if speaker is None:
            found = _SPEAKER.match(raw)
            speaker = found.group(1) if found else None
        if speaker is not None:
            speaker = speaker.strip(_WS)
        groups.setdefault((path, batch), []).append((_SPACES.sub(" ", raw).strip(_WS), speaker, at))
    out = [(path, batch, *_digest(rows, max_chars, max_keywords)) for (path, batch), rows in groups.items()]
    return pl.DataFrame(out, schema={"scope_path": pl.String, "_batch": chosen.schema["_batch"], "summary": pl.String,
                                     "keywords": pl.String}, orient="row")
