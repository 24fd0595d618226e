"""The whole configuration of a run, assembled from the roster: the knobs that belong to no phase
(:class:`~deep_sleep.core.config.BaseConsolidationConfig`: ``lookback_hours``,
``quick_nap_interval``, ``gating``) and one section per phase, the phase's own
:class:`~deep_sleep.core.config.PhaseConfig` subclass, in roster order.

Sources, later wins: defaults < TOML file (``--config FILE`` or ``DEEP_SLEEP_CONFIG``) <
environment (``DEEP_SLEEP_<SECTION>__<KNOB>``, e.g. ``DEEP_SLEEP_STRENGTHEN__INCREMENT=0.75``)
< explicit overrides (a flow parameter or keyword arguments).  Unknown sections and knobs are refused.

    >>> ConsolidationConfig().strengthen.min_accesses
    2
    >>> load_config(overrides={"strengthen": {"increment": 1.0}}).strengthen.increment
    1.0
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from deep_sleep.transforms import ROSTER, Phase

from deep_sleep.core.config import BaseConsolidationConfig, assemble, load
from deep_sleep.core.errors import ConfigError


def config_model(phases: Iterable[Phase] | None = None, *, name: str = "ConsolidationConfig") -> type[BaseConsolidationConfig]:
    """The configuration model of ``phases`` (default: the roster): one section per phase, named after it."""
    phases = tuple(ROSTER if phases is None else phases)
    twice = [n for n, k in Counter(p.name for p in phases).items() if k > 1]
    if twice:
        raise ConfigError(f"phase name(s) {', '.join(twice)} appear more than once in the roster; "
                          "each phase needs its own name (its config section)")
    return assemble({p.name: p.config for p in phases}, name=name, module=__name__,
                    doc="The whole configuration of a run: the top-level knobs, gating, and one section "
                        "per roster phase.  Frozen: build a new one to change it.")


ConsolidationConfig = config_model()


def load_config(path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> ConsolidationConfig:
    """Defaults < TOML file < environment < ``overrides``.  Errors name the bad knob."""
    return load(ConsolidationConfig, path, overrides)


__all__ = ["ConsolidationConfig", "config_model", "load_config"]
