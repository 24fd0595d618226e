# %% [markdown]
# # Phase effects on a snapshot
#
# A runnable notebook (percent cells; open it in VS Code / Jupyter with jupytext, or run it as a
# script): replay a snapshot under the default configuration and under an alternative one, then
# look at what each phase changed, per table and kind, and how the importance distribution moves.
#
#     python notebooks/phase_effects.py SNAPSHOT_DIR [--as-of ISO]
#
# Without a snapshot directory it builds a small synthetic one (no database needed).

# %%
from __future__ import annotations

import argparse
import tempfile
from datetime import UTC, datetime
from pathlib import Path

import duckdb
import polars as pl

from deep_sleep.core.snapshot import Snapshot, utc
from deep_sleep.dev.seed import SeedSpec, generate, scopes_of
from deep_sleep.jobs.compare import compare_configs
from deep_sleep.run.plan import plan
from deep_sleep.transforms.config import ConsolidationConfig

parser = argparse.ArgumentParser()
parser.add_argument("snapshot_dir", nargs="?")
parser.add_argument("--as-of", default=None)
args, _ = parser.parse_known_args()

# %% Load (or synthesise) a snapshot
if args.snapshot_dir:
    snapshot = Snapshot.read(args.snapshot_dir)
    as_of = utc(args.as_of) if args.as_of else snapshot.taken_at
else:
    as_of = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
    spec = SeedSpec(tenants=1, scopes_per_tenant=1, nodes_per_scope=2_000, seed=5, now=as_of)
    frames = generate(spec)
    scope = scopes_of(spec)[-1].path
    mine = {t: f.filter(pl.col("scope_path") == scope) for t, f in frames.items() if "scope_path" in f.columns}
    snapshot = Snapshot(scope_path=scope, taken_at=as_of, frames=mine).write(Path(tempfile.mkdtemp()) / "snap")
    snapshot = Snapshot.read(snapshot)
print(f"{snapshot.scope.display()} at {as_of.isoformat()}: {snapshot.row_counts()}")

# %% Rows changed per phase, table and kind
result = plan(snapshot, ConsolidationConfig(), as_of)
parts = []
for table, td in result.diff.tables.items():
    for kind, frame in td.frames().items():
        if frame.height:
            parts.append(frame.group_by("phase").len().with_columns(table=pl.lit(table), kind=pl.lit(kind)))
effects = pl.concat(parts).sort("phase", "table", "kind") if parts else pl.DataFrame()
print(effects)

# %% Importance before and after (DuckDB over the frames)
nodes = snapshot.table("memory_nodes")
updates = result.diff.table("memory_nodes").updates
after = nodes.join(updates.filter(pl.col("importance").is_not_null()).group_by("id").agg(pl.col("importance").last().alias("new")),
                   on="id", how="left").with_columns(pl.coalesce("new", "importance").alias("after"))
histogram = duckdb.sql(
    "SELECT floor(importance) AS bucket, count(*) AS before, "
    "(SELECT count(*) FROM after a2 WHERE floor(a2.after) = floor(a1.importance)) AS after "
    "FROM after a1 GROUP BY 1 ORDER BY 1"
).pl()
print(histogram)

# %% A/B: what if decay were twice as strong?
cmp = compare_configs(snapshot, ConsolidationConfig(), ConsolidationConfig(decay_importance={"step": 1.0}), as_of)
print(cmp.summary)

# %% Checks (this notebook runs in CI)
assert result.report.errors == []
assert effects.height > 0, "a realistic snapshot gives every run something to do"
assert int(histogram.get_column("before").sum()) == nodes.height
decayed = cmp.summary.filter((pl.col("phase") == "decay_importance") & (pl.col("table") == "memory_nodes"))
assert decayed.height and int(decayed.get_column("changed").sum()) > 0, "a stronger decay changes decayed rows"
print("ok")
