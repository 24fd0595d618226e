"""The consolidation phases: one module per phase, one pure function per module, one ordered roster.

Adding a phase is adding a module and a line to ``ROSTER``.  The module declares the phase's knobs
(a :class:`~deep_sleep.core.config.PhaseConfig` subclass, its section of
:class:`~deep_sleep.transforms.config.ConsolidationConfig`), the ``COUNTERS`` it reports, and the
function; the roster line names all three.  The configuration model and the report's counters are
built from the roster (:func:`~deep_sleep.transforms.config.config_model`, :func:`counter_names`).

Each phase function takes any of the arguments the runner offers, by name — ``snapshot`` (with
earlier phases' diffs folded in), ``config`` (its own section), ``as_of``, ``lookback_hours``,
``settings`` (the whole configuration), ``extracted``, ``summarizer``, ``embedder`` — and returns a
:class:`~deep_sleep.transforms._common.PhaseResult`.

    >>> [c for c in ROSTER[0].counters], ROSTER[0].config().min_accesses
    (['nodes_strengthened'], 2)
    >>> new_report("org\\x1facme", "2026-01-02T00:00:00Z").counters["identity_drifts"]
    0
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from deep_sleep.transforms import (
    cooccurrence,
    decay_importance,
    drift,
    episodic_summary,
    label_recalls,
    meta_nodes,
    pending_edges,
    procedural_promotion,
    prune_orphans,
    soul_corrections,
    strengthen,
    supersession,
    synthetic_links,
    tag_risk,
    train_reranker,
    working_ttl,
)
from deep_sleep.transforms._common import PhaseResult
from deep_sleep.transforms.errors import RosterError

from deep_sleep.core.config import PhaseConfig
from deep_sleep.core.errors import ConfigError
from deep_sleep.core.report import ConsolidationReport


@dataclass(frozen=True)
class Phase:
    """A roster entry: the SPEC number, the function (named after the phase), its config model (the
    phase's section of the configuration, named after the phase too) and the counters it reports."""

    number: str
    fn: Callable[..., PhaseResult]
    config: type[PhaseConfig]
    counters: tuple[str, ...]

    def __post_init__(self) -> None:
        if not (isinstance(self.config, type) and issubclass(self.config, PhaseConfig)):
            raise RosterError(f"phase {self.name}: config must be a PhaseConfig subclass, not {self.config!r}")
        if isinstance(self.counters, str) or not all(isinstance(c, str) and c for c in self.counters):
            raise RosterError(f"phase {self.name}: counters must be a tuple of names, not {self.counters!r}")

    @property
    def name(self) -> str:
        return self.fn.__name__


# SPEC §3 order.
ROSTER: tuple[Phase, ...] = (
    Phase("1", strengthen.strengthen, strengthen.StrengthenConfig, strengthen.COUNTERS),
    Phase("1.5", cooccurrence.cooccurrence, cooccurrence.CooccurrenceConfig, cooccurrence.COUNTERS),
    Phase("2", tag_risk.tag_risk, tag_risk.TagRiskConfig, tag_risk.COUNTERS),
    Phase("2.5", pending_edges.pending_edges, pending_edges.PendingEdgesConfig, pending_edges.COUNTERS),
    Phase("D1", supersession.supersession, supersession.SupersessionConfig, supersession.COUNTERS),
    Phase("3", prune_orphans.prune_orphans, prune_orphans.PruneOrphansConfig, prune_orphans.COUNTERS),
    Phase("4", meta_nodes.meta_nodes, meta_nodes.MetaNodesConfig, meta_nodes.COUNTERS),
    Phase("5", soul_corrections.soul_corrections, soul_corrections.SoulCorrectionsConfig, soul_corrections.COUNTERS),
    Phase("8", working_ttl.working_ttl, working_ttl.WorkingTtlConfig, working_ttl.COUNTERS),
    Phase("9", decay_importance.decay_importance, decay_importance.DecayImportanceConfig, decay_importance.COUNTERS),
    Phase("10", episodic_summary.episodic_summary, episodic_summary.EpisodicSummaryConfig, episodic_summary.COUNTERS),
    Phase("11", synthetic_links.synthetic_links, synthetic_links.SyntheticLinksConfig, synthetic_links.COUNTERS),
    Phase("12", procedural_promotion.procedural_promotion, procedural_promotion.ProceduralPromotionConfig,
          procedural_promotion.COUNTERS),
    Phase("D2", label_recalls.label_recalls, label_recalls.LabelRecallsConfig, label_recalls.COUNTERS),
    Phase("D3", train_reranker.train_reranker, train_reranker.TrainRerankerConfig, train_reranker.COUNTERS),
    Phase("D4", drift.drift, drift.DriftConfig, drift.COUNTERS),
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


def counter_names(phases: Iterable[Phase] | None = None) -> tuple[str, ...]:
    """Every counter of ``phases`` (default: the roster), once each, in roster order — SPEC §3's counters."""
    return tuple(dict.fromkeys(c for p in (ROSTER if phases is None else phases) for c in p.counters))


#: Every counter a run reports, in roster order (the keys of a report's ``counters``).
COUNTERS: tuple[str, ...] = counter_names()


def new_report(scope_path: str, as_of: str, *, phases: Iterable[Phase] | None = None, **fields: Any) -> ConsolidationReport:
    """A report for ``phases`` (default: the roster): every counter of theirs at 0, ``fields`` as given."""
    return ConsolidationReport.zeroed(counter_names(phases), scope_path=scope_path, as_of=as_of, **fields)


__all__ = ["ROSTER", "QUICK_NAP", "COUNTERS", "Phase", "PhaseResult", "roster", "phase_names", "counter_names",
           "new_report"]
