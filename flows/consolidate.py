"""The ``deep_sleep`` Prefect flow: one scope, extract → transform → validate → apply → report.

Tasks are thin wrappers over the pipeline of stage values (:mod:`deep_sleep.run.pipeline`, on a
shard of one): each task returns its stage's value, which the next task takes in this process
(result persistence is off, so nothing large lands in Prefect's storage), and each stage writes its
files (snapshot, diff) for replay.  The flow's parameters are its only
configuration.  It runs in Prefect's local (ephemeral) mode with no server to install.
"""

from __future__ import annotations

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
from deep_sleep.core.holds_config import HoldsConfig
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.scope import Scope
from deep_sleep.core.snapshot import utc
from deep_sleep.run import pipeline, stages
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
def extract_task(store: Store, scope: str, as_of: datetime, config: ConsolidationConfig, out: str) -> pipeline.Extracted:
    return pipeline.extract(store, scope, as_of, config, Path(out))


@task(name="transform", cache_policy=NO_CACHE)
def transform_task(extracted: pipeline.Extracted, config: ConsolidationConfig, as_of: datetime, out: str, run_id: str,
                   phases: list[str] | None, store: Store | None = None) -> pipeline.Planned:
    summarizer = summarizer_for(config, store)  # None unless the model is enabled (SPEC §7)
    scope_path = extracted.shard.scope_paths[0]
    return pipeline.transform(extracted, config, as_of, Path(out), run_ids={scope_path: run_id},
                              phases=tuple(phases) if phases else None, summarizer=summarizer)


@task(name="validate", cache_policy=NO_CACHE)
def validate_task(planned: pipeline.Planned, config: ConsolidationConfig, store: Store | None = None) -> pipeline.Validated:
    validated = pipeline.validate(planned, config)
    return pipeline.gate(store, validated, config) if store is not None else validated  # the recall-quality gate


@task(name="apply", tags=["deep-sleep-apply"], cache_policy=NO_CACHE)
def apply_task(store: Store, validated: pipeline.Validated, started_at: datetime,
               holds: HoldsConfig | None = None) -> ConsolidationReport:
    (report,) = pipeline.apply(store, validated, mode="nightly", started_at=started_at, holds=holds).reports.values()
    return report


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

    extracted = extract_task(store, scope.path, as_of, config, str(base / "snapshot"))
    planned = transform_task(extracted, config, as_of, str(base / "diff"), run_id, params.phases, store)
    validated = validate_task(planned, config, store)
    report = apply_task(store, validated, started, config.holds)
    diff_dir = base / "diff"
    report_task(report)
    if report.status == "failed":
        raise ValidationFailed(
            f"scope {scope}: the diff failed validation and was not applied; see {diff_dir}/validation.parquet\n"
            + "\n".join(report.errors),
            report.validation,
        )
    return report.to_dict()
