"""Hierarchical tenant scopes (SPEC §1).

A scope is a root-first path of ``(kind, id)`` levels.  Its storage form, ``scope_path``, joins
every kind and id with the unit separator ``\\x1f``::

    >>> s = Scope.root("org", "acme").child("brand", "b1")
    >>> s.path
    'org\\x1facme\\x1fbrand\\x1fb1'
    >>> s.tenant_id
    'acme'
    >>> [Scope.parse(p).levels[-1] for p in s.ancestor_paths()]
    [('org', 'acme'), ('brand', 'b1')]

Reads at path P may see rows at path Q iff Q is in ``ancestor_paths(P)``: an exact ``= ANY``
match, never a string-prefix scan (``org␟ac`` must not see ``org␟acme``).

Look-alike kinds and ids (issue 32)
-----------------------------------
Every scope keeps SPEC §1's rules: kinds and ids are non-empty strings of at most 128 characters
without control characters.  A *new* scope must also read as what it holds, so that two scopes
never look the same on a screen: the factories that build a scope from parts — :meth:`Scope.root`,
:meth:`Scope.child`, :meth:`Scope.from_path` — and :meth:`Scope.check_new`, which ``record_turn``
calls (a turn is how a scope comes into a store), refuse a kind or id that
:func:`~deep_sleep.core.characters.identifier_problem` finds fault with: an invisible,
direction-changing (bidi), separator or non-ASCII space character (``U+202E``, ``U+200B``,
``U+2028``, ``U+00A0``…); a text not in Unicode NFKC (fullwidth letters, ligatures, ``e`` plus a
combining accent); letters of two scripts (a Cyrillic ``а`` in a Latin id), except the mixes UTS #39
allows at its "highly restrictive" level (Latin with Han and kana, Bopomofo or Hangul); or only
Cyrillic/Greek letters that each look Latin (``асе`` reads as ``ace``).  The ScopeError names the
level and shows the code points::

    >>> Scope.root("org", "\u0430cme")
    Traceback (most recent call last):
    ...
    deep_sleep.core.errors.ScopeError: scope level 0: id 'аcme' mixes scripts (Cyrillic U+0430 CYRILLIC SMALL LETTER A at position 0; Latin c at position 1); kinds and ids must read as what they hold, so that two scopes never look alike

Stores may already hold such scopes, and an operator must be able to read, run and clean them up:
:meth:`Scope.parse` (the storage string: what the store holds) and :meth:`Scope.coerce` (a scope
*named* — by the CLI, a flow parameter — which must exist to be worked on) accept them, and
:attr:`Scope.lookalikes` lists what is wrong with each (the CLI prints it as a warning, and its
"did you mean" shows the code points of suggestions that look alike).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from deep_sleep.core.characters import identifier_problem
from deep_sleep.core.errors import ScopeError

SEP = "\x1f"
MAX_PART = 128
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


def _check_part(what: str, value: object, level: int) -> str:
    if not isinstance(value, str):
        raise ScopeError(f"scope level {level}: {what} must be a string, got {type(value).__name__} {value!r}")
    if not value:
        raise ScopeError(f"scope level {level}: {what} is empty; every kind and id needs at least one character")
    if len(value) > MAX_PART:
        raise ScopeError(
            f"scope level {level}: {what} {value[:20]!r}… is {len(value)} characters; the limit is {MAX_PART}"
        )
    bad = _CONTROL.search(value)
    if bad:
        raise ScopeError(
            f"scope level {level}: {what} {value!r} contains control character {bad.group()!r} "
            f"at position {bad.start()}; kinds and ids must be printable text"
        )
    return value


def _escape(part: str) -> str:
    return part.replace("%", "%25").replace("/", "%2F") if ("/" in part or "%" in part) else part


_ESCAPE = re.compile(r"%(2[fF]|25)")


def _unescape(part: str) -> str:
    """Only the two escapes :meth:`Scope.display` writes are read back; any other ``%`` is literal."""
    return _ESCAPE.sub(lambda m: "/" if m.group(1) in ("2f", "2F") else "%", part) if "%" in part else part


@dataclass(frozen=True, slots=True)
class Scope:
    """An immutable, validated scope.  Build it with the factories, not the constructor.

    levels: root-first tuple of ``(kind, id)`` pairs, at least one.
    """

    levels: tuple[tuple[str, str], ...]

    def __post_init__(self) -> None:
        if not self.levels:
            raise ScopeError("a scope needs at least one level (kind, id); use Scope.root(kind, id)")
        for i, level in enumerate(self.levels):
            if not (isinstance(level, tuple) and len(level) == 2):
                raise ScopeError(f"scope level {i}: expected a (kind, id) pair, got {level!r}")
            _check_part("kind", level[0], i)
            _check_part("id", level[1], i)

    # -- look-alikes -----------------------------------------------------------------------
    @property
    def lookalikes(self) -> tuple[str, ...]:
        """What makes a kind or id of this scope render as something it does not hold, one message
        per bad kind or id naming its level (empty for a clean scope)."""
        out = []
        for i, (kind, id_) in enumerate(self.levels):
            for what, value in (("kind", kind), ("id", id_)):
                problem = identifier_problem(value)
                if problem:
                    out.append(f"scope level {i}: {what} {value!r} {problem}")
        return tuple(out)

    def check_new(self) -> Scope:
        """This scope, if it may be created from outside input; else a ScopeError naming the first bad
        level and showing its code points (see "Look-alike kinds and ids" above)."""
        problems = self.lookalikes
        if problems:
            raise ScopeError(f"{problems[0]}; kinds and ids must read as what they hold, so that two scopes never look alike")
        return self

    # -- factories -------------------------------------------------------------------------
    @classmethod
    def root(cls, kind: str, id: str) -> Scope:
        """The one-level scope ``kind/id``; its id is the tenant id.  Look-alikes are refused."""
        return cls(((kind, id),)).check_new()

    def child(self, kind: str, id: str) -> Scope:
        """This scope extended by one level.  Look-alikes are refused (in any level)."""
        return Scope((*self.levels, (kind, id))).check_new()

    @classmethod
    def from_path(cls, levels: list[tuple[str, str]] | tuple[tuple[str, str], ...]) -> Scope:
        """Build from a root-first sequence of ``(kind, id)`` pairs.  Look-alikes are refused."""
        return cls(tuple(tuple(level) for level in levels)).check_new()  # type: ignore[misc]

    @classmethod
    def parse(cls, scope_path: str) -> Scope:
        """Parse the storage string ``kind␟id[␟kind␟id…]``: what the store holds reads back, look-alikes
        included (:attr:`lookalikes` lists them); SPEC §1's rules still hold."""
        if not isinstance(scope_path, str) or not scope_path:
            raise ScopeError(f"scope_path must be a non-empty string, got {scope_path!r}")
        parts = scope_path.split(SEP)
        if len(parts) % 2:
            raise ScopeError(
                f"scope_path {scope_path!r} has {len(parts)} parts; it needs kind/id pairs joined by \\x1f "
                f"(level {len(parts) // 2} has a kind {parts[-1]!r} but no id)"
            )
        return cls(tuple((parts[i], parts[i + 1]) for i in range(0, len(parts), 2)))

    @classmethod
    def legacy(cls, tenant_id: str) -> Scope:
        """How a pre-hierarchy row (``scope_path IS NULL``) reads: ``tenant␟<tenant_id>`` (a stored
        tenant id: read as it is, like :meth:`parse`)."""
        return cls((("tenant", tenant_id),))

    @classmethod
    def coerce(cls, value: Scope | str) -> Scope:
        """Accept a Scope or its storage string; also ``kind/id/kind/id`` typed by a person.  It names a
        scope, which may be a stored look-alike: :meth:`check_new` before creating one."""
        if isinstance(value, Scope):
            return value
        if isinstance(value, str) and SEP not in value and "/" in value:
            parts = [_unescape(p) for p in value.split("/")]
            if len(parts) % 2:
                raise ScopeError(
                    f"scope {value!r}: write it as kind/id[/kind/id…], got an odd number of parts "
                    "(a '/' inside a kind or id is written %2F, a '%' as %25)")
            return cls(tuple((parts[i], parts[i + 1]) for i in range(0, len(parts), 2)))
        return cls.parse(value)

    # -- views -----------------------------------------------------------------------------
    @property
    def path(self) -> str:
        return SEP.join(part for level in self.levels for part in level)

    @property
    def tenant_id(self) -> str:
        return self.levels[0][1]

    @property
    def depth(self) -> int:
        return len(self.levels)

    @property
    def parent(self) -> Scope | None:
        return Scope(self.levels[:-1]) if len(self.levels) > 1 else None

    def ancestor_paths(self) -> list[str]:
        """This path and all its prefixes, root first."""
        return [Scope(self.levels[: i + 1]).path for i in range(len(self.levels))]

    def can_see(self, other_path: str) -> bool:
        """Prefix isolation: may a read at this scope see a row stored at ``other_path``?"""
        return other_path in self.ancestor_paths()

    def display(self) -> str:
        """Human form ``kind/id/kind/id`` (accepted back by :meth:`coerce`).  A ``/`` inside a kind or
        id is written ``%2F`` and a ``%`` as ``%25``, so two scopes never display alike:

            >>> Scope.root("org", "acme/brand/b1").display()
            'org/acme%2Fbrand%2Fb1'
        """
        return "/".join(_escape(part) for level in self.levels for part in level)

    def __str__(self) -> str:
        return self.display()
