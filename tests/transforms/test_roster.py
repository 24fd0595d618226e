"""A phase owns its counters: the roster entry names the ``COUNTERS`` its module declares, and the
report's counter set is built from the roster.  ``report.json`` stays byte for byte what it was
before the counters moved out of ``deep_sleep.core.report``.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime

import pytest
from deep_sleep.transforms import COUNTERS, ROSTER, Phase, counter_names, new_report
from deep_sleep.transforms.config import ConsolidationConfig

from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run.transform import transform
from tests.transforms import toy_phase

TOY_ROSTER: tuple[Phase, ...] = (*ROSTER, Phase("T", toy_phase.toy, toy_phase.ToyConfig, toy_phase.COUNTERS))  # the line
SCOPE = "org\x1facme"
AS_OF = datetime(2026, 1, 2, tzinfo=UTC)

# A report.json written before the counters moved out of deep_sleep.core.report: the plan of an
# empty snapshot (timings cleared, run_id and status set).
OLD_REPORT_JSON = r"""{
  "as_of": "2026-01-02T00:00:00Z",
  "conflicts": 0,
  "counters": {
    "draft_skills_promoted": 0,
    "edges_created": 0,
    "edges_reinforced": 0,
    "episodes_summarized": 0,
    "facts_superseded": 0,
    "identity_drifts": 0,
    "meta_nodes_created": 0,
    "meta_nodes_updated": 0,
    "nodes_decayed": 0,
    "nodes_pruned": 0,
    "nodes_strengthened": 0,
    "recalls_labelled": 0,
    "reranker_steps": 0,
    "risk_nodes_tagged": 0,
    "soul_rejected": 0,
    "soul_updates": 0,
    "synthetic_edges_created": 0,
    "working_ttl_pruned": 0
  },
  "counters_by_phase": {
    "cooccurrence": {},
    "decay_importance": {},
    "meta_nodes": {},
    "prune_orphans": {},
    "soul_corrections": {},
    "strengthen": {},
    "supersession": {},
    "tag_risk": {},
    "working_ttl": {}
  },
  "diff_hash": "b1c52f668af83ccc7ff8c194e98027fc41360446d8d52ac282f1cf76387837a1",
  "diff_uri": null,
  "errors": [],
  "notes": {},
  "phases_run": [
    "strengthen",
    "cooccurrence",
    "tag_risk",
    "supersession",
    "prune_orphans",
    "meta_nodes",
    "soul_corrections",
    "working_ttl",
    "decay_importance"
  ],
  "phases_skipped": {
    "drift": "missing input: no working memory",
    "episodic_summary": "missing input: no episodic events",
    "label_recalls": "missing input: no recall events",
    "pending_edges": "missing input: no pending connections",
    "procedural_promotion": "missing input: no episodic events",
    "synthetic_links": "missing input: no episodic events",
    "train_reranker": "missing input: no recall events"
  },
  "quarantined": {},
  "rows_changed": {},
  "run_id": "r1",
  "scope_path": "org\u001facme",
  "snapshot_uri": null,
  "status": "empty",
  "timings": {},
  "validation": []
}
"""


def test_each_roster_entry_names_the_counters_its_module_declares():
    for phase in ROSTER:
        assert phase.counters and phase.counters == sys.modules[phase.fn.__module__].COUNTERS, phase.name


def test_the_counters_are_spec_3s_in_roster_order():
    assert COUNTERS == counter_names(ROSTER) == (
        "nodes_strengthened", "edges_created", "edges_reinforced", "risk_nodes_tagged", "facts_superseded",
        "nodes_pruned", "meta_nodes_created", "meta_nodes_updated", "soul_updates", "soul_rejected",
        "working_ttl_pruned", "nodes_decayed", "episodes_summarized", "synthetic_edges_created",
        "draft_skills_promoted", "recalls_labelled", "reranker_steps", "identity_drifts",
    )
    assert new_report(SCOPE, "2026-01-02T00:00:00Z").counters == dict.fromkeys(COUNTERS, 0)


def test_a_report_for_a_roster_with_a_new_phase_has_its_counters():
    assert counter_names(TOY_ROSTER) == (*COUNTERS, "toys_counted")  # edges_created is counted once
    report = new_report(SCOPE, "2026-01-02T00:00:00Z", phases=TOY_ROSTER, status="failed", errors=["x"])
    assert report.counters == {**dict.fromkeys(COUNTERS, 0), "toys_counted": 0}
    assert (report.status, report.errors) == ("failed", ["x"])
    again = ConsolidationReport.from_dict(json.loads(report.to_json()))
    assert again == report and again.to_json() == report.to_json()


def test_a_roster_entry_is_checked():
    with pytest.raises(TypeError, match="config must be a PhaseConfig subclass"):
        Phase("T", toy_phase.toy, dict, toy_phase.COUNTERS)
    with pytest.raises(TypeError, match="counters must be a tuple of names"):
        Phase("T", toy_phase.toy, toy_phase.ToyConfig, "toys_counted")


def test_an_old_report_json_reads_and_writes_back_byte_for_byte(tmp_path):
    (tmp_path / "report.json").write_text(OLD_REPORT_JSON)
    old = ConsolidationReport.read(tmp_path)
    assert old.counters == dict.fromkeys(COUNTERS, 0) and old.run_id == "r1"
    assert old.to_json() == OLD_REPORT_JSON


def test_the_runners_report_has_every_counter_as_before():
    report = transform(Snapshot.empty(SCOPE, taken_at=AS_OF), ConsolidationConfig(), AS_OF).report
    new = json.loads(report.to_json())
    old = json.loads(OLD_REPORT_JSON)
    assert list(new["counters"]) == list(old["counters"])  # same names, same (sorted) order in the file
    assert json.dumps(new["counters"], indent=2) == json.dumps(old["counters"], indent=2)
    assert set(new) == set(old)
