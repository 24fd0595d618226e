"""A night's console fits a screen (issue 38 item 5): counts by status, why scopes were skipped, held
rows by reason, the slowest shards and the failed scopes — never one line per scope."""

from __future__ import annotations

from deep_sleep.run.console import SCOPE_TABLE, night_lines, scope_table


def _row(i: int, status: str = "applied", **kw) -> dict:
    return {"scope": f"org/t/agent/a{i:04d}", "status": status, "reason": "never consolidated", "changes": 3,
            "conflicts": 0, "quarantined": 0, "held": 0, "shard": i // 1000, "seconds": 10.0 + i // 1000,
            "run_id": f"run{i}", **kw}


def test_a_night_of_thousands_of_scopes_prints_a_screen():
    rows = [_row(i) for i in range(2990)]
    rows += [_row(2990 + i, "failed", reason=f"apply failed: deadlock detected\nDETAIL: {i}") for i in range(7)]
    rows += [{"scope": f"org/t/agent/s{i}", "status": "skipped",
              "reason": "gated: last run 1.0 h ago (< 20 h) and 0 new sessions (< 3)"} for i in range(3)]
    rows[5]["quarantined"] = 4
    summary = {"scopes": 3000, "due": 2997, "applied": 2990, "failed": 7, "skipped": 3, "rows": rows,
               "data_quality": {"success": True, "data_docs_path": "runs/_nightly/N/data_quality/index.html"},
               "gate": {"gated": 2997, "by_status": {"measured": 2950, "zero_before": 47}, "scopes": 2950, "failed": 12,
                        "recall_before": {"median": 1.0}, "recall_after": {"median": 1.0}, "drop_pp": {"max": 50.0}},
               "held_rows": 40, "held_by_reason": {"gate_failed": 25, "used_deletes": 15},
               "table": "runs/_nightly/N/scopes.csv"}
    lines = night_lines(summary)
    assert lines == [
        "3,000 scopes: 2,997 due, 2,990 applied, 7 failed, 3 skipped; data quality passed "
        "(runs/_nightly/N/data_quality/index.html)",
        "skipped: gated 3 (e.g. org/t/agent/s0: gated: last run 1.0 h ago (< 20 h) and 0 new sessions (< 3))",
        "recall-quality gate: 2950 scope(s) measured, 12 failed; recall@k before {'median': 1.0}, after "
        "{'median': 1.0}, drop (pp) {'max': 50.0}; not measured: zero_before 47",
        "held for approval: 40 row(s) (gate_failed 25, used_deletes 15) — deep-sleep held; approve / reject RUN_ID",
        "quarantined 4 row(s) in all (left untouched; per scope and reason: deep-sleep report SCOPE, or "
        "consolidation_quarantine)",
        "slowest of 3 shard(s): shard 3 12.0 s (997 scopes, org/t/agent/a2000 … org/t/agent/a2996); shard 2 11.0 s "
        "(1,000 scopes, org/t/agent/a1000 … org/t/agent/a1999); shard 1 10.0 s (1,000 scopes, org/t/agent/a0000 … "
        "org/t/agent/a0999)",
        "failed (7):",
        "  org/t/agent/a2990: apply failed: deadlock detected DETAIL: 0",
        "  org/t/agent/a2991: apply failed: deadlock detected DETAIL: 1",
        "  org/t/agent/a2992: apply failed: deadlock detected DETAIL: 2",
        "  org/t/agent/a2993: apply failed: deadlock detected DETAIL: 3",
        "  org/t/agent/a2994: apply failed: deadlock detected DETAIL: 4",
        "  … 2 more in the per-scope table",
        "per-scope table (3,000 rows): runs/_nightly/N/scopes.csv (or: deep-sleep nightly --table)",
    ]


def test_a_shard_of_one_is_named_by_its_scope_and_a_quiet_night_says_why():
    rows = [_row(0, shard=0, seconds=31.25), _row(1, shard=1, seconds=2.0)]
    lines = night_lines({"scopes": 2, "due": 2, "applied": 2, "failed": 0, "skipped": 0, "rows": rows})
    assert lines[-1] == "slowest of 2 shard(s): shard 1 31.2 s (org/t/agent/a0000); shard 2 2.0 s (org/t/agent/a0001)"
    quiet = [{"scope": "org/q", "status": "skipped", "reason": "gated: last run 2.0 h ago"}]
    assert night_lines({"scopes": 1, "due": 0, "applied": 0, "failed": 0, "skipped": 1, "rows": quiet}) == [
        "1 scopes: 0 due, 0 applied, 0 failed, 1 skipped",
        "skipped: gated 1 (e.g. org/q: gated: last run 2.0 h ago)",
    ]


def test_the_scope_table_has_one_row_per_scope_and_every_column():
    header, rows = scope_table([_row(0), {"scope": "org/q", "status": "skipped", "reason": "gated"}])
    assert header == list(SCOPE_TABLE)
    assert rows == [["org/t/agent/a0000", "applied", "3", "0", "0", "0", "1", "10.000", "run0", "never consolidated"],
                    ["org/q", "skipped", "", "", "", "", "", "", "", "gated"]]
