"""Configuration machinery: the knobs that belong to no phase, the base of every phase's knobs, and
the loader.

Each phase declares its own knobs next to its function (``class StrengthenConfig(PhaseConfig)`` in
``transforms/strengthen.py``); the whole configuration of a run, ``ConsolidationConfig``, is
assembled from the roster one layer up (:mod:`deep_sleep.transforms.config`) with
:func:`assemble` — this layer cannot know the phases.

Sources, later wins: defaults < TOML file (``--config FILE`` or ``DEEP_SLEEP_CONFIG``) <
environment (``DEEP_SLEEP_<SECTION>__<KNOB>``, e.g. ``DEEP_SLEEP_STRENGTHEN__INCREMENT=0.75``)
< explicit overrides (a flow parameter or keyword arguments).

Strict types (issue 32).  A knob's value must be of its type as TOML (or JSON) writes it: a string
is not a number (``increment = "0.5"`` is refused: write ``0.5``), a boolean is not a number
(``min_sessions = true``), a number is not a boolean (``enabled = 1``), a fraction is not an integer
(``min_sessions = 3.0``); an integer is a number, and ``nan`` is not.  Every section is checked from
the root (:class:`~deep_sleep.core.strict_config.StrictScalars`), so phase sections and the ``holds`` / ``llm`` / ``quarantine``
sections are strict too; the error names each knob, with its value.  Other types (timestamps,
strings, lists) are pydantic's as before: ``min_timestamp = "1990-01-01T00:00:00Z"`` is read.

Environment variables are text by nature: the value of a boolean, integer or number knob is read as
TOML writes that type — ``true`` / ``false`` (any case), ``12``, ``0.75``, ``1e3``, ``inf`` — and then
checked as above, so ``DEEP_SLEEP_LLM__ENABLED=yes`` or ``=1`` is an error naming the variable
(``write true or false``), never a silent guess.  An optional knob (``retention.keep_days``) cannot be
set to null from the environment: leave the variable unset.  A whole section may be given as JSON
(``DEEP_SLEEP_GATING='{"min_sessions": 3}'``), whose types are JSON's.

Config files are read as UTF-8 TOML (a byte-order mark is allowed); a missing file, a directory, an
unreadable file, bytes that are not UTF-8 and invalid TOML are each a :class:`ConfigError` naming
the file and the fix, which the CLI prints as one line (exit 2).

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

from pydantic import ConfigDict, Field, ValidationError, create_model
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from deep_sleep.core.errors import ConfigError
from deep_sleep.core.holds_config import HoldsConfig
from deep_sleep.core.llm_config import LlmConfig
from deep_sleep.core.quarantine_config import QuarantineConfig
from deep_sleep.core.strict_config import ScalarEnv, StrictScalars


class PhaseConfig(StrictScalars):
    """The knobs of one phase: a phase module subclasses this next to its function.  Every phase
    can be turned off (``enabled``); unknown knobs are refused."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    enabled: bool = True


class GatingConfig(StrictScalars):
    model_config = ConfigDict(extra="forbid", frozen=True)
    min_interval_hours: float = Field(24, ge=0)
    min_sessions: int = Field(20, ge=1)


class HealthConfig(StrictScalars):
    """The thresholds of the run-health alerts."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    enabled: bool = True
    idle_nights: int = Field(3, ge=1)
    max_conflict_rate: float = Field(0.20, ge=0, le=1)
    quarantine_jump_factor: float = Field(2.0, ge=1)
    quarantine_jump_min: int = Field(10, ge=1)
    gated_factor: float = Field(2.0, ge=1)
    fail_nightly: bool = Field(True, description="the nightly exits 1 (flow run not Completed) when an alert fires")


class RetentionConfig(StrictScalars):
    """What the nightly removes after its run (``deep-sleep gc`` by hand): run directories and archive
    rows older than ``keep_days`` (None: keep everything).  What a still-undoable run needs is kept
    unless ``force`` (the run is then marked not undoable)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    keep_days: float | None = Field(None, ge=0)
    force: bool = False


class GateConfig(StrictScalars):
    """The recall-quality gate (SPEC §9, :mod:`deep_sleep.run.gate`): before apply, up to
    ``max_queries`` of the scope's used recall queries are replayed against the scope before and
    after the diff; a drop of recall@``k`` of the used memories by more than ``max_drop_pp``
    percentage points fails the gate (its destructive rows are then held).  Beside them, up to
    ``probes`` rows the night removes, folds or demotes are probed by a query made from their own text
    (sampled with ``probe_seed``): a night estimated to make more than ``probe_max_drop_pp`` percent of
    the scope's memory unfindable within the recall budget — and at least ``probe_min_lost`` rows — fails
    it too (SPEC §9 as amended 2026-12-06)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    enabled: bool = True
    k: int = Field(10, ge=1)
    max_queries: int = Field(50, ge=1)
    max_drop_pp: float = Field(2.0, ge=0)
    implicit: bool = False  # implicit labels count as "used" too (see deep_sleep.run.gate: off, they mean "asked")
    #: The gate's own probes per scope (deep_sleep.run.probes): rows the night removes, folds or demotes; 0: none.
    probes: int = Field(8, ge=0, le=1000)
    probe_seed: int = Field(0, ge=0, le=2**63 - 1)
    #: The probes fail when the night makes more than this share of the scope's memory unfindable (pp).
    probe_max_drop_pp: float = Field(10.0, ge=0, le=100)
    #: … and only when at least this many rows are estimated lost (a tiny scope's one weak fact is not a harmful night).
    probe_min_lost: float = Field(3.0, ge=0)


class EmbeddingConfig(StrictScalars):
    """The one embedder (SPEC §5 as amended; :mod:`deep_sleep.core.embedding`): ``model`` is
    ``hashing``, ``wordllama`` or ``package.module:attribute``.  record_turn, recall, the phases, the
    gate and the apply all use it; changing it on a store that holds vectors is ``deep-sleep reembed``."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    model: str = "hashing"


class RecallConfig(StrictScalars):
    """Live recall (SPEC §5, :func:`deep_sleep.online.recall.recall`): ``lexical`` fuses PostgreSQL
    full-text matches of the query's words with vector similarity (reciprocal-rank fusion with
    constant ``fusion_k``); off, a candidate's base score is its similarity alone.  ``events``: episodic
    events are candidates beside nodes.  ``budget_chars``: a recall returns hits in rank order until
    their passages hold this many characters; ``max_passage_chars``: one passage's bound (SPEC §5 as
    amended 2026-12-06)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    lexical: bool = True
    events: bool = True
    fusion_k: float = Field(20.0, gt=0)
    lexical_weight: float = Field(2.0, ge=0)
    #: What one recall hands a reader at most, in characters (the sum of its hits' passages).
    budget_chars: int = Field(2400, ge=1, le=1_000_000)
    #: One hit's passage at most, in characters: a longer text is cut around the query's words.
    max_passage_chars: int = Field(600, ge=40, le=100_000)


class BaseConsolidationConfig(BaseSettings, StrictScalars):
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
    embedding: EmbeddingConfig = EmbeddingConfig()
    recall: RecallConfig = RecallConfig()

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        prefix = cls.model_config.get("env_prefix", "")
        return (init_settings, ScalarEnv(settings_cls, env_settings, prefix))  # explicit values beat the environment

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
    values = read_toml(Path(path)) if path else {}
    try:
        env_only = model().model_dump(exclude_defaults=True)
        merged = _merge(_merge(values, env_only), overrides or {})
        return model(**merged)
    except ValidationError as exc:
        src = f" (from {path})" if path else ""
        raise ConfigError(f"invalid configuration{src}: {_problems(exc)}") from exc


def _problems(exc: ValidationError) -> str:
    """pydantic's errors as ``knob: why``; our own (a :class:`ConfigError` from a validator) as worded."""
    out = []
    for e in exc.errors():
        ours = (e.get("ctx") or {}).get("error")
        msg = str(ours) if isinstance(ours, ConfigError) else e["msg"]
        loc = ".".join(map(str, e["loc"]))
        out.append(f"{loc}: {msg}" if loc else msg)
    return "; ".join(out)


def read_toml(path: Path) -> dict[str, Any]:
    """The TOML file ``path`` as a dict, or a :class:`ConfigError` naming the file and the fix."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist") from None
    except IsADirectoryError:
        raise ConfigError(f"config file {path} is a directory; give the path of a TOML file in it "
                          f"(e.g. {path / 'deep-sleep.toml'})") from None
    except PermissionError:
        raise ConfigError(f"config file {path} cannot be read (permission denied); make it readable by this user") from None
    except OSError as exc:
        raise ConfigError(f"config file {path} cannot be read ({exc.strerror or exc}); give a readable TOML file") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = raw[:exc.start].count(b"\n") + 1
        raise ConfigError(f"config file {path} is not UTF-8 text (byte 0x{raw[exc.start]:02x} on line {line}); "
                          "TOML files are UTF-8: save it as UTF-8") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from exc


def work_mem_size(value: str | None, variable: str, default: str) -> str:
    """``value`` (the environment variable ``variable``) as a PostgreSQL ``work_mem`` size such as
    ``256MB``, ``default`` when unset; a :class:`ConfigError` naming the variable otherwise."""
    value = (default if value is None else value).strip()
    if not re.fullmatch(r"\d+\s*(kB|MB|GB)", value):
        raise ConfigError(f"{variable}={value!r}: expected a size such as 256MB or 1GB")
    return value
