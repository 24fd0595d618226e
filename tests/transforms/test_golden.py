"""Golden cases: ``tests/transforms/golden/<phase>/<case>.json`` hold input rows and the exact expected diff.

Each case runs its one phase through :func:`deep_sleep.run.transform.transform` (the same path as a real run)
and compares every diff row.  Missing columns of input rows take the defaults below.
"""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
from deep_sleep.transforms.config import load_config

from deep_sleep.core import tables
from deep_sleep.core.snapshot import Snapshot, utc
from deep_sleep.run.transform import transform

GOLDEN = Path(__file__).parent / "golden"
SCOPE = "org\x1fgolden\x1fbrand\x1fb1"
DEFAULTS = {
    "scope_path": SCOPE, "tenant_id": "golden", "properties": "{}", "metadata": "{}", "importance": 5.0,
    "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z", "version": 1, "weight": 1.0,
    "access_count": 0, "kind": "read",
}
CASES = sorted(GOLDEN.glob("*/*.json"))


def _frame(table: str, rows: list[dict]) -> pl.DataFrame:
    cols = tables.columns(table)
    filled = [{c: row.get(c, DEFAULTS.get(c)) for c in cols} for row in rows]
    frame = pl.DataFrame(filled, schema={c: (pl.String if cols[c].kind == "ts" else cols[c].dtype) for c in cols})
    ts = [c for c in cols if cols[c].kind == "ts"]
    return frame.with_columns(pl.col(c).str.to_datetime(time_zone="UTC", time_unit="us") for c in ts)


def _rows(frame: pl.DataFrame) -> list[dict]:
    out = []
    for row in frame.sort("id").to_dicts():
        out.append({k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in row.items() if v is not None})
    return out


@pytest.mark.parametrize("path", CASES, ids=[f"{p.parent.name}/{p.stem}" for p in CASES])
def test_golden(path: Path):
    case = json.loads(path.read_text())
    phase = path.parent.name
    snap = Snapshot(
        scope_path=SCOPE,
        taken_at=utc(case["as_of"]),
        previous_run_as_of=utc(case["previous_run_as_of"]) if case.get("previous_run_as_of") else None,
        frames={t: _frame(t, rows) for t, rows in case["input"].items()},
    )
    # embed=False: the vectors a night adds to the nodes it writes are tests/run/test_embedded.py's; the
    # cases here hold the phase's rows
    result = transform(snap, load_config(overrides=case.get("config")), utc(case["as_of"]), phases=[phase], embed=False)
    diff = result.scope_diff()  # the single-scope form: no scope_path on updates and deletes
    got = {t: {k: _rows(f) for k, f in td.frames().items() if f.height} for t, td in diff.tables.items()}
    assert got == case["expected"], case["title"]
    assert result.report.diff_hash == diff.content_hash()
    for td in result.diff.tables.values():  # the shard form names every row's scope: this one
        assert all(f.get_column("scope_path").eq(SCOPE).all() for f in td.frames().values() if f.height)
    counters = {k: v for k, v in result.report.counters.items() if v}
    assert counters == case["counters"], case["title"]
    assert result.report.phases_run == [phase]


def test_every_phase_of_the_roster_has_golden_cases():
    from deep_sleep.transforms import phase_names

    assert {p.parent.name for p in CASES} >= set(phase_names())
