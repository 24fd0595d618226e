"""Reading the run ledger (``consolidation_runs``): one run, or the last runs of a scope or fleet.

The backend of ``deep-sleep report``.  Read-only; one short query per call.

    >>> runs = last_runs(store, "org/acme/brand/b1", limit=5)      # doctest: +SKIP
    >>> print(runs_markdown(runs))                                 # doctest: +SKIP
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from psycopg.rows import dict_row

from deep_sleep.core.errors import InputError
from deep_sleep.core.scope import Scope
from deep_sleep.jobs.errors import LedgerError
from deep_sleep.run.console import markdown_table
from deep_sleep.store.db import Store


@dataclass(frozen=True)
class RunRecord:
    """One ledger row.

    run_id, scope_path, mode ('nightly', 'quick_nap', 'undo', …), as_of, started_at, finished_at.
    status: 'applied', 'failed' or 'undone'.
    counters: every counter (SPEC §3); rows_changed: table → kind → rows that landed.
    conflicts: rows a live writer changed first (for an undo: rows it could not restore).
    diff_hash, snapshot_uri, diff_uri: the diff's content hash and where the run's files are.
    errors: why a run failed.  quarantined: table → reason → rows set aside from the snapshot.
    undo_of: for an undo row, the run it undid.  undone_by: for an undone run, its undo row.
    not_restored: for an undo row, table → kind → reason → rows it could not restore.
    not_undoable: why the run can no longer be undone (its before-images were removed by ``gc``), or None.
    files_removed_at: when ``gc`` removed the run's snapshot and diff directories, or None.
    """

    run_id: str
    scope_path: str
    mode: str
    as_of: datetime
    status: str
    started_at: datetime | None = None
    finished_at: datetime | None = None
    counters: dict[str, int] = field(default_factory=dict)
    rows_changed: dict[str, dict[str, int]] = field(default_factory=dict)
    conflicts: int = 0
    diff_hash: str | None = None
    snapshot_uri: str | None = None
    diff_uri: str | None = None
    errors: list[str] = field(default_factory=list)
    quarantined: dict[str, dict[str, int]] = field(default_factory=dict)
    undo_of: str | None = None
    undone_by: str | None = None
    not_restored: dict[str, Any] = field(default_factory=dict)
    not_undoable: str | None = None
    files_removed_at: datetime | None = None

    @property
    def key_counters(self) -> dict[str, int]:
        """The counters that moved."""
        return {k: int(v) for k, v in self.counters.items() if v}

    @property
    def quarantined_rows(self) -> int:
        return sum(int(n) for reasons in self.quarantined.values() for n in reasons.values())

    @property
    def scope(self) -> str:
        return Scope.parse(self.scope_path).display()


_SELECT = """
SELECT r.run_id::text AS run_id, r.scope_path, r.mode, r.as_of, r.status, r.started_at, r.finished_at,
       r.counters, r.rows_changed, r.conflicts, r.diff_hash, r.snapshot_uri, r.diff_uri, r.errors,
       r.quarantined, r.undo_of::text AS undo_of, u.run_id::text AS undone_by, r.not_restored,
       r.not_undoable, r.files_removed_at
FROM consolidation_runs r
LEFT JOIN consolidation_runs u ON u.undo_of = r.run_id
"""


def _record(row: dict[str, Any]) -> RunRecord:
    return RunRecord(**row)


def parse_run_id(run_id: str) -> str:
    """The canonical text of a run id; a clear error when it is not a UUID."""
    try:
        return str(uuid.UUID(str(run_id)))
    except ValueError:
        raise LedgerError(f"run id {run_id!r} is not a UUID; list recent runs with `deep-sleep report`") from None


_PREFIX = re.compile(r"[0-9a-fA-F-]{4,35}")


def resolve_run_id(store: Store, run_id: str) -> str:
    """The full id of ``run_id`` — a UUID, or an unambiguous prefix of at least 4 characters as
    ``deep-sleep report`` shows them (8).  :class:`LedgerError` when none or several runs match."""
    text = str(run_id).strip().lower()
    if not _PREFIX.fullmatch(text):
        return parse_run_id(text)
    with store.pg() as con:
        rows = [r[0] for r in con.execute(
            "SELECT run_id::text FROM consolidation_runs WHERE run_id::text LIKE %s ORDER BY started_at DESC LIMIT 6",
            (text + "%",))]
    if not rows:
        raise LedgerError(f"no run id starts with {text!r}; list recent runs with `deep-sleep report`")
    if len(rows) > 1:
        raise LedgerError(f"run id prefix {text!r} is ambiguous: it starts {', '.join(rows[:5])}"
                          f"{' …' if len(rows) > 5 else ''}; give more characters")
    return rows[0]


def get_run(store: Store, run_id: str) -> RunRecord:
    """The ledger row of ``run_id`` (a UUID or an unambiguous prefix); :class:`LedgerError` naming it when there is none."""
    rid = resolve_run_id(store, run_id)
    with store.pg() as con, con.cursor(row_factory=dict_row) as cur:
        row = cur.execute(_SELECT + " WHERE r.run_id = %s::uuid", (rid,)).fetchone()
    if row is None:
        raise LedgerError(f"run {rid} is not in the ledger (consolidation_runs); list recent runs with `deep-sleep report`")
    return _record(row)


def run_config(run: RunRecord):
    """The configuration ``run`` ran with (``config.json`` beside its diff): what a decision on it —
    approve, undo — uses, whatever this process's ``--config`` or environment says.  A run that recorded
    none (before this release, a quick nap) gets the current one (:func:`~deep_sleep.transforms.config.load_config`).
    A recorded configuration this version cannot read is a ConfigError naming the run and the file."""
    from deep_sleep.core.errors import ConfigError
    from deep_sleep.run.layout import CONFIG_FILE, read_config
    from deep_sleep.transforms.config import ConsolidationConfig, load_config

    recorded = read_config(run.diff_uri) if run.diff_uri else None
    if recorded is None:
        return load_config()
    try:
        return ConsolidationConfig(**recorded)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"run {run.run_id} recorded a configuration ({run.diff_uri}/{CONFIG_FILE}) this version "
                          f"cannot read: {exc}") from None


def last_runs(store: Store, scope: Scope | str | None = None, limit: int = 20) -> list[RunRecord]:
    """The ``limit`` most recently started runs, newest first; of one exact scope if given.

        >>> [r.status for r in last_runs(store, "org/acme/brand/b1", limit=2)]   # doctest: +SKIP
        ['applied', 'undone']
    """
    if limit < 1:
        raise InputError(f"--limit must be at least 1, got {limit}")
    where, params = "", [limit]
    if scope is not None:
        where, params = " WHERE r.scope_path = %s", [Scope.coerce(scope).path, limit]
    sql = _SELECT + where + " ORDER BY r.started_at DESC, r.run_id LIMIT %s"
    with store.pg() as con, con.cursor(row_factory=dict_row) as cur:
        return [_record(row) for row in cur.execute(sql, params)]


def applied_as_of(store: Store, run_id: str) -> datetime | None:
    """The ``as_of`` the ledger recorded for ``run_id``, or None when the run is unknown."""
    try:
        return get_run(store, run_id).as_of
    except LedgerError:
        return None


# -- rendering -----------------------------------------------------------------------------

def _ts(value: datetime | None) -> str:
    return "" if value is None else value.strftime("%Y-%m-%dT%H:%M:%SZ")


def runs_rows(records: Sequence[RunRecord]) -> tuple[list[str], list[list[str]]]:
    """One row per run: id, scope, mode, as_of, status, the counters that moved, conflicts, diff, quarantined."""
    header = ["run", "scope", "mode", "as_of", "status", "counters", "conflicts", "diff", "quarantined", "note"]
    rows = []
    for r in records:
        note = ""
        if r.undone_by:
            note = f"undone by {r.undone_by[:8]}"
        elif r.undo_of:
            missed = r.conflicts
            note = f"undo of {r.undo_of[:8]}" + (f", {missed} row(s) not restored" if missed else "")
        elif r.errors:
            note = r.errors[0][:80]
        counters = ", ".join(f"{k}={v}" for k, v in r.key_counters.items())
        rows.append([r.run_id[:8], r.scope, r.mode, _ts(r.as_of), r.status, counters or "-", str(r.conflicts),
                     (r.diff_hash or "")[:8], str(r.quarantined_rows), note])
    return header, rows


def runs_markdown(records: Sequence[RunRecord], title: str = "Deep Sleep — last runs") -> str:
    header, rows = runs_rows(records)
    if not rows:
        return f"# {title}\n\n(no runs recorded)\n"
    return f"# {title}\n\n{markdown_table(header, rows)}\n"


def print_runs(records: Sequence[RunRecord], title: str = "Deep Sleep — last runs") -> None:
    """The ledger as a terminal table (full run ids listed below it)."""
    from rich.console import Console
    from rich.table import Table

    header, rows = runs_rows(records)
    table = Table(title=title)
    for h in header:
        table.add_column(h, justify="right" if h in ("conflicts", "quarantined") else "left", overflow="fold")
    for row in rows:
        table.add_row(*row)
    # The terminal's width (80 when not a terminal), at most 120: long cells fold, the table never
    # runs off the screen (issue 13).
    console = Console(width=min(120, Console().width))
    console.print(table)
    for r in records:
        console.print(f"{r.run_id}  {r.scope}  {r.mode} {r.status}", highlight=False)
