"""Phase effects: what each phase did, night by night, for a scope, a tenant or the whole fleet.

A marimo notebook (``marimo edit notebooks/phase_effects.py``), also a script that ends in
assertions:

    python notebooks/phase_effects.py [--scope org/acme | --tenant acme] [--start ISO] [--end ISO]
                                      [--dsn DSN] [--runs-dir DIR] [--fresh]
    marimo export html notebooks/phase_effects.py -o phase_effects.html -- --tenant acme

It reads only the public formats, through the project's API: the ledger (``consolidation_runs``,
:mod:`deep_sleep.jobs.ledger`), each run's snapshot directory (:class:`~deep_sleep.core.snapshot.Snapshot`)
and diff directory (:class:`~deep_sleep.core.diff.Diff`, ``report.json``).  Without ``--dsn`` it
uses the demo store of ``notebooks/_demo.py`` (seeded and consolidated over three nights once,
then reused).
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import argparse
    import sys
    from pathlib import Path

    import altair as alt
    import marimo as mo
    import polars as pl

    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the notebooks' _demo helper
    from _demo import demo_store

    from deep_sleep.core.diff import Diff
    from deep_sleep.core.scope import Scope
    from deep_sleep.core.snapshot import Snapshot, utc
    from deep_sleep.jobs.ledger import last_runs
    from deep_sleep.run.layout import read_scope_diff, read_scope_snapshot  # a run's files: its own, or its shard's
    return (Diff, Path, Scope, Snapshot, alt, argparse, demo_store, last_runs, mo, pl, read_scope_diff,
            read_scope_snapshot, utc)


@app.cell
def _(argparse):
    parser = argparse.ArgumentParser(description="what each phase did, night by night")
    parser.add_argument("--scope", help="one scope (org/acme/brand/core/…); default: all")
    parser.add_argument("--tenant", help="every scope of one tenant")
    parser.add_argument("--start", help="first night (ISO 8601); default: the oldest")
    parser.add_argument("--end", help="last night (ISO 8601); default: the newest")
    parser.add_argument("--dsn", help="the store; default: the notebooks' demo store")
    parser.add_argument("--runs-dir", help="where the runs' directories are (demo: .deep_sleep/notebooks/runs)")
    parser.add_argument("--fresh", action="store_true", help="rebuild the demo store")
    args, _unknown = parser.parse_known_args()  # not mo.cli_args(): this also runs under pytest
    return (args,)


@app.cell
def _(Scope, args, demo_store, last_runs, mo, pl, utc):
    store, runs_dir, _scopes = demo_store(args.dsn, args.runs_dir, fresh=args.fresh)
    records = [r for r in last_runs(store, limit=100_000) if r.status == "applied" and r.diff_uri]
    if args.scope:
        records = [r for r in records if r.scope_path == Scope.coerce(args.scope).path]
    if args.tenant:
        records = [r for r in records if Scope.parse(r.scope_path).tenant_id == args.tenant]
    if args.start:
        records = [r for r in records if r.as_of >= utc(args.start)]
    if args.end:
        records = [r for r in records if r.as_of <= utc(args.end)]
    runs = pl.DataFrame(
        [{"run_id": r.run_id, "scope": r.scope, "tenant": Scope.parse(r.scope_path).tenant_id,
          "night": r.as_of.date(), "conflicts": r.conflicts, "quarantined": r.quarantined_rows,
          "diff_hash": r.diff_hash, "snapshot_uri": r.snapshot_uri, "diff_uri": r.diff_uri, "scope_path": r.scope_path,
          "rows_changed": sum(n for kinds in r.rows_changed.values() for n in kinds.values())} for r in records],
    ).sort("night", "scope")
    what = args.scope or (f"tenant {args.tenant}" if args.tenant else "the whole fleet")
    mo.md(f"# Phase effects — {what}\n\n{runs.height} applied runs over {runs['night'].n_unique()} night(s), "
          f"{runs['scope'].n_unique()} scope(s), from the ledger of `{store}`".replace(str(store), "the store"))
    return records, runs


@app.cell
def _(runs):
    runs.select("night", "scope", "rows_changed", "conflicts", "quarantined", "diff_hash")
    return


@app.cell
def _(pl, read_scope_diff, runs):
    # Every diff row of every run, with its phase (SPEC §8: each row names its phase).
    _parts = []
    for _run in runs.iter_rows(named=True):
        for _table, _td in read_scope_diff(_run["diff_uri"], _run["scope_path"]).tables.items():
            for _kind in ("inserts", "updates", "deletes"):
                _frame = getattr(_td, _kind)
                if _frame.height:
                    _cols = ["phase"] + (["reason"] if _kind == "deletes" and "reason" in _frame.columns else [])
                    _parts.append(_frame.select(_cols).with_columns(
                        pl.lit(_run["night"]).alias("night"), pl.lit(_run["scope"]).alias("scope"),
                        pl.lit(_table).alias("table"), pl.lit(_kind).alias("kind")))
    diff_rows = pl.concat(_parts, how="diagonal_relaxed")
    touched = diff_rows.group_by("night", "phase").len("rows").sort("night", "phase").with_columns(pl.col("night").cast(pl.String))
    return diff_rows, touched


@app.cell
def _(alt, mo, touched):
    touched_chart = (
        alt.Chart(touched).mark_bar()
        .encode(x=alt.X("night:O", title="night"), y=alt.Y("rows:Q", title="rows touched"),
                color=alt.Color("phase:N", scale=alt.Scale(scheme="category20")), tooltip=["night:O", "phase:N", "rows:Q"])
        .properties(title="Rows touched per phase per night", width=560, height=260)
    )
    mo.vstack([mo.md("## Rows touched per phase per night"), mo.ui.altair_chart(touched_chart)])
    return (touched_chart,)


@app.cell
def _(Path, pl, read_scope_diff, read_scope_snapshot, runs):
    # Before: the snapshot each run read, less the rows it quarantined (``quarantine.parquet`` of the
    # diff directory: left untouched in the store, unseen by the phases); after: the run's diff folded in.
    def _clean(snap, diff_dir):
        _q = Path(diff_dir) / "quarantine.parquet"
        if not _q.exists():
            return snap
        _gone = pl.read_parquet(_q)
        return snap.with_frames({
            _t: snap.table(_t).filter(~pl.col("id").cast(pl.String).is_in(_g["id"].drop_nulls().implode()))
            for (_t,), _g in _gone.group_by("table")})

    _imp, _deg = [], []
    for _run in runs.iter_rows(named=True):
        _before = _clean(read_scope_snapshot(_run["snapshot_uri"], _run["scope_path"]), _run["diff_uri"])
        _after = read_scope_diff(_run["diff_uri"], _run["scope_path"]).fold(_before)
        for _side, _snap in (("before", _before), ("after", _after)):
            _nodes = _snap.table("memory_nodes").filter(pl.col("layer") == "semantic")
            _imp.append(_nodes.select(pl.col("importance").fill_nan(None).drop_nulls()).with_columns(pl.lit(_side).alias("side")))
            _co = _snap.table("memory_edges").filter(pl.col("relation") == "CO_OCCURRED")
            _ends = pl.concat([_co.select(pl.col("source_id").alias("node"), pl.col("target_id").alias("other")),
                               _co.select(pl.col("target_id").alias("node"), pl.col("source_id").alias("other"))])
            _deg.append(_ends.unique().group_by("node").len("degree")
                        .with_columns(pl.lit(_side).alias("side"), pl.lit(_run["run_id"]).alias("run_id")))
    importance = pl.concat(_imp)
    degrees = pl.concat(_deg)
    return degrees, importance


@app.cell
def _(alt, importance, mo, pl):
    # Binned here, not in the chart: the HTML then carries ~40 rows, not every node.
    importance_bins = (
        importance.group_by(side="side", bin=(pl.col("importance") * 2).floor() / 2).len("nodes").sort("side", "bin")
    )
    importance_chart = (
        alt.Chart(importance_bins).mark_bar(opacity=0.6)
        .encode(x=alt.X("bin:Q", bin=alt.Bin(step=0.5), title="importance (bins of 0.5)"),
                y=alt.Y("nodes:Q", stack=None, title="semantic nodes (all runs)"),
                color=alt.Color("side:N", sort=["before", "after"]), tooltip=["side:N", "bin:Q", "nodes:Q"])
        .properties(title="Importance before and after the runs", width=560, height=240)
    )
    mo.vstack([mo.md("## Importance distribution before / after"), importance_chart])
    return importance_bins, importance_chart


@app.cell
def _(alt, degrees, mo):
    degree_counts = degrees.group_by("side", "degree").len("nodes").sort("side", "degree")
    degree_chart = (
        alt.Chart(degree_counts).mark_bar()
        .encode(x=alt.X("degree:O", title="distinct CO_OCCURRED neighbours"), y=alt.Y("nodes:Q", title="nodes (all runs)"),
                color=alt.Color("side:N", sort=["before", "after"]), xOffset=alt.XOffset("side:N", sort=["before", "after"]))
        .properties(title="CO_OCCURRED degree distribution (cap 5)", width=560, height=240)
    )
    mo.vstack([mo.md("## `CO_OCCURRED` degree distribution"), degree_chart])
    return degree_chart, degree_counts


@app.cell
def _(alt, diff_rows, mo, pl):
    pruned = (
        diff_rows.filter(pl.col("kind") == "deletes")
        .with_columns(pl.col("reason").fill_null("(no reason)")
                      .str.replace_all(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", "<id>")
                      .str.slice(0, 70))
        .group_by("phase", "table", "reason").len("rows").sort("rows", descending=True)
    )
    pruned_chart = (
        alt.Chart(pruned).mark_bar()
        .encode(y=alt.Y("reason:N", sort="-x", title=None), x=alt.X("rows:Q", title="rows deleted"),
                color=alt.Color("phase:N", scale=alt.Scale(scheme="category20")),
                tooltip=["phase:N", "table:N", "reason:N", "rows:Q"])
        .properties(title="What was deleted, and why", width=420, height=alt.Step(18))
    )
    mo.vstack([mo.md("## What was pruned and why"), pruned_chart, pruned])
    return pruned, pruned_chart


@app.cell
def _(alt, mo, pl, records):
    quarantine = pl.DataFrame(
        [{"night": r.as_of.date(), "table": t, "reason": reason, "rows": n}
         for r in records for t, reasons in r.quarantined.items() for reason, n in reasons.items()],
        schema={"night": pl.Date, "table": pl.String, "reason": pl.String, "rows": pl.Int64},
    )
    quarantine_chart = (
        alt.Chart(quarantine).mark_bar()
        .encode(y=alt.Y("reason:N", sort="-x", title=None), x=alt.X("sum(rows):Q", title="rows set aside"),
                color="table:N", tooltip=["table:N", "reason:N", "sum(rows):Q"])
        .properties(title="Quarantine reasons", width=420, height=alt.Step(18))
    )
    mo.vstack([mo.md("## Quarantine reasons"), quarantine_chart])
    return quarantine, quarantine_chart


@app.cell
def _(alt, mo, pl, runs):
    conflicts = runs.group_by("night").agg(pl.col("conflicts").sum(), pl.len().alias("runs")).sort("night")
    conflicts_chart = (
        alt.Chart(conflicts).mark_line(point=True)
        .encode(x=alt.X("night:T", timeUnit="yearmonthdate", title="night"), y=alt.Y("conflicts:Q", title="rows skipped"),
                tooltip=["night:T", "conflicts:Q", "runs:Q"])
        .properties(title="Conflicts over time (rows a live writer changed first)", width=560, height=200)
    )
    mo.vstack([mo.md("## Conflicts over time"), conflicts_chart])
    return conflicts, conflicts_chart


@app.cell
def _(conflicts, degree_counts, degrees, diff_rows, importance, importance_bins, pl, pruned, quarantine, records, runs,
      touched):
    # What this notebook computed must agree with what the runs recorded.
    assert runs.height > 0, "no applied runs in range: run `deep-sleep demo` or widen --start/--end"
    assert touched["rows"].sum() == diff_rows.height
    _landed = runs["rows_changed"].sum()
    assert _landed <= diff_rows.height, f"the ledger says {_landed} rows landed, the diffs hold {diff_rows.height}"
    _deleted = diff_rows.filter(pl.col("kind") == "deletes")
    for _counter, _phase, _table in (("nodes_pruned", "prune_orphans", "memory_nodes"),
                                      ("episodes_summarized", "episodic_summary", "episodic_events"),
                                      ("working_ttl_pruned", "working_ttl", "memory_nodes")):
        _counted = sum(r.counters.get(_counter, 0) for r in records)
        _rows = _deleted.filter((pl.col("phase") == _phase) & (pl.col("table") == _table)).height
        assert _counted == _rows, f"{_counter}: the ledger counts {_counted}, the diffs delete {_rows}"
    assert importance["importance"].is_between(1.0, 10.0).all(), "an importance outside [1, 10] after a run"
    assert importance_bins["nodes"].sum() == importance.height and degree_counts["nodes"].sum() == degrees.height
    # No run takes a node above 5 CO_OCCURRED neighbours (a node the seed left above the cap gains none).
    _grown = (
        degrees.filter(pl.col("side") == "after")
        .join(degrees.filter(pl.col("side") == "before"), on=["run_id", "node"], how="left", suffix="_before")
        .filter((pl.col("degree") > 5) & (pl.col("degree") > pl.col("degree_before").fill_null(0)))
    )
    assert not _grown.height, f"nodes pushed above 5 CO_OCCURRED neighbours: {_grown.head(3).to_dicts()}"
    assert pruned["rows"].sum() == diff_rows.filter(pl.col("kind") == "deletes").height
    assert quarantine["rows"].sum() == sum(r.quarantined_rows for r in records)
    assert conflicts["conflicts"].sum() == runs["conflicts"].sum()
    print(f"phase effects: {runs.height} runs, {diff_rows.height} diff rows, "
          f"{touched['phase'].n_unique()} phases, {pruned['rows'].sum()} deleted, "
          f"{quarantine['rows'].sum()} quarantined, {conflicts['conflicts'].sum()} conflicts")
    print("ok")
    return


if __name__ == "__main__":
    app.run()
