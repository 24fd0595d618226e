"""Recall hands a reader passages within a budget (SPEC §5 as amended 2026-12-06, issue 36 items 1
and 2), on the real store: a summary hit quotes the turn that matches with that turn's own event id;
a turn a night folded is found by a query made from its text; the budget is never exceeded; a long
text is cut around its match; undo of a fold brings the turns back; a harmful night fails the gate's
probes and its rows wait for approval."""

from __future__ import annotations

import json
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deep_sleep.online.errors import OnlineArgumentError
from deep_sleep.online.recall import recall
from deep_sleep.online.turn import record_turn
from deep_sleep.transforms.config import load_config
from tests.online.helpers import NOW, rows
from tests.storeutil import word_of

TOPICS = ["volcano", "harbour", "violin", "glacier", "lantern", "orchard", "saffron", "compass", "meteor", "tundra",
          "falcon", "marble", "quartz", "ember", "walrus", "cactus", "nebula", "canyon", "pepper", "raven"]


def _turns(store, scope, n: int = 130) -> list[str]:
    """``n`` turns, each naming a topic, two places and a word of its own (:func:`~tests.storeutil.word_of`)."""
    ids = []
    for i in range(n):
        content = (f"{'Ada' if i % 2 else 'Bo'}: the {TOPICS[i % 20]} story {word_of(i)}, "
                   f"told at the {TOPICS[(i * 7 + 3) % 20]}-{TOPICS[(i * 3 + 1) % 20]} meetup")
        ids += record_turn(store, scope, [{"op": "create_event", "content": content}],
                           now=NOW + timedelta(minutes=i), session_id=f"s{i // 25}", nap=False).ids("create_event")
    return ids


@pytest.fixture
def folded(store, scope, runs_dir):
    """A scope whose night folded its oldest 50 of 130 turns into a summary."""
    from deep_sleep import consolidate

    ids = _turns(store, scope)
    report = consolidate(store, scope, NOW + timedelta(days=1), runs_dir=runs_dir).report()
    assert report.status == "applied" and report.counters["episodes_summarized"] == 50
    return ids, report


def test_a_summary_hit_quotes_the_matching_turn_with_its_event_id(store, scope, folded):
    ids, _ = folded
    content = rows(store, "SELECT content FROM episodic_folded WHERE id = %s", ids[7])[0][0]
    hits = recall(store, scope, f"the {word_of(7)} story told at the meetup", k=5, now=NOW + timedelta(days=2))
    summary = next(h for h in hits if h.kind == "summary")
    assert ids[7] in [ln.source_id for ln in summary.lines]
    line = next(ln for ln in summary.lines if ln.source_id == ids[7])
    assert line.text == content
    # the passage is the gist (the dates the summary's turns span), then the quoted lines, one a line
    first, last = rows(store, "SELECT properties->>'first_at', properties->>'last_at' FROM memory_nodes WHERE id = %s",
                       summary.node_id)[0]
    assert first[:10] == last[:10] == "2026-11-20"
    assert summary.text == "\n".join(["2026-11-20", *(ln.text for ln in summary.lines)])
    assert summary.chars == len(summary.text) <= load_config().recall.max_passage_chars


def test_the_events_leave_the_hot_table_whole_and_the_summary_is_a_bounded_digest(store, scope, folded):
    ids, report = folded
    assert rows(store, "SELECT count(*) FROM episodic_events WHERE id = ANY(%s::uuid[])", ids[:50]) == [(0,)]
    moved = rows(store, "SELECT id::text, summary_id::text, run_id::text, embedding IS NOT NULL FROM episodic_folded"
                        " WHERE scope_path = %s ORDER BY created_at", scope.path)
    assert [m[0] for m in moved] == ids[:50] and {m[3] for m in moved} == {True}
    assert {m[2] for m in moved} == {report.run_id}
    (summary,) = rows(store, "SELECT id::text, properties FROM memory_nodes WHERE scope_path = %s"
                             " AND label = 'META:episodic_summary'", scope.path)
    assert {m[1] for m in moved} == {summary[0]}
    props = summary[1]
    assert len(props["summary"]) <= load_config().episodic_summary.max_chars
    assert props["summary"].startswith("Bo, Ada · ") and props["source_count"] == 50
    assert "volcano" in props["keywords"].split()


def test_a_folded_turn_is_found_by_a_query_made_from_its_text(store, scope, folded):
    """Every folded turn: recall with its own text finds it, quoted by its summary, within the budget."""
    ids, _ = folded
    for eid, content in rows(store, "SELECT id::text, content FROM episodic_folded WHERE scope_path = %s", scope.path):
        hits = recall(store, scope, content, k=5, now=NOW + timedelta(days=2))
        quoted = {ln.source_id for h in hits for ln in h.lines} | {h.node_id for h in hits}
        assert eid in quoted, content
        assert sum(h.chars for h in hits) <= load_config().recall.budget_chars


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(budget=st.integers(min_value=1, max_value=3000), k=st.integers(min_value=1, max_value=20),
       query=st.sampled_from(["volcano story", "the lantern meetup number 12", "Ada Bo", "raven pepper canyon story"]))
def test_the_budget_is_never_exceeded(store, scope, folded, budget, k, query):
    hits = recall(store, scope, query, k=k, now=NOW + timedelta(days=2), budget_chars=budget)
    assert sum(h.chars for h in hits) <= budget
    assert len(hits) <= k
    assert all(h.chars == len(h.text) for h in hits)
    # a hit's lines are what its text quotes
    for h in hits:
        assert all(ln.text in h.text for ln in h.lines)


def test_the_budget_is_checked_and_comes_from_the_configuration(store, scope):
    record_turn(store, scope, [{"op": "create_event", "content": "x " * 400 + "the needle is here " + "y " * 400}],
                now=NOW, nap=False)
    with pytest.raises(OnlineArgumentError, match="budget_chars must be a positive integer"):
        recall(store, scope, "needle", budget_chars=0)
    (hit,) = recall(store, scope, "needle", k=1, now=NOW)
    # a long text is cut around its match at recall.max_passage_chars (600), an ellipsis on each cut side
    assert hit.chars == len(hit.text) <= 600 and "the needle is here" in hit.text
    assert hit.text.startswith("…") and hit.text.endswith("…")
    small = load_config(overrides={"recall": {"budget_chars": 120}})
    (cut,) = recall(store, scope, "needle", k=1, now=NOW, config=small)
    assert cut.chars <= 120 and "needle" in cut.text


def test_undo_of_a_fold_brings_the_turns_back(store, scope, folded):
    from deep_sleep.jobs.undo import undo

    ids, report = folded
    result = undo(store, report.run_id)
    assert result.complete
    back = rows(store, "SELECT id::text FROM episodic_events WHERE scope_path = %s ORDER BY created_at", scope.path)
    assert [b[0] for b in back] == ids
    assert rows(store, "SELECT count(*) FROM episodic_folded WHERE scope_path = %s", scope.path) == [(0,)]
    assert rows(store, "SELECT count(*) FROM memory_nodes WHERE scope_path = %s AND label = 'META:episodic_summary'",
                scope.path) == [(0,)]
    hits = recall(store, scope, f"the {word_of(7)} story told at the meetup", k=5, now=NOW + timedelta(days=2))
    assert ids[7] in [h.node_id for h in hits]


def test_a_harmful_night_fails_the_probes_and_its_rows_wait_for_approval(store, scope, runs_dir):
    """Pruning every fact below importance 9 (a deliberately harmful configuration): the probes found
    the facts before and not after, the gate fails and the deletes are held, the facts still stored."""
    from deep_sleep import consolidate

    labels = [f"{t} is where the {TOPICS[(i + 5) % 20]} festival happens" for i, t in enumerate(TOPICS[:10])]
    for label in labels:
        record_turn(store, scope, [{"op": "upsert_node", "label": label}], now=NOW - timedelta(days=40), nap=False)
    # the share rule would hold these deletes too (it names a row first): only the gate holds here
    harmful = load_config(overrides={"prune_orphans": {"importance_factor": 0.9}, "holds": {"max_delete_share": 1.0}})
    report = consolidate(store, scope, NOW, harmful, runs_dir=runs_dir).report()
    gate = report.gate
    assert gate["status"] == "measured" and gate["failed"]
    assert gate["probes"]["found_before"] == gate["probes"]["probes"] > 0 and gate["probes"]["found_after"] == 0
    assert report.held["reasons"] == {"gate_failed": 10}
    assert rows(store, "SELECT count(*) FROM memory_nodes WHERE scope_path = %s", scope.path) == [(10,)]
    assert json.dumps(gate)  # kept with the run
