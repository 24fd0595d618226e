"""``deep-sleep nightly`` without paying for Prefect machinery the night does not use (issue 32 item 4).

A night with nothing due does almost no work of its own (gating, run health); nearly all of its time
went to Prefect's temporary server (importing its server package into this process, then waiting
for the subprocess), the flow module's imports and the end of the flow run (benchmarks/README.md,
"a night's floor").  So:

* **No scope due and no standing Prefect server** (:func:`standing_api_url` is None): the night is
  :func:`deep_sleep.jobs.night.quiet_night` — in this process, no Prefect, no pipeline imports.  Why
  that is enough is said there.  With a standing server the flow runs as before (a flow run and its
  artifacts on the server's UI for every night; 3–5 s).
* **Scopes due and no standing server**: the flow needs an API, so a :class:`TemporaryServer` — the
  same server Prefect would start by itself — is started as soon as the gate says so, and boots in
  its own process while this one imports the flow module and the pipeline; the flow then talks to it
  through ``PREFECT_API_URL``.
* A plan (``--plan``) always runs the flow (its artifact is the plan).

The gate is taken before any of this (one set-based query), and the flow takes it again: the server is only started for a night that needs it, never for a
quiet one.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from deep_sleep.core.errors import DeepSleepError


def _mentions(path: Path, *words: str) -> bool:
    try:
        text = path.read_text(errors="replace").lower()
    except OSError:
        return False
    return any(w in text for w in words)


def _settings_may_name_an_api() -> bool:
    """Whether a Prefect settings source other than the environment could set ``PREFECT_API_URL``:
    a profile (``PREFECT_PROFILE``/``PREFECT_PROFILES_PATH``, or a ``profiles.toml`` under
    ``PREFECT_HOME`` that names it), a ``.env``, ``prefect.toml`` or ``pyproject.toml`` (``[tool.prefect]``)
    in the working directory.  Conservative: a file that might is enough."""
    if os.environ.get("PREFECT_PROFILE") or os.environ.get("PREFECT_PROFILES_PATH"):
        return True
    home = Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect").expanduser()
    return (_mentions(home / "profiles.toml", "prefect_api_url") or _mentions(Path(".env"), "prefect")
            or Path("prefect.toml").exists() or _mentions(Path("pyproject.toml"), "tool.prefect"))


def standing_api_url() -> str | None:
    """The Prefect API a flow run of this process would use, or None when Prefect would start its
    temporary server.  ``PREFECT_API_URL`` from the environment; else, when Prefect is already imported
    (a test harness, a caller's ``temporary_settings``) or a settings file might name an API, Prefect's
    own settings (importing Prefect: ~1.2 s); else None — without importing Prefect."""
    if os.environ.get("PREFECT_API_URL"):
        return os.environ["PREFECT_API_URL"]
    if "prefect.settings" in sys.modules or _settings_may_name_an_api():
        from prefect.settings import get_current_settings

        return get_current_settings().api.url or None
    return None


def _ephemeral_allowed() -> bool:
    return os.environ.get("PREFECT_SERVER_EPHEMERAL_ENABLED", "true").strip().lower() not in ("0", "false", "no", "off")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class TemporaryServer:
    """Prefect's temporary local API server for one night, started early.

    The very server Prefect 3.9 starts by itself when no API is configured (``SubprocessASGIServer``:
    the same uvicorn command, environment flags and SQLite database under ``PREFECT_HOME``, the UI off,
    stopped when the night ends) — but started by this process *before* it imports the flow, so the
    ~5 s boot overlaps those imports, and without importing Prefect's server package here (~3 s).
    Start: construct it; :meth:`wait` until it answers; :meth:`stop` (also a context manager)."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.process = self._spawn()

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def _spawn(self) -> subprocess.Popen:
        import importlib.util

        spec = importlib.util.find_spec("prefect")  # the package's location, without importing it
        if spec is None or spec.origin is None:
            raise DeepSleepError("Prefect is not installed: cannot start its temporary server")
        app_dir = str(Path(spec.origin).parent.parent)
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
        env.pop("PREFECT_API_URL", None)
        return subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "--app-dir", app_dir, "--factory", "prefect.server.api.server:create_app",
             "--host", "127.0.0.1", "--port", str(self.port), "--log-level", "error", "--lifespan", "on"],
            env=env, stdin=subprocess.DEVNULL)

    def wait(self, timeout: float | None = None) -> str:
        """Block until the server answers its health check (``timeout``: default
        ``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS``, else 180 s); its API URL.  A server that
        exits before answering (its port taken in the meantime) is started again on another port."""
        if timeout is None:
            timeout = float(os.environ.get("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS") or 180)
        deadline = time.monotonic() + timeout
        restarts = 0
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                if restarts >= 3:
                    break
                restarts += 1
                self.port = _free_port()
                self.process = self._spawn()
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as response:
                    if response.status == 200:
                        return self.api_url
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.05)
        code = self.process.poll()
        self.stop()
        raise DeepSleepError(f"Prefect's temporary server did not answer within {timeout:g} s"
                             + (f" (it exited with code {code})" if code is not None else "")
                             + "; set PREFECT_API_URL to a standing server (`prefect server start`)")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def __enter__(self) -> TemporaryServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_night(params, config, store) -> dict[str, Any]:
    """One night (``params``: :class:`~deep_sleep.jobs.night.NightlyParameters`; ``config``: its configuration; ``store``: its store): a quiet night without Prefect when no scope
    is due and no standing server is configured, else the flow — on the standing server, or on a
    :class:`TemporaryServer` that boots while the flow module is imported.  The night's summary."""
    if not params.plan:  # a night already running is named before any Prefect server starts (the flow locks)
        from deep_sleep.run.slots import check_no_night

        check_no_night(store.dsn)
    api = standing_api_url()
    if api is None and not params.plan:
        from deep_sleep.jobs.night import considered_scopes, quiet_night

        # Without --as-of the flow takes its own start as as_of (as before): not this moment, seconds
        # earlier, which would widen the window of live rows an extract finds "in the future".
        as_of = params.as_of or datetime.now(UTC)
        gates = considered_scopes(store, as_of, config.gating, params.scopes)
        if not any(g.due for g in gates):
            return quiet_night(params.model_copy(update={"as_of": as_of}), config, store, gates)
    if api is not None or not _ephemeral_allowed():  # Prefect's own settings decide (and refuse, if so told)
        from deep_sleep.flows.nightly import run_nightly

        return run_nightly(params)
    saved = os.environ.get("PREFECT_API_URL")
    with TemporaryServer() as server:
        os.environ["PREFECT_API_URL"] = server.api_url  # read when Prefect is imported; and by worker processes
        try:
            from deep_sleep.flows.nightly import run_nightly  # ~3.4 s of imports, while the server boots
            from prefect.settings import PREFECT_API_URL, temporary_settings

            os.environ["PREFECT_API_URL"] = server.wait()  # the port may have changed
            with temporary_settings({PREFECT_API_URL: server.api_url}):  # also if Prefect was imported before
                return run_nightly(params)
        finally:
            if saved is None:
                os.environ.pop("PREFECT_API_URL", None)
            else:
                os.environ["PREFECT_API_URL"] = saved


__all__ = ["TemporaryServer", "run_night", "standing_api_url"]
