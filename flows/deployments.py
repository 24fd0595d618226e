"""The deployments of Deep Sleep, for ``deep-sleep serve`` (no work pool) — the same three that
``deployments/prefect.yaml`` declares for workers:

- ``deep_sleep_nightly/nightly`` on a cron schedule (default 03:00 UTC);
- ``deep_sleep_replay/replay`` (run on demand with a snapshot or a scope and date range);
- ``scope_backfill/backfill`` (run on demand; dry run by default).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any


def deployments(cron: str = "0 3 * * *", dsn: str | None = None, runs_dir: str | None = None) -> list[Any]:
    from deep_sleep.flows.backfill import scope_backfill
    from deep_sleep.flows.nightly import deep_sleep_nightly
    from deep_sleep.flows.replay import deep_sleep_replay

    common = {k: v for k, v in {"dsn": dsn, "runs_dir": runs_dir}.items() if v}
    return [
        deep_sleep_nightly.to_deployment(
            name="nightly", cron=cron, parameters={"params": common},
            description="Consolidate every due scope of the store (gating, bounded concurrency, data-quality suite).",
        ),
        deep_sleep_replay.to_deployment(
            name="replay", parameters={"params": {k: v for k, v in common.items() if k == "runs_dir"}},
            description="Replay stored snapshots (one, or a scope over a date range); optionally compare two configs.",
        ),
        scope_backfill.to_deployment(
            name="backfill", parameters={"params": {k: v for k, v in common.items() if k == "dsn"}},
            description="Write scope_path for legacy rows in small, resumable batches.",
        ),
    ]


def own_runner_storage() -> Path:
    """Make Prefect's runner keep its storage in a temporary directory of this user's and return it.  The
    runner puts it under ``<tmp>/runner_storage``, shared by every user of the machine: once one user's
    runner has made it, another's ``serve`` fails with "Permission denied".  When that directory cannot
    be written, this process's temporary directory becomes ``<tmp>/deep-sleep-<uid>`` (0700)."""
    base = Path(tempfile.gettempdir())
    shared = base / "runner_storage"
    if not shared.exists() or os.access(shared, os.W_OK | os.X_OK):
        return shared
    own = base / f"deep-sleep-{os.getuid()}"
    own.mkdir(mode=0o700, exist_ok=True)
    tempfile.tempdir = str(own)
    return own / "runner_storage"


def serve(cron: str = "0 3 * * *", dsn: str | None = None, runs_dir: str | None = None) -> None:
    """Register the deployments with the Prefect server (PREFECT_API_URL) and run their flow runs here."""
    from prefect import serve as prefect_serve

    own_runner_storage()

    prefect_serve(*deployments(cron, dsn, runs_dir), limit=4)
