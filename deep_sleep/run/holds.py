"""Holds: the part of a run's diff that waits for approval (SPEC §9, issue 16).

:func:`split_holds` is pure: (diff, the snapshot it was planned on, the ``holds`` policy, whether the
recall-quality gate failed) → :class:`HoldSplit` — the diff to apply tonight, the diff held, and one
row per held diff row naming why.  The rules, each a whole-frame Polars expression:

- ``delete_share`` / ``delete_count``: the run deletes more than ``max_delete_share`` of the scope's
  semantic nodes (the snapshot's ``layer = 'semantic'`` rows), or more than ``max_deletes`` of them
  ("more than": exactly 5 % applies).  Then *every* semantic-node delete is held — the policy cannot
  know which of them the operator would keep.  Working-layer deletes (working-memory expiry) are
  not counted and not held by this rule: they are routine.
- ``soul_change``: with ``soul_changes``, every ``soul_profiles`` insert, update and delete.
- ``used_node``: with ``used_deletes``, the delete of a node (any layer) that has explicit positive
  recall feedback: a ``recall_events`` row of the snapshot for it with ``label_source = 'explicit'``
  and ``label >= 1.0`` (:func:`deep_sleep.online.recall.feedback` writes 1.0 for "used").
- ``gate_failed``: when the recall-quality gate says recall@k dropped, every destructive row:
  every delete of every table, and every update row of a node whose importance the run lowers
  (its last planned importance below the snapshot's — decay is what pushes used memories out of
  the top k, so it waits with the deletes).  This rule holds even when ``enabled`` is false (the
  gate has its own switch).

So that the applied part stays valid and the held part can still be applied later:

- ``with_held_node``: an edge delete touching a node whose delete is held is held too (the node
  stays tonight; the edge must not go without it).  Inserts of edges to a held-deleted node apply:
  the node is still there.
- ``same_row``: when one row of an id is held, every row of that id in that table is (the diff keeps
  one update row per phase) — otherwise the applied part would bump the row's version and the held
  row could never pass the version guard on approval.

Rows that the diff drops anyway (``Diff.combine``: updates of deleted rows) need nothing here.  A
held row whose stored row a live writer changes before the approval conflicts then, as always.

    >>> from deep_sleep.core.holds_config import HoldsConfig
    >>> split = split_holds(Diff.empty(), Snapshot("org\\x1fa", None, None, {}), HoldsConfig())
    >>> split.held.has_changes, split.summary()
    (False, {})
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import polars as pl

from deep_sleep.core import files
from deep_sleep.core.diff import KINDS, Diff, TableDiff
from deep_sleep.core.errors import InputError
from deep_sleep.core.holds_config import HoldsConfig
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.scope import Scope
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.store.db import Store

HELD_DIR = "held"  # <diff_dir>/held/: the held rows as a diff directory (SPEC §8 format)
REASONS_FILE = "reasons.parquet"  # <diff_dir>/held/reasons.parquet: one row per held row
#: The snapshot columns :func:`split_holds` reads.
COLUMNS = ("id", "layer", "importance", "source_id", "target_id", "node_id", "label", "label_source")
REASONS_SCHEMA = {"table": pl.String(), "kind": pl.String(), "id": pl.String(), "phase": pl.String(),
                  "reason": pl.String()}
# When a row matches several rules, the first of these names it.
RULES = ("used_node", "soul_change", "delete_share", "delete_count", "gate_failed", "with_held_node", "same_row")


@dataclass(frozen=True)
class HoldSplit:
    """apply: the diff to apply now.  held: the rows that wait (``apply`` ∪ ``held`` = the diff, row for row).
    rows: one row per held diff row: table, kind, id, phase, reason (a name of :data:`RULES`).
    why: one sentence per rule that fired (what the report and ``plan`` show)."""

    apply: Diff
    held: Diff
    rows: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=REASONS_SCHEMA))
    why: tuple[str, ...] = ()

    def summary(self) -> dict[str, Any]:
        """The report's ``held`` field: ``rows`` (table → kind → rows), ``reasons`` (rule → rows),
        ``phases`` (phase → rows), ``why``; ``{}`` when nothing is held."""
        if not self.held.has_changes:
            return {}
        return summarize(self.rows, self.why)

    def write(self, directory: str | Path) -> Path:
        """The held rows as a diff directory plus ``reasons.parquet``."""
        out = self.held.write(directory)
        self.rows.write_parquet(Path(out) / REASONS_FILE)
        return out


def summarize(rows: pl.DataFrame, why: tuple[str, ...] | list[str] = ()) -> dict[str, Any]:
    """See :meth:`HoldSplit.summary` (also for a reasons file read back)."""
    by_table: dict[str, dict[str, int]] = {}
    for table, kind, n in rows.group_by("table", "kind").len().sort("table", "kind").iter_rows():
        by_table.setdefault(table, {})[kind] = n
    count = lambda col: dict(rows.group_by(col).len().sort(col).iter_rows())  # noqa: E731
    return {"rows": by_table, "reasons": count("reason"), "phases": count("phase"), "why": list(why)}


def _ids(frame: pl.DataFrame, column: str = "id") -> pl.Series:
    return frame.get_column(column).cast(pl.String).drop_nulls().unique()


def _in(ids: pl.Series, column: str = "id") -> pl.Expr:
    return pl.col(column).cast(pl.String).is_in(ids.implode())


def split_holds(diff: Diff, snapshot: Snapshot, policy: HoldsConfig, gate_failed: bool = False) -> HoldSplit:
    """Split ``diff`` (planned on ``snapshot``) into what applies now and what waits; see the module docstring."""
    on = policy.enabled
    nodes = snapshot.table("memory_nodes")
    semantic = _ids(nodes.filter(pl.col("layer") == "semantic")) if "layer" in nodes.columns else _ids(nodes.head(0))
    node_deletes = diff.table("memory_nodes").deletes
    sem_deleted = node_deletes.filter(_in(semantic)).height
    why: list[str] = []
    share_fires = on and sem_deleted > policy.max_delete_share * semantic.len()
    count_fires = on and sem_deleted > policy.max_deletes
    if share_fires or count_fires:
        pct = 100 * sem_deleted / max(semantic.len(), 1)
        why.append(f"the run deletes {sem_deleted} of {semantic.len()} semantic nodes ({pct:.1f} %; the policy "
                   f"holds more than {100 * policy.max_delete_share:g} % or more than {policy.max_deletes})")
    used = pl.Series(dtype=pl.String)
    if on and policy.used_deletes:
        ev = snapshot.table("recall_events")
        if {"label", "label_source", "node_id"} <= set(ev.columns):
            used = _ids(ev.filter((pl.col("label_source") == "explicit") & (pl.col("label") >= 1.0)), "node_id")
    lowered = pl.Series(dtype=pl.String)
    if gate_failed:
        why.append("the recall-quality gate failed: every destructive row waits")
        ups = diff.table("memory_nodes").updates
        if ups.height and "importance" in ups.columns and "importance" in nodes.columns:
            last = ups.filter(pl.col("importance").is_not_null()).group_by("id", maintain_order=True).agg(
                pl.col("importance").last().alias("_new"))
            lowered = _ids(last.join(nodes.select(pl.col("id").cast(pl.String), pl.col("importance").alias("_old")),
                                     on="id").filter(pl.col("_new") < pl.col("_old")))

    # First pass: the rules on each frame (reason or null).
    reasons: dict[tuple[str, str], pl.Series] = {}
    for table, td in diff.tables.items():
        for kind, frame in td.frames().items():
            if not frame.height:
                continue
            rule = pl.lit(None, dtype=pl.String)
            conds: list[tuple[pl.Expr, str]] = []
            if table == "memory_nodes" and kind == "deletes":
                if used.len():
                    conds.append((_in(used), "used_node"))
                if share_fires or count_fires:
                    conds.append((_in(semantic), "delete_share" if share_fires else "delete_count"))
            if table == "soul_profiles" and on and policy.soul_changes:
                conds.append((pl.lit(True), "soul_change"))
            if gate_failed and kind == "deletes":
                conds.append((pl.lit(True), "gate_failed"))
            if gate_failed and table == "memory_nodes" and kind == "updates" and lowered.len():
                conds.append((_in(lowered), "gate_failed"))
            for cond, name in reversed(conds):  # the first condition wins
                rule = pl.when(cond).then(pl.lit(name)).otherwise(rule)
            reasons[(table, kind)] = frame.select(rule.alias("r")).to_series()

    # Edge deletes touching a held node delete.
    if ("memory_nodes", "deletes") in reasons and ("memory_edges", "deletes") in reasons:
        held_nodes = _ids(node_deletes.filter(reasons[("memory_nodes", "deletes")].is_not_null()))
        if held_nodes.len():
            edges = snapshot.table("memory_edges")
            touching = _ids(edges.filter(_in(held_nodes, "source_id") | _in(held_nodes, "target_id")))
            ed = diff.table("memory_edges").deletes
            r = reasons[("memory_edges", "deletes")]
            reasons[("memory_edges", "deletes")] = ed.select(
                pl.when(r.is_not_null()).then(pl.lit(r)).when(_in(touching)).then(pl.lit("with_held_node"))
                .alias("r")).to_series()

    # Every row of a held id in the same table.
    for table in {t for t, _ in reasons}:
        kinds = [k for k in KINDS if (table, k) in reasons]
        frames = diff.table(table).frames()
        held_ids = pl.concat([_ids(frames[k].filter(reasons[(table, k)].is_not_null())) for k in kinds]).unique()
        if not held_ids.len():
            continue
        for k in kinds:
            r = reasons[(table, k)]
            reasons[(table, k)] = frames[k].select(
                pl.when(r.is_not_null()).then(pl.lit(r)).when(_in(held_ids)).then(pl.lit("same_row")).alias("r")
            ).to_series()

    fired = {name for r in reasons.values() for name in r.drop_nulls().unique().to_list()}
    if "soul_change" in fired:
        why.append("the run changes the agent's SOUL profile (soul_profiles)")
    if "used_node" in fired:
        why.append("the run deletes memories the agent used (explicit positive recall feedback)")

    applied: dict[str, dict[str, pl.DataFrame]] = {}
    held: dict[str, dict[str, pl.DataFrame]] = {}
    rows = []
    for table, td in diff.tables.items():
        for kind, frame in td.frames().items():
            r = reasons.get((table, kind))
            if r is None or not r.is_not_null().any():
                applied.setdefault(table, {})[kind] = frame
                continue
            mask = r.is_not_null()
            applied.setdefault(table, {})[kind] = frame.filter(~mask)
            held.setdefault(table, {})[kind] = frame.filter(mask)
            rows.append(frame.filter(mask).select(
                pl.lit(table).alias("table"), pl.lit(kind).alias("kind"), pl.col("id").cast(pl.String),
                pl.col("phase"), pl.lit(r.filter(mask)).alias("reason")))
    if not held:
        return HoldSplit(diff, Diff.empty(), why=())
    as_diff = lambda parts: Diff({t: TableDiff(**kinds) for t, kinds in parts.items()})  # noqa: E731
    return HoldSplit(as_diff(applied), as_diff(held), pl.concat(rows).cast(REASONS_SCHEMA), tuple(why))


def held_dir(diff_dir: str | Path, scope_path: str, shard: bool) -> Path:
    """Where a scope's held rows go: ``<diff_dir>/held/`` (a single-scope diff directory), or
    ``<diff_dir>/held/<scope as kind/id…, URL-quoted>/`` (a shard's)."""
    base = Path(diff_dir) / HELD_DIR
    return base / quote(Scope.parse(scope_path).display(), safe="") if shard else base


def hold(diff: Diff, snapshot: Snapshot, report: ConsolidationReport, policy: HoldsConfig, out: Path,
         gate_failed: bool = False) -> tuple[Diff, ConsolidationReport]:
    """Split ``diff`` (:func:`split_holds`); when anything is held, write it to ``out`` and return the
    part to apply with the report's ``held`` set (``status: pending``).  A stale ``out`` (a re-run of
    the apply on the same files) is replaced."""
    if out.exists():
        shutil.rmtree(out)
    if not (policy.enabled or gate_failed) or not diff.has_changes:
        return diff, report
    t = time.perf_counter()
    split = split_holds(diff, snapshot, policy, gate_failed)
    seconds = {**report.timings, "holds": round(time.perf_counter() - t, 6)}
    if not split.held.has_changes:
        return diff, report.with_(timings=seconds)
    split.write(out)
    return split.apply, report.with_(held={**split.summary(), "status": "pending"}, timings=seconds)


HOLDS_SQL = "UPDATE consolidation_runs SET held = %s::jsonb, hold_status = 'pending' WHERE run_id = %s::uuid"


def record_holds(store: Store, run_id: str | None, held: dict) -> None:
    """Mark the run's ledger row as holding rows (``held``, ``hold_status = 'pending'``).  Written right
    after the apply's transaction: should the process die in between, the held directory is still
    there and ``deep-sleep approve`` reads the holds from it, not from this column."""
    with store.pg() as con:
        con.execute(HOLDS_SQL, (json.dumps(held, sort_keys=True), run_id))
        con.commit()


def read_held(diff_dir: str | Path, scope_path: str | None = None) -> tuple[Diff, pl.DataFrame]:
    """The held rows of a run (``<diff_dir>/held/``, or a shard scope's folder under it) and their
    reasons; an empty diff when nothing is held."""
    root = Path(diff_dir) / HELD_DIR
    if files.is_remote(diff_dir):  # on an object store: a local copy of <diff_dir>/held/, when there is one
        try:
            root = files.fetch_dir(files.join(str(diff_dir), HELD_DIR))
        except InputError:
            return Diff.empty(), pl.DataFrame(schema=REASONS_SCHEMA)
    src = root
    if scope_path is not None and (root / quote(Scope.parse(scope_path).display(), safe="")).is_dir():
        src = root / quote(Scope.parse(scope_path).display(), safe="")
    if not src.is_dir():
        return Diff.empty(), pl.DataFrame(schema=REASONS_SCHEMA)
    reasons = src / REASONS_FILE
    return Diff.read(src), (pl.read_parquet(reasons) if reasons.exists() else pl.DataFrame(schema=REASONS_SCHEMA))


def only_phases(diff: Diff, phases: set[str] | frozenset[str]) -> Diff:
    """The rows of ``diff`` whose ``phase`` is one of ``phases``."""
    keep = pl.Series(sorted(phases), dtype=pl.String).implode()
    return Diff({t: TableDiff(**{k: f.filter(pl.col("phase").is_in(keep)) for k, f in td.frames().items()})
                 for t, td in diff.tables.items()})


def phases_of(diff: Diff) -> list[str]:
    """The phases that have rows in ``diff``, sorted."""
    found: set[str] = set()
    for td in diff.tables.values():
        for frame in td.frames().values():
            found |= set(frame.get_column("phase").drop_nulls().unique().to_list())
    return sorted(found)


def hold_candidates(diff: Diff, shard, policy: HoldsConfig) -> frozenset[str]:
    """The scopes of a shard's ``diff`` (every frame with ``scope_path``) for which a rule of
    :func:`split_holds` may fire — a superset, computed for the whole shard at once: scopes with a
    ``soul_profiles`` change (``soul_changes``), scopes deleting more semantic nodes than
    ``max_deletes`` or ``max_delete_share`` of theirs, scopes deleting a node with explicit positive
    recall feedback (``used_deletes``).  The others apply whole, without a per-scope split."""
    if not policy.enabled:
        return frozenset()
    out: set[str] = set()
    if policy.soul_changes and "soul_profiles" in diff.tables:
        for frame in diff.tables["soul_profiles"].frames().values():
            if frame.height:
                out |= set(frame.get_column("scope_path").unique().to_list())
    deletes = diff.table("memory_nodes").deletes
    if deletes.height:
        nodes = shard.table("memory_nodes").select("id", "scope_path", "layer")
        semantic = nodes.filter(pl.col("layer") == "semantic")
        gone = deletes.select("id", "scope_path").join(semantic.select("id"), on="id", how="semi")
        per = gone.group_by("scope_path").len("deleted").join(
            semantic.group_by("scope_path").len("nodes"), on="scope_path", how="left")
        fired = per.filter((pl.col("deleted") > policy.max_deletes)
                           | (pl.col("deleted") > policy.max_delete_share * pl.col("nodes").fill_null(0)))
        out |= set(fired.get_column("scope_path").to_list())
        if policy.used_deletes:
            recalls = shard.table("recall_events")
            if recalls.height and "label_source" in recalls.columns and "label" in recalls.columns:
                used = recalls.filter((pl.col("label_source") == "explicit") & (pl.col("label") >= 1.0)).select(
                    pl.col("node_id").alias("id"))
                hit = deletes.join(used, on="id", how="semi")
                out |= set(hit.get_column("scope_path").unique().to_list())
    return frozenset(out)


def would_hold(diff: Diff, shard, policy: HoldsConfig | None,
               gate_failed: dict[str, bool] | None = None) -> tuple[pl.DataFrame, dict[str, tuple[str, ...]]]:
    """What the apply stage would hold of a shard's ``diff`` (every frame with ``scope_path``), scope by
    scope, without writing anything: the held rows (``scope_path`` + :data:`REASONS_SCHEMA`) and each
    scope's ``why``.  The same selection as :func:`deep_sleep.run.pipeline.apply` — the scopes of
    :func:`hold_candidates` and those whose recall-quality gate failed, each split by
    :func:`split_holds` on its own snapshot — so a plan lists exactly the rows its apply would hold.
    ``policy`` None: no holds (the quick nap's apply)."""
    empty = pl.DataFrame(schema={"scope_path": pl.String(), **REASONS_SCHEMA})
    if policy is None:
        return empty, {}
    gate_failed = gate_failed or {}
    scopes = set(hold_candidates(diff, shard, policy)) | {s for s, failed in gate_failed.items() if failed}
    scopes &= set(shard.scope_paths)
    parts, why = [], {}
    diffs = diff.by_scope(scopes) if scopes else {}
    for s in sorted(scopes):
        mine = diffs.get(s)
        if mine is None or not mine.has_changes:
            continue
        split = split_holds(mine, shard.scope(s), policy, bool(gate_failed.get(s)))
        if split.held.has_changes:
            parts.append(split.rows.select(pl.lit(s).alias("scope_path"), pl.all()))
            why[s] = split.why
    return (pl.concat(parts) if parts else empty), why
