"""Invariants of the episodic phases (10 episodic_summary, 11 synthetic_links, 12 procedural_promotion)
over random small snapshots: deterministic diffs and ids, valid diffs inside the run's scope, caps
that hold, and reruns that converge to an empty diff (these three phases may defer capped work)."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import polars as pl
from deep_sleep.transforms._common import created_id
from deep_sleep.transforms.config import load_config
from deep_sleep.validation import validate_diff
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from deep_sleep.core import tables
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run.transform import transform

SCOPE = "org\x1fprop\x1fbrand\x1fb1"
AS_OF = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
PHASES = ("episodic_summary", "synthetic_links", "procedural_promotion")
LABELS = ("alpha", "beta", "gamma", "delta", "SOUL:name", "SOUL:role")
SENTENCES = (
    "I deployed the billing service.", "Then I ran the migration.", "and I rotated the API keys",
    "I backed up the database before lunch.", "I restarted the worker pool", "I checked the dashboard.",
    "First I checked the logs, then I deployed the billing service.",
)
# a few recurring combinations, so that pairs repeat across events
MARKER_SETS = (
    (), ("alpha", "beta"), ("alpha", "SOUL:name"), ("beta", "gamma"), ("alpha", "beta", "gamma"), ("nobody", "alpha", "beta"),
    ("alpha", "alpha"), ("delta", "SOUL:role"),
)
ACTION_TYPES = ("deploy_service", "Run-Migration", "restart workers", " - ")
SKILL_NAMES = ("Deploy billing service", "Key rotation", "Send invoice", "Billing deploy")
DEFAULT_MIN_COOCCURRENCES = load_config().synthetic_links.min_cooccurrences  # drawn too (SPEC: "more than 2")
MAX_RUNS = 60  # more than any backlog of these sizes needs; each capped run makes progress


def _uid(kind: int, i: int) -> str:
    return f"00000000-0000-0000-{kind:04x}-{i:012x}"


def _content(markers, sentence: int | None) -> str:
    parts = [f"[semantic:{m}]" if not m.startswith("SOUL:") else f"[{m}]" for m in markers]
    if sentence is not None:
        parts.append(SENTENCES[sentence])
    return " ".join(parts) or "small talk about the weather"


@st.composite
def snapshots(draw):
    nodes = []
    distinct = draw(st.permutations(LABELS))  # most labels exist; some twice (resolution ties), some not at all
    for i in range(draw(st.integers(2, 12))):
        nodes.append({
            "id": _uid(0xA, i), "layer": draw(st.sampled_from(["semantic", "semantic", "semantic", "working"])),
            "label": distinct[i] if i < len(distinct) else draw(st.sampled_from(LABELS + ("ghost " + str(i),))),
            "importance": draw(st.sampled_from([1.0, 5.0, 9.0])),
            "updated_at": AS_OF - timedelta(hours=draw(st.integers(0, 100))),
        })
    ids = [n["id"] for n in nodes]
    edges = []
    if len(ids) >= 2:
        for j in range(draw(st.integers(0, 4))):
            a, b = draw(st.sampled_from(ids)), draw(st.sampled_from(ids))
            if a != b and (a, b) not in {(e["source_id"], e["target_id"]) for e in edges}:
                edges.append({"id": _uid(0xED, j), "source_id": a, "target_id": b,
                              "relation": draw(st.sampled_from(["SYNTHETIC_LINK", "RELATED_TO"])), "weight": 0.1})
    events = []
    for i in range(draw(st.integers(0, 30))):
        markers = draw(st.sampled_from(MARKER_SETS) | st.lists(st.sampled_from(LABELS + ("nobody",)), max_size=4))
        sentence = draw(st.none() | st.integers(0, len(SENTENCES) - 1))
        meta = draw(st.sampled_from([{}, {"channel": "chat"}]) | st.builds(lambda a: {"action_type": a}, st.sampled_from(ACTION_TYPES)))
        events.append({
            "id": _uid(0xE, i), "session_id": "s", "content": _content(markers, sentence), "metadata": json.dumps(meta),
            "created_at": AS_OF - timedelta(hours=draw(st.integers(0, 24 * 8) | st.integers(0, 24 * 40)),
                                            microseconds=draw(st.sampled_from([0, 0, 1]))),
            "version": draw(st.integers(1, 3)),
        })
    skills = [
        {"id": _uid(0x5, i), "name": name, "status": draw(st.sampled_from(["active", "draft", "rejected"])),
         "source": "user", "pattern_key": draw(st.sampled_from([None, "deploy_service", "rotate api keys"])), "occurrences": 1}
        for i, name in enumerate(draw(st.lists(st.sampled_from(SKILL_NAMES), max_size=2, unique=True)))
    ]
    skills = [s for k, s in enumerate(skills) if s["pattern_key"] is None or s["pattern_key"] not in {t["pattern_key"] for t in skills[:k]}]
    config = {
        "episodic_summary": {"threshold": draw(st.integers(1, 15)), "batch_size": draw(st.integers(2, 6)), "max_batches": draw(st.integers(1, 3))},
        "synthetic_links": {"min_cooccurrences": draw(st.integers(0, DEFAULT_MIN_COOCCURRENCES)), "max_pairs": draw(st.integers(0, 4)), "max_sources": draw(st.integers(1, 3))},
        "procedural_promotion": {"min_occurrences": draw(st.integers(1, 3)), "max_per_run": draw(st.integers(0, 6)),
                                 "duplicate_cosine": draw(st.sampled_from([0.5, 0.65, 0.99]))},
    }
    frames = {
        "memory_nodes": _frame("memory_nodes", nodes),
        "memory_edges": _frame("memory_edges", edges),
        "episodic_events": _frame("episodic_events", events),
        "procedural_skills": _frame("procedural_skills", skills),
    }
    return Snapshot(SCOPE, AS_OF, None, frames), load_config(overrides=config), draw(st.integers(0, 2**32 - 1))


def _shuffled(snapshot: Snapshot, seed: int) -> Snapshot:
    """The same rows in another order, every table."""
    return replace(snapshot, frames={t: f.sample(fraction=1.0, shuffle=True, seed=seed) if f.height else f
                                     for t, f in snapshot.frames.items()})


def _synthetic_links_by_hand(snap: Snapshot, config) -> set[tuple[str, str, tuple[str, ...]]]:
    """SPEC §3 phase 11 in plain loops: (source, target, source_episodic_ids) of every edge it creates."""
    c = config.synthetic_links
    start = AS_OF - timedelta(days=c.lookback_days)
    best: dict[str, tuple] = {}
    for n in snap.table("memory_nodes").iter_rows(named=True):
        if n["layer"] == "semantic":
            key = (-n["importance"], -n["updated_at"].timestamp(), n["id"])
            if n["label"] not in best or key < best[n["label"]]:
                best[n["label"]] = key
    resolve = {label: key[2] for label, key in best.items()}
    seen: dict[tuple[str, str], list[str]] = {}
    for e in snap.table("episodic_events").iter_rows(named=True):
        if not (start < e["created_at"] <= AS_OF):
            continue
        refs = set()
        for kind, x in re.findall(r"\[(semantic|SOUL):([^\[\]]+)\]", e["content"]):
            label = x if kind == "semantic" else "SOUL:" + x
            if label in resolve:
                refs.add(resolve[label])
        for a in refs:
            for b in refs:
                if a < b:
                    seen.setdefault((a, b), []).append(e["id"])
    linked = {tuple(sorted((r["source_id"], r["target_id"]))) for r in snap.table("memory_edges").iter_rows(named=True)
              if r["relation"] == "SYNTHETIC_LINK"}
    pairs = sorted(((-len(ev), a, b) for (a, b), ev in seen.items() if len(ev) > c.min_cooccurrences and (a, b) not in linked))
    return {(a, b, tuple(sorted(seen[(a, b)])[:c.max_sources])) for _, a, b in pairs[:c.max_pairs]}


def _frame(table: str, rows: list[dict]) -> pl.DataFrame:
    defaults = {"scope_path": SCOPE, "tenant_id": "prop", "properties": "{}", "metadata": "{}", "importance": 5.0,
                "access_count": 0, "created_at": AS_OF - timedelta(days=50), "updated_at": AS_OF - timedelta(days=50),
                "version": 1, "weight": 1.0, "description": "", "steps": "[]", "occurrences": 0}
    cols = tables.columns(table)
    filled = [{c: row.get(c, defaults.get(c)) for c in cols} for row in rows]
    return tables.conform(table, pl.DataFrame(filled, schema={c: cols[c].dtype for c in cols}))


def _capped(phase: str, diff, config) -> bool:
    """Whether this run stopped at a per-run cap (so a rerun may legitimately find more work)."""
    if phase == "synthetic_links":
        return diff.table("memory_edges").inserts.height == config.synthetic_links.max_pairs
    if phase == "procedural_promotion":
        return diff.table("procedural_skills").inserts.height == config.procedural_promotion.max_per_run
    return diff.table("episodic_events").deletes.height > 0  # "while more than threshold": rerun decides


def _check_caps_and_ids(phase: str, diff, snap: Snapshot, config) -> None:
    for name, td in diff.tables.items():
        if td.inserts.height:
            assert set(td.inserts.get_column("scope_path")) == {SCOPE}, name
            assert set(td.inserts.get_column("tenant_id")) == {"prop"}, name
        assert set(td.inserts.get_column("phase")) | set(td.updates.get_column("phase")) | set(td.deletes.get_column("phase")) <= {phase}
    if phase == "episodic_summary":
        c = config.episodic_summary
        deleted = diff.table("episodic_events").deletes.height
        before = snap.table("episodic_events").height
        batches = min(c.max_batches, -(-(before - c.threshold) // c.batch_size)) if before > c.threshold else 0
        assert deleted == min(batches * c.batch_size, before)  # a scope smaller than a batch gives what it has
        nodes = diff.table("memory_nodes").inserts
        assert nodes.height == batches
        assert set(nodes.get_column("label", default=pl.Series([], dtype=pl.String))) <= {"META:episodic_summary"}
    if phase == "synthetic_links":
        edges = diff.table("memory_edges").inserts
        assert edges.height <= config.synthetic_links.max_pairs
        for row in edges.iter_rows(named=True):
            assert row["source_id"] < row["target_id"] and row["relation"] == "SYNTHETIC_LINK"
            assert row["id"] == created_id(SCOPE, phase, f"{row['source_id']}|{row['target_id']}")
            props = json.loads(row["properties"])
            assert props["provenance"] == "synthetic"
            assert props["source_episodic_ids"] == sorted(props["source_episodic_ids"])
            assert 0 < len(props["source_episodic_ids"]) <= config.synthetic_links.max_sources
    if phase == "procedural_promotion":
        skills = diff.table("procedural_skills").inserts
        assert skills.height <= config.procedural_promotion.max_per_run
        for row in skills.iter_rows(named=True):
            assert row["status"] == "draft" and row["source"] == "consolidation"
            assert row["id"] == created_id(SCOPE, phase, row["pattern_key"])
            assert row["occurrences"] >= config.procedural_promotion.min_occurrences
            assert 1 <= len(json.loads(row["steps"])) <= 5


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(snapshots())
def test_episodic_phases_invariants(case):
    snapshot, config, seed = case
    for phase in PHASES:
        # The generated rows are clean: skip the snapshot quarantine (the test below keeps it).
        first = transform(snapshot, config, AS_OF, phases=[phase], check_rows=False)
        again = transform(_shuffled(snapshot, seed), config, AS_OF, phases=[phase], check_rows=False)  # rows in another order
        assert first.report.diff_hash == again.report.diff_hash == first.scope_diff().content_hash(), phase
        assert validate_diff(first.diff, first.shard, config).height == 0, phase  # the shard form
        snap, first_diff = first.scope_snapshot(), first.scope_diff()
        if phase == "synthetic_links":
            made = first_diff.table("memory_edges").inserts
            got = {(r["source_id"], r["target_id"], tuple(json.loads(r["properties"])["source_episodic_ids"]))
                   for r in made.iter_rows(named=True)} if made.height else set()
            assert got == _synthetic_links_by_hand(snap, config)
        assert validate_diff(first_diff, snap, config).height == 0, (phase, validate_diff(first_diff, snap, config))
        _check_caps_and_ids(phase, first_diff, snap, config)
        # rerun on the applied result at the same as_of: empty, unless a per-run cap deferred work,
        # and then repeated runs converge to an empty diff (each capped run makes progress).
        diff, capped = first_diff, _capped(phase, first_diff, config)
        event(f"{phase}: {'changes' if diff.has_changes else 'nothing'}{' (capped)' if diff.has_changes and capped else ''}")
        for run in range(MAX_RUNS):
            if not diff.has_changes:
                break
            snap = replace(diff.fold(snap), previous_run_as_of=AS_OF)
            nxt = transform(snap, config, AS_OF, phases=[phase], check_rows=False)
            nxt_diff = nxt.scope_diff()
            if nxt_diff.has_changes:
                assert capped, (phase, "a rerun changed something although nothing was capped", nxt_diff.row_counts())
                if run == 0:
                    assert validate_diff(nxt_diff, snap, config).height == 0, phase
                _check_caps_and_ids(phase, nxt_diff, snap, config)
            diff, capped = nxt_diff, _capped(phase, nxt_diff, config)
        assert not diff.has_changes, (phase, "reruns did not converge")


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(snapshots())
def test_the_three_phases_together_give_a_valid_diff(case):
    snapshot, config, seed = case
    result = transform(snapshot, config, AS_OF, phases=list(PHASES))
    assert validate_diff(result.diff, result.shard, config).height == 0
    assert validate_diff(result.scope_diff(), result.scope_snapshot(), config).height == 0
    assert result.report.diff_hash == result.scope_diff().content_hash()
    assert result.report.diff_hash == transform(_shuffled(snapshot, seed), config, AS_OF, phases=list(PHASES)).report.diff_hash
