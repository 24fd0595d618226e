"""The online path (SPEC §5): record a turn, recall, feedback, the quick nap — synchronous, one short
transaction per call, no orchestrator.  May import core, store, transforms, validation and run.

    >>> from deep_sleep.online import record_turn, recall, feedback, quick_nap

Modules, by job: ``ops`` (a turn's operations as pydantic models, their limits, the redaction of
credentials), ``turn`` (:func:`record_turn`, its SQL), ``recall`` (:func:`recall`,
:func:`feedback`, the candidate query), ``reranker`` (the 12 features and the score), ``nap``
(:func:`quick_nap` and its targeted snapshot), ``reply`` (parsing a model's reply into
operations), ``pg`` (connections and one-round-trip transactions), ``errors``.
"""

from deep_sleep.online.nap import quick_nap
from deep_sleep.online.recall import Hit, feedback, recall
from deep_sleep.online.turn import Landed, Receipt, Rejected, record_turn

__all__ = ["Hit", "Landed", "Receipt", "Rejected", "feedback", "quick_nap", "recall", "record_turn"]
