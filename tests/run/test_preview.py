"""The plan: the night's stages without the apply (PLAN and the Preview stage), shown record by record."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import polars as pl
import pytest
from polars.testing import assert_frame_equal

from deep_sleep.cli import main
from deep_sleep.core.diff import Diff
from deep_sleep.core.scope import Scope
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run import pipeline
from deep_sleep.run.preview import PREVIEW_FILE, Preview, plan_preview, preview, preview_markdown, with_holds
from tests.storeutil import dump, insert, node, small_graph

NOW = datetime(2026, 11, 30, 3, 0, tzinfo=UTC)


def test_plan_lists_every_record_a_run_would_change_and_applies_nothing(store, scope, runs_dir):
    ids = small_graph(store, scope, NOW)
    weak = node(scope, "trivia: old weak fact", NOW - timedelta(days=10), importance=2.0)
    insert(store, "memory_nodes", [weak])
    before = dump(store, scope)
    planned = pipeline.consolidate(store, scope, NOW, runs_dir=runs_dir, stages=(*pipeline.PLAN, Preview()))
    report = planned.report()
    assert dump(store, scope) == before  # nothing applied, no ledger row
    records = preview(Snapshot.read(report.snapshot_uri), Diff.read(report.diff_uri))
    assert_frame_equal(records, planned.preview.scope(scope.path).drop("held"))  # the Preview stage's, from the files
    by = {(r["phase"], r["kind"], r["id"]): r for r in records.iter_rows(named=True)}
    for hot in ids["hot"]:
        r = by[("strengthen", "update", hot)]
        assert r["change"].startswith("importance 5.0 → 5.5") and r["label"].startswith("project: hot")
    assert by[("working_ttl", "delete", ids["expired"][0])]["label"] == "note: scratch"
    assert by[("prune_orphans", "delete", weak["id"])]["reason"]
    diff = Diff.read(report.diff_uri)
    assert records.height == sum(n for kinds in diff.row_counts().values() for n in kinds.values())
    text = preview_markdown(records, per_phase=1)
    assert "| strengthen | memory_nodes | update | 3 |" in text and "more" in text

    # a run from the same state changes exactly what the plan listed
    run = pipeline.consolidate(store, scope, NOW, runs_dir=runs_dir).report()
    assert run.diff_hash == report.diff_hash


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


# -- a shard's preview, and the bounded renderings of a fleet's ------------------------------------
@pytest.fixture(scope="module")
def fleet_plan():
    """A shard of 24 scopes of several sizes (nested, string-prefix siblings) planned in one pass, and
    each scope planned alone."""
    from deep_sleep.transforms.config import ConsolidationConfig

    from deep_sleep.core.shard import Shard
    from deep_sleep.run.transform import transform
    from tests.transforms.shard_cases import AS_OF, fleet

    snaps = fleet(24, seed=5)
    config = ConsolidationConfig()
    shard = Shard.from_snapshots(snaps)
    return transform(shard, config, AS_OF), {s.scope_path: transform(s, config, AS_OF) for s in snaps}


def test_preview_of_a_shard_is_every_scopes_own_preview(fleet_plan):
    shard_plan, alone = fleet_plan
    records = preview(shard_plan.shard, shard_plan.diff)
    assert records.columns[0] == "scope_path"
    diff_rows = sum(n for kinds in shard_plan.diff.row_counts().values() for n in kinds.values())
    assert records.height == diff_rows > 100
    for s, one in alone.items():
        mine = records.filter(pl.col("scope_path") == s).drop("scope_path")
        assert_frame_equal(mine, preview(one.scope_snapshot(), one.scope_diff()))
    # the edge ends are looked up inside the edge's scope, inserted nodes included (META: cluster edges)
    edges = records.filter((pl.col("table") == "memory_edges") & (pl.col("kind") == "insert"))
    assert edges.height and edges.get_column("label").null_count() == 0
    assert edges.filter(pl.col("label").str.starts_with("META:")).height
    # a list column (the reranker's weights) reads as a list, before → after
    trained = records.filter((pl.col("table") == "reranker_models") & (pl.col("kind") == "update"))
    assert trained.height and trained.get_column("change").str.contains(r"^weights \[-?\d.*… → \[-?\d").all()


def test_a_plans_held_records_are_its_hold_stages_split(fleet_plan):
    """What a plan lists as held is exactly what its Hold stage split off (the rows the apply would
    leave waiting), scope by scope as each scope alone."""
    from deep_sleep.core.holds_config import HoldsConfig
    from deep_sleep.run.holds import split_holds
    from deep_sleep.run.transform import as_shard_diff
    from deep_sleep.core.shard import Shard

    shard_plan, alone = fleet_plan
    policy = HoldsConfig(max_delete_share=0.0)  # any semantic delete is held, and every SOUL correction
    split = split_holds(shard_plan.diff, shard_plan.shard, policy)
    state = pipeline.State(transformed=shard_plan, reports=shard_plan.reports, split=split)
    found = plan_preview(state)
    held = found.records.filter(pl.col("held").is_not_null())
    assert held.height == split.rows.height > 0 and len(found.why) > 1
    for s, one in alone.items():
        mine = split_holds(as_shard_diff(one.scope_diff(), s), Shard.of(one.scope_snapshot()), policy)
        assert held.filter(pl.col("scope_path") == s).height == mine.rows.height
        assert found.why.get(s, ()) == mine.why.get(s, ())
    nothing = plan_preview(pipeline.State(transformed=shard_plan, reports=shard_plan.reports))
    assert nothing.records.get_column("held").null_count() == nothing.records.height


def test_the_head_of_the_records_renders_as_the_whole(fleet_plan):
    """A fleet's plan carries only head_records per scope, with the counts of the whole: the text is the same."""
    from deep_sleep.run.preview import head_records, held_markdown, record_counts

    shard_plan, _ = fleet_plan
    records = preview(shard_plan.shard, shard_plan.diff)
    # every third record held, so held rows fall both inside and outside each phase's first rows
    records = records.with_columns(pl.when(pl.int_range(pl.len()) % 3 == 0).then(pl.lit("delete_share")).alias("held"))
    for per_phase in (1, 2, 5):
        head = head_records(records, per_phase, ("scope_path",))
        assert head.height < records.height
        for s in records.get_column("scope_path").unique().to_list():
            whole = records.filter(pl.col("scope_path") == s).drop("scope_path")
            part = head.filter(pl.col("scope_path") == s).drop("scope_path")
            counts = record_counts(whole)
            assert preview_markdown(part, per_phase, counts=counts) == preview_markdown(whole, per_phase)
            assert held_markdown(part, ("why",), per_phase, counts=counts) == held_markdown(whole, ("why",), per_phase)


def test_a_fleets_plan_is_bounded_and_its_shards_digests_merge(fleet_plan):
    """The night's text shows the fleet's counts, then only the ``max_scopes`` scopes with most records
    (each at most ``per_phase`` per phase), says how many were left out, and is the same whether the
    scopes were planned in one shard or in two."""
    from deep_sleep.core.holds_config import HoldsConfig
    from deep_sleep.run.holds import split_holds
    from deep_sleep.run.preview import PlanPreview, PreviewDigest, night_plan_markdown, record_counts

    shard_plan, _ = fleet_plan
    records = preview(shard_plan.shard, shard_plan.diff)
    split = split_holds(shard_plan.diff, shard_plan.shard, HoldsConfig())
    found = PlanPreview(with_holds(records, split.rows), dict(split.why))
    per = found.per_scope()
    scopes = [{"scope_path": s, "status": "planned", "records": per.get(s, (0, 0))[0], "held": per.get(s, (0, 0))[1],
               "diff_uri": "/runs/x/diff", "reason": ""} for s in shard_plan.shard.scope_paths]
    everyone = set(shard_plan.shard.scope_paths)
    one = found.digest(everyone, max_scopes=3, per_phase=2)
    halves = [PlanPreview(found.records.filter(pl.col("scope_path").is_in(sorted(part))), found.why)
              .digest(set(part), max_scopes=3, per_phase=2)
              for part in (shard_plan.shard.scope_paths[:10], shard_plan.shard.scope_paths[10:])]
    kwargs = {"considered": 30, "skipped": 30 - len(scopes), "max_scopes": 3, "per_phase": 2}
    text = night_plan_markdown("night", scopes, one, **kwargs)
    assert text == night_plan_markdown("night", scopes, PreviewDigest.merge(halves), **kwargs)

    assert_frame_equal(one.counts, record_counts(found.records).group_by("phase", "table", "kind")
                       .agg(pl.col("rows").sum(), pl.col("held").sum()).sort("phase", "table", "kind"), check_dtypes=False)
    top = sorted((r for r in scopes if r["records"]), key=lambda r: (-r["records"], r["scope_path"]))
    shown = [r for r in top if f"### {Scope.parse(r['scope_path']).display()}\n" in text]
    assert shown == top[:3]
    assert f"{len(top) - 3} more scope(s) with changes are not shown" in text
    assert f"{records.height} record(s) would change in {len(top)} scope(s)" in text
    assert one.head.get_column("scope_path").n_unique() == 3
    assert one.head.group_by("scope_path", "phase").len().get_column("len").max() <= 4  # 2 + 2 held at most
