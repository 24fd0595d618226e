"""Phase T — toy: counts the semantic nodes.  Not in the roster: the tests add it to one by a line,
the way a new phase is added (``tests/transforms/test_config.py``, ``test_roster.py``)."""

from __future__ import annotations

import polars as pl
from deep_sleep.transforms._common import PhaseResult
from pydantic import Field

from deep_sleep.core.config import PhaseConfig
from deep_sleep.core.snapshot import Snapshot


class ToyConfig(PhaseConfig):
    depth: int = Field(3, ge=1)
    width: float = 0.5


#: The counters this phase reports; ``edges_created`` is also phase 1.5's.
COUNTERS: tuple[str, ...] = ("toys_counted", "edges_created")


def toy(snapshot: Snapshot, config: ToyConfig) -> PhaseResult:
    nodes = snapshot.table("memory_nodes").filter(pl.col("layer") == "semantic")
    return PhaseResult(counters={"toys_counted": nodes.height})
