"""Configuration machinery: the knobs that belong to no phase, the base of every phase's knobs, and
the loader.

Each phase declares its own knobs next to its function (``class StrengthenConfig(PhaseConfig)`` in
``transforms/strengthen.py``); the whole configuration of a run, ``ConsolidationConfig``, is
assembled from the roster one layer up (:mod:`deep_sleep.transforms.config`) with
:func:`assemble` — this layer cannot know the phases.

Sources, later wins: defaults < TOML file (``--config FILE`` or ``DEEP_SLEEP_CONFIG``) <
environment (``DEEP_SLEEP_<SECTION>__<KNOB>``, e.g. ``DEEP_SLEEP_STRENGTHEN__INCREMENT=0.75``)
< explicit overrides (a flow parameter or keyword arguments).

    >>> class ToyConfig(PhaseConfig):
    ...     depth: int = 3
    >>> Toy = assemble({"toy": ToyConfig})
    >>> Toy().toy.depth, Toy().lookback_hours
    (3, 24.0)
    >>> load(Toy, overrides={"toy": {"depth": 5}}).toy.depth
    5
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from deep_sleep.core.errors import ConfigError
from deep_sleep.core.holds_config import HoldsConfig
from deep_sleep.core.llm_config import LlmConfig
from deep_sleep.core.quarantine_config import QuarantineConfig


class PhaseConfig(BaseModel):
    """The knobs of one phase: a phase module subclasses this next to its function.  Every phase
    can be turned off (``enabled``); unknown knobs are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    enabled: bool = True


class GatingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    min_interval_hours: float = Field(24, ge=0)
    min_sessions: int = Field(20, ge=1)


class HealthConfig(BaseModel):
    """The thresholds of the run-health alerts."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    enabled: bool = True
    idle_nights: int = Field(3, ge=1)
    max_conflict_rate: float = Field(0.20, ge=0, le=1)
    quarantine_jump_factor: float = Field(2.0, ge=1)
    quarantine_jump_min: int = Field(10, ge=1)
    gated_factor: float = Field(2.0, ge=1)
    fail_nightly: bool = Field(True, description="the nightly exits 1 (flow run not Completed) when an alert fires")


class RetentionConfig(BaseModel):
    """What the nightly removes after its run (``deep-sleep gc`` by hand): run directories and archive
    rows older than ``keep_days`` (None: keep everything).  What a still-undoable run needs is kept
    unless ``force`` (the run is then marked not undoable)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    keep_days: float | None = Field(None, ge=0)
    force: bool = False


class GateConfig(BaseModel):
    """The recall-quality gate (SPEC §9, :mod:`deep_sleep.run.gate`): before apply, up to
    ``max_queries`` of the scope's used recall queries are replayed against the scope before and
    after the diff; a drop of recall@``k`` of the used memories by more than ``max_drop_pp``
    percentage points fails the gate (its destructive rows are then held)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    enabled: bool = True
    k: int = Field(10, ge=1)
    max_queries: int = Field(50, ge=1)
    max_drop_pp: float = Field(2.0, ge=0)


class BaseConsolidationConfig(BaseSettings):
    """The knobs of a run that belong to no phase; :func:`assemble` adds one section per phase.
    Frozen: build a new one to change it."""

    model_config = SettingsConfigDict(
        env_prefix="DEEP_SLEEP_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    lookback_hours: float = Field(24, gt=0)
    quick_nap_interval: int = Field(10, ge=1)
    gating: GatingConfig = GatingConfig()
    health: HealthConfig = HealthConfig()
    retention: RetentionConfig = RetentionConfig()
    llm: LlmConfig = LlmConfig()  # optional Claude summaries of phases 4 and 10 (SPEC §7)
    quarantine: QuarantineConfig = QuarantineConfig()
    holds: HoldsConfig = HoldsConfig()  # rows that wait for approval (SPEC §9)
    gate: GateConfig = GateConfig()

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings)  # explicit values beat the environment

    def phase(self, name: str) -> PhaseConfig:
        """The section of phase ``name``."""
        section = getattr(self, name, None)
        if not isinstance(section, PhaseConfig):
            raise ConfigError(f"the configuration has no section for phase {name!r}; "
                              f"phase sections are: {', '.join(self.phase_sections())}")
        return section

    @classmethod
    def phase_sections(cls) -> list[str]:
        """The names of the phase sections, in roster order."""
        return [name for name, f in cls.model_fields.items()
                if isinstance(f.annotation, type) and issubclass(f.annotation, PhaseConfig)]


C = TypeVar("C", bound=BaseConsolidationConfig)


def assemble(sections: Mapping[str, type[PhaseConfig]], *, name: str = "ConsolidationConfig",
             module: str | None = None, doc: str | None = None) -> type[BaseConsolidationConfig]:
    """The configuration model with one section per phase (``sections``: phase name → its
    :class:`PhaseConfig` subclass, in roster order), each defaulting to its knobs' defaults, after
    the non-phase knobs of :class:`BaseConsolidationConfig`."""
    top = set(BaseConsolidationConfig.model_fields)
    for section, model in sections.items():
        if section in top:
            raise ConfigError(f"phase {section!r} would hide the top-level knob {section!r}; rename the phase")
        if not (isinstance(model, type) and issubclass(model, PhaseConfig)):
            raise ConfigError(f"the config of phase {section!r} is {model!r}, not a PhaseConfig subclass")
    fields: dict[str, Any] = {section: (model, model()) for section, model in sections.items()}
    return create_model(name, __base__=BaseConsolidationConfig, __module__=module or __name__,
                        __doc__=doc or BaseConsolidationConfig.__doc__, **fields)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load(model: type[C], path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> C:
    """``model`` from defaults < TOML file < environment < ``overrides``.  Errors name the bad knob."""
    path = path or os.environ.get("DEEP_SLEEP_CONFIG")
    values: dict[str, Any] = {}
    if path:
        p = Path(path)
        try:
            values = tomllib.loads(p.read_text())
        except FileNotFoundError:
            raise ConfigError(f"config file {p} does not exist") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config file {p} is not valid TOML: {exc}") from exc
    try:
        env_only = model().model_dump(exclude_defaults=True)
        merged = _merge(_merge(values, env_only), overrides or {})
        return model(**merged)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        src = f" (from {path})" if path else ""
        raise ConfigError(f"invalid configuration{src}: {problems}") from exc


def work_mem_size(value: str | None, variable: str, default: str) -> str:
    """``value`` (the environment variable ``variable``) as a PostgreSQL ``work_mem`` size such as
    ``256MB``, ``default`` when unset; a :class:`ConfigError` naming the variable otherwise."""
    value = (default if value is None else value).strip()
    if not re.fullmatch(r"\d+\s*(kB|MB|GB)", value):
        raise ConfigError(f"{variable}={value!r}: expected a size such as 256MB or 1GB")
    return value
