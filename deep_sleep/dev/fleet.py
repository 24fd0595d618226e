"""A fleet of many small scopes, generated in one vectorized pass and bulk-loaded (issue 12's benchmark).

A fleet is ``scopes`` leaf scopes ``org/<tenant>/agent/<agent>`` of ``nodes`` nodes each, 20 to a
tenant.  Generating 100,000 scopes one by one with :func:`deep_sleep.dev.seed.generate` would
take a Python loop per scope (~10 ms each); instead :func:`generate_fleet` builds ``templates``
distinct scopes with that generator (each one a realistic scope in which every phase has work,
see :mod:`deep_sleep.dev.seed`) and replicates them across the fleet with numpy gathers: scope
``i`` is a copy of template ``i % templates`` with its own scope path, tenant and ids (UUID-shaped,
derived from (seed, table, scope index, row index) by a splitmix64 mix, so no two scopes share an
id), and foreign keys (edge ends, access-log and recall node ids) remapped to the copy's ids.

    >>> frames = generate_fleet(FleetSpec(scopes=3, nodes=40, templates=2, now=datetime(2026, 1, 1, tzinfo=UTC)))
    >>> frames["memory_nodes"]["scope_path"].n_unique()
    3
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import polars as pl

from deep_sleep.core.scope import Scope
from deep_sleep.core.tables import TABLES
from deep_sleep.dev.arrays import _h64, _mix64, _uuid_text
from deep_sleep.dev.errors import SeedError
from deep_sleep.dev.seed import SeedSpec, generate, load

log = logging.getLogger(__name__)

# uuid columns that point at a node of the same scope
_NODE_REFS = {"memory_edges": ("source_id", "target_id"), "memory_access_log": ("node_id",),
              "recall_events": ("node_id",)}
SCOPES_PER_TENANT = 20


@dataclass(frozen=True)
class FleetSpec:
    """What fleet to build.  ``now`` None: the wall clock truncated to the second, read once."""

    scopes: int = 1000
    nodes: int = 100
    templates: int = 16
    seed: int = 11
    now: datetime | None = None

    def __post_init__(self) -> None:
        if self.now is None:
            object.__setattr__(self, "now", datetime.now(UTC).replace(microsecond=0))
        for name in ("scopes", "nodes", "templates"):
            if getattr(self, name) < 1:
                raise SeedError(f"FleetSpec.{name} must be >= 1, got {getattr(self, name)}")


def fleet_scope(index: int) -> Scope:
    """The ``index``-th scope of a fleet: ``org/f<tenant>/agent/a<index>``."""
    return Scope.root("org", f"f{index // SCOPES_PER_TENANT:06d}").child("agent", f"a{index:07d}")


def fleet_scopes(spec: FleetSpec) -> list[Scope]:
    return [fleet_scope(i) for i in range(spec.scopes)]


def _scope_columns(n_scopes: int) -> tuple[pl.Series, pl.Series]:
    """(scope_path, tenant_id) of scopes 0..n-1, built without a Python loop per scope."""
    idx = pl.Series("i", np.arange(n_scopes, dtype=np.int64))
    tenant = pl.select(pl.lit("f") + (idx // SCOPES_PER_TENANT).cast(pl.String).str.zfill(6)).to_series()
    path = pl.select(pl.lit("org\x1f") + tenant + pl.lit("\x1fagent\x1fa") + idx.cast(pl.String).str.zfill(7)).to_series()
    return path.alias("scope_path"), tenant.alias("tenant_id")


def _uuids(seed: int, table: str, scope: np.ndarray, row: np.ndarray) -> pl.Series:
    """UUID-shaped text ids of (scope index, row index) pairs: distinct pairs give distinct ids.

    The low word holds ``scope << 24 | row`` as it is (so ids of one table never collide; rows
    < 2^24, scopes < 2^38) under the RFC variant bits; the high word is a splitmix64 mix of it and
    the table (random-looking ids, as the store's own, and distinct across tables)."""
    s, r = scope.astype(np.uint64), row.astype(np.uint64)
    key = (s << np.uint64(24)) | r
    with np.errstate(over="ignore"):
        hi = _mix64(key ^ np.uint64(_h64(seed, "fleet", table)))
    return _uuid_text(hi, key)  # key < 2^62: the variant bits take nothing of it


def _templates(spec: FleetSpec) -> list[dict[str, pl.DataFrame]]:
    return [generate(SeedSpec(tenants=1, scopes_per_tenant=0, nodes_per_scope=spec.nodes,
                              seed=spec.seed * 1000 + k, now=spec.now)) for k in range(spec.templates)]


def _replicate(spec: FleetSpec, table: str, templates: list[dict[str, pl.DataFrame]],
               scopes: np.ndarray, paths: pl.Series, tenants: pl.Series) -> pl.DataFrame:
    """``table``'s rows for the given scope indexes: each a copy of its template's rows."""
    parts = []
    for k, frames in enumerate(templates):
        mine = scopes[scopes % spec.templates == k]
        t = frames[table]
        if not len(mine) or not t.height:
            continue
        node_index = dict(zip(frames["memory_nodes"]["id"].to_list(), range(frames["memory_nodes"].height)))
        rows = np.tile(np.arange(t.height, dtype=np.int64), len(mine))
        owner = np.repeat(mine, t.height)
        copy = t.gather(rows)
        cols = [paths.gather(owner).alias("scope_path"), tenants.gather(owner).alias("tenant_id"),
                pl.Series("_owner", owner)]
        if "id" in t.columns and TABLES[table][0].kind == "uuid":
            cols.append(_uuids(spec.seed, table, owner, rows).alias("id"))
        for ref in _NODE_REFS.get(table, ()):
            local = np.array([node_index.get(v, -1) for v in t[ref].to_list()], dtype=np.int64)[rows]
            ids = _uuids(spec.seed, "memory_nodes", owner, np.where(local < 0, (1 << 23) + rows, local))
            cols.append(pl.when(pl.Series(local >= 0)).then(ids).otherwise(None).alias(ref)
                        if (local < 0).any() else ids.alias(ref))
        parts.append(copy.with_columns(cols))
    if not parts:
        return templates[0][table].clear()
    # in scope order (zero-padded paths: index order is path order), each scope's rows as its template's
    return pl.concat(parts, how="vertical").sort("_owner", maintain_order=True).drop("_owner")


def generate_fleet(spec: FleetSpec, scopes: range | None = None,
                   tables: tuple[str, ...] | None = None) -> dict[str, pl.DataFrame]:
    """The rows of ``tables`` (default: all) for ``scopes`` (default: the whole fleet), as
    :func:`deep_sleep.dev.seed.load` takes them; a pure function of its arguments."""
    chosen = np.arange(spec.scopes, dtype=np.int64) if scopes is None else np.asarray(scopes, dtype=np.int64)
    paths, tenants = _scope_columns(spec.scopes)
    templates = _templates(spec)
    return {table: _replicate(spec, table, templates, chosen, paths, tenants) for table in (tables or TABLES)}


def iter_fleet(spec: FleetSpec, scopes_per_chunk: int = 10_000) -> Iterator[dict[str, pl.DataFrame]]:
    """The fleet in chunks of scopes (bounded memory)."""
    paths, tenants = _scope_columns(spec.scopes)
    templates = _templates(spec)
    for start in range(0, spec.scopes, scopes_per_chunk):
        chosen = np.arange(start, min(spec.scopes, start + scopes_per_chunk), dtype=np.int64)
        yield {table: _replicate(spec, table, templates, chosen, paths, tenants) for table in TABLES}


def seed_fleet(store, spec: FleetSpec, progress=None) -> dict[str, int]:
    """Generate the fleet and load it into ``store``, one table at a time (memory bounded by the
    largest table; one bulk load, with its index rebuild, per table); rows per table.  ``progress``
    (optional) is called with one line per table."""
    t0 = time.perf_counter()
    counts: dict[str, int] = {}
    for table in TABLES:
        t1 = time.perf_counter()
        frame = generate_fleet(spec, tables=(table,))[table]
        t2 = time.perf_counter()
        counts.update(load(store, {table: frame}))
        line = f"{table}: {frame.height:,} rows, generated {t2 - t1:.1f}s, loaded {time.perf_counter() - t2:.1f}s"
        del frame
        log.info("fleet %s", line)
        if progress is not None:
            progress(line)
    log.info("fleet of %d scopes seeded in %.1fs", spec.scopes, time.perf_counter() - t0)
    return counts


__all__ = ["FleetSpec", "fleet_scope", "fleet_scopes", "generate_fleet", "iter_fleet", "seed_fleet"]
