"""Nothing lost: live writers during a nightly apply, and a crash at a random moment of it."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import polars as pl
import psycopg
import pytest
from deep_sleep.transforms.config import ConsolidationConfig

from deep_sleep.core.scope import Scope
from deep_sleep.run import pipeline
from deep_sleep.store.db import Store
from tests.storeutil import create_database, drop_database, scalar

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)
DOMAIN = ("memory_nodes", "memory_edges", "episodic_events")


def bulk_scope(store: Store, scope: Scope, nodes: int) -> None:
    """``nodes`` stale semantic nodes (decay will touch them all), half of them read twice in the
    last hour (strengthen), a chain of edges, and 150 old episodic events (a summary batch)."""
    with store.pg() as con:
        con.execute(
            """INSERT INTO memory_nodes (id, scope_path, tenant_id, layer, label, properties, importance,
                                         created_at, updated_at)
               SELECT md5(%(s)s || g)::uuid, %(s)s, %(t)s, 'semantic', 'topic' || (g %% 97) || ': item ' || g, '{}',
                      2 + (g %% 7), %(now)s - interval '90 days', %(now)s - interval '60 days' + (g || ' seconds')::interval
               FROM generate_series(1, %(n)s) g""",
            {"s": scope.path, "t": scope.tenant_id, "n": nodes, "now": NOW})
        con.execute(
            """INSERT INTO memory_access_log (scope_path, tenant_id, node_id, accessed_at)
               SELECT %(s)s, %(t)s, md5(%(s)s || g)::uuid, %(now)s - interval '1 minute' * k
               FROM generate_series(1, %(n)s, 2) g, generate_series(1, 2) k""",
            {"s": scope.path, "t": scope.tenant_id, "n": nodes, "now": NOW})
        con.execute(
            """INSERT INTO memory_edges (id, scope_path, tenant_id, source_id, target_id, relation, created_at, updated_at)
               SELECT md5('e' || %(s)s || g)::uuid, %(s)s, %(t)s, md5(%(s)s || g)::uuid, md5(%(s)s || (g + 1))::uuid,
                      'RELATED_TO', %(now)s - interval '60 days', %(now)s - interval '60 days'
               FROM generate_series(1, %(n)s - 1, 3) g""",
            {"s": scope.path, "t": scope.tenant_id, "n": nodes, "now": NOW})
        con.execute(
            """INSERT INTO episodic_events (id, scope_path, tenant_id, session_id, content, created_at)
               SELECT md5('ev' || %(s)s || g)::uuid, %(s)s, %(t)s, 's' || (g %% 5), 'event number ' || g,
                      %(now)s - interval '20 days' + (g || ' minutes')::interval
               FROM generate_series(1, 150) g""",
            {"s": scope.path, "t": scope.tenant_id, "now": NOW})
        con.commit()
        con.execute("ANALYZE")


def apply_from_files(store: Store, diff_dir: Path):
    """Apply what a planned run directory's files say applies (its diff less its held rows), as the
    run it names: an apply re-run by hand on a planned night's files, in any process."""
    from deep_sleep.core.diff import Diff
    from deep_sleep.core.report import ConsolidationReport
    from deep_sleep.jobs.undo_plan import without_rows
    from deep_sleep.run.apply import apply
    from deep_sleep.run.holds import read_held
    from deep_sleep.run.transform import as_shard_diff

    report = ConsolidationReport.read(diff_dir)
    s = report.scope_path
    diff = without_rows(as_shard_diff(Diff.read(diff_dir), s), read_held(diff_dir, s)[0])
    return apply(store, diff, {s: report.with_(status="planned")}, started_at=datetime.now(UTC))[s], report.run_id


def _planned(store: Store, scope: Scope, config: ConsolidationConfig, base: Path) -> Path:
    """The night up to its apply, files under ``base``; its diff directory."""
    ctx = pipeline.Context.of(NOW, config, scopes=scope, store=store, base=base, run_ids={scope.path: str(uuid.uuid4())})
    assert pipeline.run(pipeline.PLAN, ctx).report().status == "planned"
    return ctx.diff_dir


def checksum(store: Store, scope: Scope) -> dict[str, str]:
    with store.pg() as con:
        return {t: con.execute(f"SELECT md5(coalesce(string_agg(to_jsonb(x)::text, '|' ORDER BY id), '')) FROM {t} x WHERE scope_path = %s",
                               (scope.path,)).fetchone()[0] for t in DOMAIN}


LEDGER = ("run_id", "scope_path", "mode", "as_of", "status", "counters", "phases_run", "phases_skipped", "rows_changed",
          "conflicts", "diff_hash", "diff_uri", "errors", "quarantined")  # all but clocks (started/finished, timings)


def run_records(store: Store) -> dict[str, str]:
    """The ledger rows and the archive's before-images, as checksums (an interrupted apply leaves neither)."""
    with store.pg() as con:
        return {
            "consolidation_runs": con.execute(f"SELECT md5(coalesce(string_agg(jsonb_build_array({', '.join(LEDGER)})::text, '|' "
                                              "ORDER BY run_id), '')) FROM consolidation_runs").fetchone()[0],
            "consolidation_archive": con.execute("SELECT md5(coalesce(string_agg(jsonb_build_array(run_id, table_name, row_id, op, reason, row)::text, "
                                                 "'|' ORDER BY run_id, table_name, row_id, op), '')) FROM consolidation_archive").fetchone()[0],
        }


class Writer(threading.Thread):
    """A live agent: updates its own share of nodes -- the columns the apply writes too (importance,
    properties, access_count) -- and inserts new ones, remembering what it committed on each node
    and when each write began and returned (``time.time()``, to place it against the apply)."""

    def __init__(self, dsn: str, scope: Scope, ids: list[str], name: str, stop: threading.Event):
        super().__init__(daemon=True)
        self.dsn, self.scope, self.ids, self.tag, self.stop = dsn, scope, ids, name, stop
        self.last: dict[str, tuple[float, str]] = {}  # node -> (importance, properties.live) last committed
        self.count: dict[str, int] = {}  # node -> successful writes (its access_count, which starts at 0)
        self.first: dict[str, float] = {}  # node -> when its first successful write began
        self.spans: list[tuple[float, float]] = []  # (began, returned) of every successful update
        self.inserted: list[str] = []
        self.gone: set[str] = set()
        self.writes = 0
        self.error: BaseException | None = None

    def run(self) -> None:
        rng = random.Random(self.tag)
        try:
            with psycopg.connect(self.dsn, autocommit=True) as con:
                while not self.stop.is_set():
                    nid = rng.choice(self.ids)
                    importance = 2 + (self.writes % 500) / 100  # in [2, 7): the next run decays it
                    live = f"{self.tag} #{self.writes}"
                    began = time.time()
                    cur = con.execute("UPDATE memory_nodes SET importance = %s, properties = properties || jsonb_build_object('live', %s::text), "
                                      "access_count = access_count + 1 WHERE id = %s", (importance, live, nid))
                    if cur.rowcount == 1:
                        self.spans.append((began, time.time()))
                        self.last[nid] = (importance, live)
                        self.count[nid] = self.count.get(nid, 0) + 1
                        self.first.setdefault(nid, began)
                    else:  # consolidation deleted (and archived) the node before this write: nothing to write to
                        self.last.pop(nid, None)
                        self.gone.add(nid)
                    if self.writes % 5 == 0:
                        new = str(uuid.uuid4())
                        con.execute("INSERT INTO memory_nodes (id, scope_path, tenant_id, label, updated_at) VALUES (%s, %s, %s, %s, %s)",
                                    (new, self.scope.path, self.scope.tenant_id, f"live insert {self.tag}", NOW))
                        self.inserted.append(new)
                    self.writes += 1
        except BaseException as exc:  # surfaced by the test
            self.error = exc


def test_live_writers_during_a_large_apply_lose_nothing(store, scope, tmp_path):
    bulk_scope(store, scope, 30_000)
    config = ConsolidationConfig(holds={"enabled": False})  # every planned delete and decay is to land
    diff_dir = _planned(store, scope, config, tmp_path)
    with store.pg() as con:
        ids = [r[0] for r in con.execute("SELECT id::text FROM memory_nodes WHERE scope_path = %s ORDER BY id", (scope.path,))]
        decays = {r[0] for r in con.execute("SELECT id::text FROM memory_nodes WHERE scope_path = %s AND importance > 1 "
                                            "AND importance < 8", (scope.path,))}  # bulk_scope's nodes are all 60 days old
    stop = threading.Event()
    shares = [ids[i::4] for i in range(4)]  # each writer owns its nodes: the last write per node is known
    writers = [Writer(store.dsn, scope, share, f"w{i}", stop) for i, share in enumerate(shares)]
    for w in writers:
        w.start()
    time.sleep(0.5)  # live turns land between the snapshot and the apply ...
    apply_began = time.time()
    # ... and during it (no holds: every planned delete and decay is to land, for the checks below)
    report, run_id = apply_from_files(store, diff_dir)
    apply_ended = time.time()
    time.sleep(0.2)
    stop.set()
    for w in writers:
        w.join(timeout=30)
        assert w.error is None, w.error
    assert report.status == "applied"
    # writes that began after the apply began and returned before it ended: committed inside its transaction
    inside = sum(1 for w in writers for b, e in w.spans if apply_began < b and e < apply_ended)
    assert inside > 0 and sum(1 for w in writers for b, _ in w.spans if b < apply_began) > 0
    # every live write is present, row by row, in the columns the apply writes
    with store.pg() as con:
        rows = {r[0]: r[1:] for r in con.execute(
            "SELECT id::text, importance, properties->>'live', access_count, last_decayed_at FROM memory_nodes WHERE scope_path = %s",
            (scope.path,))}
    lost = [(nid, want, rows.get(nid)) for w in writers for nid, want in w.last.items()
            if nid not in rows or (rows[nid][0], rows[nid][1]) != want or rows[nid][2] != w.count[nid]]
    assert lost == []
    # a node first written before the apply began changed after the snapshot: the apply must have
    # skipped its decay (a conflict); a node nobody wrote got it
    early = {nid for w in writers for nid, t in w.first.items() if t < apply_began and nid in w.last}
    assert early and [nid for nid in early if rows[nid][3] is not None] == []
    written = {nid for w in writers for nid in w.first} | {g for w in writers for g in w.gone}
    planned = set(pl.read_parquet(diff_dir / "memory_nodes.updates.parquet").get_column("id").to_list())
    untouched = (decays & planned & rows.keys()) - written
    assert untouched and [nid for nid in untouched if rows[nid][3] != NOW] == []
    # a node planned for deletion whose neighbour a writer changed stays with the edge between them
    # (issue 31): the store never holds an edge without its node
    assert scalar(store, "SELECT count(*) FROM memory_edges e WHERE e.scope_path = %s AND NOT (EXISTS (SELECT 1 FROM"
                         " memory_nodes n WHERE n.id = e.source_id) AND EXISTS (SELECT 1 FROM memory_nodes n WHERE"
                         " n.id = e.target_id))", scope.path) == 0
    assert all(i in rows for w in writers for i in w.inserted)
    # a write that found no row hit a node the run had deleted before it: that node is archived by the run
    gone = sorted({g for w in writers for g in w.gone})
    assert scalar(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s AND row_id = ANY(%s)",
                  run_id, gone) == len(gone)
    assert report.conflicts >= len(early & decays)
    assert scalar(store, "SELECT conflicts FROM consolidation_runs WHERE run_id = %s", run_id) == report.conflicts
    # the next run consolidates what the live writers made it skip (the decay of those nodes)
    skipped = sorted(nid for nid in early if rows[nid][0] < 8)
    again = pipeline.consolidate(store, scope, NOW, config, runs_dir=tmp_path / "runs").report()
    assert again.status == "applied" and again.conflicts == 0
    # each was decayed, or (importance < 4, at most one neighbour, a week old) pruned
    with store.pg() as con:
        left = dict(con.execute("SELECT id::text, last_decayed_at FROM memory_nodes WHERE id = ANY(%s::uuid[])", (skipped,)).fetchall())
    assert [nid for nid, at in left.items() if at != NOW] == []
    assert scalar(store, "SELECT count(*) FROM consolidation_archive WHERE run_id = %s AND row_id = ANY(%s)",
                  again.run_id, sorted(set(skipped) - left.keys())) == len(set(skipped) - left.keys())


KILLED_APPLY = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from deep_sleep.store.db import Store
    from tests.run.test_concurrency import apply_from_files

    dsn, diff_dir, marker = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    store = Store(dsn)
    marker.write_text("starting")
    apply_from_files(store, Path(diff_dir))
    marker.write_text("done")
    """
)


def _clone(admin_dsn: str, template: str, name: str) -> Store:
    return create_database(admin_dsn, name, template=template)


@pytest.fixture(scope="module")
def crash_template(admin_dsn, tmp_path_factory):
    """A database with one mid-size scope and a planned diff for it, used as a template per trial."""
    name = f"ds_crash_tpl_{os.getpid()}"
    store = create_database(admin_dsn, name)
    scope = Scope.root("org", "crash").child("brand", "b1")
    bulk_scope(store, scope, 8_000)
    work = tmp_path_factory.mktemp("crash")
    diff_dir = _planned(store, scope, ConsolidationConfig(), work)
    before = {**checksum(store, scope), **run_records(store)}
    # the after-state, from an uninterrupted apply on a clone
    ref = _clone(admin_dsn, name, f"{name}_ref")
    t = time.perf_counter()
    apply_from_files(ref, diff_dir)
    seconds = time.perf_counter() - t
    after = {**checksum(ref, scope), **run_records(ref)}
    assert all(after[k] != before[k] for k in after)  # the run changes every domain table, the ledger and the archive
    yield {"admin": admin_dsn, "name": name, "scope": scope, "diff_dir": diff_dir, "before": before, "after": after, "seconds": seconds}
    for db in (name, f"{name}_ref", f"{name}_trial"):
        drop_database(admin_dsn, db)


# Each trial clones the store and starts a Python process; 10 kills at random moments inside the
# open transaction keep the suite's time in bounds (`make fuzz`-style soak: raise it locally).
TRIALS = int(os.environ.get("DEEP_SLEEP_SIGKILL_TRIALS", "10"))


def test_sigkill_at_random_moments_leaves_before_or_after_and_reruns_converge(crash_template, tmp_path):
    t = crash_template
    rng = random.Random(20261129)
    script = tmp_path / "apply.py"
    script.write_text(KILLED_APPLY)
    env = {**os.environ, "PYTHONPATH": str(Path.cwd())}
    outcomes = {"before": 0, "after": 0}
    opened: list[bool] = []
    for trial in range(TRIALS):
        store = _clone(t["admin"], t["name"], f"{t['name']}_trial")
        marker = tmp_path / f"m{trial}"
        proc = subprocess.Popen([sys.executable, str(script), store.dsn, str(t["diff_dir"]), str(marker)], env=env)
        deadline = time.monotonic() + 60
        with psycopg.connect(store.dsn, autocommit=True) as con:  # kill only inside the apply's open write transaction
            while not con.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
                                  "AND xact_start IS NOT NULL AND backend_xid IS NOT NULL").fetchone()[0]:
                assert time.monotonic() < deadline and proc.poll() is None, f"trial {trial}: the apply never opened its transaction"
                time.sleep(0.005)
        opened.append(not marker.exists() or marker.read_text() == "starting")
        time.sleep(rng.uniform(0, 1.3 * t["seconds"]))
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        with psycopg.connect(store.dsn) as con:  # wait until Postgres has noticed the dead backend
            for _ in range(300):
                busy = con.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                                   "AND pid <> pg_backend_pid()").fetchone()[0]
                if not busy:
                    break
                time.sleep(0.02)
        state = {**checksum(store, t["scope"]), **run_records(store)}
        assert state in (t["before"], t["after"]), (f"trial {trial}: the store is neither before nor after",
                                                    [k for k in state if state[k] not in (t["before"][k], t["after"][k])])
        outcomes["before" if state == t["before"] else "after"] += 1
        applied = scalar(store, "SELECT count(*) FROM consolidation_runs WHERE status = 'applied'")
        assert applied == (0 if state == t["before"] else 1)
        if state == t["before"]:  # a rerun converges to the after-state
            assert apply_from_files(store, t["diff_dir"])[0].status == "applied"
            assert {**checksum(store, t["scope"]), **run_records(store)} == t["after"]
    assert all(opened)  # every kill came after the transaction had opened, none before the child got going
    assert outcomes["before"] > 0  # most kills land inside the transaction
