"""Replay comparison: two diffs of the same snapshot, row by row, per phase (SPEC §6).

Two configurations on one snapshot (:func:`compare_configs`), two code versions' diff
directories (:func:`compare_dirs`), or any two :class:`~deep_sleep.core.diff.Diff` values
(:func:`compare_diffs`) give one frozen :class:`Comparison`:

- per (phase, table, kind) the rows only in A, only in B, and changed — same id, different
  values, with the columns that differ and both sides' values of them;
- how the counters move (A, B, delta), in total and per phase, and which phases ran or were
  skipped on each side.

A row is identified by (table, kind, phase, id): a row that phase p deletes in A and phase q in
B shows up as "only in A" under p and "only in B" under q.  Values are compared through their
JSON encoding, so a column one side leaves out equals a null on the other (in updates a null
means "not changed"), and a dtype change between code versions is a change.

    >>> cmp = compare_configs(snapshot, ConsolidationConfig(),                 # doctest: +SKIP
    ...                       load_config(overrides={"strengthen": {"increment": 1.0}}), as_of)
    >>> print(comparison_markdown(cmp))                                         # doctest: +SKIP

Replaying stored snapshots over a date range, which compares each replay when given a second
configuration, lives in :mod:`deep_sleep.jobs.replay_range`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl

from deep_sleep.core.diff import KINDS, Diff
from deep_sleep.core.files import write_atomic
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run.console import markdown_table
from deep_sleep.run.transform import transform
from deep_sleep.transforms import COUNTERS
from deep_sleep.transforms.config import ConsolidationConfig

KEY = ("phase", "id")
ROWS_SCHEMA = {"table": pl.String(), "kind": pl.String(), "phase": pl.String(), "id": pl.String(), "side": pl.String(),
               "columns": pl.List(pl.String()), "a": pl.String(), "b": pl.String()}
SUMMARY_SCHEMA = {"phase": pl.String(), "table": pl.String(), "kind": pl.String(), "only_a": pl.Int64(),
                  "only_b": pl.Int64(), "changed": pl.Int64(), "same": pl.Int64()}
COUNTER_SCHEMA = {"counter": pl.String(), "phase": pl.String(), "a": pl.Int64(), "b": pl.Int64(), "delta": pl.Int64()}
PHASE_SCHEMA = {"phase": pl.String(), "a": pl.String(), "b": pl.String()}
COMPARISON_FILE = "comparison.json"
ROWS_FILE = "comparison_rows.parquet"


@dataclass(frozen=True)
class Comparison:
    """A against B.

    label_a, label_b: what was compared (config names, directories, code versions).
    hash_a, hash_b: the diffs' content hashes.
    rows: one row per differing diff row — table, kind, phase, id, side (``only_a``, ``only_b``,
      ``changed``), columns (that differ, for ``changed``), a and b (JSON of those columns' values).
    summary: per (phase, table, kind): only_a, only_b, changed, same.
    counters: per counter that moved on either side: phase ("" = the run's total), a, b, delta (b − a).
    phases: per phase either side ran or skipped: its status in A and in B ("ran", "skipped: <reason>").
    """

    label_a: str
    label_b: str
    hash_a: str
    hash_b: str
    rows: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=ROWS_SCHEMA))
    summary: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=SUMMARY_SCHEMA))
    counters: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=COUNTER_SCHEMA))
    phases: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=PHASE_SCHEMA))

    @property
    def identical(self) -> bool:
        """Same diff, same counters."""
        return self.hash_a == self.hash_b and not self.rows.height and not self.counters.filter(pl.col("delta") != 0).height

    def counter_deltas(self, phase: str = "") -> dict[str, int]:
        """counter → B − A (the run's totals, or one phase's), for the counters that moved."""
        moved = self.counters.filter((pl.col("phase") == phase) & (pl.col("delta") != 0))
        return dict(zip(moved["counter"].to_list(), moved["delta"].to_list()))

    def differing(self, phase: str | None = None, table: str | None = None) -> pl.DataFrame:
        """The differing rows, of one phase and/or table."""
        out = self.rows
        if phase is not None:
            out = out.filter(pl.col("phase") == phase)
        if table is not None:
            out = out.filter(pl.col("table") == table)
        return out

    def to_dict(self, max_rows: int | None = 10_000) -> dict[str, Any]:
        rows = self.rows if max_rows is None else self.rows.head(max_rows)
        return {
            "label_a": self.label_a, "label_b": self.label_b, "hash_a": self.hash_a, "hash_b": self.hash_b,
            "identical": self.identical, "summary": self.summary.to_dicts(), "counters": self.counters.to_dicts(),
            "phases": self.phases.to_dicts(), "rows_total": self.rows.height,
            "rows_truncated": rows.height < self.rows.height, "rows": rows.to_dicts(),
        }

    def write(self, directory: str | Path, max_rows: int | None = 10_000) -> Path:
        """``comparison.json`` (the first ``max_rows`` differing rows) and ``comparison_rows.parquet`` (all)."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        write_atomic(out / COMPARISON_FILE, json.dumps(self.to_dict(max_rows), indent=2, sort_keys=True, default=str) + "\n")
        self.rows.write_parquet(out / ROWS_FILE)
        return out / COMPARISON_FILE


# -- comparing ---------------------------------------------------------------------------------

def _encoded(frame: pl.DataFrame, columns: list[str], side: str) -> pl.DataFrame:
    """Key columns plus, per value column, ``"col":<json>`` (``"col":null`` when the frame lacks it)."""
    exprs = [
        (pl.struct(pl.col(c)).struct.json_encode().str.strip_prefix("{").str.strip_suffix("}") if c in frame.columns
         else pl.lit(json.dumps(c) + ":null")).alias(f"{c}__{side}")
        for c in columns
    ]
    return frame.select(*KEY, *exprs).with_columns(pl.lit(True).alias(f"_in_{side}"))


def _compare_frames(table: str, kind: str, fa: pl.DataFrame, fb: pl.DataFrame) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(differing rows, per-phase summary) of one table and kind."""
    columns = sorted({*fa.columns, *fb.columns} - set(KEY))
    joined = _encoded(fa, columns, "a").join(_encoded(fb, columns, "b"), on=list(KEY), how="full", coalesce=True)
    joined = joined.with_columns(pl.col("_in_a").fill_null(False), pl.col("_in_b").fill_null(False))
    differs = {c: pl.col(f"{c}__a").ne_missing(pl.col(f"{c}__b")) for c in columns}
    both = pl.col("_in_a") & pl.col("_in_b")
    any_diff = pl.any_horizontal(*differs.values()) if columns else pl.lit(False)
    side = (pl.when(~pl.col("_in_b")).then(pl.lit("only_a")).when(~pl.col("_in_a")).then(pl.lit("only_b"))
            .when(any_diff).then(pl.lit("changed")).otherwise(pl.lit("same")))
    changed_cols = (pl.concat_list([pl.when(d).then(pl.lit(c)) for c, d in differs.items()]).list.drop_nulls()
                    if columns else pl.lit([], dtype=pl.List(pl.String())))

    def values(s: str) -> pl.Expr:
        parts = [pl.when(d & both).then(pl.col(f"{c}__{s}")) for c, d in differs.items()]
        return pl.when(side == "changed").then(pl.lit("{") + pl.concat_str(parts, separator=",", ignore_nulls=True) + pl.lit("}"))

    classified = joined.select(
        pl.lit(table).alias("table"), pl.lit(kind).alias("kind"), *KEY, side.alias("side"),
        pl.when(side == "changed").then(changed_cols).otherwise(pl.lit([], dtype=pl.List(pl.String()))).alias("columns"),
        values("a").alias("a"), values("b").alias("b"),
    )
    summary = (
        classified.group_by("phase").agg(*(pl.col("side").eq(s).sum().cast(pl.Int64).alias(s) for s in ("only_a", "only_b", "changed", "same")))
        .select("phase", pl.lit(table).alias("table"), pl.lit(kind).alias("kind"), "only_a", "only_b", "changed", "same")
    )
    return classified.filter(pl.col("side") != "same"), summary


def _counter_rows(report_a: ConsolidationReport | None, report_b: ConsolidationReport | None) -> pl.DataFrame:
    if report_a is None or report_b is None:
        return pl.DataFrame(schema=COUNTER_SCHEMA)
    rows = []
    for c in COUNTERS:
        a, b = int(report_a.counters.get(c, 0)), int(report_b.counters.get(c, 0))
        if a or b:
            rows.append({"counter": c, "phase": "", "a": a, "b": b, "delta": b - a})
    phases = list(dict.fromkeys([*report_a.counters_by_phase, *report_b.counters_by_phase]))
    for p in phases:
        ca, cb = report_a.counters_by_phase.get(p, {}), report_b.counters_by_phase.get(p, {})
        for c in [c for c in COUNTERS if c in ca or c in cb]:
            a, b = int(ca.get(c, 0)), int(cb.get(c, 0))
            rows.append({"counter": c, "phase": p, "a": a, "b": b, "delta": b - a})
    return pl.DataFrame(rows, schema=COUNTER_SCHEMA)


def _phase_rows(report_a: ConsolidationReport | None, report_b: ConsolidationReport | None) -> pl.DataFrame:
    if report_a is None or report_b is None:
        return pl.DataFrame(schema=PHASE_SCHEMA)

    def status(r: ConsolidationReport, p: str) -> str:
        if p in r.phases_run:
            return "ran"
        return f"skipped: {r.phases_skipped[p]}" if p in r.phases_skipped else "not in roster"

    from deep_sleep.transforms import ROSTER

    order = [p.name for p in ROSTER]
    seen = {*report_a.phases_run, *report_a.phases_skipped, *report_b.phases_run, *report_b.phases_skipped}
    names = [p for p in order if p in seen] + sorted(seen - set(order))
    return pl.DataFrame([{"phase": p, "a": status(report_a, p), "b": status(report_b, p)} for p in names], schema=PHASE_SCHEMA)


def compare_diffs(diff_a: Diff, diff_b: Diff, *, report_a: ConsolidationReport | None = None,
                  report_b: ConsolidationReport | None = None, label_a: str = "A", label_b: str = "B") -> Comparison:
    """Compare two diffs row by row (and, given their reports, counters and phases).

        >>> compare_diffs(Diff.empty(), Diff.empty()).identical
        True
    """
    rows, summaries = [], []
    for table in sorted({*diff_a.tables, *diff_b.tables}):
        for kind in KINDS:
            fa, fb = diff_a.table(table).frames()[kind], diff_b.table(table).frames()[kind]
            if not (fa.height or fb.height):
                continue
            differing, summary = _compare_frames(table, kind, fa, fb)
            rows.append(differing)
            summaries.append(summary)
    return Comparison(
        label_a=label_a, label_b=label_b, hash_a=diff_a.content_hash(), hash_b=diff_b.content_hash(),
        rows=(pl.concat(rows).sort("phase", "table", "kind", "id") if rows else pl.DataFrame(schema=ROWS_SCHEMA)),
        summary=(pl.concat(summaries).sort("phase", "table", "kind") if summaries else pl.DataFrame(schema=SUMMARY_SCHEMA)),
        counters=_counter_rows(report_a, report_b),
        phases=_phase_rows(report_a, report_b),
    )


def compare_configs(snapshot: Snapshot, config_a: ConsolidationConfig, config_b: ConsolidationConfig, as_of,
                    *, phases: Sequence[str] | None = None, label_a: str = "A", label_b: str = "B") -> Comparison:
    """Transform one snapshot under two configurations and compare the diffs (no store involved)."""
    a = transform(snapshot, config_a, as_of, tuple(phases) if phases else None)
    b = transform(snapshot, config_b, as_of, tuple(phases) if phases else None)
    return compare_diffs(a.scope_diff(), b.scope_diff(), report_a=a.report, report_b=b.report, label_a=label_a, label_b=label_b)


def compare_dirs(dir_a: str | Path, dir_b: str | Path, scope_path: str | None = None) -> Comparison:
    """Compare two diff directories (e.g. two code versions' replays of one snapshot); their
    reports, when present, supply counters and phases.  A shard's diff directory holds many
    scopes: ``scope_path`` names the one to compare."""
    from deep_sleep.run.layout import is_shard_diff, read_scope_diff, read_scope_report

    def report(d: Path) -> ConsolidationReport | None:
        return read_scope_report(d, scope_path) if (d / "report.json").is_file() or is_shard_diff(d) else None

    from deep_sleep.core.files import fetch_dir

    a, b = fetch_dir(dir_a), fetch_dir(dir_b)  # a URL (s3://…) is fetched to a local copy first
    return compare_diffs(read_scope_diff(a, scope_path), read_scope_diff(b, scope_path), report_a=report(a),
                         report_b=report(b), label_a=str(dir_a), label_b=str(dir_b))


# -- rendering ---------------------------------------------------------------------------------

def comparison_tables(cmp: Comparison, limit: int = 50) -> list[tuple[str, list[str], list[list[str]]]]:
    """The comparison as titled tables (phases, counters, rows per phase and table, examples): built
    once, printed as Markdown or on a terminal."""
    out = []
    differing_phases = cmp.phases.filter(pl.col("a") != pl.col("b"))
    if differing_phases.height:
        out.append(("Phases that differ", ["phase", cmp.label_a, cmp.label_b], [list(r) for r in differing_phases.rows()]))
    moved = cmp.counters.filter(pl.col("delta") != 0)
    if moved.height:
        out.append(("Counters", ["counter", "phase", cmp.label_a, cmp.label_b, "delta"],
                    [[r["counter"], r["phase"] or "(total)", str(r["a"]), str(r["b"]), f"{r['delta']:+d}"] for r in moved.iter_rows(named=True)]))
    diff_summary = cmp.summary.filter((pl.col("only_a") + pl.col("only_b") + pl.col("changed")) > 0)
    if diff_summary.height:
        out.append(("Rows per phase and table", ["phase", "table", "kind", f"only {cmp.label_a}", f"only {cmp.label_b}", "changed", "same"],
                    [[str(v) for v in r] for r in diff_summary.rows()]))
    if cmp.rows.height:
        shown = cmp.rows.head(limit)
        rows = [[r["phase"], r["table"], r["kind"], r["id"], r["side"], ", ".join(r["columns"]), r["a"] or "", r["b"] or ""]
                for r in shown.iter_rows(named=True)]
        more = f" (first {limit} of {cmp.rows.height})" if cmp.rows.height > limit else ""
        out.append((f"Differing rows{more}", ["phase", "table", "kind", "id", "side", "columns", cmp.label_a, cmp.label_b], rows))
    return out


def comparison_markdown(cmp: Comparison, limit: int = 50) -> str:
    verdict = "identical" if cmp.identical else f"{cmp.rows.height} differing row(s)"
    parts = [f"# Replay comparison — {cmp.label_a} vs {cmp.label_b} — {verdict}", "",
             f"diff hashes: {cmp.label_a} `{cmp.hash_a[:16]}` · {cmp.label_b} `{cmp.hash_b[:16]}`", ""]
    for title, header, rows in comparison_tables(cmp, limit):
        parts += [f"## {title}", markdown_table(header, rows), ""]
    return "\n".join(parts)


def print_comparison(cmp: Comparison, limit: int = 50) -> None:
    """The comparison as terminal tables."""
    from rich.console import Console
    from rich.table import Table

    console = Console(width=max(120, Console().width))
    verdict = "identical" if cmp.identical else f"{cmp.rows.height} differing row(s)"
    console.print(f"{cmp.label_a} vs {cmp.label_b}: {verdict}  (hashes {cmp.hash_a[:8]} / {cmp.hash_b[:8]})", highlight=False)
    for title, header, rows in comparison_tables(cmp, limit):
        table = Table(title=title)
        for h in header:
            table.add_column(h, overflow="fold")
        for row in rows:
            table.add_row(*row)
        console.print(table)
