"""Hand-built shards for the per-scope tests of the phases (``test_<phase>_shard.py``): rows of
several scopes (with the string-prefix siblings ``org/ac`` and ``org/acme``, and a nested scope) and
the one differential check that the plan of a shard of many gives each scope exactly what the plan
of a shard of that scope alone (``Shard.of(snapshot)``) gives.

Two ways to build the input: rows of every scope in one list per table (:func:`shard_of`, rows name
their ``scope_path``), or one single-scope :class:`Snapshot` per scope (:func:`scope_snapshot` from
row dicts, :func:`snapshot_of` from frames such as :func:`nodes` / :func:`edges`), then
:func:`each_scope_alone`.  :func:`fleet` generates random fleets of single-scope snapshots."""

from __future__ import annotations

import random
import uuid
from datetime import UTC, datetime, timedelta

import polars as pl
from deep_sleep.transforms.config import ConsolidationConfig

from deep_sleep.core import tables
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.dev.generate import generate
from deep_sleep.dev.spec import SeedSpec
from deep_sleep.run.transform import Transformed, transform

AS_OF = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
AC = "org\x1fac"
ACME = "org\x1facme"
NESTED = "org\x1facme\x1fagent\x1fa1"
DEFAULTS = {"properties": "{}", "metadata": "{}", "importance": 5.0, "layer": "semantic", "version": 1, "weight": 1.0,
            "access_count": 0, "created_at": AS_OF - timedelta(days=1), "updated_at": AS_OF - timedelta(days=1)}
OLD = AS_OF - timedelta(days=30)
#: Column defaults of :func:`scope_frame` (older rows than :data:`DEFAULTS`, and access-log rows are reads).
SCOPE_DEFAULTS = {**DEFAULTS, "kind": "read", "created_at": AS_OF - timedelta(days=10),
                  "updated_at": AS_OF - timedelta(days=10)}
#: The report fields a shard run must give each scope exactly as its own run does.
SAME = ("counters", "counters_by_phase", "phases_run", "phases_skipped", "rows_changed", "notes", "diff_hash",
        "quarantined", "scope_path", "as_of")


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


def assert_plan_is_each_scope_alone(got: Transformed, snaps: list[Snapshot], config: ConsolidationConfig,
                                    phases: tuple[str, ...] | list[str] | None = None, **kw) -> None:
    """``got`` (the plan of a shard holding every scope of ``snaps``) gives every scope the report
    fields (:data:`SAME`), diff, clean snapshot and quarantined rows of the plan of a shard of that
    scope alone (``kw``: the rest of :func:`plan`'s arguments, as ``got`` was planned)."""
    assert set(got.shard.scope_paths) == {s.scope_path for s in snaps}
    for snap in snaps:
        s = snap.scope_path
        alone = transform(Shard.of(snap), config, AS_OF, phases=phases, **kw)
        assert alone.shard.scope_paths == (s,)
        for field in SAME:
            assert getattr(got.reports[s], field) == getattr(alone.report, field), (s, field)
        assert got.scope_diff(s).content_hash() == alone.scope_diff().content_hash() == got.reports[s].diff_hash, s
        assert got.scope_quarantined(s).equals(alone.scope_quarantined()), s
        assert got.scope_snapshot(s).held_nodes == alone.scope_snapshot().held_nodes, s


def _same_as_alone(shard: Shard, snaps: list[Snapshot], phases: tuple[str, ...], config: ConsolidationConfig | None,
                   check_rows: bool, **kw) -> Transformed:
    """The plan of ``phases`` on ``shard``, after asserting that every scope of ``snaps`` got the
    report fields (:data:`SAME`) and diff of the plan of a shard of that scope alone."""
    config = config or ConsolidationConfig()
    got = transform(shard, config, AS_OF, phases=phases, check_rows=check_rows, **kw)
    assert_plan_is_each_scope_alone(got, snaps, config, phases, check_rows=check_rows, **kw)
    return got


def assert_each_scope_alone(shard: Shard, snaps: list[Snapshot], phase: str | tuple[str, ...],
                            config: ConsolidationConfig | None = None, **kw) -> dict:
    """The plan of ``phase`` (or phases) on ``shard`` gives every scope the report and diff of the plan
    of a shard of that scope alone; the reports."""
    phases = (phase,) if isinstance(phase, str) else tuple(phase)
    return _same_as_alone(shard, snaps, phases, config, False, **kw).reports


def each_scope_alone(snaps: list[Snapshot], phase: str, config: ConsolidationConfig | None = None,
                     check_rows: bool = True, **kw) -> Transformed:
    """The plan of ``phase`` on the shard of ``snaps``, after asserting that every scope got exactly
    the report fields and diff of the plan of a shard of that scope alone."""
    return _same_as_alone(Shard.from_snapshots(snaps), snaps, (phase,), config, check_rows, **kw)


def interleaved_shard(rows: dict[str, list[dict]], scopes: tuple[str, ...],
                      previous: dict[str, datetime] | None = None) -> tuple[Shard, list[Snapshot]]:
    """:func:`shard_of` with the frames left interleaved."""
    return shard_of(rows, scopes, previous, interleaved=True)


def of_scope(frame: pl.DataFrame, scope: str) -> pl.DataFrame:
    """The rows of one scope of a diff frame that carries ``scope_path``."""
    return frame.filter(pl.col("scope_path") == scope)


def nid(n: int) -> str:
    """A uuid text numbered ``n``."""
    return f"00000000-0000-0000-0000-{n:012d}"


def new_id() -> str:
    return str(uuid.uuid4())


def ago(**delta: float) -> datetime:
    return AS_OF - timedelta(**delta)


def scope_frame(table: str, scope: str, rows: list[dict]) -> pl.DataFrame:
    """Rows of one scope's ``table``; columns not given take :data:`SCOPE_DEFAULTS` (or null); a node
    without a label is labelled by its id's last digits."""
    cols = tables.columns(table)
    base = {**SCOPE_DEFAULTS, "scope_path": scope, "tenant_id": scope.split("\x1f")[1]}
    filled = [{c: row.get(c, base.get(c)) for c in cols} for row in rows]
    if table == "memory_nodes":
        for row in filled:
            row["label"] = row["label"] or f"n{row['id'][-4:]}"
    return tables.conform(table, pl.DataFrame(filled, schema={c: cols[c].dtype for c in cols}))


def scope_snapshot(scope: str, previous_run_as_of: datetime | None = None, **rows: list[dict]) -> Snapshot:
    """A single-scope snapshot of row dicts per table (:func:`scope_frame`)."""
    return Snapshot(scope, AS_OF, previous_run_as_of, {t: scope_frame(t, scope, r) for t, r in rows.items()})


def snapshot_of(scope: str, previous_run_as_of: datetime | None = None, **frames: pl.DataFrame) -> Snapshot:
    """A single-scope snapshot of frames per table."""
    return Snapshot(scope, AS_OF, previous_run_as_of, {name: tables.conform(name, f) for name, f in frames.items()})


def nodes(scope: str, rows: list[dict]) -> pl.DataFrame:
    """Semantic nodes of ``scope`` with fresh ids: each row needs ``label``; the rest defaults (old, importance 5)."""
    base = {"scope_path": scope, "tenant_id": scope.split("\x1f")[1], "layer": "semantic", "properties": "{}",
            "importance": 5.0, "access_count": 0, "created_at": OLD, "updated_at": OLD, "version": 1}
    return tables.conform("memory_nodes", pl.DataFrame([{"id": new_id(), **base, **r} for r in rows]))


def edges(scope: str, rows: list[dict]) -> pl.DataFrame:
    """Edges of ``scope`` with fresh ids: each row needs ``source_id`` and ``target_id``."""
    base = {"scope_path": scope, "tenant_id": scope.split("\x1f")[1], "relation": "RELATED_TO", "weight": 1.0,
            "properties": "{}", "created_at": OLD, "updated_at": OLD, "valid_from": OLD, "version": 1}
    return tables.conform("memory_edges", pl.DataFrame([{"id": new_id(), **base, **r} for r in rows]))


def rows(got: Transformed, scope: str, table: str, kind: str) -> pl.DataFrame:
    """One scope's ``kind`` rows of ``table`` in the shard's diff (single-scope form), by id."""
    frame = got.scope_diff(scope).table(table).frames()[kind]
    return frame.sort("id") if frame.height else frame


def _rename(frames: dict[str, pl.DataFrame], old: str, new: str) -> dict[str, pl.DataFrame]:
    tenant = new.split("\x1f")[1]
    out = {}
    for name, f in frames.items():
        cols = [pl.when(pl.col("scope_path") == old).then(pl.lit(new)).otherwise(pl.col("scope_path")).alias("scope_path")]
        if "tenant_id" in f.columns:
            cols.append(pl.when(pl.col("scope_path") == old).then(pl.lit(tenant)).otherwise(pl.col("tenant_id")).alias("tenant_id"))
        out[name] = f.with_columns(cols)
    return out


def fleet(n_scopes: int, seed: int, sizes: tuple[int, ...] = (20, 60, 150)) -> list[Snapshot]:
    """``n_scopes`` single-scope snapshots taken at :data:`AS_OF`: nested org and leaf scopes of
    several tenants, sizes drawn from ``sizes``, half with a previous run, and (from 2 scopes on)
    ``org/ac`` beside ``org/acme`` (string-prefix siblings)."""
    rng = random.Random(seed)
    snaps: list[Snapshot] = []
    part = 0
    while len(snaps) < n_scopes:
        spec = SeedSpec(tenants=rng.randint(1, 3), scopes_per_tenant=rng.randint(0, 3), nodes_per_scope=rng.choice(sizes),
                        seed=seed * 100 + part, now=AS_OF - timedelta(minutes=5))
        frames = {t: f for t, f in generate(spec).items() if f.height}
        paths = sorted(frames["memory_nodes"]["scope_path"].unique().to_list())
        if part == 1:  # a string-prefix sibling of an earlier part's org/acme
            frames = _rename(frames, paths[0], AC)
            paths = sorted(frames["memory_nodes"]["scope_path"].unique().to_list())
        elif part > 1:  # keep the scopes of every part distinct
            for p in paths:
                frames = _rename(frames, p, p.replace("org\x1f", f"org\x1fp{part}", 1))
            paths = sorted(frames["memory_nodes"]["scope_path"].unique().to_list())
        taken = {s.scope_path for s in snaps}
        for p in paths:
            if len(snaps) == n_scopes:
                break
            if p in taken:  # part 1 keeps only its org/ac
                continue
            mine = {t: tables.conform(t, f.filter(pl.col("scope_path") == p)) for t, f in frames.items()}
            prev = AS_OF - timedelta(hours=rng.choice([2, 12, 30])) if rng.random() < 0.5 else None
            snaps.append(Snapshot(p, AS_OF, prev, mine))
        part += 1
    ids = pl.concat([s.table("memory_nodes").select("id") for s in snaps])
    assert ids.get_column("id").is_unique().all()
    return snaps
