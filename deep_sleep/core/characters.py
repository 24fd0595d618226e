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

__all__ = ["HIDDEN", "INVISIBLE", "INVISIBLE_RE", "PRESENTATION", "codepoints", "describe", "hidden", "identifier_problem",
           "invisible", "shown", "skeleton", "unattached_mark", "without_hidden"]

#: A regex character class (Python ``re`` and Polars/Rust ``regex`` alike) of the characters a
#: label must not hold because they render as nothing, or as something else than they are: every
#: *default-ignorable* code point of Unicode (the characters a renderer shows as nothing: the soft
#: hyphen U+00AD, the combining grapheme joiner U+034F, the Arabic letter mark U+061C, the Hangul
#: fillers U+115F/1160/3164/FFA0, the Khmer inherent vowels U+17B4/17B5, the Mongolian variation
#: selectors and vowel separator U+180B–180F, the zero-width characters and joiners U+200B–200D,
#: the direction marks, embeddings, overrides and isolates U+200E/200F, U+202A–202E, U+2066–2069,
#: the invisible operators and deprecated format characters U+2060–206F, the variation selectors
#: U+FE00–FE0D (U+FE0E/FE0F: see :data:`HIDDEN`), U+FEFF, the shorthand format controls
#: U+1BCA0–1BCA3, the musical format characters U+1D173–1D17A and every tag character and
#: supplementary variation selector, U+E0000–E0FFF — where an invisible "ignore previous
#: instructions" can hide after a visible word), the line and paragraph separators U+2028/2029,
#: the interlinear annotation characters U+FFF9–FFFB (and the unassigned U+FFF0–FFF8 beside them),
#: the Egyptian hieroglyph format controls U+13430–1343F and the blank Braille pattern U+2800.
#: Every format character (category Cf) is here except the prepended concatenation marks (U+0600–0605,
#: U+06DD, U+070F, U+0890/0891, U+08E2, U+110BD, U+110CD), which render as a visible sign.
INVISIBLE = ("[\u00ad\u034f\u061c\u115f\u1160\u17b4\u17b5\u180b-\u180f\u200b-\u200f\u2028-\u202e\u2060-\u206f"
             "\u2800\u3164\ufe00-\ufe0d\ufeff\uffa0\ufff0-\ufffb\U00013430-\U0001343f\U0001bca0-\U0001bca3"
             "\U0001d173-\U0001d17a\U000e0000-\U000e0fff]")
INVISIBLE_RE = re.compile(INVISIBLE)
#: The presentation selectors (text style U+FE0E, emoji style U+FE0F): visible in their place — right
#: after a symbol (``❤️``) or a keycap's base (``1️⃣``) — and hidden anywhere else (``hello\ufe0f``).
PRESENTATION = "\ufe0e\ufe0f"
_KEYCAP_BASES = "0123456789#*"
#: What makes a label render as something it does not hold, as one Polars (Rust ``regex``) pattern for
#: the nightly's quarantine: an :data:`INVISIBLE` character, a presentation selector that does not
#: follow a symbol or a keycap base, or a combining mark at the start (after any white space): a mark
#: with no character of its own sits on whatever is shown before the label, and a label of marks
#: alone shows nothing of its own.  :func:`hidden` and :func:`unattached_mark` are the same rules in Python.
HIDDEN = f"{INVISIBLE}|(?:^|[^\\p{{S}}{_KEYCAP_BASES}])[{PRESENTATION}]|^\\s*\\p{{M}}"

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
    """Positions of the :data:`INVISIBLE` characters of ``text`` and of its presentation selectors
    that follow neither a symbol nor a keycap base (see :data:`HIDDEN`)."""
    found = [m.start() for m in INVISIBLE_RE.finditer(text)]
    if "\ufe0e" in text or "\ufe0f" in text:
        found = sorted(found + [i for i, ch in enumerate(text) if ch in PRESENTATION and not _presents(text, i)])
    return found


def _presents(text: str, i: int) -> bool:
    """Does the presentation selector at ``i`` follow a character it can present (a symbol, a keycap base)?"""
    return i > 0 and (unicodedata.category(text[i - 1]).startswith("S") or text[i - 1] in _KEYCAP_BASES)


def unattached_mark(text: str) -> int | None:
    """The position of a combining mark that starts ``text`` (after any white space), else None: it has
    no character of its own to sit on.

    >>> unattached_mark("\u0301\u0301"), unattached_mark("e\u0301")
    (0, None)
    """
    rest = text.lstrip()
    if rest and unicodedata.category(rest[0]).startswith("M"):
        return len(text) - len(rest)
    return None


def hidden(text: str) -> str | None:
    """Why ``text`` (a label) would render as something it does not hold, or None: the rules of
    :data:`HIDDEN`, the characters named by code point and position."""
    found = invisible(text)
    if found:
        return f"contains invisible or direction-changing character(s) {codepoints(text, found)}"
    mark = unattached_mark(text)
    if mark is not None:
        return (f"starts with combining mark(s) ({codepoints(text, [mark])}) that belong to no character of "
                "the label (they would sit on whatever is shown before it)")
    return None


def without_hidden(text: str) -> str:
    """``text`` with every character :func:`invisible` finds replaced by a space and leading combining
    marks dropped (a label made from free text, e.g. a thought's)."""
    found = set(invisible(text))
    if found:
        text = "".join(" " if i in found else ch for i, ch in enumerate(text))
    while (mark := unattached_mark(text)) is not None:
        text = text[:mark] + text[mark + 1:]
    return text


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
    return (cat in ("Cc", "Cf", "Cs", "Zl", "Zp") or (cat == "Zs" and ch != " ") or ch in PRESENTATION
            or INVISIBLE_RE.match(ch) is not None)


def identifier_problem(text: str) -> str | None:
    """Why ``text`` cannot be an identifier that people read (a scope kind or id), or None.

    In this order: spaces at either end (``"acme "`` would look like ``acme``); a control,
    format (bidi, zero-width), separator or non-ASCII space character, or a presentation selector;
    not in Unicode normal form NFKC (fullwidth letters, ligatures, ``e`` + combining accent);
    letters of more than one script, except the mixes UTS #39 allows at its "highly restrictive"
    level (Latin with Han and Japanese kana, Bopomofo or Hangul); or only Cyrillic/Greek letters
    that each render like a Latin one (a whole-script look-alike of a Latin id)."""
    if text != text.strip(" "):  # other white space is refused below, by code point
        return (f"has leading or trailing white space ({text!r}); a scope that differs from another only by "
                f"spaces would look like it: write it {text.strip(' ')!r}" if text.strip(" ") else "is only white space")
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
