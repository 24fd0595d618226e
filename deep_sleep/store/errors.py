"""Errors of the store layer, and the one place that decides whether a database error is transient.

Transient means a retry of the same work may succeed: a serialization failure, a deadlock, a lock
timeout, a server shutting down or a lost connection.  The decision is by ``psycopg`` error class
and by SQLSTATE (ADBC's errors carry ``sqlstate`` too), never by matching message text.
"""

from __future__ import annotations

import psycopg
import psycopg.errors

from deep_sleep.core.errors import DeepSleepError, TransientError

#: SQLSTATEs worth a retry: serialization failure, deadlock, lock not available, admin/crash
#: shutdown, cannot connect now, and the connection-exception class 08.
TRANSIENT_SQLSTATES = frozenset({"40001", "40P01", "55P03", "57P01", "57P02", "57P03"})
TRANSIENT_SQLSTATE_CLASSES = ("08",)


class StoreError(DeepSleepError):
    """The store cannot be reached or is not in the expected shape."""


class StoreUnavailable(StoreError, TransientError):
    """The store could not be reached just now; a retry may succeed."""


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of a psycopg or ADBC error (None for anything else)."""
    code = getattr(exc, "sqlstate", None)
    return code if isinstance(code, str) and len(code) == 5 else None


def is_transient(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an error it was raised from) is worth retrying."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DeepSleepError) and exc.transient:
            return True
        code = sqlstate(exc)
        if code is not None and (code in TRANSIENT_SQLSTATES or code.startswith(TRANSIENT_SQLSTATE_CLASSES)):
            return True
        if isinstance(exc, (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected,
                            psycopg.errors.LockNotAvailable, psycopg.errors.AdminShutdown)):
            return True
        if isinstance(exc, psycopg.OperationalError) and code is None:
            return True  # psycopg raises OperationalError without a SQLSTATE when the connection is lost
        exc = exc.__cause__ or exc.__context__
    return False
