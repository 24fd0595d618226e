"""The notebooks' demo store: a seeded store consolidated night by night through the stages.

``demo_store()`` gives (store, runs directory, scopes) with a few applied nights in the ledger and
their snapshot and diff directories on disk — built once into the database ``deep_sleep_notebooks``
of the embedded server (or ``--dsn``'s server) and under ``.deep_sleep/notebooks/runs``, then reused
(``fresh=True`` rebuilds).  Each night runs the nightly's stages (:mod:`deep_sleep.run.pipeline`)
for every scope, with a little live traffic so the charts have
something to show: before night 2 a few rows that break the store's invariants (quarantined by the
run), and during every night a live write to some rows the diff is about to update (conflicts).
"""

from __future__ import annotations

import shutil
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from deep_sleep.transforms.config import ConsolidationConfig
from deep_sleep.core.diff import Diff
from deep_sleep.core.scope import Scope
from deep_sleep.dev.seed import SeedSpec, scopes_of, seed_store
from deep_sleep.run import pipeline
from deep_sleep.run.layout import run_dir
from deep_sleep.store.db import Store, create_database, embedded_dsn, resolve_dsn

DATABASE = "deep_sleep_notebooks"
RUNS_DIR = Path(".deep_sleep") / "notebooks" / "runs"
NOW = datetime(2026, 11, 28, 3, 0, tzinfo=UTC)  # the seed's "now": the last night
NIGHTS = 3
SPEC = SeedSpec(tenants=2, scopes_per_tenant=2, nodes_per_scope=400, seed=11, now=NOW)


def nights(n: int = NIGHTS) -> list[datetime]:
    """The demo's nights, oldest first (the last one is the seed's now)."""
    return [NOW - timedelta(days=n - 1 - i) for i in range(n)]


def demo_store(dsn: str | None = None, runs_dir: str | Path | None = None, fresh: bool = False) -> tuple[Store, Path, list[Scope]]:
    admin = resolve_dsn(dsn) if dsn else embedded_dsn(database="postgres")
    runs = Path(runs_dir or RUNS_DIR).resolve()
    store = create_database(admin, DATABASE, replace=False)  # exists: migrated, kept
    with store.pg() as con:
        kept = [r[0] for r in con.execute("SELECT diff_uri FROM consolidation_runs WHERE status = 'applied'")]
    whole = len(kept) == NIGHTS * len(scopes_of(SPEC)) and all(
        u and Path(u).is_relative_to(runs) and (Path(u) / "report.json").is_file() for u in kept)
    if fresh or not whole:  # built elsewhere, or its files are gone: build it again
        store = create_database(admin, DATABASE)  # dropped and made afresh
        shutil.rmtree(runs, ignore_errors=True)
        seed_store(store, SPEC)
        for i, as_of in enumerate(nights()):
            if i == 1:
                _break_some_rows(store, scopes_of(SPEC)[1])
            for scope in scopes_of(SPEC):
                _night(store, scope, as_of, runs)
    return store, runs, scopes_of(SPEC)


def _night(store: Store, scope: Scope, as_of: datetime, runs: Path) -> None:
    """The night's stages (:data:`~deep_sleep.run.pipeline.NIGHT`), with a live turn between the plan and the apply."""
    run_id = str(uuid.uuid4())
    ctx = pipeline.Context.of(as_of, ConsolidationConfig(), scopes=scope, store=store, started_at=as_of,
                              base=run_dir(runs, scope, as_of, run_id), run_ids={scope.path: run_id})
    planned = pipeline.run(pipeline.PLAN, ctx)
    _live_writes(store, ctx.diff_dir)
    pipeline.run((pipeline.Apply(),), ctx, planned)


def _live_writes(store: Store, diff_dir: Path, rows: int = 3) -> None:
    """A live turn touches a few nodes the plan is about to update: the apply skips them (conflicts)."""
    updates = Diff.read(diff_dir).tables.get("memory_nodes")
    if updates is None or not updates.updates.height:
        return
    ids = updates.updates.get_column("id").sort().head(rows).to_list()
    with store.pg() as con:
        con.execute("UPDATE memory_nodes SET access_count = access_count + 1 WHERE id = ANY(%s::uuid[])", (ids,))
        con.commit()


def _break_some_rows(store: Store, scope: Scope) -> None:
    """Rows a buggy writer might leave: NaN importance, and an edge to a node that does not exist."""
    with store.pg() as con:
        con.execute(
            "INSERT INTO memory_nodes (id, scope_path, tenant_id, label, importance, updated_at) "
            "SELECT gen_random_uuid(), %s, %s, 'legacy: broken ' || g, 'NaN'::float8, %s FROM generate_series(1, 3) g",
            (scope.path, scope.tenant_id, NOW - timedelta(days=3)),
        )
        src = con.execute("SELECT id FROM memory_nodes WHERE scope_path = %s ORDER BY id LIMIT 1", (scope.path,)).fetchone()[0]
        con.execute(
            "INSERT INTO memory_edges (id, scope_path, tenant_id, source_id, target_id, relation) "
            "VALUES (gen_random_uuid(), %s, %s, %s, gen_random_uuid(), 'RELATED_TO')",
            (scope.path, scope.tenant_id, src),
        )
        con.commit()
