"""Holds on the real store, read back (issue 31 item 6 in miniature): a failing recall-quality gate
holds the deletes on its own — with the delete share under the limit and the used-delete rule off —
in a single scope and in a two-scope shard (only the failing scope holds); an edge waits with its
held *target* node; and a META node whose stale CLUSTERS edge is held by a failed gate does not take
its replacement CLUSTERS edge tonight, so the store never holds a META node over its cap."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from deep_sleep.core.scope import Scope
from deep_sleep.jobs.approve import approve, reject
from deep_sleep.run import pipeline
from deep_sleep.transforms.config import ConsolidationConfig
from tests.storeutil import edge, embed_labels, insert, node, scalar, used

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
STRONG = [f"deploy pipeline stage {w} checklist" for w in ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot",
                                                            "golf", "hotel", "india", "juliet", "kilo", "lima")]
WEAK = "billing invoice retry policy"
# Only the gate can hold: a delete share up to 50 % applies, the used-delete rule is off.
GATE_ONLY = ConsolidationConfig(holds={"max_delete_share": 0.5, "used_deletes": False})


def _count(store, sql: str, *params) -> int:
    return scalar(store, sql, *params)


def _alive(store, node_id: str) -> bool:
    return _count(store, "SELECT count(*) FROM memory_nodes WHERE id = %s", node_id) == 1


def _weak_used_scope(store, scope: Scope, *, used_by_agent: bool) -> str:
    """Twelve strong, recent, connected nodes and one weak old orphan that phase 3 prunes (1 of 13
    semantic nodes: 7.7 %, under the 50 % limit); ``used_by_agent``: the agent used the orphan for
    "billing invoice retry" (so the gate, replaying that query, loses it).  Every node embedded."""
    strong = [node(scope, label, NOW - timedelta(days=1), importance=7.0) for label in STRONG]
    weak = node(scope, WEAK, NOW - timedelta(days=60), importance=2.0)
    insert(store, "memory_nodes", [*strong, weak])
    insert(store, "memory_edges", [edge(scope, a["id"], b["id"], at=NOW - timedelta(days=1)) for a, b in zip(strong, strong[1:])])
    embed_labels(store, scope)
    if used_by_agent:
        insert(store, "recall_events", [used(scope, weak["id"], "billing invoice retry", NOW - timedelta(hours=2))])
    return weak["id"]


def test_a_failing_gate_alone_holds_the_deletes_of_a_single_scope(store, scope, runs_dir):
    weak = _weak_used_scope(store, scope, used_by_agent=True)
    run = pipeline.consolidate(store, scope, NOW, GATE_ONLY, runs_dir=runs_dir).report()
    assert run.status == "applied", run.errors
    assert run.gate["status"] == "measured" and run.gate["failed"] is True, run.gate
    assert run.held["reasons"] == {"gate_failed": 1} and run.held["rows"] == {"memory_nodes": {"deletes": 1}}
    assert _alive(store, weak)
    assert _count(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s", run.run_id) == 0
    assert _count(store, "SELECT count(*) FROM consolidation_runs WHERE run_id = %s AND hold_status = 'pending'", run.run_id) == 1
    # the same scope with the gate off: the delete applies (the gate, and nothing else, held it)
    off = pipeline.consolidate(store, scope, NOW + timedelta(minutes=5),
                               GATE_ONLY.model_copy(update={"gate": GATE_ONLY.gate.model_copy(update={"enabled": False})}),
                               runs_dir=runs_dir).report()
    assert off.held == {} and off.rows_changed["memory_nodes"]["deletes"] == 1
    assert not _alive(store, weak)


def test_a_failing_gate_holds_only_its_own_scopes_deletes_in_a_shard(store, scope, runs_dir):
    other = Scope.from_path([*scope.levels[:-1], (scope.levels[-1][0], scope.levels[-1][1] + "x")])
    failing = _weak_used_scope(store, scope, used_by_agent=True)
    passing = _weak_used_scope(store, other, used_by_agent=False)  # nothing used: its gate cannot fail
    state = pipeline.consolidate(store, [scope, other], NOW, GATE_ONLY, runs_dir=runs_dir)
    mine, theirs = state.reports[scope.path], state.reports[other.path]
    assert mine.status == theirs.status == "applied"
    assert mine.gate["failed"] is True and theirs.gate["failed"] is False
    assert mine.held["reasons"] == {"gate_failed": 1} and theirs.held == {}
    assert _alive(store, failing) and not _alive(store, passing)
    assert mine.rows_changed.get("memory_nodes", {}).get("deletes", 0) == 0
    assert theirs.rows_changed["memory_nodes"]["deletes"] == 1
    assert _count(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s", theirs.run_id) == 1
    assert _count(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s", mine.run_id) == 0


def test_an_edge_waits_with_its_held_target_node(store, scope, runs_dir):
    """The edge hub → scratch has the held node as its TARGET (test_holds covers the source): the
    node's delete waits (the agent used it) and the edge waits with it; approving takes both."""
    hub = node(scope, "project: hub", NOW - timedelta(hours=3))
    scratch = node(scope, "note: scratch", NOW - timedelta(hours=2), layer="working", properties={"ttl_hours": 1})
    e = edge(scope, hub["id"], scratch["id"], at=NOW - timedelta(hours=2))
    insert(store, "memory_nodes", [hub, scratch])
    insert(store, "memory_edges", [e])
    insert(store, "recall_events", [used(scope, scratch["id"], "scratch", NOW - timedelta(hours=1))])
    run = pipeline.consolidate(store, scope, NOW, runs_dir=runs_dir, phases=("working_ttl",)).report()
    assert run.held["reasons"] == {"used_node": 1, "with_held_node": 1}, run.held
    assert run.held["rows"] == {"memory_edges": {"deletes": 1}, "memory_nodes": {"deletes": 1}}
    assert _alive(store, scratch["id"]) and _count(store, "SELECT count(*) FROM memory_edges WHERE id = %s", e["id"]) == 1
    d = approve(store, run.run_id)
    assert d.applied == {"memory_edges": {"deletes": 1}, "memory_nodes": {"deletes": 1}} and d.conflicts == 0
    assert not _alive(store, scratch["id"]) and _count(store, "SELECT count(*) FROM memory_edges WHERE id = %s", e["id"]) == 0
    assert _alive(store, hub["id"])


def _clusters(store, meta_label: str, scope: Scope) -> set[str]:
    with store.pg() as con:
        return {r[0] for r in con.execute(
            "SELECT e.target_id::text FROM memory_edges e JOIN memory_nodes m ON m.id = e.source_id AND m.scope_path = e.scope_path"
            " WHERE m.scope_path = %s AND m.label = %s AND e.relation = 'CLUSTERS'", (scope.path, meta_label))}


def _meta_text(store, scope) -> str:
    with store.pg() as con:
        return con.execute("SELECT properties::text FROM memory_nodes WHERE scope_path = %s AND label = 'META:project'",
                           (scope.path,)).fetchone()[0]


def held_cluster_swap(store, scope, runs_dir, *, cap: int = 3, chain: bool = False, night_two: bool = True):
    """The held member swap of issue 31 why-item 8, as the tests that decide it start from: META:project
    clusters its top ``cap`` of 5 members (``chain``: the members linked in a row, so they are no
    orphans); the weakest is lifted above them all and a used scratch note expires, so the next night's
    gate fails and holds the swap.  Returns (config, members, the first night's top, the scratch note,
    the second night's report, or None without ``night_two``)."""
    config = ConsolidationConfig(meta_nodes={"min_group": 2, "max_members": cap}, holds={"used_deletes": False})
    members = [node(scope, f"project: part {i}", NOW - timedelta(hours=3), importance=8.0 - i * 0.5) for i in range(5)]
    insert(store, "memory_nodes", members)
    if chain:
        insert(store, "memory_edges", [edge(scope, a["id"], b["id"], at=NOW - timedelta(hours=3)) for a, b in zip(members, members[1:])])
    phases = ("working_ttl", "meta_nodes")
    first = pipeline.consolidate(store, scope, NOW, config, runs_dir=runs_dir, phases=phases).report()
    assert first.status == "applied" and first.held == {}
    top = {m["id"] for m in members[:cap]}
    assert _clusters(store, "META:project", scope) == top
    scratch = node(scope, "note: scratch billing retry", NOW + timedelta(hours=1), layer="working", properties={"ttl_hours": 1})
    insert(store, "memory_nodes", [scratch])
    with store.pg() as con:  # the weakest member rises above them all
        con.execute("UPDATE memory_nodes SET importance = 9.5 WHERE id = %s", (members[4]["id"],))
        con.commit()
    embed_labels(store, scope)
    insert(store, "recall_events", [used(scope, scratch["id"], "scratch billing retry", NOW + timedelta(hours=2))])
    if not night_two:
        return config, members, top, scratch, None
    second = pipeline.consolidate(store, scope, NOW + timedelta(hours=3), config, runs_dir=runs_dir, phases=phases).report()
    # scratch + a CLUSTERS edge; the insert and the META node's refreshed text (it names the new member)
    assert second.held["reasons"] == {"gate_failed": 2, "cluster_cap": 2}, second.held
    return config, members, top, scratch, second


def test_a_failed_gate_keeps_a_meta_node_within_its_cap_in_the_applied_part(store, scope, runs_dir):
    """Issue 31 why-item 8: META:project clusters its top 3 of 5 members; a live write lifts a
    non-member into the top, so the next night drops the weakest member's CLUSTERS edge and adds the
    new one's — but its gate fails (a used scratch note expires), which holds every delete, the
    CLUSTERS edge's too; the replacement insert must wait with it (cluster_cap).  The store is read
    back: the META node never has more than 3 CLUSTERS edges, tonight or after the approval."""
    config, members, top, scratch, _ = held_cluster_swap(store, scope, runs_dir, chain=True, night_two=False)
    cap, lifted = 3, members[4]["id"]
    text_before = _meta_text(store, scope)
    second = pipeline.consolidate(store, scope, NOW + timedelta(hours=3), config, runs_dir=runs_dir,
                                  phases=("working_ttl", "meta_nodes")).report()
    assert second.status == "applied", second.errors
    assert second.gate["failed"] is True, second.gate
    # scratch + a CLUSTERS edge; the insert and the META node's refreshed text (it names the new member)
    assert second.held["reasons"] == {"gate_failed": 2, "cluster_cap": 2}, second.held
    assert second.held["rows"] == {"memory_edges": {"deletes": 1, "inserts": 1},
                                   "memory_nodes": {"deletes": 1, "updates": 1}}, second.held
    assert _clusters(store, "META:project", scope) == top  # not top + the lifted one: 4 > 3
    assert _alive(store, scratch["id"])
    assert _meta_text(store, scope) == text_before  # the text still names the members it has

    d = approve(store, second.run_id, config=config)
    assert d.conflicts == 0
    now_top = {lifted, members[0]["id"], members[1]["id"]}
    assert _clusters(store, "META:project", scope) == now_top and len(now_top) == cap
    assert not _alive(store, scratch["id"])
    assert _meta_text(store, scope) != text_before  # the refreshed text came with its members


def test_rejecting_the_held_cluster_change_keeps_the_old_members(store, scope, runs_dir):
    """The same night rejected: the META node keeps its old top members, within the cap."""
    _, _, top, _, second = held_cluster_swap(store, scope, runs_dir)
    reject(store, second.run_id)
    assert _clusters(store, "META:project", scope) == top


def test_an_approval_after_a_later_night_changed_the_members_keeps_the_meta_node_within_its_cap(store, scope, runs_dir):
    """Night 2's gate fails and holds its member swap (part 2 out, part 4 in).  Night 3 — the gate off —
    makes that swap; part 4 then falls and part 3 rises, and night 4 swaps them.  Approving night 2 now
    would add part 4 back beside three members (its stale delete is already gone): that insert must be
    a conflict, so the META node keeps its cap."""
    cap = 3
    config = ConsolidationConfig(meta_nodes={"min_group": 2, "max_members": cap}, holds={"used_deletes": False})
    no_gate = config.model_copy(update={"gate": config.gate.model_copy(update={"enabled": False})})
    members = [node(scope, f"project: part {i}", NOW - timedelta(hours=3), importance=8.0 - i * 0.5) for i in range(5)]
    insert(store, "memory_nodes", members)
    phases = ("working_ttl", "meta_nodes")
    pipeline.consolidate(store, scope, NOW, config, runs_dir=runs_dir, phases=phases)

    def lift(i: int, importance: float) -> None:
        with store.pg() as con:
            con.execute("UPDATE memory_nodes SET importance = %s WHERE id = %s", (importance, members[i]["id"]))
            con.commit()

    lift(4, 9.5)
    scratch = node(scope, "note: scratch billing retry", NOW + timedelta(hours=1), layer="working", properties={"ttl_hours": 1})
    insert(store, "memory_nodes", [scratch])
    embed_labels(store, scope)
    insert(store, "recall_events", [used(scope, scratch["id"], "scratch billing retry", NOW + timedelta(hours=2))])
    held = pipeline.consolidate(store, scope, NOW + timedelta(hours=3), config, runs_dir=runs_dir, phases=phases).report()
    assert held.held["reasons"] == {"gate_failed": 2, "cluster_cap": 2}, held.held  # + the META node's text
    third = pipeline.consolidate(store, scope, NOW + timedelta(hours=4), no_gate, runs_dir=runs_dir, phases=("meta_nodes",)).report()
    assert third.rows_changed["memory_edges"] == {"deletes": 1, "inserts": 1}
    lift(4, 1.0)
    lift(3, 9.7)
    fourth = pipeline.consolidate(store, scope, NOW + timedelta(hours=5), no_gate, runs_dir=runs_dir, phases=("meta_nodes",)).report()
    assert fourth.rows_changed["memory_edges"] == {"deletes": 1, "inserts": 1}
    now_top = {members[3]["id"], members[0]["id"], members[1]["id"]}
    assert _clusters(store, "META:project", scope) == now_top

    d = approve(store, held.run_id, config=config)
    assert d.applied["memory_edges"] == {"deletes": 0, "inserts": 0} and d.conflicts >= 2
    assert _clusters(store, "META:project", scope) == now_top
