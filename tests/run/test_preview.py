"""The plan: the nightly pipeline without its apply stage, shown record by record."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl

from deep_sleep.cli import main
from deep_sleep.core.diff import Diff
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run.preview import PREVIEW_FILE, preview, preview_markdown
from deep_sleep.run.stages import consolidate_scope, plan_scope
from tests.storeutil import dump, insert, node, small_graph

NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)


def test_plan_lists_every_record_a_run_would_change_and_applies_nothing(store, scope, runs_dir):
    ids = small_graph(store, scope, NOW)
    weak = node(scope, "trivia: old weak fact", NOW - timedelta(days=10), importance=2.0)
    insert(store, "memory_nodes", [weak])
    before = dump(store, scope)
    planned = plan_scope(store, scope, as_of=NOW, base_dir=runs_dir)
    assert dump(store, scope) == before  # nothing applied, no ledger row
    records = preview(Snapshot.read(planned.snapshot_dir), Diff.read(planned.diff_dir))
    by = {(r["phase"], r["kind"], r["id"]): r for r in records.iter_rows(named=True)}
    for hot in ids["hot"]:
        r = by[("strengthen", "update", hot)]
        assert r["change"].startswith("importance 5.0 → 5.5") and r["label"].startswith("project: hot")
    assert by[("working_ttl", "delete", ids["expired"][0])]["label"] == "note: scratch"
    assert by[("prune_orphans", "delete", weak["id"])]["reason"]
    diff = Diff.read(planned.diff_dir)
    assert records.height == sum(n for kinds in diff.row_counts().values() for n in kinds.values())
    text = preview_markdown(records, per_phase=1)
    assert "| strengthen | memory_nodes | update | 3 |" in text and "more" in text

    # a run from the same state changes exactly what the plan listed
    run = consolidate_scope(store, scope, as_of=NOW, base_dir=runs_dir)
    assert run.diff_hash == planned.report.diff_hash


def test_the_cli_plan_prints_and_writes_the_complete_list(store, scope, runs_dir, capsys):
    small_graph(store, scope, NOW)
    code = main(["--dsn", store.dsn, "plan", scope.display(), "--as-of", NOW.isoformat(), "--runs-dir", str(runs_dir)])
    out = capsys.readouterr().out
    assert code == 0 and "nothing was applied" in out and "strengthen" in out
    written = list(runs_dir.rglob(PREVIEW_FILE))
    assert len(written) == 1 and pl.read_parquet(written[0]).height >= 4


def test_plan_of_an_unknown_scope_names_the_nearest(store, scope, runs_dir, capsys):
    small_graph(store, scope, NOW)
    code = main(["--dsn", store.dsn, "plan", scope.display() + "x", "--runs-dir", str(runs_dir)])
    assert code == 2 and "did you mean" in capsys.readouterr().err.lower()
    assert not list(runs_dir.rglob(PREVIEW_FILE))
