"""A phase's window (SPEC §3 "Terms"): ``(max(as_of − lookback, the scope's previous run), as_of]``.
For one scope the bound is computed without a frame; it is the bound :func:`window_starts` gives
(previous run none, older or newer than the lookback), and the rows inside are the same."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import polars as pl
import pytest
from deep_sleep.transforms import _common
from deep_sleep.transforms._common import in_own_window, in_scope_window, window_starts, with_window

from deep_sleep.core import tables
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot

AS_OF = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
SCOPE = "org\x1fw\x1fbrand\x1fb1"


@pytest.mark.parametrize("previous", [None, AS_OF - timedelta(hours=100), AS_OF - timedelta(hours=2, microseconds=7),
                                      AS_OF + timedelta(hours=1)])
@pytest.mark.parametrize("as_shard", [False, True])
def test_one_scopes_window_is_the_frames(previous, as_shard):
    snap = Snapshot.empty(SCOPE, taken_at=AS_OF, previous_run_as_of=previous)
    view = Shard.of(snap) if as_shard else snap
    expected = window_starts(view, AS_OF, 24.0).item(0, "window_start")
    one = _common._one_window_start(view, AS_OF, 24.0)
    assert one == expected and one.tzinfo is UTC
    stamps = [AS_OF - timedelta(hours=h) for h in (30, 24, 23.9, 2, 1.9, 0)] + [AS_OF + timedelta(seconds=1), expected]
    frame = pl.DataFrame({"scope_path": [SCOPE] * len(stamps), "at": stamps}, schema={"scope_path": pl.String, "at": tables.TS})
    inside = (frame["at"] > expected) & (frame["at"] <= AS_OF)
    assert frame.select(in_own_window(view, "at", AS_OF, 24.0)).to_series().equals(inside.alias("at"))
    windowed = with_window(frame, view, AS_OF, 24.0)
    assert windowed.schema["window_start"] == tables.TS
    assert windowed.select(in_scope_window("at", AS_OF)).to_series().equals(inside.alias("at"))


def test_several_scopes_and_other_time_zones_take_the_frame():
    from dataclasses import replace

    one = Shard.of(Snapshot.empty(SCOPE, taken_at=AS_OF))
    two = replace(one, scope_paths=(SCOPE, SCOPE + "2"), previous_run_as_of={})
    assert _common._one_window_start(two, AS_OF, 24.0) is None
    assert _common._one_window_start(one, AS_OF.astimezone(timezone(timedelta(hours=2))), 24.0) is None
