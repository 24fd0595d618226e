"""The error family: every exception Deep Sleep raises on purpose derives from :class:`DeepSleepError`.

Messages name the table, key and value, and the fix.  Each error says whether retrying the same
call may succeed (``transient``); the store's errors module classifies database errors by
``psycopg`` error class and SQLSTATE (:func:`deep_sleep.store.errors.is_transient`).  Each package
keeps its own errors in one ``errors`` module built on these classes; the CLI turns every
``DeepSleepError`` into a clean message and exit code 2, never a traceback.
"""

from __future__ import annotations


class DeepSleepError(Exception):
    """Base class of every error Deep Sleep raises on purpose."""

    #: True when the same call may succeed if retried (a lost connection, a lock timeout, …).
    transient: bool = False


class InputError(DeepSleepError, ValueError):
    """Bad input from the caller — an argument, a file, a parameter; the message names it and the fix.

    Also a ``ValueError``, so pydantic validators and callers that catch ``ValueError`` keep working."""


class ScopeError(InputError):
    """A scope level or path that cannot be stored; the message names the bad level."""


class ConfigError(InputError):
    """A configuration file, variable or parameter is invalid."""


class SnapshotError(InputError):
    """A snapshot directory is missing, malformed, or not of this schema version."""


class TimeRangeError(InputError, OverflowError):
    """A time outside years 1–9999 once converted to UTC (``0001-01-01T00:00:00+01:00`` is year 0 there).
    Also an ``OverflowError``, what Python raises for it, so callers that caught that keep working."""


class DiffError(InputError):
    """A diff is malformed (unknown table, missing key column, unreadable file)."""


class ValidationFailed(DeepSleepError):
    """A diff failed validation; nothing was applied.  ``failures`` holds the failing checks."""

    def __init__(self, message: str, failures: list[dict]):
        super().__init__(message)
        self.failures = failures


class TransientError(DeepSleepError):
    """A failure that a retry of the same call may not meet (lost connection, lock timeout, deadlock)."""

    transient = True
