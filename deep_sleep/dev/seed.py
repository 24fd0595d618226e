"""A realistic, deterministic synthetic memory store: :func:`seed_store` = :func:`generate` + :func:`load`.

Tests, benchmarks and demos need a store where every consolidation phase (SPEC §3) has work
to do, at sizes from a few hundred rows to a million nodes in one scope.  The parts:

* :mod:`deep_sleep.dev.spec` — what to generate (:class:`SeedSpec`, :func:`scopes_of`, the vocabularies);
* :mod:`deep_sleep.dev.generate` — :func:`generate`, a pure function of the spec (what the data holds
  is documented there), built by :mod:`~deep_sleep.dev.nodes`, :mod:`~deep_sleep.dev.edges`,
  :mod:`~deep_sleep.dev.events` and :mod:`~deep_sleep.dev.small_tables`;
* :mod:`deep_sleep.dev.load` — :func:`load`, the bulk loader (ADBC staging, one ``INSERT … SELECT``
  per table, index rebuild for large loads into empty tables).

This module is the public entry point: ``from deep_sleep.dev.seed import SeedSpec, generate, load,
scopes_of, seed_store``.
"""

from __future__ import annotations

from deep_sleep.dev.generate import generate
from deep_sleep.dev.load import load
from deep_sleep.dev.spec import (
    MARKERS,
    NEAR_MISSES,
    PREFIXES,
    RELATIONS,
    WORDS,
    SeedSpec,
    scopes_of,
)

__all__ = ["MARKERS", "NEAR_MISSES", "PREFIXES", "RELATIONS", "WORDS", "SeedSpec", "generate", "load", "scopes_of",
           "seed_store"]


def seed_store(store, spec: SeedSpec) -> dict[str, int]:
    """Generate ``spec`` and load it into ``store``; rows per table."""
    return load(store, generate(spec))
