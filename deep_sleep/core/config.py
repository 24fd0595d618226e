"""Configuration: every knob of SPEC §3 with its default.

Sources, later wins: defaults < TOML file (``--config FILE`` or ``DEEP_SLEEP_CONFIG``) <
environment (``DEEP_SLEEP_<SECTION>__<KNOB>``, e.g. ``DEEP_SLEEP_STRENGTHEN__INCREMENT=0.75``)
< explicit overrides (a flow parameter or keyword arguments).

    >>> ConsolidationConfig().strengthen.min_accesses
    2
    >>> load_config(overrides={"strengthen": {"increment": 1.0}}).strengthen.increment
    1.0
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from deep_sleep.core.errors import ConfigError
from deep_sleep.core.quarantine_config import QuarantineConfig


class _Knobs(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    enabled: bool = True


class StrengthenConfig(_Knobs):
    min_accesses: int = Field(2, ge=1)
    increment: float = Field(0.5, gt=0)
    cap: float = Field(10.0, le=10.0)


class CooccurrenceConfig(_Knobs):
    window_seconds: float = Field(900.0, ge=0)
    max_neighbours: int = Field(5, ge=0)


class TagRiskConfig(_Knobs):
    markers: tuple[str, ...] = (
        "risk", "danger", "failure", "loss", "negative", "decline", "warning", "critical", "error", "threat",
    )


class PendingEdgesConfig(_Knobs):
    pass


class SupersessionConfig(_Knobs):
    functional_relations: tuple[str, ...] = ("is", "lives_in", "works_at", "prefers", "role")


class PruneOrphansConfig(_Knobs):
    importance_factor: float = Field(0.4, ge=0, le=1)  # prune below factor × 10
    min_age_days: float = Field(7, ge=0)
    max_degree: int = Field(1, ge=0)


class MetaNodesConfig(_Knobs):
    min_group: int = Field(3, ge=2)
    max_members: int = Field(10, ge=1)


class SoulCorrectionsConfig(_Knobs):
    canonical_keys: tuple[str, ...] = ("name", "role", "personality", "language")


class WorkingTtlConfig(_Knobs):
    pass


class DecayImportanceConfig(_Knobs):
    stale_days: float = Field(30, ge=0)
    step: float = Field(0.5, gt=0)
    floor: float = Field(1.0, ge=1.0)
    min_interval_hours: float = Field(24, ge=0)
    exempt_importance: float = Field(8.0, le=10.0)


class EpisodicSummaryConfig(_Knobs):
    threshold: int = Field(100, ge=1)
    batch_size: int = Field(50, ge=1)
    max_batches: int = Field(1, ge=1)


class SyntheticLinksConfig(_Knobs):
    lookback_days: float = Field(7, ge=0)
    min_cooccurrences: int = Field(2, ge=0)  # pairs seen together in MORE than this many events
    weight: float = Field(0.1, ge=0)
    max_sources: int = Field(20, ge=1)
    max_pairs: int = Field(50, ge=0)


class ProceduralPromotionConfig(_Knobs):
    lookback_days: float = Field(30, ge=0)
    min_occurrences: int = Field(3, ge=1)
    max_per_run: int = Field(5, ge=0)
    duplicate_cosine: float = Field(0.65, ge=0, le=1)


class LabelRecallsConfig(_Knobs):
    min_label: float = Field(0.5, ge=0, le=1)


class TrainRerankerConfig(_Knobs):
    learning_rate: float = Field(0.05, gt=0)
    explicit_weight: float = Field(2.0, gt=0)


class DriftConfig(_Knobs):
    max_step: float = Field(0.05, ge=0, le=1)


class GatingConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    min_interval_hours: float = Field(24, ge=0)
    min_sessions: int = Field(20, ge=1)


class ConsolidationConfig(BaseSettings):
    """The whole configuration of a run.  Frozen: build a new one to change it."""

    model_config = SettingsConfigDict(
        env_prefix="DEEP_SLEEP_", env_nested_delimiter="__", extra="forbid", frozen=True
    )

    lookback_hours: float = Field(24, gt=0)
    quick_nap_interval: int = Field(10, ge=1)
    gating: GatingConfig = GatingConfig()
    quarantine: QuarantineConfig = QuarantineConfig()

    strengthen: StrengthenConfig = StrengthenConfig()
    cooccurrence: CooccurrenceConfig = CooccurrenceConfig()
    tag_risk: TagRiskConfig = TagRiskConfig()
    pending_edges: PendingEdgesConfig = PendingEdgesConfig()
    supersession: SupersessionConfig = SupersessionConfig()
    prune_orphans: PruneOrphansConfig = PruneOrphansConfig()
    meta_nodes: MetaNodesConfig = MetaNodesConfig()
    soul_corrections: SoulCorrectionsConfig = SoulCorrectionsConfig()
    working_ttl: WorkingTtlConfig = WorkingTtlConfig()
    decay_importance: DecayImportanceConfig = DecayImportanceConfig()
    episodic_summary: EpisodicSummaryConfig = EpisodicSummaryConfig()
    synthetic_links: SyntheticLinksConfig = SyntheticLinksConfig()
    procedural_promotion: ProceduralPromotionConfig = ProceduralPromotionConfig()
    label_recalls: LabelRecallsConfig = LabelRecallsConfig()
    train_reranker: TrainRerankerConfig = TrainRerankerConfig()
    drift: DriftConfig = DriftConfig()

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, env_settings)  # explicit values beat the environment

    def phase(self, name: str) -> BaseModel:
        return getattr(self, name)


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> ConsolidationConfig:
    """Defaults < TOML file < environment < ``overrides``.  Errors name the bad knob."""
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
        env_only = ConsolidationConfig().model_dump(exclude_defaults=True)
        merged = _merge(_merge(values, env_only), overrides or {})
        return ConsolidationConfig(**merged)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        src = f" (from {path})" if path else ""
        raise ConfigError(f"invalid configuration{src}: {problems}") from exc
