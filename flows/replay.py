"""The ``deep_sleep_replay`` Prefect flow: replay one stored snapshot, or every stored snapshot of a
scope over a date range, and optionally compare two configurations — never writing to the store.

Tasks are thin wrappers over :mod:`deep_sleep.jobs.replay_range` and :mod:`deep_sleep.jobs.compare`; they pass
paths and small summaries.
The flow's parameters are its only configuration.  With a ``dsn`` the ledger is *read* to replay
each snapshot at its run's recorded ``as_of`` and check the recorded diff hash.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from deep_sleep.transforms.config import ConsolidationConfig, load_config
from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE
from pydantic import BaseModel, Field, model_validator

from deep_sleep.core.errors import InputError
from deep_sleep.core.scope import Scope
from deep_sleep.jobs import compare, replay_range
from deep_sleep.run.console import markdown_table
from deep_sleep.store.db import Store, connect_store


class ReplayParameters(BaseModel):
    """Parameters of a replay: one ``snapshot_dir``, or a ``scope`` and date range under ``runs_dir``."""

    snapshot_dir: str | None = Field(None, description="one snapshot directory to replay")
    scope: str | None = Field(None, description="scope (kind/id[/kind/id…]) whose stored snapshots to replay")
    runs_dir: str | None = Field(None, description="where runs keep snapshots; default DEEP_SLEEP_RUNS_DIR or .deep_sleep/runs")
    start: datetime | None = Field(None, description="earliest snapshot taken_at to replay (UTC); default: no bound")
    end: datetime | None = Field(None, description="latest snapshot taken_at to replay (UTC); default: no bound")
    as_of: datetime | None = Field(None, description="replay time of a single snapshot; default: its run's as_of, else taken_at")
    config_file: str | None = Field(None, description="TOML configuration A")
    config: dict[str, Any] = Field(default_factory=dict, description="knob overrides of configuration A")
    compare_config_file: str | None = Field(None, description="TOML configuration B; set it (or compare_config) to compare")
    compare_config: dict[str, Any] | None = Field(None, description="knob overrides of configuration B, e.g. {'strengthen': {'enabled': false}}")
    phases: list[str] | None = Field(None, description="replay only these phases (default: the whole roster)")
    out: str | None = Field(None, description="where to write diffs, reports and comparisons; default .deep_sleep/replays/<now>")
    dsn: str | None = Field(None, description="read the ledger (as_of, recorded hash) from this store; nothing is written")

    @model_validator(mode="after")
    def _one_source(self) -> ReplayParameters:
        if bool(self.snapshot_dir) == bool(self.scope):
            raise InputError("give either snapshot_dir (one snapshot) or scope (its stored snapshots, optionally start/end)")
        if self.as_of is not None and self.scope:
            raise InputError("as_of applies to a single snapshot_dir; a range replays each snapshot at its own run's as_of")
        return self

    @property
    def comparing(self) -> bool:
        return self.compare_config_file is not None or self.compare_config is not None


@task(name="find-snapshots", cache_policy=NO_CACHE)
def find_snapshots_task(runs_dir: str | None, scope: str, start: datetime | None, end: datetime | None) -> list[str]:
    return [str(s.path) for s in replay_range.find_snapshots(runs_dir, scope, start, end)]


@task(name="replay", cache_policy=NO_CACHE)
def replay_task(snapshot_dir: str, config: ConsolidationConfig, compare_config: ConsolidationConfig | None,
                as_of: datetime | None, store: Store | None, phases: list[str] | None, out: str) -> dict[str, Any]:
    replay = replay_range.replay_stored(snapshot_dir, config, compare_config, as_of=as_of, store=store, phases=phases, out=out)
    summary = replay_range.replay_summary(replay)
    summary["markdown"] = compare.comparison_markdown(replay.comparison) if replay.comparison else ""
    return summary


@task(name="replay-report", cache_policy=NO_CACHE)
def report_task(summaries: list[dict[str, Any]], title: str, out: Path) -> str:
    header = ["snapshot taken_at", "as_of", "from", "status", "diff", "reproduces", "rows differing"]
    rows = [[s["taken_at"], s["as_of"], s["as_of_source"], s["status"], s["diff_hash"][:8],
             {None: "n/a", True: "yes", False: "NO"}[s["reproduces"]],
             str(s["comparison"]["differing_rows"]) if "comparison" in s else ""] for s in summaries]
    body = [f"# {title}", "", markdown_table(header, rows) if rows else "(no stored snapshots in range)", ""]
    body += [f"## Snapshot taken {s['taken_at']} (as_of {s['as_of']})\n" + s["markdown"].split("\n", 2)[2].replace("\n## ", "\n### ")
             for s in summaries if s["markdown"]]
    markdown = "\n".join(body)
    (out / "replay.md").write_text(markdown)
    create_markdown_artifact(markdown=markdown, key="deep-sleep-replay", description=title)
    return markdown


@flow(name="deep_sleep_replay", log_prints=True)
def deep_sleep_replay(params: ReplayParameters) -> list[dict[str, Any]]:
    """Replay (and compare); returns one summary per snapshot (status, diff hash, reproduces, comparison)."""
    config = load_config(params.config_file, params.config)
    compare_config = load_config(params.compare_config_file, params.compare_config or {}) if params.comparing else None
    store = connect_store(params.dsn) if params.dsn else None
    out = Path(params.out or Path(".deep_sleep") / "replays" / datetime.now(UTC).strftime("%Y%m%dT%H%M%S.%fZ"))
    out.mkdir(parents=True, exist_ok=True)
    if params.snapshot_dir:
        dirs, title = [params.snapshot_dir], f"Deep Sleep replay of {params.snapshot_dir}"
    else:
        scope = Scope.coerce(params.scope)
        dirs = find_snapshots_task(params.runs_dir, scope.path, params.start, params.end)
        title = f"Deep Sleep replay of {scope.display()}"
    summaries = []
    for d in dirs:
        target = out / Path(d).resolve().parent.name if params.scope else out
        summaries.append(replay_task(d, config, compare_config, params.as_of, store, params.phases, str(target)))
    report_task(summaries, title, out)
    for s in summaries:
        s.pop("markdown", None)
    return summaries
