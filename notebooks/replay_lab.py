"""Replay lab: one stored snapshot under two configurations, side by side, phase by phase.

A marimo notebook (``marimo edit notebooks/replay_lab.py``), also a script that ends in assertions:

    python notebooks/replay_lab.py [--scope S] [--night YYYY-MM-DD | --snapshot DIR]
                                   [--set section.knob=value …] [--config-b FILE]
                                   [--diff-a DIR --diff-b DIR] [--dsn DSN] [--runs-dir DIR]
    marimo export html notebooks/replay_lab.py -o replay_lab.html -- --set prune_orphans.importance_factor=0.6

Config A is the default configuration (what the night ran); config B is A with the ``--set``
overrides (or ``--config-b FILE``).  Both replays run the transform and validation stages on the
stored snapshot (:func:`deep_sleep.jobs.compare.replay_stored`), touching no store; A must
reproduce the diff hash the ledger recorded for that night.  With ``--diff-a/--diff-b`` it compares
two diff directories instead (e.g. two code versions' replays of the same snapshot).
"""

import marimo

__generated_with = "0.25.2"
app = marimo.App(width="medium")


@app.cell
def _():
    import argparse
    import sys
    import tempfile
    from pathlib import Path

    import altair as alt
    import marimo as mo
    import polars as pl

    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the notebooks' _demo helper
    from _demo import demo_store

    from deep_sleep.transforms.config import ConsolidationConfig, load_config
    from deep_sleep.core.scope import Scope
    from deep_sleep.jobs.compare import compare_dirs
    from deep_sleep.jobs.replay_range import find_snapshots, replay_stored
    return (ConsolidationConfig, Path, Scope, alt, argparse, compare_dirs, demo_store, find_snapshots, load_config, mo,
            pl, replay_stored, tempfile)


@app.cell
def _(argparse):
    parser = argparse.ArgumentParser(description="one snapshot, two configurations")
    parser.add_argument("--scope", default="org/acme/brand/core/conversation/support")
    parser.add_argument("--night", help="the stored snapshot of this night (YYYY-MM-DD); default: the newest")
    parser.add_argument("--snapshot", help="a snapshot directory (instead of --scope/--night)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KNOB=VALUE",
                        help="config B's overrides (repeatable)")
    parser.add_argument("--config-b", help="config B from a TOML file")
    parser.add_argument("--diff-a", help="compare two diff directories instead of replaying")
    parser.add_argument("--diff-b")
    parser.add_argument("--dsn")
    parser.add_argument("--runs-dir")
    args, _unknown = parser.parse_known_args()  # not mo.cli_args(): this also runs under pytest
    if not args.set and not args.config_b:
        args.set = ["prune_orphans.importance_factor=0.6", "cooccurrence.max_neighbours=3", "decay_importance.step=1.0"]
    return (args,)


@app.cell
def _(ConsolidationConfig, args, load_config):
    def _value(text):
        for cast in (int, float):
            try:
                return cast(text)
            except ValueError:
                pass
        return {"true": True, "false": False}.get(text.lower(), text)

    overrides: dict = {}
    for _item in args.set:
        _key, _, _raw = _item.partition("=")
        _section, _, _knob = _key.partition(".")
        overrides.setdefault(_section, {})[_knob] = _value(_raw)
    config_a = ConsolidationConfig()
    config_b = load_config(args.config_b, overrides=overrides)
    return config_a, config_b, overrides


@app.cell
def _(Path, Scope, args, demo_store, find_snapshots, mo):
    store, runs_dir, _scopes = demo_store(args.dsn, args.runs_dir)
    if args.snapshot:
        from deep_sleep.jobs.replay_range import StoredSnapshot

        stored = StoredSnapshot.at(Path(args.snapshot))
    else:
        _found = find_snapshots(runs_dir, Scope.coerce(args.scope))
        if args.night:
            _found = [s for s in _found if s.taken_at.date().isoformat() <= args.night] or _found
        stored = _found[-1]
    mo.md(f"# Replay lab\n\nSnapshot of **{Scope.parse(stored.scope_path).display()}** taken "
          f"{stored.taken_at.isoformat()} (run `{stored.run_id}`)")
    return store, stored


@app.cell
def _(args, compare_dirs, config_a, config_b, mo, overrides, replay_stored, store, stored, tempfile):
    out = tempfile.mkdtemp(prefix="replay-lab-")
    replay = replay_stored(stored, config_a, config_b, store=store, out=out, labels=("default", "B"))
    comparison = compare_dirs(args.diff_a, args.diff_b) if args.diff_a and args.diff_b else replay.comparison
    mo.md(f"Config B = default with `{overrides}`.  Replay A at {replay.as_of.isoformat()} (from the "
          f"{replay.as_of_source}) {'reproduces' if replay.reproduces else 'does NOT reproduce'} the recorded "
          f"diff hash `{(replay.recorded_hash or '')[:16]}…`; B's hash is `{comparison.hash_b[:16]}…`.")
    return comparison, out, replay


@app.cell
def _(alt, comparison, mo, pl):
    per_phase = (
        comparison.summary.group_by("phase").agg(pl.col("only_a", "only_b", "changed", "same").sum())
        .unpivot(index="phase", variable_name="side", value_name="rows")
        .filter(pl.col("side") != "same").sort("phase", "side")
        .filter(pl.col("rows").sum().over("phase") > 0)  # the phases where A and B part
    )
    differ_chart = (
        alt.Chart(per_phase).mark_bar()
        .encode(y=alt.Y("phase:N", title=None), x=alt.X("rows:Q", title="rows that differ"),
                color=alt.Color("side:N", scale=alt.Scale(domain=["only_a", "only_b", "changed"])),
                yOffset="side:N", tooltip=["phase:N", "side:N", "rows:Q"])
        .properties(title="Rows that differ per phase (A = default, B = overrides)", width=480, height=alt.Step(10))
    )
    mo.vstack([mo.md("## Which rows differ, per phase"), differ_chart])
    return differ_chart, per_phase


@app.cell
def _(alt, comparison, mo, pl):
    deltas = comparison.counters.filter((pl.col("phase") == "") & (pl.col("delta") != 0)).sort("counter")
    delta_chart = (
        alt.Chart(deltas).mark_bar()
        .encode(y=alt.Y("counter:N", title=None), x=alt.X("delta:Q", title="B − A"),
                color=alt.condition(alt.datum.delta > 0, alt.value("#4c78a8"), alt.value("#e45756")),
                tooltip=["counter:N", "a:Q", "b:Q", "delta:Q"])
        .properties(title="Counter deltas (B − A)", width=480, height=alt.Step(18))
    )
    mo.vstack([mo.md("## Counter deltas"), delta_chart, deltas])
    return delta_chart, deltas


@app.cell
def _(comparison, mo):
    phase_pick = mo.ui.dropdown(options=sorted(set(comparison.rows["phase"].to_list())) or ["-"],
                                value=None, label="rows of phase")
    phase_pick
    return (phase_pick,)


@app.cell
def _(comparison, mo, phase_pick):
    _rows = comparison.differing(phase=phase_pick.value) if phase_pick.value else comparison.rows
    mo.vstack([mo.md(f"## Differing rows ({_rows.height})"), _rows.select("table", "kind", "phase", "id", "side", "columns").head(200)])
    return


@app.cell
def _(comparison, deltas, per_phase, pl, replay):
    # The replay of the night's own config must give the night's diff; B must differ; the figures agree.
    assert replay.reproduces, f"replay A gave {replay.report.diff_hash}, the ledger recorded {replay.recorded_hash}"
    assert not comparison.identical, "config B changed nothing: pick overrides that matter"
    assert per_phase["rows"].sum() == comparison.rows.height
    _a, _b = replay.report.counters, replay.report_b.counters
    assert {r["counter"]: r["delta"] for r in deltas.iter_rows(named=True)} == {
        k: _b[k] - _a[k] for k in _a if _b[k] != _a[k]}
    assert comparison.rows.filter(pl.col("side") == "only_a").height == per_phase.filter(pl.col("side") == "only_a")["rows"].sum()
    print(f"replay lab: A reproduces {replay.recorded_hash[:12]}; B differs in {comparison.rows.height} rows over "
          f"{per_phase.filter(pl.col('rows') > 0)['phase'].n_unique()} phases; counter deltas {dict(zip(deltas['counter'], deltas['delta']))}")
    print("ok")
    return


if __name__ == "__main__":
    app.run()
