"""Every exception Deep Sleep raises on purpose.  Messages name the table, key and value, and the fix."""

from __future__ import annotations


class DeepSleepError(Exception):
    """Base class."""


class StoreError(DeepSleepError):
    """The store cannot be reached or is not in the expected shape."""


class SnapshotError(DeepSleepError):
    """A snapshot directory is missing, malformed, or not of this schema version."""


class DiffError(DeepSleepError):
    """A diff is malformed (unknown table, missing key column, unreadable file)."""


class ConfigError(DeepSleepError):
    """A configuration file, variable or parameter is invalid."""


class ValidationFailed(DeepSleepError):
    """A diff failed validation; nothing was applied.  ``failures`` holds the failing checks."""

    def __init__(self, message: str, failures: list[dict]):
        super().__init__(message)
        self.failures = failures
