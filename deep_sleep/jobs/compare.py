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

Replay over a date range (:func:`replay_range`): every stored snapshot of a scope under the
runs directory whose ``taken_at`` falls in [start, end] is planned and validated again at its
run's ``as_of`` — the ledger's when a store is given (read only), else the one its
``diff/report.json`` recorded, else its ``taken_at`` — writing nothing to the store; with a
second configuration each replay is also compared, A against B.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import polars as pl

from deep_sleep.core.diff import KINDS, Diff
from deep_sleep.core.errors import SnapshotError
from deep_sleep.core.files import write_atomic
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.scope import Scope
from deep_sleep.core.snapshot import MANIFEST, Snapshot, iso, utc
from deep_sleep.run import stages
from deep_sleep.run.console import markdown_table
from deep_sleep.run.plan import plan
from deep_sleep.store.db import Store
from deep_sleep.transforms import COUNTERS
from deep_sleep.transforms.config import ConsolidationConfig
from deep_sleep.validation import validate_diff

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
    """Plan one snapshot under two configurations and compare the diffs (no store involved)."""
    a = plan(snapshot, config_a, as_of, tuple(phases) if phases else None)
    b = plan(snapshot, config_b, as_of, tuple(phases) if phases else None)
    return compare_diffs(a.diff, b.diff, report_a=a.report, report_b=b.report, label_a=label_a, label_b=label_b)


def compare_dirs(dir_a: str | Path, dir_b: str | Path) -> Comparison:
    """Compare two diff directories (e.g. two code versions' replays of one snapshot); their
    ``report.json`` files, when present, supply counters and phases."""
    def report(d: Path) -> ConsolidationReport | None:
        return ConsolidationReport.read(d) if (d / "report.json").is_file() else None

    a, b = Path(dir_a), Path(dir_b)
    return compare_diffs(Diff.read(a), Diff.read(b), report_a=report(a), report_b=report(b), label_a=str(a), label_b=str(b))


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


# -- replaying stored snapshots ----------------------------------------------------------------

_RUN_DIR = re.compile(r"^\d{8}T\d{6}\.\d{6}Z_(?P<run_id>[0-9a-f-]{36})$")


@dataclass(frozen=True)
class StoredSnapshot:
    """A snapshot directory kept by a run (``<runs>/<scope>/<as_of>_<run_id>/snapshot``), or anywhere.

    path: the snapshot directory.  scope_path, taken_at: from its manifest.
    run_id: the run that took it (from the run directory's name), if known.
    recorded: that run's ``diff/report.json``, if kept.
    """

    path: Path
    scope_path: str
    taken_at: datetime
    run_id: str | None = None
    recorded: ConsolidationReport | None = None

    @classmethod
    def at(cls, directory: str | Path) -> StoredSnapshot:
        """Describe one snapshot directory from its manifest, without reading its tables."""
        path = Path(directory)
        mpath = path / MANIFEST
        if not mpath.is_file():
            raise SnapshotError(f"{path} is not a snapshot directory: {MANIFEST} is missing")
        try:
            manifest = json.loads(mpath.read_text())
            scope_path, taken_at = manifest["scope_path"], utc(manifest["taken_at"])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise SnapshotError(f"{mpath}: unreadable manifest ({exc})") from exc
        match = _RUN_DIR.match(path.resolve().parent.name)
        report_dir = path.resolve().parent / "diff"
        recorded = ConsolidationReport.read(report_dir) if (report_dir / "report.json").is_file() else None
        return cls(path=path, scope_path=scope_path, taken_at=taken_at,
                   run_id=match.group("run_id") if match else None, recorded=recorded)


def find_snapshots(runs_dir: str | Path | None, scope: Scope | str, start: datetime | str | None = None,
                   end: datetime | str | None = None) -> list[StoredSnapshot]:
    """The scope's stored snapshots under ``runs_dir`` (layout of :func:`deep_sleep.run.stages.run_dir`)
    whose ``taken_at`` is within [start, end], oldest first."""
    scope = Scope.coerce(scope)
    base = stages.runs_dir(runs_dir) / quote(scope.display(), safe="")
    lo, hi = (utc(start) if start else None), (utc(end) if end else None)
    found = []
    for manifest in sorted(base.glob(f"*/snapshot/{MANIFEST}")):
        stored = StoredSnapshot.at(manifest.parent)
        if stored.scope_path != scope.path:
            continue
        if (lo is None or stored.taken_at >= lo) and (hi is None or stored.taken_at <= hi):
            found.append(stored)
    return sorted(found, key=lambda s: (s.taken_at, str(s.path)))


def resolve_as_of(stored: StoredSnapshot, store: Store | None = None) -> tuple[datetime, str, str | None]:
    """(as_of, where it came from, the diff hash the run recorded): the ledger's, else the run's
    ``report.json``'s, else the snapshot's ``taken_at`` (no recorded hash)."""
    if store is not None and stored.run_id:
        from deep_sleep.jobs.ledger import LedgerError, get_run

        try:
            run = get_run(store, stored.run_id)
            return utc(run.as_of), "ledger", run.diff_hash
        except LedgerError:
            pass
    if stored.recorded is not None:
        return utc(stored.recorded.as_of), "report", stored.recorded.diff_hash or None
    return stored.taken_at, "taken_at", None


def replay_snapshot(snapshot: Snapshot | str | Path, config: ConsolidationConfig, as_of: datetime | str, *,
                    phases: Sequence[str] | None = None, out: str | Path | None = None) -> tuple[Diff, ConsolidationReport]:
    """Transform and validate one snapshot (no store); write the diff and ``report.json`` to ``out`` if given.
    A diff that fails validation gives a report with status ``failed`` and the failing checks."""
    snap = snapshot if isinstance(snapshot, Snapshot) else Snapshot.read(snapshot)
    planned = plan(snap, config, utc(as_of), tuple(phases) if phases else None)
    failures = validate_diff(planned.diff, planned.snapshot, config)
    report = planned.report.with_(snapshot_uri=str(snap.source.resolve()) if snap.source else None)
    if failures.height:
        summary = failures.group_by("check", "table", "kind", "phase").len().sort("table", "kind", "check")
        report = report.with_(status="failed", validation=failures.head(200).to_dicts(), errors=report.errors + [
            f"validation failed: {r['check']} — {r['table']}.{r['kind']} from phase {r['phase']}: {r['len']} row(s)"
            for r in summary.iter_rows(named=True)])
    if out is not None:
        planned.diff.write(out)
        report = report.with_(diff_uri=str(Path(out).resolve()))
        report.write(out)
    return planned.diff, report


@dataclass(frozen=True)
class SnapshotReplay:
    """One stored snapshot replayed (and, with a second config, compared).

    snapshot: what was replayed.  as_of, as_of_source: when, and where that came from
    ('ledger', 'report', 'taken_at').  report: the replay under config A.  recorded_hash: the
    diff hash the run recorded, if known.  report_b, comparison: config B's replay and A vs B.
    out: where the diffs, reports and comparison were written, if anywhere.  legacy_hash: the
    replayed diff's hash in the encoding of releases before 2026-11-30 (newline-delimited JSON),
    computed only when the recorded hash differs from the new one.
    """

    snapshot: StoredSnapshot
    as_of: datetime
    as_of_source: str
    report: ConsolidationReport
    recorded_hash: str | None = None
    report_b: ConsolidationReport | None = None
    comparison: Comparison | None = None
    out: Path | None = None
    legacy_hash: str | None = None

    @property
    def reproduces(self) -> bool | None:
        """Whether the replay gave the recorded diff hash (None when none was recorded); a hash
        recorded before 2026-11-30 is compared with :attr:`legacy_hash`."""
        if self.recorded_hash is None:
            return None
        return self.recorded_hash in (self.report.diff_hash, self.legacy_hash)


def replay_stored(stored: StoredSnapshot | str | Path, config: ConsolidationConfig,
                  compare_config: ConsolidationConfig | None = None, *, as_of: datetime | str | None = None,
                  store: Store | None = None, phases: Sequence[str] | None = None, out: str | Path | None = None,
                  labels: tuple[str, str] = ("A", "B")) -> SnapshotReplay:
    """Replay one stored snapshot at ``as_of`` (default: :func:`resolve_as_of`), under ``config`` and,
    if given, ``compare_config``; write ``out/a``, ``out/b`` and ``out/comparison`` when ``out`` is given."""
    stored = stored if isinstance(stored, StoredSnapshot) else StoredSnapshot.at(stored)
    at, source, recorded = resolve_as_of(stored, store)
    if as_of is not None:
        at, source = utc(as_of), "parameter"
    snap = Snapshot.read(stored.path)
    base = Path(out) if out is not None else None
    diff_a, report_a = replay_snapshot(snap, config, at, phases=phases, out=base / "a" if base else None)
    legacy = diff_a.ndjson_content_hash() if recorded and recorded != report_a.diff_hash else None
    report_b = comparison = None
    if compare_config is not None:
        diff_b, report_b = replay_snapshot(snap, compare_config, at, phases=phases, out=base / "b" if base else None)
        comparison = compare_diffs(diff_a, diff_b, report_a=report_a, report_b=report_b, label_a=labels[0], label_b=labels[1])
        if base:
            comparison.write(base / "comparison")
    return SnapshotReplay(snapshot=stored, as_of=at, as_of_source=source, report=report_a, recorded_hash=recorded,
                          report_b=report_b, comparison=comparison, out=base, legacy_hash=legacy)


def replay_range(runs_dir: str | Path | None, scope: Scope | str, start: datetime | str, end: datetime | str,
                 config: ConsolidationConfig, compare_config: ConsolidationConfig | None = None, *,
                 store: Store | None = None, phases: Sequence[str] | None = None,
                 out: str | Path | None = None) -> list[SnapshotReplay]:
    """Replay every stored snapshot of ``scope`` taken within [start, end], oldest first; see :func:`replay_stored`.
    With ``out``, each replay goes to ``out/<run directory name>/`` and a summary to ``out/replay_range.json``.

        >>> [r.reproduces for r in replay_range(runs, "org/acme", "2026-11-01", "2026-11-30", cfg)]  # doctest: +SKIP
        [True, True]
    """
    results = []
    for stored in find_snapshots(runs_dir, scope, start, end):
        target = Path(out) / stored.path.resolve().parent.name if out is not None else None
        results.append(replay_stored(stored, config, compare_config, store=store, phases=phases, out=target))
    if out is not None:
        Path(out).mkdir(parents=True, exist_ok=True)
        write_atomic(Path(out) / "replay_range.json", json.dumps([replay_summary(r) for r in results], indent=2, default=str) + "\n")
    return results


def replay_summary(r: SnapshotReplay) -> dict[str, Any]:
    """The JSON-able gist of one replay (what the flow returns and ``replay_range.json`` holds)."""
    out = {
        "snapshot": str(r.snapshot.path), "run_id": r.snapshot.run_id, "taken_at": iso(r.snapshot.taken_at),
        "as_of": iso(r.as_of), "as_of_source": r.as_of_source, "status": r.report.status, "diff_hash": r.report.diff_hash,
        "recorded_hash": r.recorded_hash, "reproduces": r.reproduces,
        "counters": {k: v for k, v in r.report.counters.items() if v}, "errors": r.report.errors,
        "out": str(r.out) if r.out else None,
    }
    if r.comparison is not None:
        out["comparison"] = {"identical": r.comparison.identical, "differing_rows": r.comparison.rows.height,
                             "hash_b": r.comparison.hash_b, "counter_deltas": r.comparison.counter_deltas()}
    return out


def range_rows(results: Sequence[SnapshotReplay]) -> tuple[list[str], list[list[str]]]:
    """One row per replayed snapshot."""
    compared = any(r.comparison is not None for r in results)
    header = ["taken_at", "as_of", "from", "status", "diff", "recorded", "reproduces", "counters"]
    header += ["rows differing", "counter deltas"] if compared else []
    rows = []
    for r in results:
        counters = ", ".join(f"{k}={v}" for k, v in r.report.counters.items() if v) or "-"
        row = [iso(r.snapshot.taken_at) or "", iso(r.as_of) or "", r.as_of_source, r.report.status, r.report.diff_hash[:8],
               (r.recorded_hash or "")[:8], {None: "n/a", True: "yes", False: "NO"}[r.reproduces], counters]
        if compared:
            c = r.comparison
            row += ["", ""] if c is None else [str(c.rows.height), ", ".join(f"{k}={v:+d}" for k, v in c.counter_deltas().items()) or "-"]
        rows.append(row)
    return header, rows


def range_markdown(results: Sequence[SnapshotReplay], title: str = "Deep Sleep replay") -> str:
    header, rows = range_rows(results)
    parts = [f"# {title}", "", markdown_table(header, rows) if rows else "(no stored snapshots in range)", ""]
    for r in results:
        if r.comparison is not None and not r.comparison.identical:
            body = comparison_markdown(r.comparison).split("\n", 2)[2].replace("\n## ", "\n### ")
            parts += [f"## Snapshot taken {iso(r.snapshot.taken_at)} (as_of {iso(r.as_of)})", body]
    return "\n".join(parts)
