import pytest

from deep_sleep.core.scope import SEP, Scope, ScopeError


def test_factories_and_path():
    s = Scope.root("org", "acme").child("brand", "b1").child("conversation", "c9")
    assert s.path == SEP.join(["org", "acme", "brand", "b1", "conversation", "c9"])
    assert s.tenant_id == "acme"
    assert Scope.parse(s.path) == s
    assert Scope.from_path([("org", "acme"), ("brand", "b1"), ("conversation", "c9")]) == s
    assert Scope.coerce("org/acme/brand/b1/conversation/c9") == s
    assert s.display() == "org/acme/brand/b1/conversation/c9"


def test_ancestor_paths_root_first():
    s = Scope.root("org", "acme").child("brand", "b1")
    assert s.ancestor_paths() == ["org\x1facme", "org\x1facme\x1fbrand\x1fb1"]
    assert Scope.root("org", "acme").ancestor_paths() == ["org\x1facme"]


def test_prefix_isolation_is_exact():
    acme = Scope.root("org", "acme")
    ac = Scope.root("org", "ac")
    assert not ac.can_see(acme.path)
    assert not acme.can_see(ac.path)
    child = acme.child("brand", "b1")
    sibling = acme.child("brand", "b2")
    assert child.can_see(acme.path)
    assert not child.can_see(sibling.path)
    assert not acme.can_see(child.path)


def test_legacy_reads_as_tenant_path():
    assert Scope.legacy("acme").path == "tenant\x1facme"


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda: Scope.root("", "x"), "level 0: kind is empty"),
        (lambda: Scope.root("org", ""), "level 0: id is empty"),
        (lambda: Scope.root("org", "a").child("brand", "x" * 129), "level 1: id"),
        (lambda: Scope.root("org", "a").child("br\nand", "x"), "level 1: kind"),
        (lambda: Scope.root("org", "a\x1fb"), "control character"),
        (lambda: Scope.parse("org\x1facme\x1fbrand"), "level 1 has a kind 'brand' but no id"),
        (lambda: Scope.parse(""), "non-empty"),
        (lambda: Scope(()), "at least one level"),
        (lambda: Scope.root("org", 5), "must be a string"),
    ],
)
def test_scope_errors_name_the_bad_level(build, needle):
    with pytest.raises(ScopeError, match=needle.replace("(", r"\(")):
        build()


def test_128_characters_is_allowed():
    assert Scope.root("k" * 128, "i" * 128).depth == 1


# ---------------------------------------------------------------------------------------------
# look-alike kinds and ids (issue 32): refused when a scope is built from input, read when stored


@pytest.mark.parametrize(
    ("build", "needle"),
    [
        (lambda: Scope.root("org", "\u0430cme"), "level 0: id 'аcme' mixes scripts (Cyrillic U+0430 CYRILLIC SMALL LETTER A at position 0; Latin c"),
        (lambda: Scope.root("org", "acme\u202e"), "level 0: id 'acme\\u202e' holds invisible, direction-changing or control characters (U+202E RIGHT-TO-LEFT OVERRIDE at position 4)"),
        (lambda: Scope.root("org", "ac\u200bme"), "U+200B ZERO WIDTH SPACE at position 2"),
        (lambda: Scope.root("org", "acme\u2028"), "U+2028 LINE SEPARATOR"),
        (lambda: Scope.root("org", "a\u00a0cme"), "U+00A0 NO-BREAK SPACE"),
        (lambda: Scope.root("org", "\uff41cme"), "not in Unicode normal form NFKC (U+FF41 FULLWIDTH LATIN SMALL LETTER A at position 0); write it 'acme'"),
        (lambda: Scope.root("org", "cafe\u0301"), "U+0301 COMBINING ACUTE ACCENT at position 4"),
        (lambda: Scope.root("org", "\u0430\u0441\u0435"), "Cyrillic letters that all look Latin"),
        (lambda: Scope.root("org", "acme").child("br\u0430nd", "b1"), "level 1: kind 'brаnd' mixes scripts"),
        (lambda: Scope.root("org", "acme").child("brand", "b\u03bf1"), "level 1: id 'bο1' mixes scripts (Latin b at position 0; Greek U+03BF GREEK SMALL LETTER OMICRON"),
        (lambda: Scope.from_path([("org", "acme"), ("agent", "\u202eevil")]), "level 1: id"),
        (lambda: Scope.coerce("org/\u0430cme").check_new(), "U+0430 CYRILLIC SMALL LETTER A"),
        (lambda: Scope.coerce("org/acme ").check_new(), "scope level 0: id 'acme ' has leading or trailing white space "
                                                        "('acme '); a scope that differs from another only by spaces would "
                                                        "look like it: write it 'acme'"),
        (lambda: Scope.root("org", " acme"), "level 0: id ' acme' has leading or trailing white space"),
        (lambda: Scope.root("org ", "acme"), "level 0: kind 'org ' has leading or trailing white space"),
        (lambda: Scope.root("org", "acme").child("brand", "  "), "level 1: id '  ' is only white space"),
        (lambda: Scope.root("org", "hello\ufe0f"), "U+FE0F VARIATION SELECTOR-16 at position 5"),
        (lambda: Scope.root("org", "a\u3164"), "U+3164 HANGUL FILLER at position 1"),
    ],
)
def test_lookalike_kinds_and_ids_are_refused_naming_the_level_and_the_code_points(build, needle):
    with pytest.raises(ScopeError) as caught:
        build()
    assert needle in str(caught.value), str(caught.value)
    assert "two scopes never look alike" in str(caught.value)


@pytest.mark.parametrize("id_", ["Москва", "東京", "東京tokyoひらがな", "서울seoul", "café", "αβγ", "شركة", "a b", "user-1_x.y", "tëst"])
def test_ids_of_one_script_or_an_allowed_mix_are_accepted(id_):
    assert Scope.root("org", id_).lookalikes == ()


def test_stored_lookalike_scopes_still_read_so_an_operator_can_clean_them_up():
    stored = "org\x1f\u0430cme\x1fagent\x1fa1\u202e"
    scope = Scope.parse(stored)  # what the store holds reads back
    assert scope.path == stored and Scope.coerce(stored) == scope
    assert scope.ancestor_paths() == ["org\x1f\u0430cme", stored] and scope.parent == Scope.parse("org\x1f\u0430cme")
    assert [p.split(":")[0] for p in scope.lookalikes] == ["scope level 0", "scope level 1"]
    assert Scope.coerce("org/\u0430cme/agent/a1\u202e") == scope  # a person naming it, to clean it up
    with pytest.raises(ScopeError, match="scope level 0: id 'аcme' mixes scripts"):
        scope.check_new()
    with pytest.raises(ScopeError, match="level 0"):
        scope.child("agent", "a2")  # nothing new is built on it
    assert Scope.legacy("\u0430cme").tenant_id == "\u0430cme"  # a legacy tenant id reads as stored
    with pytest.raises(ScopeError, match="control character"):  # SPEC §1 still holds for stored paths
        Scope.parse("org\x1fac\x00me")
