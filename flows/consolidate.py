"""The ``deep_sleep`` Prefect flow: one scope's night (:data:`deep_sleep.run.pipeline.NIGHT` on a shard of one).

Each stage runs as a Prefect task (a thin wrapper: :func:`stage_task` runs one stage value), so the
flow run shows extract, transform, gate, hold, validate and apply with their own states and times;
the stage values pass from task to task in this process (result persistence is off, so nothing large
lands in Prefect's storage), and the stages write the run's files (snapshot, diff) for replay.  The
flow's parameters are its only configuration.  It runs in Prefect's local (ephemeral) mode with no
server to install.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

from deep_sleep.transforms.config import load_config
from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, Field

from deep_sleep.core.errors import ValidationFailed
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.scope import Scope
from deep_sleep.run import pipeline
from deep_sleep.run.console import report_markdown
from deep_sleep.run.layout import run_dir
from deep_sleep.run.llm import summarizer_for
from deep_sleep.run.slots import ApplyInSlot
from deep_sleep.store.db import connect_store


class DeepSleepParameters(BaseModel):
    """Parameters of one scope's nightly run."""

    scope: str = Field(description="scope as kind/id[/kind/id…] or its \\x1f-joined scope_path")
    as_of: datetime | None = Field(None, description="logical time of the run (UTC); default: now at flow start")
    config_file: str | None = Field(None, description="TOML file of configuration knobs")
    config: dict[str, Any] = Field(default_factory=dict, description="knob overrides, e.g. {'strengthen': {'increment': 1.0}}")
    dsn: str | None = Field(None, description="PostgreSQL DSN; default DEEP_SLEEP_DSN or the embedded server")
    runs_dir: str | None = Field(None, description="where snapshots and diffs are kept; default .deep_sleep/runs")
    phases: list[str] | None = Field(None, description="run only these phases (default: the whole roster)")
    apply_concurrency: int = Field(2, ge=1, description="applies at once across runs (the store's apply slots)")


@task(cache_policy=NO_CACHE, retries=0)
def stage_task(stage, ctx: pipeline.Context, state: pipeline.State) -> pipeline.State:
    """One stage of the run (:func:`deep_sleep.run.pipeline.step`)."""
    return pipeline.step(stage, ctx, state)


@task(name="report", cache_policy=NO_CACHE)
def report_task(report: ConsolidationReport) -> None:
    key = "deep-sleep-" + "".join(ch if ch.isalnum() else "-" for ch in Scope.parse(report.scope_path).display().lower())
    create_markdown_artifact(markdown=report_markdown(report), key=key[:100], description=f"Deep Sleep report, {report.status}")


@flow(name="deep_sleep", log_prints=True)
def deep_sleep(params: DeepSleepParameters) -> dict[str, Any]:
    """Consolidate one scope; returns the ``ConsolidationReport`` as a dict.  Fails if validation fails."""
    scope = Scope.coerce(params.scope)
    config = load_config(params.config_file, params.config)
    store = connect_store(params.dsn)
    ctx = pipeline.Context.of(params.as_of, config, scopes=scope, store=store,
                              phases=tuple(params.phases) if params.phases else None,
                              summarizer=summarizer_for(config, store))  # None unless the model is enabled (SPEC §7)
    run_id = pipeline.new_run_id()
    ctx = replace(ctx.with_base(run_dir(params.runs_dir, scope, ctx.as_of, run_id)), run_ids={scope.path: run_id})
    state = pipeline.State()
    for stage in pipeline.NIGHT:  # the apply holds one of the store's apply slots, as a nightly's does
        stage = ApplyInSlot(params.apply_concurrency) if isinstance(stage, pipeline.Apply) else stage
        state = stage_task.with_options(name=stage.name)(stage, ctx, state)
    report = pipeline.finish(ctx, state).report(scope.path)
    report_task(report)
    if report.status == "failed":
        raise ValidationFailed(
            f"scope {scope}: the diff failed validation and was not applied; see {Path(ctx.diff_dir)}/validation.parquet\n"
            + "\n".join(report.errors),
            report.validation,
        )
    return report.to_dict()
