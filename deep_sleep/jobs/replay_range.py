"""Replay over a date range (SPEC §6): stored snapshots planned and validated again, writing nothing to the store.

Every stored snapshot of a scope under the runs directory whose ``taken_at`` falls in [start, end]
(:func:`find_snapshots`) is planned and validated again at its run's ``as_of`` (:func:`resolve_as_of`:
the ledger's when a store is given (read only), else the one its ``diff/report.json`` recorded,
else its ``taken_at``); with a second configuration each replay is also compared, A against B
(:func:`deep_sleep.jobs.compare.compare_diffs`).

    >>> results = replay_range(runs, "org/acme", "2026-11-01", "2026-11-30", cfg)   # doctest: +SKIP
    >>> print(range_markdown(results))                                            # doctest: +SKIP
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from deep_sleep.core.diff import Diff
from deep_sleep.core.errors import SnapshotError
from deep_sleep.core.files import write_atomic
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.scope import Scope
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import MANIFEST, Snapshot, iso, manifest_time, utc
from deep_sleep.jobs.compare import Comparison, compare_diffs, comparison_markdown
from deep_sleep.jobs.errors import LedgerError
from deep_sleep.jobs.ledger import get_run
from deep_sleep.run import pipeline
from deep_sleep.run.layout import runs_dir as local_runs_dir
from deep_sleep.run.layout import scope_dir_name
from deep_sleep.run.console import markdown_table
from deep_sleep.store.db import Store
from deep_sleep.transforms.config import ConsolidationConfig

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
            scope_path, taken_at = manifest["scope_path"], manifest_time(mpath, "taken_at", manifest.get("taken_at"))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise SnapshotError(f"{mpath}: unreadable manifest ({exc})") from exc
        match = _RUN_DIR.match(path.resolve().parent.name)
        report_dir = path.resolve().parent / "diff"
        recorded = ConsolidationReport.read(report_dir) if (report_dir / "report.json").is_file() else None
        return cls(path=path, scope_path=scope_path, taken_at=taken_at,
                   run_id=match.group("run_id") if match else None, recorded=recorded)


def find_snapshots(runs_dir: str | Path | None, scope: Scope | str, start: datetime | str | None = None,
                   end: datetime | str | None = None) -> list[StoredSnapshot]:
    """The scope's stored snapshots under ``runs_dir`` (layout of :func:`deep_sleep.run.layout.run_dir`)
    whose ``taken_at`` is within [start, end], oldest first."""
    scope = Scope.coerce(scope)
    base = local_runs_dir(runs_dir) / scope_dir_name(scope)
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
    """Replay one snapshot (no store): :data:`~deep_sleep.run.pipeline.REPLAY` on it as a shard of one,
    the diff and ``report.json`` written to ``out`` if given.  A diff that fails validation gives a
    report with status ``failed`` and the failing checks.  Returns the scope's diff and report."""
    snap = snapshot if isinstance(snapshot, Snapshot) else Snapshot.read(snapshot)
    ctx = pipeline.Context.of(as_of, config, diff_dir=Path(out) if out is not None else None,
                              phases=tuple(phases) if phases else None)
    state = pipeline.run(pipeline.REPLAY, ctx, pipeline.State(shard=Shard.of(snap)))
    return state.transformed.scope_diff(), state.report()


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
