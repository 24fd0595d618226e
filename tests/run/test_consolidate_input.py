"""Issue 37: ``consolidate`` refuses by name what the CLI refuses — an ``as_of`` a year ahead (it
applied, and the scope was then never due), a time outside the calendar in UTC (an OverflowError), a
scope with no rows (it got a ledger row) — with nothing written; ``force=True`` is the caller's word."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from deep_sleep.core.errors import InputError, TimeRangeError
from deep_sleep.run.pipeline import consolidate
from tests.storeutil import insert, node, scalar


def _ledger(store, scope) -> int:
    return scalar(store, "SELECT count(*) FROM consolidation_runs WHERE scope_path = %s", scope.path)


def test_an_as_of_a_year_ahead_is_refused_unless_forced(store, scope, runs_dir, monkeypatch):
    monkeypatch.delenv("DEEP_SLEEP_AS_OF_MARGIN_HOURS", raising=False)
    now = datetime.now(UTC)
    insert(store, "memory_nodes", [node(scope, "project: apollo", now - timedelta(days=2))])
    ahead = now + timedelta(days=365)
    with pytest.raises(InputError, match=r"consolidate: as_of .* is 87\d\d\.\d h after the wall clock \(the margin is 1 h, "
                                         r"DEEP_SLEEP_AS_OF_MARGIN_HOURS\); .* pass force=True if you mean it"):
        consolidate(store, scope, ahead, runs_dir=runs_dir)
    assert _ledger(store, scope) == 0 and not (runs_dir.exists() and any(runs_dir.iterdir()))
    assert consolidate(store, scope, now + timedelta(minutes=30), runs_dir=runs_dir).report().status == "applied"  # in the margin
    assert consolidate(store, scope, ahead, runs_dir=runs_dir, force=True).report().status == "applied"
    # a plan applies nothing: it may look ahead
    from deep_sleep.run.pipeline import PLAN

    assert consolidate(store, scope, ahead + timedelta(days=1), runs_dir=runs_dir, stages=PLAN).reports


@pytest.mark.parametrize("as_of", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-12:00",
                                   datetime(1, 1, 1, tzinfo=__import__("datetime").timezone(timedelta(hours=1)))])
def test_an_as_of_outside_the_calendar_in_utc_is_named(store, scope, runs_dir, as_of):
    with pytest.raises(TimeRangeError, match="is outside years 1–9999 once converted to UTC") as caught:
        consolidate(store, scope, as_of, runs_dir=runs_dir)
    assert isinstance(caught.value, InputError) and isinstance(caught.value, OverflowError)
    assert _ledger(store, scope) == 0


def test_a_scope_with_no_rows_gets_no_run_and_no_ledger_row(store, scope, runs_dir):
    with pytest.raises(InputError, match=rf"consolidate: scope\(s\) {scope.display()} hold no rows in this store; "
                                         r"nothing to consolidate \(no run and no ledger row is written for them\)"):
        consolidate(store, scope, datetime(2026, 11, 20, 3, tzinfo=UTC), runs_dir=runs_dir)
    assert _ledger(store, scope) == 0 and not (runs_dir.exists() and any(runs_dir.iterdir()))
    # in a shard, the empty ones are named and nothing runs
    insert(store, "memory_nodes", [node(scope, "project: apollo", datetime(2026, 11, 18, tzinfo=UTC))])
    empty = scope.parent.child("brand", "nothing-here")
    with pytest.raises(InputError, match="brand/nothing-here hold no rows"):
        consolidate(store, [scope, empty], datetime(2026, 11, 20, 3, tzinfo=UTC), runs_dir=runs_dir)
    assert _ledger(store, scope) == 0
