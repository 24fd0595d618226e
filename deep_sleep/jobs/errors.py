"""Errors of the jobs: the ledger, undo and the scope backfill."""

from __future__ import annotations

from deep_sleep.core.errors import DeepSleepError, InputError


class LedgerError(InputError):
    """A run id that is malformed or not in the ledger."""


class UndoError(DeepSleepError):
    """An undo that was refused (unknown, failed, undone or undo run; before-images gone).  Nothing was written."""


class BackfillError(DeepSleepError):
    """The backfill cannot proceed (schema not migrated, a table it cannot page, retries exhausted)."""


class HoldError(DeepSleepError):
    """An approval or rejection that was refused (unknown run, nothing held, already decided, a run
    that is not applied).  Nothing was written."""
