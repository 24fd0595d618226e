"""A shard's plan is every scope's own plan (SPEC §2 "Scale"): for fleets of 1–60 scopes of different
sizes, previous runs, nested scopes and string-prefix siblings (``org/ac`` beside ``org/acme``), one
pass over the shard gives each scope exactly the diff hash, counters, skips, notes, rows and
quarantine of a run of that scope alone (a shard of one).  What each phase computes is pinned by its
golden cases (tests/transforms/golden/); this checks that scopes never mix inside a shard."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import polars as pl
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deep_sleep.core import tables
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.dev.generate import generate
from deep_sleep.dev.spec import SeedSpec
from deep_sleep.run.transform import transform
from deep_sleep.transforms import ROSTER
from deep_sleep.transforms.config import ConsolidationConfig

AS_OF = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)
SAME = ("counters", "counters_by_phase", "phases_run", "phases_skipped", "rows_changed", "notes", "diff_hash",
        "quarantined", "scope_path", "as_of")


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
    """``n_scopes`` single-scope snapshots: nested org and leaf scopes of several tenants, sizes drawn
    from ``sizes``, half with a previous run, and (from 2 scopes on) ``org/ac`` beside ``org/acme``."""
    rng = random.Random(seed)
    snaps: list[Snapshot] = []
    part = 0
    while len(snaps) < n_scopes:
        spec = SeedSpec(tenants=rng.randint(1, 3), scopes_per_tenant=rng.randint(0, 3), nodes_per_scope=rng.choice(sizes),
                        seed=seed * 100 + part, now=AS_OF - timedelta(minutes=5))
        frames = {t: f for t, f in generate(spec).items() if f.height}
        paths = sorted(frames["memory_nodes"]["scope_path"].unique().to_list())
        if part == 1:  # a string-prefix sibling of an earlier part's org/acme
            frames = _rename(frames, paths[0], "org\x1fac")
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


def assert_shard_equals_scopes(snaps: list[Snapshot], config: ConsolidationConfig | None = None) -> None:
    config = config or ConsolidationConfig()
    shard = Shard.from_snapshots(snaps)
    got = transform(shard, config, AS_OF)
    for snap in snaps:
        alone = transform(snap, config, AS_OF)
        mine = got.reports[snap.scope_path]
        for field in SAME:
            assert getattr(mine, field) == getattr(alone.report, field), (snap.scope_path, field)
        assert got.scope_diff(snap.scope_path).content_hash() == alone.scope_diff().content_hash() == alone.report.diff_hash


def test_every_scope_of_a_shard_gets_its_own_plan():
    assert_shard_equals_scopes(fleet(12, seed=1))


def test_a_shard_of_one_is_the_scope():
    assert_shard_equals_scopes(fleet(1, seed=2))


def test_prefix_siblings_and_nested_scopes_never_mix():
    snaps = fleet(8, seed=3)
    paths = {s.scope_path for s in snaps}
    assert "org\x1fac" in paths and "org\x1facme" in paths
    assert any(p.startswith("org\x1facme\x1f") for p in paths)  # a scope nested under org/acme
    assert_shard_equals_scopes(snaps)


@pytest.mark.parametrize("phase", [p.name for p in ROSTER])
def test_each_phase_alone_on_a_shard(phase):
    snaps = fleet(6, seed=4)
    shard = Shard.from_snapshots(snaps)
    got = transform(shard, ConsolidationConfig(), AS_OF, phases=(phase,))
    for snap in snaps:
        alone = transform(snap, ConsolidationConfig(), AS_OF, phases=(phase,))
        mine = got.reports[snap.scope_path]
        for field in SAME:
            assert getattr(mine, field) == getattr(alone.report, field), (snap.scope_path, field)


@settings(max_examples=4, deadline=None, suppress_health_check=list(HealthCheck))
@given(n=st.integers(1, 60), seed=st.integers(10, 10_000))
def test_random_fleets(n, seed):
    assert_shard_equals_scopes(fleet(n, seed=seed, sizes=(5, 30, 80)))


def test_scope_hashes_cut_from_one_encoding_equal_each_scopes_own_hash():
    snaps = fleet(10, seed=5)
    got = transform(Shard.from_snapshots(snaps), ConsolidationConfig(), AS_OF)
    fast, plain = got.diff.scope_hashes(), got.diff.scope_hashes_plain()
    assert fast == plain and len(fast) >= 5
    counts = got.diff.scope_row_counts()
    assert counts == {s: d.row_counts() for s, d in got.diff.by_scope().items()}
