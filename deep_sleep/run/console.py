"""One renderer for reports: rows built once, printed as a terminal table or Markdown (Prefect artifacts)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

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


# -- a night over the fleet ---------------------------------------------------------------------
#: Scopes or shards a night's console names per list (the slowest shards, the failed scopes).
NIGHT_TOP = 5
#: The per-scope table's columns (``deep-sleep nightly --table``, ``scopes.csv`` in the night's directory).
SCOPE_TABLE = ("scope", "status", "changes", "conflicts", "quarantined", "held", "shard", "seconds", "run_id", "reason")


def gate_line(g: dict[str, Any]) -> str:
    """The night summary's gate sentence: what could not be measured comes first when it is most of
    the fleet, so "0 failed" never reads as a pass nobody measured."""
    unmeasured = {k: v for k, v in g.get("by_status", {}).items() if k != "measured"}
    why = ", ".join(f"{k} {v}" for k, v in sorted(unmeasured.items(), key=lambda kv: -kv[1]))
    measured = (f"{g['scopes']} scope(s) measured, {g['failed']} failed" +
                (f"; recall@k before {g['recall_before']}, after {g['recall_after']}, drop (pp) {g['drop_pp']}"
                 if g["scopes"] else ""))
    gated = g.get("gated", g["scopes"])
    if unmeasured and 2 * sum(unmeasured.values()) >= gated:
        return f"recall-quality gate: could NOT measure {sum(unmeasured.values())} of {gated} scope(s) ({why}); {measured}"
    return f"recall-quality gate: {measured}" + (f"; not measured: {why}" if why else "")


def _counted(counts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v:,}" for k, v in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))


def _cut(text: str, n: int = 120) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 1] + "…"


def night_lines(summary: dict[str, Any], top: int = NIGHT_TOP) -> list[str]:
    """A night's console summary — a screen whatever the fleet's size: the scopes by status, why the
    skipped ones were skipped, the recall-quality gate, held rows by reason, quarantined rows, the
    slowest shards (a shard of one by its scope), the failed scopes (the first ``top``) and where the
    per-scope table is.  ``summary``: the night's (:func:`deep_sleep.jobs.night.night_summary`)."""
    rows = summary.get("rows", [])
    dq = summary.get("data_quality")
    lines = [f"{summary['scopes']:,} scopes: {summary['due']:,} due, {summary['applied']:,} applied, "
             f"{summary['failed']:,} failed, {summary['skipped']:,} skipped"
             + (f"; data quality {'passed' if dq['success'] else 'FAILED'} ({dq['data_docs_path']})" if dq else "")]
    skipped = [r for r in rows if r["status"] == "skipped"]
    if skipped:
        kinds: dict[str, int] = {}
        for r in skipped:
            kind = str(r.get("reason") or "").split(":", 1)[0] or "no reason"
            kinds[kind] = kinds.get(kind, 0) + 1
        lines.append(f"skipped: {_counted(kinds)} (e.g. {skipped[0]['scope']}: {_cut(skipped[0].get('reason', ''))})")
    if summary.get("gate"):
        lines.append(gate_line(summary["gate"]))
    held = summary.get("held_by_reason") or {}
    if summary.get("held_rows"):
        lines.append(f"held for approval: {summary['held_rows']:,} row(s)" + (f" ({_counted(held)})" if held else "")
                     + " — deep-sleep held; approve / reject RUN_ID")
    quarantined = sum(r.get("quarantined") or 0 for r in rows)
    if quarantined:
        lines.append(f"quarantined {quarantined:,} row(s) in all (left untouched; per scope and reason: deep-sleep report "
                     "SCOPE, or consolidation_quarantine)")
    shards: dict[int, list[dict]] = {}
    for r in rows:
        if r.get("shard") is not None and r.get("seconds") is not None:
            shards.setdefault(r["shard"], []).append(r)
    if shards:
        slow = sorted(shards.items(), key=lambda kv: -max(x["seconds"] for x in kv[1]))[:top]
        parts = []
        for k, members in slow:
            secs = max(x["seconds"] for x in members)
            who = members[0]["scope"] if len(members) == 1 else f"{len(members):,} scopes, {members[0]['scope']} … {members[-1]['scope']}"
            parts.append(f"shard {k + 1} {secs:.1f} s ({who})")
        lines.append(f"slowest of {len(shards):,} shard(s): " + "; ".join(parts))
    failed = [r for r in rows if r["status"] == "failed"]
    if failed:
        lines.append(f"failed ({len(failed):,}):")
        lines += [f"  {r['scope']}: {_cut(r.get('reason', ''))}" for r in failed[:top]]
        if len(failed) > top:
            lines.append(f"  … {len(failed) - top:,} more in the per-scope table")
    if summary.get("seconds"):
        names = {"all": "in all", "shards": "in the shards", "data_quality": "data quality"}
        lines.append("time: " + ", ".join(f"{v:.1f} s {names.get(k, k)}" for k, v in summary["seconds"].items()))
    if summary.get("table"):
        lines.append(f"per-scope table ({len(rows):,} rows): {summary['table']} (or: deep-sleep nightly --table)")
    return lines


def scope_table(rows: Sequence[dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """The night's per-scope table (:data:`SCOPE_TABLE`'s columns), one row per considered scope.  A
    failed scope applied nothing: its changes and conflicts are "—" (its report keeps what its transform
    planned)."""
    def cell(r: dict[str, Any], key: str) -> str:
        value = r.get(key)
        if key in ("changes", "conflicts") and r.get("status") == "failed":
            return "—"
        if value is None:
            return ""
        if key == "shard":
            return str(value + 1)
        return f"{value:.3f}" if isinstance(value, float) else str(value)

    return list(SCOPE_TABLE), [[cell(r, k) for k in SCOPE_TABLE] for r in rows]
