"""The ``quarantine`` section of the configuration: bounds a stored row must keep to be consolidated.

A row outside them is set aside with a named reason (validation/quarantine.py; docs/semantics.md, "Quarantine"),
never repaired.

    >>> QuarantineConfig().max_label_chars
    2048
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field


class QuarantineConfig(BaseModel):
    """max_label_chars: longest label (and pending-edge label, skill name) accepted; longer ones
    would be copied into new edges and META summaries.
    min_timestamp: rows stamped before this (UTC) are not believed (clocks at 0, int seconds read as 1970).
    future_tolerance_seconds: rows stamped later than as_of + this are not believed (clock skew allowance).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    max_label_chars: int = Field(2048, ge=1)
    min_timestamp: datetime = datetime.fromisoformat("1990-01-01T00:00:00+00:00")
    future_tolerance_seconds: float = Field(300.0, ge=0)
