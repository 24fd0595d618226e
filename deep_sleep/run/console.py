"""One renderer for reports: rows built once, printed as a terminal table or Markdown (Prefect artifacts)."""

from __future__ import annotations

from collections.abc import Sequence

from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.scope import Scope
from deep_sleep.transforms import COUNTERS


def _scope(report: ConsolidationReport) -> str:
    return Scope.parse(report.scope_path).display()


def summary_rows(reports: Sequence[ConsolidationReport]) -> tuple[list[str], list[list[str]]]:
    """One row per scope: status, the counters that moved in any of the reports, conflicts, errors."""
    moved = [c for c in COUNTERS if any(r.counters.get(c) for r in reports)]
    header = ["scope", "status", *moved, "conflicts", "diff", "errors"]
    rows = [
        [
            _scope(r), r.status, *[str(r.counters.get(c, 0)) for c in moved], str(r.conflicts),
            r.diff_hash[:8], str(len(r.errors)),
        ]
        for r in reports
    ]
    return header, rows


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    esc = lambda s: str(s).replace("|", "\\|")  # noqa: E731
    lines = ["| " + " | ".join(map(esc, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(esc, row)) + " |" for row in rows]
    return "\n".join(lines)


def report_markdown(report: ConsolidationReport) -> str:
    """The whole report of one scope as Markdown (the flow's artifact)."""
    parts = [f"# Deep Sleep — `{_scope(report)}` — {report.status}", "", f"as_of `{report.as_of}` · run `{report.run_id}` · diff `{report.diff_hash[:16]}`", ""]
    rows = [[name, str(value)] for name, value in report.counters.items() if value]
    parts += ["## Counters", markdown_table(["counter", "value"], rows or [["(none moved)", "0"]]), ""]
    phase_rows = [[p, "ran", ", ".join(f"{k}={v}" for k, v in report.counters_by_phase.get(p, {}).items()), f"{report.timings.get(p, 0):.3f}"] for p in report.phases_run]
    phase_rows += [[p, "skipped", why, ""] for p, why in report.phases_skipped.items()]
    parts += ["## Phases", markdown_table(["phase", "", "counters / reason", "seconds"], phase_rows), ""]
    changed = [[t, str(k.get("inserts", 0)), str(k.get("updates", 0)), str(k.get("deletes", 0))] for t, k in sorted(report.rows_changed.items())]
    if changed:
        parts += ["## Rows changed", markdown_table(["table", "inserts", "updates", "deletes"], changed), ""]
    parts += [f"conflicts (rows changed by live writers since the snapshot, left as they were): **{report.conflicts}**", ""]
    stages = [[s, f"{report.timings[s]:.3f}"] for s in ("extract", "transform", "validate", "apply") if s in report.timings]
    if stages:
        parts += ["## Stages", markdown_table(["stage", "seconds"], stages), ""]
    for phase, notes in report.notes.items():
        parts += [f"- {phase}: {n}" for n in notes]
    if report.errors:
        parts += ["## Errors", *[f"- {e}" for e in report.errors], ""]
    if report.validation:
        keys = ["check", "table", "kind", "phase", "id", "column", "value"]
        parts += ["## Failing rows (first 200)", markdown_table(keys, [[str(v.get(k, "")) for k in keys] for v in report.validation]), ""]
    return "\n".join(parts)


def summary_columns(reports: Sequence[ConsolidationReport]) -> tuple[list[str], list[list[str]]]:
    """The summary transposed for terminals: one row per counter, one column per scope (#1, #2 …)."""
    header, rows = summary_rows(reports)
    cols = [[header[i]] + [row[i] for row in rows] for i in range(1, len(header))]
    return ["", *[f"#{n}" for n in range(1, len(reports) + 1)]], cols


def print_summary(reports: Sequence[ConsolidationReport], title: str = "Deep Sleep") -> None:
    """A counter × scope table (scopes numbered, listed below it) on the terminal."""
    from rich.console import Console
    from rich.table import Table

    header, rows = summary_columns(reports)
    table = Table(title=title)
    table.add_column(header[0], justify="left", no_wrap=True, min_width=max(len(r[0]) for r in rows))
    for h in header[1:]:
        table.add_column(h, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(*row)
    console = Console(width=max(100, Console().width))
    console.print(table)
    for n, r in enumerate(reports, 1):
        console.print(f"#{n}  {_scope(r)}  ({r.status}; run {r.run_id})", highlight=False)
