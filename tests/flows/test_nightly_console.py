"""``deep-sleep nightly`` on a small seeded store: the due night's and the quiet night's console, exact
(issue 38 item 5); ``--table`` prints the per-scope table, which is always in the night's scopes.csv."""

from __future__ import annotations

import csv
import re
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from deep_sleep.dev.seed import SeedSpec, seed_store
from tests.storeutil import create_database, drop_database

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


@pytest.fixture()
def seeded(admin_dsn):
    name = f"ds_console_{uuid.uuid4().hex[:8]}"
    store = create_database(admin_dsn, name)
    seed_store(store, SeedSpec(tenants=1, scopes_per_tenant=2, nodes_per_scope=80, seed=5, now=NOW,
                               embedding_model="hashing"))
    yield store
    drop_database(admin_dsn, name)


def _night(store, tmp_path, capsys, as_of: datetime, *extra: str) -> tuple[int, list[str]]:
    from deep_sleep.cli import main

    code = main(["--dsn", store.dsn, "nightly", "--as-of", as_of.isoformat(), "--runs-dir", str(tmp_path), *extra])
    out = capsys.readouterr().out
    lines = [re.sub(r"_nightly/[^/ )]+", "_nightly/NIGHT", line.replace(str(tmp_path), "RUNS")) for line in out.splitlines()]
    # the time line's figures vary: its shape is checked, and it is replaced by its words
    times = [i for i, line in enumerate(lines) if line.startswith("time: ")]
    assert len(times) == 1, out
    words = re.sub(r"\d+\.\d s ", "", lines[times[0]])
    assert re.fullmatch(r"time: (\d+\.\d s [a-z ]+)(, \d+\.\d s [a-z ]+)*", lines[times[0]]), lines[times[0]]
    return code, lines[: times[0]] + [words] + lines[times[0] + 1 :]


SCOPES = ["org/acme", "org/acme/brand/core/conversation/sales", "org/acme/brand/core/conversation/support"]
GATE = {"min": 1.0, "median": 1.0, "p90": 1.0, "max": 1.0}


@pytest.mark.flow
def test_the_due_and_the_quiet_nights_console(prefect_harness, seeded, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DEEP_SLEEP_DSN", raising=False)
    code, lines = _night(seeded, tmp_path, capsys, NOW)
    assert code == 0
    zero = {k: 0.0 for k in GATE}
    assert lines == [
        "3 scopes: 3 due, 3 applied, 0 failed, 0 skipped; data quality passed "
        "(RUNS/_nightly/NIGHT/data_quality/data_docs/index.html)",
        f"recall-quality gate: 3 scope(s) measured, 0 failed; recall@k before {GATE}, after {GATE}, drop (pp) {zero}",
        "held for approval: 9 row(s) (soul_change 9) — deep-sleep held; approve / reject RUN_ID",
        f"slowest of 1 shard(s): {lines[3].split(': ', 1)[1].split(' (')[0]} (3 scopes, {SCOPES[0]} … {SCOPES[2]})",
        "time: in all, in the shards, data quality, health, retention",
        "per-scope table (3 rows): RUNS/_nightly/NIGHT/scopes.csv (or: deep-sleep nightly --table)",
    ]
    assert re.fullmatch(r"shard 1 \d+\.\d s", lines[3].split(": ", 1)[1].split(" (")[0])  # its time, not asserted
    (table,) = tmp_path.glob("_nightly/*/scopes.csv")
    with table.open() as f:
        got = list(csv.DictReader(f))
    assert [(r["scope"], r["status"], r["shard"]) for r in got] == [(s, "applied", "1") for s in SCOPES]

    # an hour later every scope is gated: the quiet night says why, and --table prints the table first
    code, lines = _night(seeded, tmp_path, capsys, NOW + timedelta(hours=1), "--table")
    assert code == 0
    gated = "gated: last run 1.0 h ago (< 24 h) and 0 new sessions (< 20)"
    assert lines[:2] == ["| scope | status | changes | conflicts | quarantined | held | shard | seconds | run_id | reason |",
                         "|---|---|---|---|---|---|---|---|---|---|"]
    assert lines[2:5] == [f"| {s} | skipped |  |  |  |  |  |  |  | {gated} |" for s in SCOPES]
    assert lines[5:] == ["",
                         "3 scopes: 0 due, 0 applied, 0 failed, 3 skipped",
                         f"skipped: gated 3 (e.g. {SCOPES[0]}: {gated})",
                         "time: in all, in the shards, health, retention",
                         "per-scope table (3 rows): RUNS/_nightly/NIGHT/scopes.csv (or: deep-sleep nightly --table)"]
    assert len(list(tmp_path.glob("_nightly/*/scopes.csv"))) == 2
