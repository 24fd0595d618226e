"""The ``deep_sleep`` Prefect flow: one scope, extract → transform → validate → apply → report.

Tasks are thin wrappers over :mod:`deep_sleep.run.stages`; they pass directories (snapshot, diff),
never frames, so nothing large lands in Prefect's state.  The flow's parameters are its only
configuration.  It runs in Prefect's local (ephemeral) mode with no server to install.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from deep_sleep.transforms.config import ConsolidationConfig, load_config
from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, Field

from deep_sleep.core.errors import ValidationFailed
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.scope import Scope
from deep_sleep.core.snapshot import utc
from deep_sleep.run import stages
from deep_sleep.run.llm import summarizer_for
from deep_sleep.run.console import report_markdown
from deep_sleep.store.db import Store, connect_store


class DeepSleepParameters(BaseModel):
    """Parameters of one scope's nightly run."""

    scope: str = Field(description="scope as kind/id[/kind/id…] or its \\x1f-joined scope_path")
    as_of: datetime | None = Field(None, description="logical time of the run (UTC); default: now at flow start")
    config_file: str | None = Field(None, description="TOML file of configuration knobs")
    config: dict[str, Any] = Field(default_factory=dict, description="knob overrides, e.g. {'strengthen': {'increment': 1.0}}")
    dsn: str | None = Field(None, description="PostgreSQL DSN; default DEEP_SLEEP_DSN or the embedded server")
    runs_dir: str | None = Field(None, description="where snapshots and diffs are kept; default .deep_sleep/runs")
    phases: list[str] | None = Field(None, description="run only these phases (default: the whole roster)")


@task(name="extract", retries=2, retry_delay_seconds=5, cache_policy=NO_CACHE)
def extract_task(store: Store, scope: str, as_of: datetime, config: ConsolidationConfig, out: str) -> str:
    return str(stages.extract_stage(store, scope, as_of, config, Path(out)))


@task(name="transform", cache_policy=NO_CACHE)
def transform_task(snapshot_dir: str, config: ConsolidationConfig, as_of: datetime, out: str, run_id: str,
                   phases: list[str] | None, timings: dict[str, float], store: Store | None = None) -> str:
    summarizer = summarizer_for(config, store)  # None unless the model is enabled (SPEC §7)
    return str(stages.plan_stage(Path(snapshot_dir), config, as_of, Path(out), run_id=run_id,
                                 phases=tuple(phases) if phases else None, timings=timings, summarizer=summarizer))


@task(name="validate", cache_policy=NO_CACHE)
def validate_task(snapshot_dir: str, diff_dir: str, config: ConsolidationConfig) -> str:
    return stages.validate_stage(Path(snapshot_dir), Path(diff_dir), config).status


@task(name="apply", tags=["deep-sleep-apply"], cache_policy=NO_CACHE)
def apply_task(store: Store, diff_dir: str, started_at: datetime) -> ConsolidationReport:
    return stages.apply_stage(store, Path(diff_dir), mode="nightly", started_at=started_at)


@task(name="report", cache_policy=NO_CACHE)
def report_task(report: ConsolidationReport) -> None:
    key = "deep-sleep-" + "".join(ch if ch.isalnum() else "-" for ch in Scope.parse(report.scope_path).display().lower())
    create_markdown_artifact(markdown=report_markdown(report), key=key[:100], description=f"Deep Sleep report, {report.status}")


@flow(name="deep_sleep", log_prints=True)
def deep_sleep(params: DeepSleepParameters) -> dict[str, Any]:
    """Consolidate one scope; returns the ``ConsolidationReport`` as a dict.  Fails if validation fails."""
    started = datetime.now(UTC)
    as_of = utc(params.as_of or started)
    scope = Scope.coerce(params.scope)
    config = load_config(params.config_file, params.config)
    store = connect_store(params.dsn)
    run_id = str(uuid.uuid4())
    base = stages.run_dir(params.runs_dir, scope, as_of, run_id)

    t = time.perf_counter()
    snapshot_dir = extract_task(store, scope.path, as_of, config, str(base / "snapshot"))
    extract_seconds = {"extract": round(time.perf_counter() - t, 6)}
    diff_dir = transform_task(snapshot_dir, config, as_of, str(base / "diff"), run_id, params.phases, extract_seconds, store)
    validate_task(snapshot_dir, diff_dir, config)
    report = apply_task(store, diff_dir, started)
    report_task(report)
    if report.status == "failed":
        raise ValidationFailed(
            f"scope {scope}: the diff failed validation and was not applied; see {diff_dir}/validation.parquet\n"
            + "\n".join(report.errors),
            report.validation,
        )
    return report.to_dict()
