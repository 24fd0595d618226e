"""The embedded server survives a stale pid file whose pid was reused by something else."""

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
