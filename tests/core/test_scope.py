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
