"""Property tests of the graph phases (cooccurrence, tag_risk, pending_edges, supersession) over
random small snapshots built directly as frames (no database).

Each phase: same input (in any row order) → same diff hash; the diff validates; every row stays in
the run's scope; folding the diff in and rerunning (previous run = this ``as_of``) changes
nothing.  Cooccurrence and tag_risk are also checked against brute-force references.
"""

from __future__ import annotations

import json
import unicodedata
from datetime import UTC, datetime, timedelta

import polars as pl
from deep_sleep.transforms._common import window_start
from deep_sleep.transforms.config import ConsolidationConfig
from deep_sleep.transforms.pending_edges import OUTCOMES
from deep_sleep.validation import validate_diff
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from deep_sleep.core import tables
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run.transform import transform

SCOPE = "org\x1fprop\x1fbrand\x1fb1"
AS_OF = datetime(2026, 11, 20, 3, tzinfo=UTC)
GRAPH = ("cooccurrence", "tag_risk", "pending_edges", "supersession")
RELATIONS = ("CO_OCCURRED", "is", "lives_in", "likes", "RELATED_TO")
LABELS = ("alpha", "beta", "Risky plan", "terror", "errors found", "my_error", "asterisk", "SOUL:name", "gamma")
PROPS = (
    "{}",
    '{"note": "a warning sign"}',
    '{"note": "subterranean"}',
    '{"danger": "none"}',
    '{"meta": {"x": "risk"}}',
    '{"risk_node": true}',
    '{"risk_node": false, "v": "LOSS"}',
    '{"n": "x\\nthreat"}',
    "[1]",
)
# Offsets of updated_at before as_of (s): ties, the 900 s boundary, the window start, the future.
OFFSETS = (0, 0, 1, 30, 60, 100, 300, 899.999999, 900, 900.000001, 1800, 3600, 86400, 86400 * 3, -1)
FAST = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _uuid(i: int) -> str:
    return f"00000000-0000-4000-8000-{i:012x}"


@st.composite
def snapshots(draw) -> tuple[Snapshot, ConsolidationConfig]:
    n = draw(st.integers(0, 10))
    ids = [_uuid(i) for i in draw(st.lists(st.integers(1, 4095), min_size=n, max_size=n, unique=True))]
    nodes = pl.DataFrame(
        {
            "id": ids,
            "scope_path": SCOPE,
            "tenant_id": "prop",
            "layer": [draw(st.sampled_from(("semantic",) * 5 + ("working",))) for _ in ids],
            "label": [draw(st.sampled_from(LABELS)) for _ in ids],
            "properties": [draw(st.sampled_from(PROPS)) for _ in ids],
            "importance": [float(draw(st.integers(1, 10))) for _ in ids],
            "access_count": 0,
            "created_at": AS_OF - timedelta(days=10),
            "updated_at": [AS_OF - timedelta(seconds=draw(st.sampled_from(OFFSETS))) for _ in ids],
            "version": [draw(st.integers(1, 5)) for _ in ids],
        },
        schema_overrides={"created_at": tables.TS, "updated_at": tables.TS},
    )
    edge_rows, seen = [], set()
    if n:
        for k in range(draw(st.integers(0, 3 * n))):
            s, t = draw(st.sampled_from(ids)), draw(st.sampled_from(ids))
            rel = draw(st.sampled_from(RELATIONS))
            if (s, t, rel) in seen:
                continue
            seen.add((s, t, rel))
            created = AS_OF - timedelta(days=draw(st.integers(1, 4)))
            edge_rows.append(
                {
                    "id": _uuid(0x100000 + k),
                    "source_id": s,
                    "target_id": t,
                    "relation": rel,
                    "weight": float(draw(st.integers(0, 3))),
                    "properties": draw(st.sampled_from(("{}", '{"functional": true}', '{"functional": "true"}'))),
                    "created_at": created,
                    "updated_at": created,
                    "valid_from": created,
                    "valid_to": draw(st.sampled_from((None, None, None, created + timedelta(hours=1)))),
                    "version": draw(st.integers(1, 3)),
                }
            )
    edges = tables.conform(
        "memory_edges", pl.DataFrame(edge_rows, schema={**tables.schema("memory_edges")}, orient="row") if edge_rows else tables.empty("memory_edges")
    ).with_columns(scope_path=pl.lit(SCOPE), tenant_id=pl.lit("prop"))
    labels = sorted(set(nodes.get_column("label").to_list())) + ["nobody"]
    pending = [
        {
            "id": _uuid(0x200000 + k),
            "source_label": draw(st.sampled_from(labels)),
            "target_label": draw(st.sampled_from(labels)),
            "relation": draw(st.sampled_from(RELATIONS)),
            "weight": 0.5,
            "created_at": AS_OF - timedelta(minutes=draw(st.integers(0, 3))),
            "consumed_by_run": draw(st.sampled_from((None, None, _uuid(0x300000)))),
            "version": 1,
        }
        for k in range(draw(st.integers(0, 6)))
    ]
    pending_frame = tables.conform("pending_connections", pl.DataFrame(pending) if pending else tables.empty("pending_connections"))
    pending_frame = pending_frame.with_columns(scope_path=pl.lit(SCOPE), tenant_id=pl.lit("prop"))
    prev = draw(st.sampled_from((None, AS_OF - timedelta(hours=1), AS_OF - timedelta(hours=48))))
    snap = Snapshot(
        SCOPE,
        AS_OF,
        prev,
        {
            "memory_nodes": tables.conform("memory_nodes", nodes),
            "memory_edges": edges,
            "pending_connections": pending_frame,
        },
    )
    config = ConsolidationConfig(
        cooccurrence={"max_neighbours": draw(st.integers(0, 5)), "window_seconds": draw(st.sampled_from((900.0, 0.0, 3600.0)))}
    )
    return snap, config


def _run(snap: Snapshot, config: ConsolidationConfig, phases=GRAPH):
    # The generated rows are clean by construction (except one non-object ``properties`` that the
    # phases must tolerate), so the snapshot quarantine is skipped: it would dominate the runtime.
    return transform(snap, config, AS_OF, phases=list(phases), check_rows=False)


def _shuffled(snap: Snapshot, seed: int) -> Snapshot:
    return snap.with_frames({name: frame.sample(fraction=1.0, shuffle=True, seed=seed) for name, frame in snap.frames.items()})


def _rerun_snapshot(snap: Snapshot, diff) -> Snapshot:
    folded = diff.fold(snap)
    return Snapshot(folded.scope_path, folded.taken_at, AS_OF, folded.frames)


def _check_scope(diff, snap: Snapshot) -> None:
    for name, td in diff.tables.items():
        if td.inserts.height:
            assert td.inserts.get_column("scope_path").eq(SCOPE).all(), name
            assert td.inserts.get_column("tenant_id").eq("prop").all(), name
        for frame in (td.updates, td.deletes):
            assert frame.get_column("id").is_in(snap.table(name).get_column("id").implode()).all(), name


@FAST
@given(snapshots(), st.sampled_from(GRAPH + ("all",)), st.integers(0, 1000))
def test_deterministic_valid_scoped_idempotent(case, phase, seed):
    snap, config = case
    phases = GRAPH if phase == "all" else (phase,)
    first = _run(snap, config, phases)
    again = _run(_shuffled(snap, seed), config, phases)
    assert first.report.diff_hash == again.report.diff_hash == first.scope_diff().content_hash()
    assert first.report.counters == again.report.counters
    for name, td in first.scope_diff().tables.items():  # created ids do not depend on row order or the run
        assert sorted(td.inserts.get_column("id")) == sorted(again.scope_diff().table(name).inserts.get_column("id"))
    clean = first.scope_snapshot()
    failures = validate_diff(first.diff, first.shard)  # the shard form (every row with its scope_path)
    assert failures.is_empty(), failures.to_dicts()
    assert validate_diff(first.scope_diff(), clean).is_empty()  # the single-scope form
    _check_scope(first.scope_diff(), clean)
    for td in first.diff.tables.values():  # the shard diff names each row's scope: this one
        assert all(f.get_column("scope_path").eq(SCOPE).all() for f in td.frames().values() if f.height)
    rerun = _run(_rerun_snapshot(clean, first.scope_diff()), config, phases)
    assert not rerun.scope_diff().has_changes, rerun.scope_diff().row_counts()


def _co_neighbours(edges: pl.DataFrame) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for e in edges.filter((pl.col("relation") == "CO_OCCURRED") & (pl.col("source_id") != pl.col("target_id"))).iter_rows(named=True):
        out.setdefault(e["source_id"], set()).add(e["target_id"])
        out.setdefault(e["target_id"], set()).add(e["source_id"])
    return out


def _cooccurrence_reference(snap: Snapshot, config: ConsolidationConfig):
    """The SPEC rule, O(N²): every node ranks all its candidates."""
    k, width = config.cooccurrence.max_neighbours, timedelta(seconds=config.cooccurrence.window_seconds)
    start = window_start(snap, AS_OF, config.lookback_hours)
    nodes = snap.table("memory_nodes").filter(pl.col("layer") == "semantic")
    t = {r["id"]: r["updated_at"] for r in nodes.iter_rows(named=True) if start < r["updated_at"] <= AS_OF}
    nbrs = _co_neighbours(snap.table("memory_edges"))
    co = snap.table("memory_edges").filter((pl.col("relation") == "CO_OCCURRED") & (pl.col("source_id") != pl.col("target_id")))
    reinforced = sorted(
        e["id"] for e in co.iter_rows(named=True)
        if e["source_id"] in t and e["target_id"] in t and abs(t[e["source_id"]] - t[e["target_id"]]) <= width
    )
    top = {}
    for a in t:
        cands = sorted((abs(t[a] - t[b]), b) for b in t if b != a and abs(t[a] - t[b]) <= width and b not in nbrs.get(a, ()))
        top[a] = {b for _, b in cands[: max(0, k - len(nbrs.get(a, ())))]}
    created = sorted((a, b) for a in t for b in top[a] if a < b and a in top[b])
    return created, reinforced


@FAST
@given(snapshots())
def test_cooccurrence_matches_the_quadratic_rule_and_keeps_the_cap(case):
    result = _run(case[0], case[1], ["cooccurrence"])
    snap, config, diff = result.scope_snapshot(), case[1], result.scope_diff()
    edges = diff.table("memory_edges")
    created = sorted(edges.inserts.select("source_id", "target_id").iter_rows()) if edges.inserts.height else []
    reinforced = sorted(edges.updates.get_column("id").to_list())
    assert (created, reinforced) == _cooccurrence_reference(snap, config)
    k = config.cooccurrence.max_neighbours
    before, after = _co_neighbours(snap.table("memory_edges")), _co_neighbours(diff.fold(snap).table("memory_edges"))
    for node, now in after.items():
        had = before.get(node, set())
        assert len(now) <= max(k, len(had)), node
        if len(had) >= k:
            assert now == had, node


def _word_start_hit(text: str, markers) -> bool:
    low = text.lower()
    for m in markers:
        at = low.find(m)
        while at >= 0:
            prev = low[at - 1] if at else ""
            if not prev or not (prev.isalnum() or unicodedata.category(prev).startswith("M")):
                return True
            at = low.find(m, at + 1)
    return False


@FAST
@given(snapshots())
def test_tag_risk_matches_a_reference(case):
    result = _run(case[0], case[1], ["tag_risk"])
    snap, config = result.scope_snapshot(), case[1]
    markers = config.tag_risk.markers
    start = window_start(snap, AS_OF, config.lookback_hours)
    expected = []
    for r in snap.table("memory_nodes").iter_rows(named=True):
        props = json.loads(r["properties"])
        if r["layer"] != "semantic" or not (start < r["updated_at"] <= AS_OF) or not isinstance(props, dict):
            continue
        if props.get("risk_node") is True:
            continue
        texts = [r["label"]] + [v for v in props.values() if isinstance(v, str)]
        if any(_word_start_hit(x, markers) for x in texts):
            expected.append(r["id"])
    updates = result.scope_diff().table("memory_nodes").updates
    assert sorted(updates.get_column("id").to_list()) == sorted(expected)
    for text in updates.get_column("properties", default=pl.Series([], dtype=pl.String)):
        props = json.loads(text)
        assert props["risk_node"] is True and props["risk_tagged_at"] == "2026-11-20T03:00:00Z"


@FAST
@given(snapshots())
def test_pending_edges_consumes_every_open_row_once(case):
    result = _run(case[0], case[1], ["cooccurrence", "pending_edges"])
    snap = result.scope_snapshot()
    open_rows = snap.table("pending_connections").filter(pl.col("consumed_by_run").is_null())
    if not open_rows.height:
        assert result.report.phases_skipped["pending_edges"] == "missing input: no pending connections"
        return
    updates = result.scope_diff().table("pending_connections").updates
    assert sorted(updates.get_column("id").to_list()) == sorted(open_rows.get_column("id").to_list())
    assert set(updates.get_column("outcome").to_list()) <= set(OUTCOMES)
    assert updates.get_column("consumed_by_run").n_unique() == 1
    edges = result.scope_diff().fold(snap).table("memory_edges")
    assert edges.select("source_id", "target_id", "relation").is_unique().all()
    before, after = _co_neighbours(snap.table("memory_edges")), _co_neighbours(edges)
    for node, now in after.items():  # pending CO_OCCURRED edges respect the (default) cap too
        assert len(now) <= max(5, len(before.get(node, ()))), node
    assert result.report.counters_by_phase.get("pending_edges", {}).get("edges_created", 0) == updates.filter(pl.col("outcome") == "created").height


@FAST
@given(snapshots())
def test_supersession_leaves_one_current_edge_per_functional_group(case):
    result = _run(case[0], case[1], ["supersession"])
    snap, config, diff = result.scope_snapshot(), case[1], result.scope_diff()
    edges = diff.fold(snap).table("memory_edges")
    functional = pl.col("relation").is_in(pl.Series(list(config.supersession.functional_relations)).implode()) | (
        pl.col("properties").str.json_path_match("$.functional") == "true"
    ) & ~pl.col("properties").str.contains('"true"', literal=True)
    current = edges.filter(pl.col("valid_to").is_null() & functional)
    assert current.group_by("source_id", "relation").len().get_column("len").max() in (None, 1)
    before = snap.table("memory_edges").select("id", "valid_to", "created_at")
    closed = diff.table("memory_edges").updates.select("id").join(before, on="id")
    assert closed.get_column("valid_to").is_null().all()


def test_pending_edges_skips_without_open_rows():
    snap = Snapshot(SCOPE, AS_OF, None, {})
    result = _run(snap, ConsolidationConfig(), ["pending_edges"])
    assert result.report.phases_skipped == {"pending_edges": "missing input: no pending connections"}


def test_pending_edges_sees_edges_created_earlier_in_the_run():
    """A pending row proposing the CO_OCCURRED edge cooccurrence just created reports ``exists``."""
    ids = [_uuid(1), _uuid(2)]
    nodes = tables.conform(
        "memory_nodes",
        pl.DataFrame(
            {
                "id": ids, "scope_path": SCOPE, "tenant_id": "prop", "layer": "semantic", "label": ["a", "b"],
                "properties": "{}", "importance": 5.0, "access_count": 0, "created_at": AS_OF, "version": 1,
                "updated_at": [AS_OF - timedelta(minutes=5), AS_OF - timedelta(minutes=1)],
            }
        ),
    )
    pending = tables.conform(
        "pending_connections",
        pl.DataFrame(
            {
                "id": [_uuid(0x200001)], "scope_path": SCOPE, "tenant_id": "prop", "source_label": "a", "target_label": "b",
                "relation": "CO_OCCURRED", "weight": 1.0, "created_at": AS_OF, "version": 1,
            }
        ),
    )
    snap = Snapshot(SCOPE, AS_OF, None, {"memory_nodes": nodes, "pending_connections": pending})
    result = _run(snap, ConsolidationConfig(), ["cooccurrence", "pending_edges"])
    assert result.report.counters["edges_created"] == 1
    assert result.scope_diff().table("pending_connections").updates.get_column("outcome").to_list() == ["exists"]


def test_supersession_closes_a_fact_created_earlier_in_the_same_run():
    """Two pending ``is`` facts of one source are both created (created_at = as_of, a tie): the larger id
    stays current and the other, an insert of this run, is closed at once — one insert row each."""
    ids = [_uuid(1), _uuid(2), _uuid(3)]
    nodes = tables.conform(
        "memory_nodes",
        pl.DataFrame(
            {
                "id": ids, "scope_path": SCOPE, "tenant_id": "prop", "layer": "semantic", "label": ["a", "x", "y"],
                "properties": "{}", "importance": 5.0, "access_count": 0, "created_at": AS_OF, "version": 1,
                "updated_at": AS_OF - timedelta(days=3),
            }
        ),
    )
    pending = tables.conform(
        "pending_connections",
        pl.DataFrame(
            {
                "id": [_uuid(0x200001), _uuid(0x200002)], "scope_path": SCOPE, "tenant_id": "prop", "source_label": "a",
                "target_label": ["x", "y"], "relation": "is", "weight": 1.0, "created_at": AS_OF, "version": 1,
            }
        ),
    )
    snap = Snapshot(SCOPE, AS_OF, None, {"memory_nodes": nodes, "pending_connections": pending})
    result = _run(snap, ConsolidationConfig(), ["pending_edges", "supersession"])
    inserts = result.scope_diff().table("memory_edges").inserts.sort("id")
    assert inserts.height == 2 and not result.scope_diff().table("memory_edges").updates.height
    closed = inserts.filter(pl.col("valid_to").is_not_null())
    assert closed.height == 1 and closed.get_column("valid_to")[0] == AS_OF
    assert json.loads(closed.get_column("properties")[0])["superseded_by"] == inserts.get_column("id")[1]
    assert validate_diff(result.diff, result.shard).is_empty() and validate_diff(result.scope_diff(), result.scope_snapshot()).is_empty()
