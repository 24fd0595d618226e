"""Deployments against a real Prefect server started by the test: register (``deep-sleep serve``),
trigger the nightly deployment through the API, and see it complete and change the store."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.storeutil import scalar, small_graph

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the Prefect server exited"
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise AssertionError("the Prefect server did not become healthy")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


@pytest.mark.flow
def test_served_deployments_run_through_a_real_prefect_server(store, scope, tmp_path):
    port = _free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "prefect-home"), "PREFECT_API_URL": api,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "DO_NOT_TRACK": "1", "PREFECT_LOGGING_LEVEL": "WARNING",
           "PYTHONPATH": str(Path.cwd()),
           "PREFECT_RUNNER_POLL_FREQUENCY": "1"}  # serve picks the run up within a second, not ten
    bin_dir = Path(sys.executable).parent
    server = subprocess.Popen([str(bin_dir / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                              env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    served = None
    try:
        _wait_healthy(api, server)
        ids = small_graph(store, scope, NOW)
        log = open(tmp_path / "serve.log", "w")  # noqa: SIM115 - closed with the process
        served = subprocess.Popen([str(bin_dir / "deep-sleep"), "--dsn", store.dsn, "serve", "--runs-dir", str(tmp_path / "runs")],
                                  env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        from prefect.client.orchestration import get_client
        from prefect.deployments import run_deployment
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: api}):
            with get_client(sync_client=True) as client:
                deadline = time.monotonic() + 120
                names = set()
                while time.monotonic() < deadline and len(names) < 3:
                    assert served.poll() is None, "deep-sleep serve exited"
                    names = {d.name for d in client.read_deployments()}
                    time.sleep(1)
                assert names >= {"nightly", "replay", "backfill"}
                nightly = client.read_deployment_by_name("deep_sleep_nightly/nightly")
                assert nightly.schedules and nightly.schedules[0].schedule.cron == "0 3 * * *"
            run = run_deployment(
                "deep_sleep_nightly/nightly",
                parameters={"params": {"as_of": NOW.isoformat(), "dsn": store.dsn, "scopes": [scope.display()],
                                       "data_quality": False, "runs_dir": str(tmp_path / "runs"),
                                       "task_runner": "processes", "max_workers": 1}},
                timeout=300,
            )
        assert run.state is not None and run.state.is_completed(), (run.state, (tmp_path / "serve.log").read_text()[-3000:])
        assert scalar(store, "SELECT count(*) FROM consolidation_runs WHERE scope_path = %s AND status = 'applied'", scope.path) == 1
        assert scalar(store, "SELECT importance FROM memory_nodes WHERE id = %s", ids["hot"][0]) == 5.5
    finally:
        if served is not None:
            _stop(served)
        _stop(server)


# -- Prefect's runner storage is shared by every user of <tmp>: serve takes its own when it must --------------

def test_the_runner_storage_stays_where_prefect_puts_it_when_this_user_may_write_there(tmp_path, monkeypatch):
    import tempfile

    from deep_sleep.flows.deployments import own_runner_storage

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    assert own_runner_storage() == tmp_path / "runner_storage"  # not there yet: Prefect makes it
    (tmp_path / "runner_storage").mkdir()
    assert own_runner_storage() == tmp_path / "runner_storage" and tempfile.gettempdir() == str(tmp_path)


def test_a_runner_storage_of_another_user_sends_serve_to_a_temporary_directory_of_its_own(tmp_path):
    """As another user would meet it: <tmp>/runner_storage not writable (made by root, mode 0755 — here
    0555, and the child runs without root's power to write anywhere: tests/core/test_config.py)."""
    from tests.core.test_config import _as_unprivileged

    base = tmp_path / "tmp"
    base.mkdir()
    base.chmod(0o777)
    (base / "runner_storage").mkdir(mode=0o555)
    (base / "runner_storage").chmod(0o555)
    code = ("import os, tempfile\n"
            "from deep_sleep.flows.deployments import own_runner_storage\n"
            "got = own_runner_storage()\n"
            "got.mkdir(parents=True, exist_ok=True)\n"  # what Prefect's runner then does
            "print(os.getuid(), got, tempfile.gettempdir(), oct(os.stat(got.parent).st_mode & 0o777))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=Path.cwd(),
                          env={**os.environ, "TMPDIR": str(base), "PYTHONPATH": str(Path.cwd())}, timeout=120,
                          **_as_unprivileged())
    assert done.returncode == 0, done.stderr[-2000:]
    uid, got, tmp, mode = done.stdout.split()
    own = base / f"deep-sleep-{uid}"
    assert (got, tmp, mode) == (str(own / "runner_storage"), str(own), "0o700")
