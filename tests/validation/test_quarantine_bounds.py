"""Issue 13, items 4 and 5: the quarantine catalogue's bounds — labels, tenant root, timestamps,
recall similarity — each a named, configurable reason; consolidation never sees such rows."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import polars as pl
import pytest

from deep_sleep.core import tables
from deep_sleep.core.shard import Shard
from deep_sleep.transforms.config import load_config
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run.transform import transform
from deep_sleep.validation.quarantine import REASONS, future_limit, quarantine, quarantine_plain

SCOPE = "org\x1facme\x1fbrand\x1fb1"
NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


def _nodes(rows: list[dict]) -> pl.DataFrame:
    base = {"scope_path": SCOPE, "tenant_id": "acme", "layer": "semantic", "properties": "{}", "importance": 5.0,
            "created_at": NOW - timedelta(days=2), "updated_at": NOW - timedelta(hours=1), "version": 1}
    return tables.conform("memory_nodes", pl.DataFrame([{**base, "id": str(uuid.uuid4()), **r} for r in rows]))


def _reasons(snap: Snapshot, as_of: datetime = NOW, config=None) -> dict[str, str]:
    _, found = quarantine(snap, as_of, config)
    return dict(zip(found.get_column("id").to_list(), found.get_column("reason").to_list()))


@pytest.mark.parametrize(("label", "reason"), [
    ("x" * 100_000, "label longer than max_label_chars"),
    ("line\u2028separator", "invisible or direction-changing characters in label"),
    ("para\u2029separator", "invisible or direction-changing characters in label"),
    ("zero\u200bwidth", "invisible or direction-changing characters in label"),
    ("bom\ufeff", "invisible or direction-changing characters in label"),
    ("evil\u202egnp.exe", "invisible or direction-changing characters in label"),
    ("isolate\u2066x\u2069", "invisible or direction-changing characters in label"),
    # issue 37: what the live path now refuses is quarantined too (one definition: deep_sleep.core.characters.HIDDEN)
    ("hello" + "".join(chr(0xE0000 + ord(c)) for c in "ignore"), "invisible or direction-changing characters in label"),
    ("soft\u00adhyphen", "invisible or direction-changing characters in label"),
    ("hello\ufe0f", "invisible or direction-changing characters in label"),
    ("\u3164", "invisible or direction-changing characters in label"),
    ("\u2800", "invisible or direction-changing characters in label"),
    ("\u0301\u0301", "invisible or direction-changing characters in label"),
])
def test_bad_labels_are_quarantined_by_name(label, reason):
    frame = _nodes([{"label": label}, {"label": "project: fine"}])
    got = _reasons(Snapshot(SCOPE, NOW, frames={"memory_nodes": frame}))
    assert list(got.values()) == [reason]
    assert reason in REASONS


def test_symbols_with_their_presentation_selector_are_not_quarantined():
    frame = _nodes([{"label": "I \u2764\ufe0f pizza"}, {"label": "keycap 1\ufe0f\u20e3"}, {"label": "cafe\u0301"}])
    assert _reasons(Snapshot(SCOPE, NOW, frames={"memory_nodes": frame})) == {}


def test_label_bound_is_configurable():
    frame = _nodes([{"label": "x" * 40}])
    snap = Snapshot(SCOPE, NOW, frames={"memory_nodes": frame})
    assert _reasons(snap) == {}
    assert list(_reasons(snap, config=load_config(overrides={"quarantine": {"max_label_chars": 32}}).quarantine).values()) == [
        "label longer than max_label_chars"]


def test_tenant_that_is_not_the_scope_root_is_quarantined():
    frame = _nodes([{"label": "project: theirs", "tenant_id": "globex"}, {"label": "project: ours"}])
    assert list(_reasons(Snapshot(SCOPE, NOW, frames={"memory_nodes": frame})).values()) == [
        "tenant_id differs from the scope's root"]


def test_timestamps_before_1990_and_far_future_are_quarantined_and_year_9999_does_not_crash():
    frame = _nodes([
        {"label": "project: epoch", "updated_at": datetime(1970, 1, 1, 0, 0, 1, tzinfo=UTC)},
        {"label": "project: y9999", "updated_at": datetime(9999, 12, 31, 23, 59, tzinfo=UTC)},
        {"label": "project: skewed a little", "updated_at": NOW + timedelta(minutes=4)},
        {"label": "project: fine"},
    ])
    snap = Snapshot(SCOPE, NOW, frames={"memory_nodes": frame})
    assert sorted(_reasons(snap).values()) == ["timestamp before min_timestamp", "timestamp in the future"]
    # an as_of at the end of year 9999: as_of + tolerance overflows; nothing crashes
    late = datetime(9999, 12, 31, 23, 58, tzinfo=UTC)
    assert sorted(_reasons(snap, as_of=late).values()) == ["timestamp before min_timestamp"]
    result = transform(snap, load_config(), NOW)
    assert result.report.quarantined == {"memory_nodes": {"timestamp before min_timestamp": 1, "timestamp in the future": 1}}
    floor = load_config(overrides={"quarantine": {"min_timestamp": "1960-01-01T00:00:00Z"}}).quarantine
    assert sorted(_reasons(snap, config=floor).values()) == ["timestamp in the future"]


def test_the_future_is_after_the_later_of_as_of_and_the_extracts_own_time():
    """Issue 32: a snapshot taken at T, planned with as_of = T - 10 min (``--as-of`` in the past, or a
    shard extracted late in a long night), keeps the rows live turns wrote at T - 1 min: they are not
    from the future.  A row 10 minutes after T (beyond the 5-minute tolerance) still is."""
    taken = NOW
    as_of = taken - timedelta(minutes=10)
    frame = _nodes([
        {"label": "project: written after as_of", "updated_at": taken - timedelta(minutes=1)},
        {"label": "project: fine", "updated_at": as_of - timedelta(hours=1)},
        {"label": "project: skewed a little", "updated_at": taken + timedelta(minutes=4)},
        {"label": "project: from the future", "updated_at": taken + timedelta(minutes=10)},
    ])
    future = frame.get_column("id")[3]
    snap = Snapshot(SCOPE, taken, frames={"memory_nodes": frame})
    assert future_limit(as_of, taken, timedelta(minutes=5)) == taken + timedelta(minutes=5)
    assert future_limit(taken + timedelta(hours=1), taken, timedelta(minutes=5)) == taken + timedelta(hours=1, minutes=5)
    assert _reasons(snap, as_of=as_of) == {future: "timestamp in the future"}
    clean, _ = quarantine(snap, as_of)
    assert clean.table("memory_nodes").get_column("id").to_list() == frame.get_column("id").to_list()[:3]
    # the plain statement of the rules, and a shard holding the scope, say the same
    _, plain = quarantine_plain(snap, as_of)
    assert plain.select("id", "reason").rows() == [(future, "timestamp in the future")]
    _, in_shard = quarantine(Shard.of(snap), as_of)
    assert in_shard.select("id", "reason", "scope_path").rows() == [(future, "timestamp in the future", SCOPE)]
    # and the plan of that run quarantines that row alone
    result = transform(snap, load_config(), as_of, phases=["decay_importance"])
    assert result.report.quarantined == {"memory_nodes": {"timestamp in the future": 1}}
    assert result.scope_quarantined().get_column("id").to_list() == [future]
    # as_of later than the extract: the limit is as_of's
    assert _reasons(snap, as_of=taken + timedelta(minutes=10)) == {}


def test_recall_with_nan_similarity_is_quarantined_and_a_rerun_changes_nothing():
    node = _nodes([{"label": "project: a"}])
    nid = node.get_column("id")[0]
    recalls = tables.conform("recall_events", pl.DataFrame({
        "id": [str(uuid.uuid4()), str(uuid.uuid4()), str(uuid.uuid4())], "scope_path": SCOPE, "tenant_id": "acme",
        "query": "project a", "node_id": nid, "similarity": [float("nan"), 0.8, 0.7],
        "features": [[float("nan")] * 12, [0.1] * 12, [0.1] * 11 + [float("inf")]],
        "created_at": NOW - timedelta(hours=2), "version": 1,
    }, schema_overrides={"features": pl.List(pl.Float64)}))
    snap = Snapshot(SCOPE, NOW, frames={"memory_nodes": node, "recall_events": recalls})
    first = transform(snap, load_config(), NOW, phases=["label_recalls"])
    assert first.report.quarantined == {"recall_events": {"features are not finite numbers": 1,
                                                          "similarity is not a finite number": 1}}
    assert first.report.counters["recalls_labelled"] == 1
    labelled = first.scope_diff().table("recall_events").updates
    assert labelled.height == 1 and labelled.get_column("label").is_finite().all()
    # the store after that run: the good recall labelled, the bad ones as they were
    after = snap.with_frames({"recall_events": recalls.with_columns(
        pl.when(pl.col("id") == labelled.get_column("id")[0]).then(labelled.get_column("label")[0]).otherwise(pl.col("label")).alias("label"))})
    again = transform(after, load_config(), NOW, phases=["label_recalls"])
    assert again.report.counters["recalls_labelled"] == 0 and again.scope_diff().table("recall_events").updates.height == 0


def test_null_similarity_is_not_labelled_again_and_again():
    recalls = tables.conform("recall_events", pl.DataFrame({
        "id": [str(uuid.uuid4())], "scope_path": SCOPE, "tenant_id": "acme", "query": "q", "node_id": str(uuid.uuid4()),
        "similarity": pl.Series([None], dtype=pl.Float64), "features": [[0.1] * 12], "created_at": NOW - timedelta(hours=2)},
        schema_overrides={"features": pl.List(pl.Float64)}))
    snap = Snapshot(SCOPE, NOW, frames={"recall_events": recalls})
    result = transform(snap, load_config(), NOW, phases=["label_recalls"], check_rows=False)
    assert result.report.counters["recalls_labelled"] == 0


def test_quarantine_section_is_a_knob_of_every_source(monkeypatch, tmp_path):
    monkeypatch.setenv("DEEP_SLEEP_QUARANTINE__MAX_LABEL_CHARS", "99")
    assert load_config().quarantine.max_label_chars == 99
    toml = tmp_path / "c.toml"
    toml.write_text("[quarantine]\nfuture_tolerance_seconds = 60\n")
    assert load_config(str(toml)).quarantine.future_tolerance_seconds == 60
    assert json.loads(load_config().model_dump_json())["quarantine"]["min_timestamp"].startswith("1990-01-01")
