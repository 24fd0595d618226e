"""Showing a backfill: one row per table (terminal or Markdown), rich progress bars, JSON."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from deep_sleep.jobs.backfill.values import BackfillResult, Progress, ProgressCallback


def result_rows(result: BackfillResult) -> tuple[list[str], list[list[str]]]:
    """One row per table (for a terminal table or Markdown)."""
    header = ["table", "legacy rows", "backfilled", "job total", "batches", "retries", "conflicts", "seconds"]
    rows = [[t.table, f"{t.legacy_rows:,}", f"{t.rows_backfilled:,}", f"{t.rows_backfilled_job:,}", str(t.batches),
             str(t.retries), str(t.conflicts), f"{t.seconds:.2f}"] for t in result.tables]
    return header, rows


@contextlib.contextmanager
def rich_progress() -> Iterator[ProgressCallback]:
    """A progress callback drawing one rich progress bar per table (for the CLI)."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        TextColumn,
        TimeElapsedColumn,
    )
    from rich.progress import Progress as Bar

    with Bar(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
             TextColumn("{task.fields[note]}")) as bar:
        ids: dict[str, Any] = {}

        def update(p: Progress) -> None:
            if p.table not in ids:
                ids[p.table] = bar.add_task(p.table, total=p.rows_total or 1, note="")
            note = f"pass {p.pass_no} · {p.batches} batches · batch {p.batch_size}"
            note += f" · {p.retries} retries" if p.retries else ""
            note += f" · {p.conflicts} conflicts" if p.conflicts else ""
            bar.update(ids[p.table], completed=(p.rows_total or 1) if p.finished else p.rows_done, note=note)

        yield update


def dumps(result: BackfillResult) -> str:
    return json.dumps(result.to_dict(), indent=2, sort_keys=True, default=str) + "\n"
