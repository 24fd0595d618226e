"""The night's gate summary (issue 32 item 2): a gate that could not measure never reads as a pass."""

from __future__ import annotations

from deep_sleep.jobs.night import gate_distribution, gate_line


def _r(status, **kw):
    return {"gate": {"status": status, "failed": False, **kw}}


def test_most_scopes_unmeasurable_is_said_first_and_measured_figures_are_only_the_measured():
    results = [_r("no_used_query") for _ in range(7)] + [_r("zero_before", queries=3, recall_before=0.0, recall_after=0.0)]
    results += [_r("measured", queries=2, recall_before=1.0, recall_after=0.5, drop_pp=50.0, failed=True),
                _r("measured", queries=1, recall_before=0.5, recall_after=0.5, drop_pp=0.0), {"gate": None}]
    g = gate_distribution(results)
    assert g["gated"] == 10 and g["by_status"] == {"measured": 2, "no_used_query": 7, "zero_before": 1}
    assert (g["scopes"], g["failed"]) == (2, 1)
    assert g["recall_before"] == {"min": 0.5, "median": 0.75, "p90": 1.0, "max": 1.0}  # zero_before's 0.0 is not in it
    line = gate_line(g)
    assert line.startswith("recall-quality gate: could NOT measure 8 of 10 scope(s) (no_used_query 7, zero_before 1);")
    assert "2 scope(s) measured, 1 failed" in line


def test_a_mostly_measured_night_says_its_figures_first_and_names_the_rest():
    results = [_r("measured", queries=1, recall_before=1.0, recall_after=1.0, drop_pp=0.0) for _ in range(3)]
    line = gate_line(gate_distribution(results + [_r("no_vectors")]))
    assert line.startswith("recall-quality gate: 3 scope(s) measured, 0 failed; recall@k before")
    assert line.endswith("; not measured: no_vectors 1")
    assert gate_distribution([{"gate": None}]) is None
    none = gate_line(gate_distribution([_r("no_used_query")]))
    assert none == "recall-quality gate: could NOT measure 1 of 1 scope(s) (no_used_query 1); 0 scope(s) measured, 0 failed"
