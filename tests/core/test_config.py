"""The configuration machinery of the core layer, on sections it is handed (it never sees the roster)."""

from __future__ import annotations

import pytest
from pydantic import Field

from deep_sleep.core.config import (
    BaseConsolidationConfig,
    GatingConfig,
    PhaseConfig,
    assemble,
    load,
)
from deep_sleep.core.errors import ConfigError


class AlphaConfig(PhaseConfig):
    size: int = Field(2, ge=1)


class BetaConfig(PhaseConfig):
    """No knobs but ``enabled``."""


def test_assemble_puts_the_sections_after_the_top_level_knobs():
    Model = assemble({"alpha": AlphaConfig, "beta": BetaConfig})
    assert list(Model.model_fields) == ["lookback_hours", "quick_nap_interval", "gating", "health", "retention", "llm", "quarantine", "holds", "gate", "alpha", "beta"]
    assert Model.phase_sections() == ["alpha", "beta"]
    got = Model()
    assert got.alpha == AlphaConfig() and got.beta.enabled and got.gating == GatingConfig()
    assert isinstance(got, BaseConsolidationConfig) and got.phase("alpha") is got.alpha


def test_a_section_may_not_hide_a_top_level_knob_nor_be_something_else():
    with pytest.raises(ConfigError, match="phase 'gating' would hide the top-level knob"):
        assemble({"gating": AlphaConfig})
    with pytest.raises(ConfigError, match="not a PhaseConfig subclass"):
        assemble({"alpha": GatingConfig})


def test_asking_for_a_section_that_is_not_there_names_the_sections():
    with pytest.raises(ConfigError, match="no section for phase 'gamma'; phase sections are: alpha, beta"):
        assemble({"alpha": AlphaConfig, "beta": BetaConfig})().phase("gamma")
    with pytest.raises(ConfigError, match="no section for phase 'gating'"):
        assemble({"alpha": AlphaConfig})().phase("gating")


def test_load_names_the_file_and_the_bad_knob(tmp_path, monkeypatch):
    monkeypatch.delenv("DEEP_SLEEP_CONFIG", raising=False)
    Model = assemble({"alpha": AlphaConfig})
    with pytest.raises(ConfigError, match="does not exist"):
        load(Model, tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[alpha\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        load(Model, bad)
    good = tmp_path / "good.toml"
    good.write_text("[alpha]\nsize = 5\n")
    monkeypatch.setenv("DEEP_SLEEP_CONFIG", str(good))
    assert load(Model).alpha.size == 5  # DEEP_SLEEP_CONFIG names the file when no path is given
    monkeypatch.setenv("DEEP_SLEEP_ALPHA__SIZE", "0")
    with pytest.raises(ConfigError, match=r"\(from .*good\.toml\): alpha\.size: Input should be greater than or equal to 1"):
        load(Model)
