"""Characters that make text render as something other than what it holds, and how to name them.

One definition for the whole namespace: the online path refuses these characters in labels
(:mod:`deep_sleep.online.ops`), the nightly quarantines stored labels that hold them
(``validation/quarantine.py``), and scope kinds and ids refuse them and a few more look-alike
tricks (:mod:`deep_sleep.core.scope`).  Messages show code points, because the characters
themselves cannot be seen::

    >>> codepoints("a\\u202ebc")
    'U+202E RIGHT-TO-LEFT OVERRIDE at position 1'
    >>> identifier_problem("\\u0430cme")
    'mixes scripts (Cyrillic U+0430 CYRILLIC SMALL LETTER A at position 0; Latin c at position 1)'
    >>> skeleton("\\u0430cme") == skeleton("acme")
    True
"""

from __future__ import annotations

import re
import unicodedata

__all__ = ["INVISIBLE", "INVISIBLE_RE", "codepoints", "describe", "identifier_problem", "invisible", "shown", "skeleton"]

#: A regex character class (Python ``re`` and Polars/Rust ``regex`` alike) of the characters a
#: label must not hold: line/paragraph separators (U+2028/2029), zero-width characters and joiners
#: (U+200B–U+200D, U+2060, U+FEFF), direction marks, embeddings, overrides and isolates (U+200E/200F,
#: U+202A–U+202E, U+2066–U+2069), and the other invisible operators (U+2061–U+2064).
INVISIBLE = "[\u200b-\u200f\u2028-\u202e\u2060-\u2064\u2066-\u2069\ufeff]"
INVISIBLE_RE = re.compile(INVISIBLE)

# Scripts UTS #39 lets one identifier mix at its "highly restrictive" level (each with Latin).
_ALLOWED_MIXES = (frozenset({"Latin", "Han", "Hiragana", "Katakana"}), frozenset({"Latin", "Han", "Bopomofo"}),
                  frozenset({"Latin", "Han", "Hangul"}))
# Letters of Cyrillic and Greek that render like a Latin letter (after UTS #39's confusables for
# the ones that matter in ids), mapped to that letter; an id made only of these is a whole-script
# look-alike of a Latin id ("асе" in Cyrillic reads as "ace").
_LATIN_LOOKALIKES = str.maketrans(
    "аеорсухіјѕһԁԛԝӏАВЕКМНОРСТХЅІЈУҮԚԜ" "οαικνρτυχΑΒΕΖΗΙΚΜΝΟΡΤΥΧ",
    "aeopcyxijshdqwlABEKMHOPCTXSIJYYQW" "oaikvptuxABEZHIKMNOPTYX",
)
_SCRIPT_OF_NAME = {"CJK": "Han", "IDEOGRAPHIC": "Han", "KATAKANA-HIRAGANA": "Katakana"}


def describe(ch: str) -> str:
    """``U+0430 CYRILLIC SMALL LETTER A`` (printable ASCII is shown as itself)."""
    if " " <= ch <= "~":
        return ch
    return f"U+{ord(ch):04X} {unicodedata.name(ch, '(unnamed)')}"


def codepoints(text: str, positions: list[int] | None = None, limit: int = 5) -> str:
    """The characters of ``text`` at ``positions`` (default: every one that is not printable ASCII),
    named with their code points and positions, at most ``limit`` of them."""
    if positions is None:
        positions = [i for i, ch in enumerate(text) if not " " <= ch <= "~"]
    shown = [f"{describe(text[i])} at position {i}" for i in positions[:limit]]
    more = len(positions) - limit
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def invisible(text: str) -> list[int]:
    """Positions of the :data:`INVISIBLE` characters of ``text``."""
    return [m.start() for m in INVISIBLE_RE.finditer(text)]


def _script(ch: str) -> str | None:
    """The script of a letter, from its Unicode name (``CYRILLIC SMALL LETTER A`` → Cyrillic); None for
    what is not a letter (digits, punctuation, symbols, marks: they belong to every script)."""
    if not unicodedata.category(ch).startswith("L"):
        return None
    words = unicodedata.name(ch, "").split()
    if not words or words[0] == "MODIFIER":
        return None
    if words[0] in ("FULLWIDTH", "HALFWIDTH") and len(words) > 1:
        words = words[1:]
    return _SCRIPT_OF_NAME.get(words[0], words[0].capitalize())


def _not_an_identifier_character(ch: str) -> bool:
    """Control, format (bidi, zero-width), surrogate, line/paragraph separators, any space but U+0020."""
    cat = unicodedata.category(ch)
    return cat in ("Cc", "Cf", "Cs", "Zl", "Zp") or (cat == "Zs" and ch != " ") or INVISIBLE_RE.match(ch) is not None


def identifier_problem(text: str) -> str | None:
    """Why ``text`` cannot be an identifier that people read (a scope kind or id), or None.

    In this order: a control, format (bidi, zero-width), separator or non-ASCII space character;
    not in Unicode normal form NFKC (fullwidth letters, ligatures, ``e`` + combining accent);
    letters of more than one script, except the mixes UTS #39 allows at its "highly restrictive"
    level (Latin with Han and Japanese kana, Bopomofo or Hangul); or only Cyrillic/Greek letters
    that each render like a Latin one (a whole-script look-alike of a Latin id)."""
    if text.isascii() and text.isprintable():  # the common case: nothing to look alike
        return None
    hidden = [i for i, ch in enumerate(text) if _not_an_identifier_character(ch)]
    if hidden:
        return f"holds invisible, direction-changing or control characters ({codepoints(text, hidden)})"
    normal = unicodedata.normalize("NFKC", text)
    if normal != text:
        changed = [i for i, ch in enumerate(text) if unicodedata.normalize("NFKC", ch) != ch
                   or unicodedata.combining(ch)]
        return f"is not in Unicode normal form NFKC ({codepoints(text, changed)}); write it {normal!r}"
    first: dict[str, int] = {}
    for i, ch in enumerate(text):
        script = _script(ch)
        if script is not None:
            first.setdefault(script, i)
    if len(first) > 1 and not any(set(first) <= mix for mix in _ALLOWED_MIXES):
        parts = [f"{script} {describe(text[i])} at position {i}" for script, i in first.items()]
        return f"mixes scripts ({'; '.join(parts)})"
    if set(first) & {"Cyrillic", "Greek"} and all(
            _script(ch) is None or ch.translate(_LATIN_LOOKALIKES) != ch for ch in text):
        letters = [i for i, ch in enumerate(text) if _script(ch) is not None]
        return (f"is written in {' and '.join(sorted(first))} letters that all look Latin "
                f"({codepoints(text, letters)}); it would read as {text.translate(_LATIN_LOOKALIKES)!r}")
    return None


def skeleton(text: str) -> str:
    """What ``text`` looks like: NFKC, invisible characters dropped, Cyrillic/Greek look-alikes read
    as Latin.  Two texts with one skeleton may render alike; compare skeletons, show code points."""
    text = "".join(ch for ch in unicodedata.normalize("NFKC", text) if not _not_an_identifier_character(ch) or ch == " ")
    return text.translate(_LATIN_LOOKALIKES)


def shown(text: str) -> str:
    """``text`` safe to print: every character that is not printable (controls, bidi overrides,
    zero-width and separator characters) written as its escape, as ``repr`` does, so a terminal
    line is neither reversed nor hides anything (``'acme\\u202e'``)."""
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else repr(ch)[1:-1] for ch in text)
