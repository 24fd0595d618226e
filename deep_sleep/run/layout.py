"""Where a run's files go, and how one scope is read back out of them (SPEC §8).

A run (a shard of scopes; a single scope is a shard of one) keeps a directory::

    <runs>/<scope as kind%2Fid…>/<as_of>_<id>/     a shard of one (deep-sleep run, a nightly shard of one)
    <runs>/_shards/<as_of>_<id>/                  a shard of many scopes (the nightly)
        snapshot/   manifest.json + <table>.parquet (a shard's rows sorted by scope, every scope listed
                    in the manifest; a shard of one is also a valid single-scope snapshot)
        diff/       a shard of one: report.json + <table>.<kind>.parquet (the single-scope layout);
                    a shard of many: reports.parquet (one row per scope: scope_path, run_id, status,
                    diff_hash, report JSON) + <table>.<kind>.parquet (every scope's rows, each with
                    scope_path); both: [quarantine.parquet, validation.parquet, preview.parquet, held/]

The runs directory may be an object-store URL (``s3://…``): a run is staged in a local directory and
published there (:func:`publish`).  :func:`read_scope_diff`, :func:`read_scope_report` and
:func:`read_scope_snapshot` read one scope out of either layout, local or remote.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from urllib.parse import quote

import polars as pl

from deep_sleep.core import files
from deep_sleep.core.diff import Diff
from deep_sleep.core.errors import InputError, SnapshotError
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.scope import Scope
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot, utc

REPORTS_FILE = "reports.parquet"
QUARANTINE_FILE = "quarantine.parquet"
VALIDATION_FILE = "validation.parquet"
DEFAULT_RUNS_DIR = Path(".deep_sleep") / "runs"


def runs_location(value: str | Path | None = None) -> str:
    """The runs directory as given (``value``, else ``$DEEP_SLEEP_RUNS_DIR``, else ``.deep_sleep/runs``):
    a local path, or an object-store URL kept whole (``s3://bucket/runs``; ``Path`` would fold its
    ``//``).  The nightly, ``gc`` and the readers of a run's files take either."""
    return str(value or os.environ.get("DEEP_SLEEP_RUNS_DIR") or DEFAULT_RUNS_DIR)


def runs_dir(value: str | Path | None = None) -> Path:
    """The runs directory as a local path (:func:`runs_location`).  An object-store URL is refused by
    name: the commands that write through this (``run``, ``plan``, the one-scope flow, ``replay-range``)
    keep their files on local disk; only the nightly stages and publishes to a URL."""
    location = runs_location(value)
    if files.is_remote(location):
        raise InputError(f"runs directory {location} is an object-store URL; this command reads and writes a local "
                         "runs directory — give a local path (--runs-dir / DEEP_SLEEP_RUNS_DIR), or use the nightly, "
                         "which stages each shard locally and publishes it to the URL")
    return files.local_path(location)


#: A run directory's scope folder name is at most this many bytes (file systems allow 255).
MAX_SCOPE_DIR_BYTES = 200


def scope_dir_name(scope: Scope | str) -> str:
    """The folder of a scope's runs: its display (``kind/id…``) URL-quoted, so two scopes never share
    one and ``/`` in an id stays one level.  A name over :data:`MAX_SCOPE_DIR_BYTES` (a deep scope
    of long or non-ASCII ids) is cut and ends with a hash of the whole, so it stays distinct."""
    name = quote(Scope.coerce(scope).display(), safe="")
    if len(name.encode()) <= MAX_SCOPE_DIR_BYTES:
        return name
    import hashlib

    return name[: MAX_SCOPE_DIR_BYTES - 17] + "~" + hashlib.sha256(name.encode()).hexdigest()[:16]


def _stamp(as_of: datetime) -> str:
    return utc(as_of).strftime("%Y%m%dT%H%M%S.%fZ")


def run_location(runs: str | Path | None, scopes: list[str] | tuple[str, ...], as_of: datetime, run_id: str) -> str:
    """Where a run's directory goes: a shard of one under its scope (``<runs>/<scope as kind/id…,
    URL-quoted>/<as_of>_<id>``), a shard of many under ``<runs>/_shards/<as_of>_<id>`` — a local path
    or a URL, as the runs directory is."""
    base = runs_location(runs)
    if len(scopes) == 1:
        return files.join(base, scope_dir_name(Scope.parse(scopes[0])), f"{_stamp(as_of)}_{run_id}")
    return files.join(base, "_shards", f"{_stamp(as_of)}_{run_id}")


def run_dir(runs: str | Path | None, scope: Scope, as_of: datetime, run_id: str) -> Path:
    """A single scope's run directory on local disk (:func:`run_location`)."""
    return runs_dir(runs) / scope_dir_name(scope) / f"{_stamp(as_of)}_{run_id}"


def publish(snapshot_dir: Path | None, diff_dir: Path | None, location: str) -> None:
    """Copy a run's snapshot and diff directories to ``location/snapshot`` and ``location/diff``
    (``s3://…``, ``gs://…``, ``file://…``): workers on other machines share no disk."""
    for local, part in ((snapshot_dir, "snapshot"), (diff_dir, "diff")):
        if local is not None and local.is_dir():
            files.publish_dir(local, files.join(location, part))


# -- the run's configuration ------------------------------------------------------------------------
#: The whole configuration a run ran with, beside its diff (``<diff>/config.json``): what an approval or
#: an undo of the run decides with (``meta_nodes.max_members``, the holds, the embedder…).
CONFIG_FILE = "config.json"


def write_config(out: Path, config) -> None:
    """``config`` (a configuration model) as ``out/config.json`` (every knob, JSON; written atomically)."""
    out.mkdir(parents=True, exist_ok=True)
    tmp = out / f".{CONFIG_FILE}.tmp"
    tmp.write_text(json.dumps(config.model_dump(mode="json"), sort_keys=True, indent=1) + "\n", encoding="utf-8")
    tmp.replace(out / CONFIG_FILE)


def read_config(directory: str | Path) -> dict | None:
    """The configuration a run recorded beside its diff (a URL is fetched first), None when it recorded
    none (runs of earlier releases, the quick nap) or its files are gone."""
    try:
        path = files.fetch_dir(directory) / CONFIG_FILE
        if not path.is_file():
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, InputError):
        return None
    return data if isinstance(data, dict) else None


# -- reports -------------------------------------------------------------------------------------
def write_reports(out: Path, reports: dict[str, ConsolidationReport]) -> None:
    """A shard of one's ``report.json``, or a shard of many's ``reports.parquet`` (written atomically)."""
    if len(reports) == 1:
        (report,) = reports.values()
        report.write(out)
        return
    rows = [{"scope_path": s, "run_id": r.run_id, "status": r.status, "diff_hash": r.diff_hash,
             "report": json.dumps(r.to_dict(), sort_keys=True)} for s, r in sorted(reports.items())]
    frame = pl.DataFrame(rows, schema={"scope_path": pl.String, "run_id": pl.String, "status": pl.String,
                                       "diff_hash": pl.String, "report": pl.String})
    tmp = out / f".{REPORTS_FILE}.tmp"
    frame.write_parquet(tmp)
    tmp.replace(out / REPORTS_FILE)


def is_shard_diff(directory: str | Path) -> bool:
    return (files.fetch_dir(directory) / REPORTS_FILE).is_file()


def read_scope_report(directory: str | Path, scope_path: str | None = None) -> ConsolidationReport:
    """One scope's report out of a diff directory (a shard's: ``scope_path`` is required; a URL is
    fetched first, :func:`deep_sleep.core.files.fetch_dir`)."""
    src = files.fetch_dir(directory)
    if not is_shard_diff(src):
        return ConsolidationReport.read(src)
    if scope_path is None:
        raise InputError(f"{src} holds the diffs of many scopes; name one (--scope)")
    rows = pl.scan_parquet(src / REPORTS_FILE).filter(pl.col("scope_path") == scope_path).collect()
    if not rows.height:
        raise SnapshotError(f"{src}: no report of scope {Scope.parse(scope_path)} in {REPORTS_FILE}")
    return ConsolidationReport.from_dict(json.loads(rows.item(0, "report")))


def read_scope_diff(directory: str | Path, scope_path: str | None = None) -> Diff:
    """One scope's diff out of a diff directory, as a run of that scope alone wrote it (no
    ``scope_path`` on updates and deletes; a URL is fetched first)."""
    src = files.fetch_dir(directory)
    if not is_shard_diff(src):
        return Diff.read(src)
    if scope_path is None:
        raise InputError(f"{src} holds the diffs of many scopes; name one (--scope)")
    shard = Diff.read(src, where=pl.col("scope_path") == scope_path)
    return shard.by_scope((scope_path,)).get(scope_path, Diff.empty())


def read_scope_snapshot(directory: str | Path, scope_path: str | None = None) -> Snapshot:
    """One scope's snapshot out of a snapshot directory (a shard's or a single scope's; a URL is fetched first)."""
    directory = files.fetch_dir(directory)
    shard = Shard.read(directory)
    if scope_path is None:
        if len(shard.scope_paths) != 1:
            raise InputError(f"{directory} holds {len(shard.scope_paths)} scopes; name one (--scope)")
        scope_path = shard.scope_paths[0]
    return replace(shard.scope(scope_path), source=Path(directory))


__all__ = ["CONFIG_FILE", "write_config", "read_config", "REPORTS_FILE", "QUARANTINE_FILE", "VALIDATION_FILE", "DEFAULT_RUNS_DIR", "runs_location", "runs_dir", "scope_dir_name",
           "run_location", "run_dir", "publish", "write_reports", "is_shard_diff", "read_scope_report",
           "read_scope_diff", "read_scope_snapshot"]
