"""episodic_summary on a shard: the threshold, the batches and "the oldest events" are each scope's own."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta

from deep_sleep.core.summary import Summary, SummaryRequest
from deep_sleep.transforms.config import ConsolidationConfig, load_config
from deep_sleep.transforms.episodic_summary import episodic_summary, summary_node_id
from tests.transforms.shard_cases import AC, ACME, AS_OF, NESTED, assert_each_scope_alone, shard_of, uid

START = AS_OF - timedelta(days=20)


def _events(scope: str, s: int, count: int, first_minute: int, step: int) -> list[dict]:
    return [{"id": uid(s, n), "scope_path": scope, "session_id": "s", "content": f" {scope[-4:]} event {n} ",
             "created_at": START + timedelta(minutes=first_minute + step * n)} for n in range(count)]


def _interleaved(*parts: list[dict]) -> list[dict]:
    rows = [r for part in parts for r in part]
    return sorted(rows, key=lambda r: (r["created_at"], r["id"]))  # not grouped by scope


def test_each_scope_has_its_own_threshold_and_oldest_events():
    # ACME's 60 events are the shard's oldest and together the shard holds 180 > 100 events, but only
    # AC (120 events) is over the threshold: its own 50 oldest are summarised, ACME keeps all of its.
    events = _interleaved(_events(AC, 1, 120, 1000, 2), _events(ACME, 2, 60, 0, 3))
    nodes = [{"id": uid(3, 1), "scope_path": NESTED, "label": "x"}]  # NESTED: no events at all
    shard, snaps = shard_of({"episodic_events": events, "memory_nodes": nodes}, (AC, ACME, NESTED))

    result = episodic_summary(shard, ConsolidationConfig().phase("episodic_summary"), AS_OF)
    assert result.skipped_scopes == {NESTED: "missing input: no episodic events"}
    assert dict(result.by_scope.select("scope_path", "episodes_summarized").iter_rows()) == {AC: 50}
    assert sorted(result.diff.tables["episodic_events"].deletes["id"]) == sorted(uid(1, n) for n in range(50))
    node = result.diff.tables["memory_nodes"].inserts.row(0, named=True)
    assert result.diff.tables["memory_nodes"].inserts.height == 1
    assert (node["id"], node["scope_path"], node["tenant_id"]) == (summary_node_id(AC, uid(1, 0), uid(1, 49)), AC, "ac")

    reports = assert_each_scope_alone(shard, snaps, "episodic_summary")
    assert reports[NESTED].phases_skipped == {"episodic_summary": "missing input: no episodic events"}
    assert reports[ACME].phases_run == ["episodic_summary"] and reports[ACME].counters["episodes_summarized"] == 0


class Recording:
    """A summarizer that answers every request with its scope and key, and keeps the requests."""

    def __init__(self) -> None:
        self.requests: list[SummaryRequest] = []

    def summarize(self, requests: Sequence[SummaryRequest]) -> list[Summary | None]:
        self.requests.extend(requests)
        return [Summary(f"{r.scope_path.split(chr(31))[1]}:{len(r.items)}", "m") for r in requests]


def test_max_batches_per_scope_and_the_summarizer_gets_each_request_with_its_scope():
    config = load_config(overrides={"episodic_summary": {"threshold": 10, "batch_size": 20, "max_batches": 2}})
    # AC: 120 events → 2 batches (the cap); ACME: 25 → 1 batch of 20; NESTED: 5, under the threshold.
    events = _interleaved(_events(ACME, 2, 25, 0, 1), _events(AC, 1, 120, 5, 1), _events(NESTED, 3, 5, 0, 7))
    shard, snaps = shard_of({"episodic_events": events}, (AC, ACME, NESTED))

    summarizer = Recording()
    result = episodic_summary(shard, config.phase("episodic_summary"), AS_OF, summarizer=summarizer)
    assert [(r.scope_path, r.key) for r in summarizer.requests] == [
        (AC, f"{uid(1, 0)}|{uid(1, 19)}"), (AC, f"{uid(1, 20)}|{uid(1, 39)}"), (ACME, f"{uid(2, 0)}|{uid(2, 19)}")]
    assert dict(result.by_scope.select("scope_path", "episodes_summarized").iter_rows()) == {AC: 40, ACME: 20}
    inserts = result.diff.tables["memory_nodes"].inserts.sort("scope_path")
    assert inserts["scope_path"].to_list() == [AC, AC, ACME]
    assert inserts["properties"].str.json_path_match("$.summary").to_list().count("acme:20") == 1

    assert_each_scope_alone(shard, snaps, "episodic_summary", config, summarizer=Recording())


def test_a_shard_without_any_event_is_skipped():
    shard, snaps = shard_of({"memory_nodes": [{"id": uid(1, 1), "scope_path": AC, "label": "x"}]}, (AC, ACME))
    result = episodic_summary(shard, ConsolidationConfig().phase("episodic_summary"), AS_OF)
    assert result.skipped == "missing input: no episodic events"
    assert_each_scope_alone(shard, snaps, "episodic_summary")
