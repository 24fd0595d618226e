"""Hand-built shards for the per-scope tests of shard-native phases: rows of several scopes (with
the string-prefix siblings ``org/ac`` and ``org/acme``) in one frame per table, and the check that
a shard run gives each scope exactly what a run of that scope alone gives."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl

from deep_sleep.core import tables
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run.plan import plan, plan_shard
from deep_sleep.transforms.config import ConsolidationConfig

AS_OF = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
AC = "org\x1fac"
ACME = "org\x1facme"
NESTED = "org\x1facme\x1fagent\x1fa1"
DEFAULTS = {"properties": "{}", "metadata": "{}", "importance": 5.0, "layer": "semantic", "version": 1, "weight": 1.0,
            "access_count": 0, "created_at": AS_OF - timedelta(days=1), "updated_at": AS_OF - timedelta(days=1)}
SAME = ("counters", "counters_by_phase", "phases_run", "phases_skipped", "rows_changed", "notes", "diff_hash")


def uid(scope: int, n: int) -> str:
    """A uuid text, distinct per (scope, n) and ordered by n first."""
    return f"00000000-0000-0000-{n:04x}-{scope:012x}"


def frame(table: str, rows: list[dict]) -> pl.DataFrame:
    """Rows of ``table`` (missing columns from DEFAULTS, else null; ``tenant_id`` from ``scope_path``)."""
    cols = tables.columns(table)
    filled = []
    for row in rows:
        row = {**row, "tenant_id": row["scope_path"].split("\x1f")[1]}
        filled.append({c: row.get(c, DEFAULTS.get(c)) for c in cols})
    return tables.conform(table, pl.DataFrame(filled, schema={c: cols[c].dtype for c in cols}))


def shard_of(rows: dict[str, list[dict]], scopes: tuple[str, ...],
             previous: dict[str, datetime] | None = None, *, interleaved: bool = False) -> tuple[Shard, list[Snapshot]]:
    """The shard of ``rows`` (scopes' rows interleaved, in the order given) and each scope's snapshot.
    ``interleaved``: the shard's frames keep that order — not grouped by scope, as a shard's frames
    are after earlier phases' folds."""
    frames = {t: frame(t, r) for t, r in rows.items()}
    previous = previous or {}
    shard = Shard.from_frames({s: previous.get(s) for s in scopes}, AS_OF, frames)
    if interleaved:
        shard = shard.with_frames(frames)
    snaps = [Snapshot(s, AS_OF, previous.get(s), {t: f.filter(pl.col("scope_path") == s) for t, f in frames.items()})
             for s in scopes]
    return shard, snaps


def assert_each_scope_alone(shard: Shard, snaps: list[Snapshot], phase: str | tuple[str, ...],
                            config: ConsolidationConfig | None = None, **kw) -> dict:
    """plan_shard of ``phase`` (or phases) gives every scope the report and diff of its own plan; the reports."""
    config = config or ConsolidationConfig()
    phases = (phase,) if isinstance(phase, str) else tuple(phase)
    got = plan_shard(shard, config, AS_OF, phases=phases, check_rows=False, **kw)
    diffs = got.scope_diffs()
    for snap in snaps:
        alone = plan(snap, config, AS_OF, phases=phases, check_rows=False, **kw)
        for field in SAME:
            assert getattr(got.reports[snap.scope_path], field) == getattr(alone.report, field), (snap.scope_path, field)
        assert diffs[snap.scope_path].content_hash() == alone.diff.content_hash(), snap.scope_path
    return got.reports


def interleaved_shard(rows: dict[str, list[dict]], scopes: tuple[str, ...],
                      previous: dict[str, datetime] | None = None) -> tuple[Shard, list[Snapshot]]:
    """:func:`shard_of` with the frames left interleaved."""
    return shard_of(rows, scopes, previous, interleaved=True)


def of_scope(frame: pl.DataFrame, scope: str) -> pl.DataFrame:
    """The rows of one scope of a diff frame that carries ``scope_path``."""
    return frame.filter(pl.col("scope_path") == scope)
