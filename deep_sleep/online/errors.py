"""Errors of the online path: bad arguments to its calls, and one malformed operation of a turn."""

from __future__ import annotations

from deep_sleep.core.errors import InputError


class OnlineArgumentError(InputError):
    """An argument of ``record_turn`` / ``recall`` / ``feedback`` is invalid; the message names the
    call, the argument and the rule (``recall: k must be a positive integer, got 0``)."""


class OnlineArgumentTypeError(OnlineArgumentError, TypeError):
    """An argument of an online call has the wrong type.  Also a ``TypeError``, so callers that
    caught the bare ``TypeError`` these calls raised before keep working."""


class OpRejected(InputError):
    """One operation of a turn is malformed.  ``record_turn`` never raises it: it catches it and
    files a :class:`~deep_sleep.online.turn.Rejected` with the message as the reason (the field
    and the rule broken), and the turn's valid operations still land.  An ``InputError`` (so a
    ``ValueError``), which is also what lets pydantic carry it out of a field validator."""
