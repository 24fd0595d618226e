"""The characters that make text render as something it does not hold (deep_sleep/core/characters.py):
one definition, shared by the online checks, the scope rules and the quarantine."""

from __future__ import annotations

import unicodedata

import pytest

from deep_sleep.core.characters import INVISIBLE, codepoints, identifier_problem, invisible, shown, skeleton


def test_the_quarantine_refuses_the_same_invisible_characters_as_the_online_path():
    from deep_sleep.validation import quarantine

    assert quarantine.INVISIBLE == INVISIBLE


@pytest.mark.parametrize("ch", ["\u200b", "\u200c", "\u200d", "\u200e", "\u200f", "\u2028", "\u2029", "\u202a", "\u202e",
                                "\u2060", "\u2064", "\u2066", "\u2069", "\ufeff"])
def test_every_listed_character_is_found_and_named_by_its_code_point(ch):
    text = f"ab{ch}c"
    assert invisible(text) == [2]
    assert codepoints(text) == f"U+{ord(ch):04X} {unicodedata.name(ch)} at position 2"
    assert shown(text) == "ab" + ch.encode("unicode_escape").decode() + "c"


def test_code_points_are_listed_up_to_a_limit():
    assert codepoints("\u0430\u0435\u043e\u0440\u0441\u0443x", limit=2) == (
        "U+0430 CYRILLIC SMALL LETTER A at position 0, U+0435 CYRILLIC SMALL LETTER IE at position 1 and 4 more")


def test_skeletons_of_texts_that_render_alike_are_equal():
    assert len({skeleton(t) for t in ("org/acme", "org/\u0430cme", "org/acm\u0435", "org/acme\u202e", "org/\uff41cme")}) == 1
    assert skeleton("org/acme") != skeleton("org/acne")


def test_identifier_problems_are_none_for_plain_ascii_and_single_script_text():
    assert [identifier_problem(t) for t in ("acme", "Москва", "東京tokyo", "a b")] == [None] * 4
    assert identifier_problem("\u0430cme").startswith("mixes scripts")
