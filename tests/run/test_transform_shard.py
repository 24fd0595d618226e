"""A shard's plan is every scope's own plan (SPEC §2 "Scale"): for fleets of 1–60 scopes of different
sizes, previous runs, nested scopes and string-prefix siblings (``org/ac`` beside ``org/acme``), one
pass over the shard gives each scope exactly the diff hash, counters, skips, notes, rows and
quarantine of a run of that scope alone (a shard of one).  What each phase computes is pinned by its
golden cases (tests/transforms/golden/); this checks that scopes never mix inside a shard."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run.transform import transform
from deep_sleep.transforms import ROSTER
from deep_sleep.transforms.config import ConsolidationConfig
from tests.transforms.shard_cases import AS_OF, fleet

SAME = ("counters", "counters_by_phase", "phases_run", "phases_skipped", "rows_changed", "notes", "diff_hash",
        "quarantined", "scope_path", "as_of")


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
