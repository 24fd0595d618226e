"""The consolidation phases: one module per phase, one pure function per module, one ordered roster.

Adding a phase is adding a module and a line to ``ROSTER``.  Each phase function takes any of
the arguments the runner offers, by name — ``snapshot`` (with earlier phases' diffs folded in),
``config`` (its own section of :class:`~deep_sleep.core.config.ConsolidationConfig`), ``as_of``,
``lookback_hours``, ``scope_path``, ``settings`` (the whole configuration), ``embedder`` — and returns a :class:`~deep_sleep.transforms._common.PhaseResult`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from deep_sleep.core.errors import ConfigError
from deep_sleep.transforms._common import PhaseResult
from deep_sleep.transforms.cooccurrence import cooccurrence
from deep_sleep.transforms.decay_importance import decay_importance
from deep_sleep.transforms.drift import drift
from deep_sleep.transforms.episodic_summary import episodic_summary
from deep_sleep.transforms.label_recalls import label_recalls
from deep_sleep.transforms.meta_nodes import meta_nodes
from deep_sleep.transforms.pending_edges import pending_edges
from deep_sleep.transforms.procedural_promotion import procedural_promotion
from deep_sleep.transforms.prune_orphans import prune_orphans
from deep_sleep.transforms.soul_corrections import soul_corrections
from deep_sleep.transforms.strengthen import strengthen
from deep_sleep.transforms.supersession import supersession
from deep_sleep.transforms.synthetic_links import synthetic_links
from deep_sleep.transforms.tag_risk import tag_risk
from deep_sleep.transforms.train_reranker import train_reranker
from deep_sleep.transforms.working_ttl import working_ttl


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
    Phase("1.5", cooccurrence, ("edges_created", "edges_reinforced")),
    Phase("2", tag_risk, ("risk_nodes_tagged",)),
    Phase("2.5", pending_edges, ("edges_created",)),
    Phase("D1", supersession, ("facts_superseded",)),
    Phase("3", prune_orphans, ("nodes_pruned",)),
    Phase("4", meta_nodes, ("meta_nodes_created", "meta_nodes_updated")),
    Phase("5", soul_corrections, ("soul_updates", "soul_rejected")),
    Phase("8", working_ttl, ("working_ttl_pruned",)),
    Phase("9", decay_importance, ("nodes_decayed",)),
    Phase("10", episodic_summary, ("episodes_summarized",)),
    Phase("11", synthetic_links, ("synthetic_edges_created",)),
    Phase("12", procedural_promotion, ("draft_skills_promoted",)),
    Phase("D2", label_recalls, ("recalls_labelled",)),
    Phase("D3", train_reranker, ("reranker_steps",)),
    Phase("D4", drift, ("identity_drifts",)),
)

QUICK_NAP: tuple[str, ...] = ("strengthen", "soul_corrections", "episodic_summary")


def roster(names: tuple[str, ...] | list[str] | None = None) -> tuple[Phase, ...]:
    """The roster, or the named subset of it in roster order.  Unknown names are an error."""
    if names is None:
        return ROSTER
    known = {p.name for p in ROSTER}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"unknown phase(s) {', '.join(unknown)}; phases are: {', '.join(p.name for p in ROSTER)}")
    return tuple(p for p in ROSTER if p.name in names)


def phase_names() -> list[str]:
    return [p.name for p in ROSTER]


__all__ = ["ROSTER", "QUICK_NAP", "Phase", "PhaseResult", "roster", "phase_names"]
