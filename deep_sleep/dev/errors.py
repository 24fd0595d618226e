"""Errors of the development helpers (the synthetic store generator and loader)."""

from __future__ import annotations

from deep_sleep.core.errors import InputError


class SeedError(InputError):
    """A seed spec or a frame to load that cannot be used (a bad size, a naive ``now``, an unknown table)."""
