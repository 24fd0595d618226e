"""Property tests of the node phases (prune_orphans, meta_nodes, soul_corrections, decay_importance)
over random small snapshots built directly as frames (no database).

Each phase: same input (in any row order) → same diff hash; the diff validates; every row stays in
the run's scope; created ids are the UUIDv5 of their natural keys; folding the diff in and rerunning
(previous run = this ``as_of``) changes nothing; and the result agrees with a brute-force reference
written with plain Python loops (caps included).
"""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import polars as pl
from deep_sleep.transforms._common import created_id
from deep_sleep.transforms.config import ConsolidationConfig
from deep_sleep.validation import validate_diff
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deep_sleep.core import tables
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run.transform import transform

SCOPE = "org\x1fprop\x1fbrand\x1fb9"
AS_OF = datetime(2026, 11, 20, 3, tzinfo=UTC)
LABELS = (
    "alpha: a", "alpha: b", "Alpha c", "ALPHA: d", "beta: x", "beta y", "gamma: z", "misc", " ", ": x",
    "SOUL:name", "SOUL:role", "SOUL: Language", "SOUL:favorite_color", "AGENT_IDENTITY: core",
    "META:alpha", "META:beta",
)
PROPS = (
    "{}", "{}", '{"ttl_hours": 1}', '{"ttl_hours": 2000}', '{"ttl_hours": "soon"}', '{"pinned": true}', "[1]",
    '{"_last_edited_by": "user_manual_edit", "value": "v1"}',
    '{"_last_edited_by": "user_manual_edit", "value": "v2"}',
    '{"_last_edited_by": "user_manual_edit"}',
    '{"_last_edited_by": "agent", "value": "x"}',
)
IMPORTANCE = (1.0, 1.2, 3.0, 3.9, 4.0, 5.0, 7.9, 8.0, 9.5, 10.0)
# Hours before as_of: the 1 h ttl, the 24 h window / interval, the 7- and 30-day boundaries.
HOURS = (0, 0.5, 1, 12, 24, 24 * 7, 24 * 7 + 1e-6, 24 * 8, 24 * 30, 24 * 30 + 1e-6, 24 * 100)
RELATIONS = ("RELATED_TO", "CO_OCCURRED", "CLUSTERS")
PHASES = ("prune_orphans", "meta_nodes", "soul_corrections", "decay_importance")
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _uuid(i: int) -> str:
    return f"00000000-0000-4000-8000-{i:012x}"


def _ago(hours: float) -> datetime:
    return AS_OF - timedelta(microseconds=round(hours * 3_600_000_000))


@st.composite
def snapshots(draw) -> tuple[Snapshot, ConsolidationConfig]:
    n = draw(st.integers(0, 14))
    ids = [_uuid(i) for i in draw(st.lists(st.integers(1, 4095), min_size=n, max_size=n, unique=True))]
    decayed = [draw(st.sampled_from((None, 0, 1, 23.999, 24, 48))) for _ in ids]
    nodes = pl.DataFrame(
        {
            "id": ids,
            "scope_path": SCOPE,
            "tenant_id": "prop",
            "layer": [draw(st.sampled_from(("semantic",) * 6 + ("working",))) for _ in ids],
            "label": [draw(st.sampled_from(LABELS)) for _ in ids],
            "properties": [draw(st.sampled_from(PROPS)) for _ in ids],
            "importance": [draw(st.sampled_from(IMPORTANCE)) for _ in ids],
            "access_count": 0,
            "created_at": AS_OF - timedelta(days=200),
            "updated_at": [_ago(draw(st.sampled_from(HOURS))) for _ in ids],
            "last_decayed_at": [None if h is None else _ago(h) for h in decayed],
            "version": [draw(st.integers(1, 5)) for _ in ids],
        },
        schema_overrides={"created_at": tables.TS, "updated_at": tables.TS, "last_decayed_at": tables.TS},
    )
    edge_rows, seen = [], set()
    for k in range(draw(st.integers(0, 2 * n)) if n else 0):
        s, t, rel = draw(st.sampled_from(ids)), draw(st.sampled_from(ids)), draw(st.sampled_from(RELATIONS))
        if (s, t, rel) not in seen:
            seen.add((s, t, rel))
            version = draw(st.integers(1, 3))
            edge_rows.append({"id": _uuid(10_000 + k), "source_id": s, "target_id": t, "relation": rel, "version": version})
    edge_schema = {"id": pl.String, "source_id": pl.String, "target_id": pl.String, "relation": pl.String, "version": pl.Int64}
    made = pl.lit(AS_OF - timedelta(days=50), dtype=tables.TS)
    edges = pl.DataFrame(edge_rows, schema=edge_schema).with_columns(
        scope_path=pl.lit(SCOPE), tenant_id=pl.lit("prop"), weight=pl.lit(1.0), properties=pl.lit("{}"),
        created_at=made, updated_at=made,
    )
    keys = draw(st.lists(st.sampled_from(("name", "role", "language", "favorite_color")), unique=True, max_size=3))
    souls = pl.DataFrame(
        {
            "id": [_uuid(20_000 + i) for i in range(len(keys))],
            "scope_path": SCOPE,
            "tenant_id": "prop",
            "key": keys,
            "value": [draw(st.sampled_from(("v1", "v2", "old"))) for _ in keys],
            "updated_at": AS_OF - timedelta(days=3),
            "version": 1,
        },
        schema_overrides={"updated_at": tables.TS},
    )
    previous = draw(st.sampled_from((None, 2, 30)))
    snap = Snapshot(
        scope_path=SCOPE,
        taken_at=AS_OF,
        previous_run_as_of=None if previous is None else AS_OF - timedelta(hours=previous),
        frames={
            "memory_nodes": tables.conform("memory_nodes", nodes),
            "memory_edges": tables.conform("memory_edges", edges),
            "soul_profiles": tables.conform("soul_profiles", souls),
        },
    )
    config = ConsolidationConfig(
        prune_orphans={"max_degree": draw(st.integers(0, 2))},
        meta_nodes={"min_group": draw(st.integers(2, 3)), "max_members": draw(st.integers(1, 3))},
        decay_importance={"min_interval_hours": draw(st.sampled_from((0, 24)))},
    )
    return snap, config


def _reversed(snap: Snapshot) -> Snapshot:
    return snap.with_frames({name: frame.reverse() for name, frame in snap.frames.items()})


def _run(snap: Snapshot, config: ConsolidationConfig, phase: str):
    # Rows the snapshot quarantine would set aside (blank labels, non-object properties) are kept on
    # purpose: the phases must tolerate them, and skipping the quarantine keeps the tests fast.
    return transform(snap, config, AS_OF, phases=[phase], check_rows=False)


def _check_common(snap: Snapshot, config: ConsolidationConfig, phase: str):
    first = _run(snap, config, phase)
    assert first.report.phases_run == [phase]
    assert first.scope_diff().content_hash() == first.report.diff_hash
    assert _run(_reversed(snap), config, phase).report.diff_hash == first.report.diff_hash
    failures = validate_diff(first.diff, snap, config)  # the shard form (every row with its scope_path)
    assert failures.height == 0, failures.to_dicts()
    assert validate_diff(first.scope_diff(), snap, config).height == 0  # the single-scope form
    for name, td in first.scope_diff().tables.items():
        assert set(td.inserts.get_column("phase")) <= {phase}
        if td.inserts.height:
            assert set(td.inserts.get_column("scope_path")) == {SCOPE}
            assert set(td.inserts.get_column("tenant_id")) == {"prop"}
        for kind in (td.updates, td.deletes):
            assert set(kind.get_column("id")) <= set(snap.table(name).get_column("id"))
    folded = replace(first.scope_diff().fold(snap), previous_run_as_of=AS_OF)
    again = _run(folded, config, phase)
    assert not again.scope_diff().has_changes, again.scope_diff().row_counts()
    return first, folded


def _prefix(label: str) -> str | None:
    text = label.split(":", 1)[0] if ":" in label else (label.split() or [None])[0]
    return None if text is None or not text.strip() else text.strip().lower()


def _protected(label: str) -> bool:
    return label.startswith(("SOUL:", "AGENT_IDENTITY:"))


@FAST
@given(snapshots())
def test_prune_orphans(case):
    snap, config = case
    first, folded = _check_common(snap, config, "prune_orphans")
    knobs = config.prune_orphans
    # Brute-force reference: expired nodes, then peel weak nodes one at a time until none qualifies.
    nodes = {r["id"]: r for r in snap.table("memory_nodes").to_dicts()}
    neighbours = {i: set() for i in nodes}
    for e in snap.table("memory_edges").to_dicts():
        if e["source_id"] != e["target_id"]:
            neighbours[e["source_id"]].add(e["target_id"])
            neighbours[e["target_id"]].add(e["source_id"])
    live = {i for i, r in nodes.items() if r["layer"] == "semantic" and not _protected(r["label"])}
    expired = set()
    for i in live:
        ttl = json.loads(nodes[i]["properties"]).get("ttl_hours") if nodes[i]["properties"].startswith("{") else None
        if isinstance(ttl, (int, float)) and nodes[i]["updated_at"] + timedelta(hours=ttl) <= AS_OF:
            expired.add(i)
    old = AS_OF - timedelta(days=knobs.min_age_days)
    weak = {i for i in live - expired if nodes[i]["importance"] < knobs.importance_factor * 10 and nodes[i]["updated_at"] < old}
    gone = set(expired)
    changed = True
    while changed:
        changed = False
        for i in sorted(weak - gone):
            if len(neighbours[i] - gone) <= knobs.max_degree:
                gone.add(i)
                changed = True
    deleted = set(first.scope_diff().table("memory_nodes").deletes.get_column("id"))
    assert deleted == gone, (sorted(deleted - gone), sorted(gone - deleted))
    assert first.report.counters["nodes_pruned"] == len(gone)
    edges_left = folded.table("memory_edges")
    assert not edges_left.filter(pl.col("source_id").is_in(list(gone)) | pl.col("target_id").is_in(list(gone))).height


@FAST
@given(snapshots())
def test_meta_nodes(case):
    snap, config = case
    first, folded = _check_common(snap, config, "meta_nodes")
    knobs = config.meta_nodes
    groups: dict[str, list[dict]] = {}
    for r in snap.table("memory_nodes").to_dicts():
        if r["layer"] == "semantic" and not r["label"].startswith("META:") and not _protected(r["label"]):
            if (p := _prefix(r["label"])) is not None:
                groups.setdefault(p, []).append(r)
    nodes = folded.table("memory_nodes")
    edges = folded.table("memory_edges").filter(pl.col("relation") == "CLUSTERS")
    inserted = first.scope_diff().table("memory_nodes").inserts
    for row in inserted.to_dicts():
        assert row["id"] == created_id(SCOPE, "meta_nodes", row["label"][len("META:"):])
    for row in first.scope_diff().table("memory_edges").inserts.to_dicts():
        assert row["id"] == created_id(SCOPE, "meta_nodes", f"{row['source_id']}|{row['target_id']}")
    expected_new = 0
    for prefix, members in groups.items():
        if len(members) < knobs.min_group:
            continue
        ranked = sorted(members, key=lambda r: (-r["importance"], -r["updated_at"].timestamp(), r["id"]))
        top = ranked[: knobs.max_members]
        metas = nodes.filter((pl.col("label") == f"META:{prefix}") & (pl.col("layer") == "semantic"))
        before = snap.table("memory_nodes").filter(pl.col("label") == f"META:{prefix}", pl.col("layer") == "semantic")
        expected_new += not before.height
        meta = metas.sort(["importance", "updated_at", "id"], descending=[True, True, False]).row(0, named=True)
        props = json.loads(meta["properties"])
        assert props["member_count"] == len(members)
        assert props["member_ids"] == [r["id"] for r in top]
        assert props["summary"].startswith(f"{prefix} ({len(members)}): " + "; ".join(r["label"] for r in top))
        targets = edges.filter(pl.col("source_id") == meta["id"]).get_column("target_id").to_list()
        assert sorted(targets) == sorted(r["id"] for r in top)  # exactly the top members: the cap holds
    assert first.report.counters["meta_nodes_created"] == expected_new == inserted.height


@FAST
@given(snapshots())
def test_soul_corrections(case):
    snap, config = case
    first, folded = _check_common(snap, config, "soul_corrections")
    # Same window again (previous run unchanged): the upsert is a no-op on its own result.
    assert not _run(first.scope_diff().fold(snap), config, "soul_corrections").scope_diff().has_changes
    start = AS_OF - timedelta(hours=config.lookback_hours)
    start = max(start, snap.previous_run_as_of) if snap.previous_run_as_of else start
    latest: dict[str, tuple] = {}
    rejected = 0
    for r in snap.table("memory_nodes").to_dicts():
        props = json.loads(r["properties"]) if r["properties"].startswith("{") else {}
        if not (r["layer"] == "semantic" and start < r["updated_at"] <= AS_OF and r["label"].startswith("SOUL:")):
            continue
        if props.get("_last_edited_by") != "user_manual_edit":
            continue
        key = r["label"][len("SOUL:"):].strip().lower()
        if key not in config.soul_corrections.canonical_keys or "value" not in props:
            rejected += 1
            continue
        if key not in latest or (-r["updated_at"].timestamp(), r["id"]) < latest[key][0]:
            latest[key] = ((-r["updated_at"].timestamp(), r["id"]), props["value"])
    profiles = {r["key"]: r["value"] for r in folded.table("soul_profiles").to_dicts()}
    for key, (_, value) in latest.items():
        assert profiles[key] == value
    assert folded.table("soul_profiles").get_column("key").is_unique().all()
    assert first.report.counters["soul_rejected"] == rejected
    assert len(first.report.notes.get("soul_corrections", [])) == rejected
    for row in first.scope_diff().table("soul_profiles").inserts.to_dicts():
        assert row["id"] == created_id(SCOPE, "soul_corrections", row["key"])


@FAST
@given(snapshots())
def test_decay_importance(case):
    snap, config = case
    first, _ = _check_common(snap, config, "decay_importance")
    knobs = config.decay_importance
    expected = {}
    for r in snap.table("memory_nodes").to_dicts():
        last = r["last_decayed_at"]
        if (
            r["layer"] == "semantic"
            and not _protected(r["label"])
            and r["updated_at"] < AS_OF - timedelta(days=knobs.stale_days)
            and knobs.floor < r["importance"] < knobs.exempt_importance
            and (last is None or (last <= AS_OF - timedelta(hours=knobs.min_interval_hours) and last < AS_OF))
        ):
            expected[r["id"]] = max(r["importance"] - knobs.step, knobs.floor)
    updates = first.scope_diff().table("memory_nodes").updates
    got = dict(updates.select("id", "importance").iter_rows()) if updates.height else {}
    assert got == expected
    assert first.report.counters["nodes_decayed"] == len(expected)


def test_rejected_soul_key_is_named_in_the_notes():
    edit = {
        "id": _uuid(1), "scope_path": SCOPE, "tenant_id": "prop", "layer": "semantic", "label": "SOUL:favorite_color",
        "properties": '{"_last_edited_by": "user_manual_edit", "value": "teal"}', "importance": 5.0,
        "updated_at": AS_OF - timedelta(hours=1), "version": 1,
    }
    snap = Snapshot(SCOPE, AS_OF, frames={"memory_nodes": tables.conform("memory_nodes", pl.DataFrame([edit]))})
    result = _run(snap, ConsolidationConfig(), "soul_corrections")
    assert result.report.notes["soul_corrections"] == [
        f"rejected SOUL key 'favorite_color' (node {_uuid(1)}): only name, role, personality, language are honoured"
    ]
    assert result.report.counters["soul_rejected"] == 1 and not result.scope_diff().has_changes
