"""Errors raised on purpose are of the family: bad input is an ``InputError`` (still a
``ValueError``) naming the input; a phase that breaks its contract is a ``PhaseError``."""

from __future__ import annotations

import polars as pl
import pytest
from deep_sleep.transforms import roster
from deep_sleep.transforms.errors import PhaseError

from deep_sleep.core import tables
from deep_sleep.core.embedding import HashingEmbedder
from deep_sleep.core.errors import ConfigError, DeepSleepError, InputError
from deep_sleep.core.snapshot import Snapshot, utc


@pytest.mark.parametrize("call, error, named", [
    (lambda: utc("yesterday"), InputError, "'yesterday'"),
    (lambda: tables.columns("memory_notes"), InputError, "'memory_notes'"),
    (lambda: Snapshot(scope_path="org\x1fa", taken_at=utc("2026-11-20T03:00:00Z")).table("memory_notes"), InputError, "'memory_notes'"),
    (lambda: tables.conform("memory_nodes", pl.DataFrame({"importance": ["high"]})), InputError, "memory_nodes.importance"),
    (lambda: HashingEmbedder(dim=1), InputError, "dim"),
    (lambda: roster(["strengthen", "dream"]), ConfigError, "dream"),
])
def test_bad_input_is_an_input_error_naming_it(call, error, named):
    with pytest.raises(error) as caught:
        call()
    assert isinstance(caught.value, DeepSleepError) and isinstance(caught.value, ValueError)
    assert named in str(caught.value)
    assert not caught.value.transient


def test_a_bad_work_mem_setting_is_a_config_error(monkeypatch):
    from deep_sleep.run.apply import apply_work_mem

    monkeypatch.setenv("DEEP_SLEEP_APPLY_WORK_MEM", "lots")
    with pytest.raises(ConfigError, match="DEEP_SLEEP_APPLY_WORK_MEM='lots'"):
        apply_work_mem()


def test_a_phase_asking_for_an_unknown_argument_is_a_phase_error():
    from deep_sleep.transforms import Phase
    from deep_sleep.transforms.config import ConsolidationConfig

    from deep_sleep.run.transform import _arguments
    from deep_sleep.transforms.strengthen import StrengthenConfig

    def strengthen(snapshot, weather):  # a real phase's name (its config section exists), an argument nobody offers
        raise AssertionError("not called")

    snap = Snapshot(scope_path="org\x1fa", taken_at=utc("2026-11-20T03:00:00Z"))
    with pytest.raises(PhaseError, match="strengthen asks for \\['weather'\\]"):
        _arguments(Phase("1", strengthen, StrengthenConfig, ()), snap, ConsolidationConfig(), snap.taken_at, snap)
