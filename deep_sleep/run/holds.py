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

:func:`split_holds_shard` is the same split of a whole shard's diff in one pass (every rule keyed
by ``(scope_path, id)``, the thresholds counted per scope): each scope gets exactly the split of
:func:`split_holds` on that scope alone (tested differentially).  Its held rows are written once
for the shard: ``<diff_dir>/held/<table>.<kind>.parquet`` and ``reasons.parquet``, every row with
``scope_path`` (the layout of a shard's diff); :func:`read_held` reads one scope out of them (and
out of the per-scope folders ``held/<scope>/`` of earlier releases).

    >>> from deep_sleep.core.holds_config import HoldsConfig
    >>> split = split_holds(Diff.empty(), Snapshot("org\\x1fa", None, None, {}), HoldsConfig())
    >>> split.held.has_changes, split.summary()
    (False, {})
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

import polars as pl

from deep_sleep.core import files, tables
from deep_sleep.core.diff import KINDS, Diff, TableDiff
from deep_sleep.core.errors import InputError
from deep_sleep.core.holds_config import HoldsConfig
from deep_sleep.core.report import ConsolidationReport
from deep_sleep.core.scope import Scope
from deep_sleep.core.shard import Shard
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
        why.append(_share_why(sem_deleted, semantic.len(), policy))
    used = pl.Series(dtype=pl.String)
    if on and policy.used_deletes:
        ev = snapshot.table("recall_events")
        if {"label", "label_source", "node_id"} <= set(ev.columns):
            used = _ids(ev.filter((pl.col("label_source") == "explicit") & (pl.col("label") >= 1.0)), "node_id")
    lowered = pl.Series(dtype=pl.String)
    if gate_failed:
        why.append(WHY_GATE)
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
    why += _fired_why(fired)

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


WHY_GATE = "the recall-quality gate failed: every destructive row waits"
WHY_FIRED = {"soul_change": "the run changes the agent's SOUL profile (soul_profiles)",
             "used_node": "the run deletes memories the agent used (explicit positive recall feedback)"}


def _share_why(deleted: int, semantic: int, policy: HoldsConfig) -> str:
    pct = 100 * deleted / max(semantic, 1)
    return (f"the run deletes {deleted} of {semantic} semantic nodes ({pct:.1f} %; the policy "
            f"holds more than {100 * policy.max_delete_share:g} % or more than {policy.max_deletes})")


def _fired_why(fired: set[str]) -> list[str]:
    return [text for rule, text in WHY_FIRED.items() if rule in fired]


# -- the shard's split ---------------------------------------------------------------------------
@dataclass(frozen=True)
class ShardHoldSplit:
    """:class:`HoldSplit` of a shard: apply and held are shard diffs (every row with ``scope_path``;
    ``apply`` ∪ ``held`` = the diff, row for row), rows the reasons with ``scope_path``, why the
    sentences of each scope that holds rows."""

    apply: Diff
    held: Diff
    rows: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema={"scope_path": pl.String(), **REASONS_SCHEMA}))
    why: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def scopes(self) -> list[str]:
        """The scopes that hold rows, sorted."""
        return sorted(self.why)

    def summaries(self) -> dict[str, dict[str, Any]]:
        """Each scope's :meth:`HoldSplit.summary` (scopes that hold rows), counted for all at once."""
        return summarize_many(self.rows, self.why)

    def scope(self, scope_path: str) -> HoldSplit:
        """One scope's split, as :meth:`Diff.by_scope` reads its rows (what a test compares with
        :func:`split_holds` of that scope alone)."""
        applied = self.apply.by_scope((scope_path,)).get(scope_path, Diff.empty())
        if scope_path not in self.why:
            return HoldSplit(applied, Diff.empty(), why=())
        held = self.held.by_scope((scope_path,)).get(scope_path, Diff.empty())
        rows = self.rows.filter(pl.col("scope_path") == scope_path).drop("scope_path")
        return HoldSplit(applied, held, rows, self.why[scope_path])

    def write(self, directory: str | Path) -> Path:
        """Every scope's held rows in one diff directory (rows sorted by ``scope_path``, each with it)
        plus ``reasons.parquet`` (with ``scope_path``)."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        for name, td in self.held.tables.items():
            for kind, frame in td.frames().items():
                if frame.height:
                    frame.sort("scope_path", maintain_order=True).write_parquet(out / f"{name}.{kind}.parquet",
                                                                                **tables.PARQUET_OPTIONS)
        self.rows.sort("scope_path", maintain_order=True).write_parquet(out / REASONS_FILE)
        return out


def summarize_many(rows: pl.DataFrame, why: Mapping[str, tuple[str, ...] | list[str]]) -> dict[str, dict[str, Any]]:
    """:func:`summarize` of every scope of ``rows`` (reasons with ``scope_path``), one group-by per field."""
    out: dict[str, dict[str, Any]] = {s: {"rows": {}, "reasons": {}, "phases": {}, "why": list(why.get(s, ()))}
                                      for s in rows.get_column("scope_path").unique().to_list()}
    for s, table, kind, n in rows.group_by("scope_path", "table", "kind").len().sort(
            "scope_path", "table", "kind").iter_rows():
        out[s]["rows"].setdefault(table, {})[kind] = n
    for col, key in (("reason", "reasons"), ("phase", "phases")):
        for s, value, n in rows.group_by("scope_path", col).len().sort("scope_path", col).iter_rows():
            out[s][key][value] = n
    return out


def _key(column: str = "id") -> pl.Expr:
    """(scope_path, id) of a row: ids are matched within their own scope only."""
    return pl.struct(pl.col("scope_path"), pl.col(column).cast(pl.String).alias("id"))


def _keys(frame: pl.DataFrame, column: str = "id") -> pl.Series:
    """The distinct (scope_path, ``column``) keys of ``frame``'s rows, null ids left out."""
    return (frame.filter(pl.col(column).is_not_null()).select(_key(column).alias("k")).unique().to_series()
            if frame.height else pl.Series("k", [], dtype=pl.Struct({"scope_path": pl.String, "id": pl.String})))


def _in_keys(keys: pl.Series, column: str = "id") -> pl.Expr:
    return _key(column).is_in(keys.implode()) if keys.len() else pl.lit(False)


def _scope_in(scopes: Iterable[str]) -> pl.Expr:
    return pl.col("scope_path").is_in(pl.Series(sorted(scopes), dtype=pl.String).implode())


def _per_scope_counts(keys: pl.Series) -> dict[str, int]:
    if not keys.len():
        return {}
    return dict(keys.struct.field("scope_path").value_counts().iter_rows())


def split_holds_shard(diff: Diff, shard: Shard, policy: HoldsConfig, gate_failed: Mapping[str, bool] | None = None,
                      scopes: Iterable[str] | None = None) -> ShardHoldSplit:
    """:func:`split_holds` of every scope of a shard's ``diff`` (every frame with ``scope_path``,
    planned on ``shard``) in one pass: each rule is one expression over the whole frame, keyed by
    (scope_path, id), the share/count thresholds counted per scope.  ``gate_failed``: scope → the
    recall-quality gate failed; ``scopes``: only these scopes may hold rows (None: all; e.g. the
    scopes whose validation passed) — the rows of the others apply whole, as without a split."""
    on = policy.enabled
    gate = {s for s, failed in (gate_failed or {}).items() if failed}
    eligible = None if scopes is None else set(scopes)
    if eligible is not None:
        gate &= eligible
    nodes = shard.table("memory_nodes")
    sem_nodes = nodes.filter(pl.col("layer") == "semantic") if "layer" in nodes.columns else nodes.head(0)
    semantic = _keys(sem_nodes)
    node_deletes = diff.table("memory_nodes").deletes
    sem_deleted = (dict(node_deletes.filter(_in_keys(semantic)).group_by("scope_path").len().iter_rows())
                   if node_deletes.height and on else {})
    n_semantic = _per_scope_counts(semantic) if sem_deleted else {}
    share = {s for s, n in sem_deleted.items() if n > policy.max_delete_share * n_semantic.get(s, 0)}
    count = {s for s, n in sem_deleted.items() if n > policy.max_deletes} - share  # named delete_share if both
    if eligible is not None:
        share, count = share & eligible, count & eligible
    used = _keys(node_deletes.head(0))
    if on and policy.used_deletes and node_deletes.height:
        ev = shard.table("recall_events")
        if {"label", "label_source", "node_id"} <= set(ev.columns):
            used = _keys(ev.filter((pl.col("label_source") == "explicit") & (pl.col("label") >= 1.0)), "node_id")
    lowered = used.head(0)
    ups = diff.table("memory_nodes").updates
    if gate and ups.height and "importance" in ups.columns and "importance" in nodes.columns:
        last = (ups.filter(_scope_in(gate) & pl.col("importance").is_not_null())
                .group_by("scope_path", "id", maintain_order=True).agg(pl.col("importance").last().alias("_new")))
        old = nodes.select("scope_path", pl.col("id").cast(pl.String), pl.col("importance").alias("_old"))
        lowered = _keys(last.join(old, on=["scope_path", "id"]).filter(pl.col("_new") < pl.col("_old")))

    # First pass: the rules on each frame (reason or null), in split_holds' order (the first wins).
    reasons: dict[tuple[str, str], pl.Series] = {}
    for table, td in diff.tables.items():
        for kind, frame in td.frames().items():
            if not frame.height:
                continue
            conds: list[tuple[pl.Expr, str]] = []
            if table == "memory_nodes" and kind == "deletes":
                if used.len():
                    conds.append((_in_keys(used), "used_node"))
                if share:
                    conds.append((_scope_in(share) & _in_keys(semantic), "delete_share"))
                if count:
                    conds.append((_scope_in(count) & _in_keys(semantic), "delete_count"))
            if table == "soul_profiles" and on and policy.soul_changes:
                conds.append((pl.lit(True), "soul_change"))
            if gate and kind == "deletes":
                conds.append((_scope_in(gate), "gate_failed"))
            if gate and table == "memory_nodes" and kind == "updates" and lowered.len():
                conds.append((_in_keys(lowered), "gate_failed"))
            rule = pl.lit(None, dtype=pl.String)
            for cond, name in reversed(conds):
                rule = pl.when(cond).then(pl.lit(name)).otherwise(rule)
            if eligible is not None and conds:
                rule = pl.when(_scope_in(eligible)).then(rule).otherwise(pl.lit(None, dtype=pl.String))
            reasons[(table, kind)] = frame.select(rule.alias("r")).to_series()

    # Edge deletes touching a held node delete of the same scope.
    if ("memory_nodes", "deletes") in reasons and ("memory_edges", "deletes") in reasons:
        held_nodes = _keys(node_deletes.filter(reasons[("memory_nodes", "deletes")].is_not_null()))
        if held_nodes.len():
            edges = shard.table("memory_edges")
            touching = _keys(edges.filter(_in_keys(held_nodes, "source_id") | _in_keys(held_nodes, "target_id")))
            ed = diff.table("memory_edges").deletes
            r = reasons[("memory_edges", "deletes")]
            reasons[("memory_edges", "deletes")] = ed.select(
                pl.when(r.is_not_null()).then(pl.lit(r)).when(_in_keys(touching)).then(pl.lit("with_held_node"))
                .alias("r")).to_series()

    # Every row of a held (scope, id) in the same table.
    for table in {t for t, _ in reasons}:
        kinds = [k for k in KINDS if (table, k) in reasons]
        frames = diff.table(table).frames()
        held_keys = pl.concat([_keys(frames[k].filter(reasons[(table, k)].is_not_null())) for k in kinds]).unique()
        if not held_keys.len():
            continue
        for k in kinds:
            r = reasons[(table, k)]
            reasons[(table, k)] = frames[k].select(
                pl.when(r.is_not_null()).then(pl.lit(r)).when(_in_keys(held_keys)).then(pl.lit("same_row")).alias("r")
            ).to_series()

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
                pl.col("scope_path"), pl.lit(table).alias("table"), pl.lit(kind).alias("kind"),
                pl.col("id").cast(pl.String), pl.col("phase"), pl.lit(r.filter(mask)).alias("reason")))
    if not held:
        return ShardHoldSplit(diff, Diff.empty())
    as_diff = lambda parts: Diff({t: TableDiff(**kinds) for t, kinds in parts.items()})
    reasons_frame = pl.concat(rows).cast({"scope_path": pl.String(), **REASONS_SCHEMA})
    fired = {s: set(rs) for s, rs in reasons_frame.group_by("scope_path").agg(pl.col("reason").unique()).iter_rows()}
    why = {}
    for s in sorted(fired):
        sentences = [_share_why(sem_deleted[s], n_semantic.get(s, 0), policy)] if s in share or s in count else []
        if s in gate:
            sentences.append(WHY_GATE)
        why[s] = tuple(sentences + _fired_why(fired[s]))
    return ShardHoldSplit(as_diff(applied), as_diff(held), reasons_frame, why)


def held_dir(diff_dir: str | Path, scope_path: str, shard: bool) -> Path:
    """Where a scope's held rows go: ``<diff_dir>/held/`` (a single-scope diff directory), or
    ``<diff_dir>/held/<scope as kind/id…, URL-quoted>/`` (a shard's scope applied on its own; shards
    of earlier releases kept every scope's rows so — a shard now writes one set of files,
    :meth:`ShardHoldSplit.write`)."""
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


HOLDS_SQL = """UPDATE consolidation_runs r SET held = v.held, hold_status = 'pending'
FROM unnest(%s::uuid[], %s::jsonb[]) AS v(run_id, held) WHERE r.run_id = v.run_id"""


def record_holds(store: Store, run_id: str | None, held: dict) -> None:
    """Mark the run's ledger row as holding rows (``held``, ``hold_status = 'pending'``).  Written right
    after the apply's transaction: should the process die in between, the held directory is still
    there and ``deep-sleep approve`` reads the holds from it, not from this column."""
    record_holds_many(store, {run_id: held})


def record_holds_many(store: Store, held: Mapping[str | None, dict]) -> None:
    """:func:`record_holds` of many runs (run id → its report's ``held``) in one UPDATE (a shard's runs)."""
    if not held:
        return
    ids = list(held)
    with store.pg() as con:
        con.execute(HOLDS_SQL, (ids, [json.dumps(held[r], sort_keys=True) for r in ids]))
        con.commit()


def read_held(diff_dir: str | Path, scope_path: str | None = None) -> tuple[Diff, pl.DataFrame]:
    """The held rows of a run and their reasons; an empty diff when nothing is held.  Reads the three
    layouts of ``<diff_dir>/held/``: a single-scope run's diff directory; a shard's (every row with
    ``scope_path``, :meth:`ShardHoldSplit.write`: the rows of ``scope_path``, as a run of that scope
    alone held them); and the per-scope folders ``held/<scope>/`` of shards of earlier releases.
    ``diff_dir`` may be a URL (a local copy of its ``held/`` is fetched)."""
    empty = Diff.empty(), pl.DataFrame(schema=REASONS_SCHEMA)
    src = Path(diff_dir) / HELD_DIR
    if files.is_remote(diff_dir):
        try:
            src = files.fetch_dir(files.join(str(diff_dir), HELD_DIR))
        except InputError:
            return empty
    if not src.is_dir():
        return empty
    reasons = src / REASONS_FILE
    if reasons.exists() and "scope_path" in pl.read_parquet_schema(reasons):
        if scope_path is None:
            raise InputError(f"{src} holds the held rows of many scopes; name the scope to read (scope_path)")
        rows = pl.scan_parquet(reasons).filter(pl.col("scope_path") == scope_path).collect().drop("scope_path")
        if not rows.height:
            return empty
        diff = Diff.read(src, where=pl.col("scope_path") == scope_path)
        return diff.by_scope((scope_path,)).get(scope_path, Diff.empty()), rows
    folder = src / quote(Scope.parse(scope_path).display(), safe="") if scope_path is not None else None
    if folder is not None and folder.is_dir():
        src, reasons = folder, folder / REASONS_FILE
    return Diff.read(src), (pl.read_parquet(reasons) if reasons.exists() else empty[1])


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


def would_hold(diff: Diff, shard, policy: HoldsConfig | None,
               gate_failed: Mapping[str, bool] | None = None) -> tuple[pl.DataFrame, dict[str, tuple[str, ...]]]:
    """What the apply stage would hold of a shard's ``diff`` (every frame with ``scope_path``), without
    writing anything: the held rows (``scope_path`` + :data:`REASONS_SCHEMA`) and each holding scope's
    ``why`` — :func:`split_holds_shard`, the apply's own split, so a plan lists exactly the rows its
    apply would hold.  ``policy`` None: no holds (the quick nap's apply)."""
    if policy is None:
        return pl.DataFrame(schema={"scope_path": pl.String(), **REASONS_SCHEMA}), {}
    split = split_holds_shard(diff, shard, policy, gate_failed)
    return split.rows, dict(split.why)
