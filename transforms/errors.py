"""Errors of the phases and of the roster."""

from __future__ import annotations

from deep_sleep.core.errors import DeepSleepError


class PhaseError(DeepSleepError):
    """A phase broke its contract with the runner (asked for an argument the runner does not offer,
    reported a counter the report does not know) or met input it cannot work on.  A bug in the
    phase, not in the caller's input: the message names the phase."""


class RosterError(PhaseError, TypeError):
    """A roster entry that is not well formed (its config is not a PhaseConfig, its counters not names)."""
