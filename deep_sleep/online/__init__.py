"""The online path (SPEC §5): record a turn, recall, feedback, the quick nap — synchronous, one short
transaction per call, no orchestrator.  May import core, store, transforms, validation and run.

    >>> from deep_sleep.online import record_turn, recall, feedback, quick_nap
"""

from deep_sleep.online.turn import Hit, Landed, Receipt, Rejected, feedback, quick_nap, recall, record_turn

__all__ = ["Hit", "Landed", "Receipt", "Rejected", "feedback", "quick_nap", "recall", "record_turn"]
