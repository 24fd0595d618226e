"""The consolidation phases: one module per phase, one pure function per module, one ordered roster.

Adding a phase is adding a module and a line to ``ROSTER``.  Each phase function takes any of
the arguments the runner offers, by name — ``snapshot`` (with earlier phases' diffs folded in),
``config`` (its own section of :class:`~deep_sleep.config.ConsolidationConfig`), ``as_of``,
``lookback_hours`` — and returns a :class:`~transforms._common.PhaseResult`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from transforms._common import PhaseResult
from transforms.strengthen import strengthen
from transforms.working_ttl import working_ttl


@dataclass(frozen=True)
class Phase:
    """A roster entry: the SPEC number, the function (named after the phase), its counters."""

    number: str
    fn: Callable[..., PhaseResult]
    counters: tuple[str, ...]

    @property
    def name(self) -> str:
        return self.fn.__name__


# SPEC §3 order.
ROSTER: tuple[Phase, ...] = (
    Phase("1", strengthen, ("nodes_strengthened",)),
    Phase("8", working_ttl, ("working_ttl_pruned",)),
)

QUICK_NAP: tuple[str, ...] = ("strengthen", "soul_corrections", "episodic_summary")


def roster(names: tuple[str, ...] | list[str] | None = None) -> tuple[Phase, ...]:
    """The roster, or the named subset of it in roster order.  Unknown names are an error."""
    if names is None:
        return ROSTER
    known = {p.name for p in ROSTER}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"unknown phase(s) {', '.join(unknown)}; phases are: {', '.join(p.name for p in ROSTER)}")
    return tuple(p for p in ROSTER if p.name in names)


def phase_names() -> list[str]:
    return [p.name for p in ROSTER]


__all__ = ["ROSTER", "QUICK_NAP", "Phase", "PhaseResult", "roster", "phase_names"]
