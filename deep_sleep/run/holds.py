"""Holds: the part of a run's diff that waits for approval (SPEC §9).

:func:`split_holds` is pure: (a shard's diff, the shard it was planned on, the ``holds`` policy,
each scope's recall-quality gate verdict) → :class:`HoldSplit` — the diff to apply tonight, the diff
held, and one row per held diff row naming why.  Every rule is one Polars expression over a whole
frame, keyed by ``(scope_path, id)`` and counted per scope, so a shard of many scopes is split in one
pass and each scope gets the split of a shard of that scope alone.  The rules:

- ``delete_share`` / ``delete_count``: the run deletes more than ``max_delete_share`` of the scope's
  semantic nodes, or more than ``max_deletes`` of them ("more than": exactly 5 % applies).  Then
  *every* semantic-node delete of the scope is held — the policy cannot know which of them the
  operator would keep.  Working-layer deletes (working-memory expiry) are routine: not counted, not
  held by this rule.
- ``soul_change``: with ``soul_changes``, every ``soul_profiles`` row of a SOUL correction (phase
  ``soul_corrections``); with ``drift_changes`` (off by default) identity drift's (phase ``drift``).
- ``used_node``: with ``used_deletes``, the delete of a node (any layer) that has explicit positive
  recall feedback (a ``recall_events`` row of the shard for it with ``label_source = 'explicit'``
  and ``label >= 1.0``).
- ``gate_failed``: when a scope's recall-quality gate says recall@k dropped, every destructive row
  of it: every delete of every table, and every update row of a node whose importance the run lowers
  (decay is what pushes used memories out of the top k).  This rule holds even when ``enabled`` is
  false (the gate has its own switch).

**The part applied tonight is valid on its own** (SPEC §9 as amended 2026-12-04).  The split is
closed under the graph, so that no edge is left pointing at a node deleted tonight and none is
deleted without reason:

- an edge delete touching a node whose delete *applies* tonight applies tonight, whatever else held
  it (an edge goes with whichever of its endpoints goes);
- otherwise an edge delete touching a node whose delete is held is held too (``with_held_node``):
  the node stays tonight, and its edge waits with it;
- ``cluster_cap``: when a ``CLUSTERS`` edge delete of a META node is held, the ``CLUSTERS`` inserts of
  that META node wait with it, so the applied part never leaves a META node above its member cap,
  and so does the META node's own update by phase 4 (its text names the new members);
- ``same_row``: when one row of an id is held, every row of that id in that table is (the diff keeps
  one update row per phase) — otherwise the applied part would bump the row's version and the held
  row could never pass the version guard on approval.

The validate stage then checks the applied part alone against the snapshot (every SPEC §4 check),
and an approval applies a selection of held rows closed the same way (:func:`close_selection`).
A held row whose stored row a live writer changes before the approval conflicts then, as always.

Held rows are written once per run directory: ``<diff_dir>/held/<table>.<kind>.parquet`` and
``reasons.parquet``, every row with ``scope_path`` (a shard of one too); :func:`read_held` reads one
scope out of them, and out of the layouts of earlier releases (``held/`` as a single-scope diff
directory, per-scope folders ``held/<scope>/``).

    >>> from deep_sleep.core.holds_config import HoldsConfig
    >>> from deep_sleep.core.shard import Shard
    >>> from deep_sleep.core.snapshot import Snapshot
    >>> split = split_holds(Diff.empty(), Shard.of(Snapshot("org\\x1fa", None, None, {})), HoldsConfig())
    >>> split.held.has_changes, split.summaries()
    (False, {})
"""

from __future__ import annotations

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
from deep_sleep.core.scope import Scope
from deep_sleep.core.shard import Shard

HELD_DIR = "held"  # <diff_dir>/held/: the held rows as a diff directory (SPEC §8 format)
REASONS_FILE = "reasons.parquet"  # <diff_dir>/held/reasons.parquet: one row per held row
#: The snapshot columns :func:`split_holds` reads.
COLUMNS = ("id", "scope_path", "layer", "importance", "source_id", "target_id", "node_id", "label", "label_source")
REASONS_SCHEMA = {"scope_path": pl.String(), "table": pl.String(), "kind": pl.String(), "id": pl.String(),
                  "phase": pl.String(), "reason": pl.String()}
# When a row matches several rules, the first of these names it.
RULES = ("used_node", "soul_change", "delete_share", "delete_count", "gate_failed", "with_held_node", "cluster_cap",
         "same_row")
#: The rules that hold a row only because another held row waits (the closure under the graph): a
#: rejection takes the rows held so with the rows it rejects (:func:`deep_sleep.jobs.approve.reject`).
CLOSURE_RULES = ("with_held_node", "cluster_cap", "same_row")
#: The phases whose soul_profiles rows each knob holds.
SOUL_PHASES = {"soul_changes": "soul_corrections", "drift_changes": "drift"}
#: The phase that writes META nodes and their ``CLUSTERS`` edges (phase 4), whose rows ``cluster_cap`` keeps together.
META_PHASE = "meta_nodes"

WHY_GATE = "the recall-quality gate failed: every destructive row waits"
WHY_FIRED = {"soul_change": "the run changes the agent's SOUL profile (soul_profiles)",
             "used_node": "the run deletes memories the agent used (explicit positive recall feedback)"}

_KEY_DTYPE = pl.Struct({"scope_path": pl.String, "id": pl.String})


@dataclass(frozen=True)
class HoldSplit:
    """apply: the diff to apply now; held: the rows that wait (``apply`` ∪ ``held`` = the diff, row for
    row; both shard diffs, every row with ``scope_path``).  rows: one row per held diff row
    (:data:`REASONS_SCHEMA`; ``reason`` a name of :data:`RULES`).  why: scope → one sentence per rule
    that fired there (what the report and ``plan`` show)."""

    apply: Diff
    held: Diff
    rows: pl.DataFrame = field(default_factory=lambda: pl.DataFrame(schema=REASONS_SCHEMA))
    why: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def scopes(self) -> list[str]:
        """The scopes that hold rows, sorted."""
        return sorted(self.why)

    def summaries(self) -> dict[str, dict[str, Any]]:
        """Each holding scope's report field ``held``: ``rows`` (table → kind → rows), ``reasons``
        (rule → rows), ``phases`` (phase → rows), ``cells`` (phase → rule → rows: what the held
        queue counts by reason within a phase), ``why``; counted for all scopes at once."""
        return summarize(self.rows, self.why)

    def write(self, directory: str | Path) -> Path:
        """Every scope's held rows in one diff directory (rows sorted by ``scope_path``, each with it)
        plus ``reasons.parquet``."""
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        for name, td in self.held.tables.items():
            for kind, frame in td.frames().items():
                if frame.height:
                    frame.sort("scope_path", maintain_order=True).write_parquet(out / f"{name}.{kind}.parquet",
                                                                                **tables.PARQUET_OPTIONS)
        self.rows.sort("scope_path", maintain_order=True).write_parquet(out / REASONS_FILE)
        return out


def summarize(rows: pl.DataFrame, why: Mapping[str, tuple[str, ...] | list[str]] | None = None) -> dict[str, dict[str, Any]]:
    """scope → ``{"rows", "reasons", "phases", "cells", "why"}`` of held rows (reasons with
    ``scope_path``), one group-by per field."""
    why = why or {}
    out: dict[str, dict[str, Any]] = {s: {"rows": {}, "reasons": {}, "phases": {}, "cells": {}, "why": list(why.get(s, ()))}
                                      for s in rows.get_column("scope_path").unique().to_list()}
    for s, table, kind, n in rows.group_by("scope_path", "table", "kind").len().sort(
            "scope_path", "table", "kind").iter_rows():
        out[s]["rows"].setdefault(table, {})[kind] = n
    for col, key in (("reason", "reasons"), ("phase", "phases")):
        for s, value, n in rows.group_by("scope_path", col).len().sort("scope_path", col).iter_rows():
            out[s][key][value] = n
    for s, phase, reason, n in rows.group_by("scope_path", "phase", "reason").len().sort(
            "scope_path", "phase", "reason").iter_rows():
        out[s]["cells"].setdefault(phase, {})[reason] = n
    return out


# -- keys ----------------------------------------------------------------------------------------
def _key(column: str = "id") -> pl.Expr:
    """(scope_path, id) of a row: ids are matched within their own scope only."""
    return pl.struct(pl.col("scope_path"), pl.col(column).cast(pl.String).alias("id"))


def _keys(frame: pl.DataFrame, column: str = "id") -> pl.Series:
    """The distinct (scope_path, ``column``) keys of ``frame``'s rows, null ids left out."""
    if not frame.height:
        return pl.Series("k", [], dtype=_KEY_DTYPE)
    return frame.filter(pl.col(column).is_not_null()).select(_key(column).alias("k")).unique().to_series()


def _in_keys(keys: pl.Series, column: str = "id") -> pl.Expr:
    return _key(column).is_in(keys.implode()) if keys.len() else pl.lit(False)


def _scope_in(scopes: Iterable[str]) -> pl.Expr:
    return pl.col("scope_path").is_in(pl.Series(sorted(scopes), dtype=pl.String).implode())


def _per_scope_counts(keys: pl.Series) -> dict[str, int]:
    if not keys.len():
        return {}
    return dict(keys.struct.field("scope_path").value_counts().iter_rows())


def _first(conds: list[tuple[pl.Expr, str]]) -> pl.Expr:
    """The name of the first condition that holds (null when none)."""
    rule = pl.lit(None, dtype=pl.String)
    for cond, name in reversed(conds):
        rule = pl.when(cond).then(pl.lit(name)).otherwise(rule)
    return rule


# -- the split -----------------------------------------------------------------------------------
def split_holds(diff: Diff, shard: Shard, policy: HoldsConfig, gate_failed: Mapping[str, bool] | None = None,
                scopes: Iterable[str] | None = None) -> HoldSplit:
    """Split a shard's ``diff`` (every frame with ``scope_path``, planned on ``shard``) into what
    applies tonight and what waits; see the module docstring.  ``gate_failed``: scope → the
    recall-quality gate failed; ``scopes``: only these scopes may hold rows (None: all; e.g. the
    scopes whose validation passed) — the rows of the others apply whole, as without a split."""
    on = policy.enabled
    gate = {s for s, failed in (gate_failed or {}).items() if failed}
    eligible = None if scopes is None else set(scopes)
    if eligible is not None:
        gate &= eligible
    if not diff.has_changes or not (on or gate):
        return HoldSplit(diff, Diff.empty())
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
    soul_phases = [phase for knob, phase in SOUL_PHASES.items() if on and getattr(policy, knob)]

    # The rules on each frame (reason or null), the first that holds naming the row.
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
            if table == "soul_profiles" and soul_phases:
                conds.append((pl.col("phase").is_in(soul_phases), "soul_change"))
            if gate and kind == "deletes":
                conds.append((_scope_in(gate), "gate_failed"))
            if gate and table == "memory_nodes" and kind == "updates" and lowered.len():
                conds.append((_in_keys(lowered), "gate_failed"))
            rule = _first(conds)
            if eligible is not None and conds:
                rule = pl.when(_scope_in(eligible)).then(rule).otherwise(pl.lit(None, dtype=pl.String))
            reasons[(table, kind)] = frame.select(rule.alias("r")).to_series()

    ends = _delete_ends(diff, shard)
    _close_edges(diff, ends, reasons)
    _close_clusters(diff, ends, reasons)
    _close_rows(diff, reasons)
    applied, held, rows = _split(diff, reasons)
    if rows is None:
        return HoldSplit(diff, Diff.empty())
    fired = {s: set(rs) for s, rs in rows.group_by("scope_path").agg(pl.col("reason").unique()).iter_rows()}
    why = {}
    for s in sorted(fired):
        sentences = [_share_why(sem_deleted[s], n_semantic.get(s, 0), policy)] if s in share | count else []
        if s in gate:
            sentences.append(WHY_GATE)
        why[s] = tuple(sentences + [text for rule, text in WHY_FIRED.items() if rule in fired[s]])
    return HoldSplit(applied, held, rows, why)


def _delete_ends(diff: Diff, shard: Shard) -> pl.DataFrame:
    """The diff's edge deletes (one row each, in order) with their ends and relation, read from the
    shard (a delete names its edge by id only)."""
    ed = diff.table("memory_edges").deletes
    edges = shard.table("memory_edges")
    cols = [c for c in ("source_id", "target_id", "relation") if c in edges.columns]
    if not ed.height:
        return pl.DataFrame(schema={"scope_path": pl.String, "id": pl.String, "phase": pl.String,
                                    **{c: edges.schema[c] for c in cols}})
    return ed.select("scope_path", pl.col("id").cast(pl.String), "phase").join(
        edges.select("scope_path", pl.col("id").cast(pl.String), *cols), on=["scope_path", "id"], how="left",
        maintain_order="left")


def _none(n: int) -> pl.Series:
    return pl.Series("r", [None] * n, dtype=pl.String)


def _close_edges(diff: Diff, ends: pl.DataFrame, reasons: dict[tuple[str, str], pl.Series]) -> None:
    """An edge delete goes with an endpoint whose delete applies tonight; otherwise it waits with an
    endpoint whose delete is held (``with_held_node``).  Updates ``reasons`` in place."""
    node_deletes = diff.table("memory_nodes").deletes
    if not node_deletes.height or not ends.height:
        return
    node_reason = reasons.get(("memory_nodes", "deletes"), _none(node_deletes.height))
    held_nodes = _keys(node_deletes.filter(node_reason.is_not_null()))
    if not held_nodes.len():
        return
    gone_nodes = _keys(node_deletes.filter(node_reason.is_null()))
    touches = lambda keys: (_in_keys(keys, "source_id") | _in_keys(keys, "target_id")).fill_null(False)  # noqa: E731
    r = reasons.get(("memory_edges", "deletes"), _none(ends.height))
    reasons[("memory_edges", "deletes")] = ends.select(
        pl.when(touches(gone_nodes)).then(pl.lit(None, dtype=pl.String))
        .when(pl.lit(r).is_not_null()).then(pl.lit(r))
        .when(touches(held_nodes)).then(pl.lit("with_held_node"))
        .otherwise(pl.lit(None, dtype=pl.String)).alias("r")).to_series()


def _close_clusters(diff: Diff, ends: pl.DataFrame, reasons: dict[tuple[str, str], pl.Series]) -> None:
    """A META node whose ``CLUSTERS`` edge delete is held keeps its ``CLUSTERS`` inserts waiting too
    (``cluster_cap``): phase 4 deletes the members that fell out of the top ``max_members`` to make
    room for new ones, so the inserts alone would take the node over its cap.  Its own update by
    phase 4 (the refreshed text naming the new members, and its vector) waits with them, so the
    stored text never names members whose edges are not there."""
    r_del = reasons.get(("memory_edges", "deletes"))
    if r_del is None or "relation" not in ends.columns:
        return
    held_meta = _keys(ends.filter(r_del.is_not_null() & (pl.col("relation") == "CLUSTERS")), "source_id")
    if not held_meta.len():
        return
    ins = diff.table("memory_edges").inserts
    if ins.height:
        r = reasons.get(("memory_edges", "inserts"), _none(ins.height))
        reasons[("memory_edges", "inserts")] = ins.select(
            pl.when(pl.lit(r).is_not_null()).then(pl.lit(r))
            .when((pl.col("relation") == "CLUSTERS") & _in_keys(held_meta, "source_id")).then(pl.lit("cluster_cap"))
            .otherwise(pl.lit(None, dtype=pl.String)).alias("r")).to_series()
    ups = diff.table("memory_nodes").updates
    if ups.height:
        r = reasons.get(("memory_nodes", "updates"), _none(ups.height))
        reasons[("memory_nodes", "updates")] = ups.select(
            pl.when(pl.lit(r).is_not_null()).then(pl.lit(r))
            .when((pl.col("phase") == META_PHASE) & _in_keys(held_meta)).then(pl.lit("cluster_cap"))
            .otherwise(pl.lit(None, dtype=pl.String)).alias("r")).to_series()


def _close_rows(diff: Diff, reasons: dict[tuple[str, str], pl.Series]) -> None:
    """Every row of a held (scope, id) in the same table is held (``same_row``)."""
    for table in {t for t, _ in reasons}:
        kinds = [k for k in KINDS if (table, k) in reasons]
        frames = diff.table(table).frames()
        held_keys = pl.concat([_keys(frames[k].filter(reasons[(table, k)].is_not_null())) for k in kinds]).unique()
        if not held_keys.len():
            continue
        for k in kinds:
            r = reasons[(table, k)]
            reasons[(table, k)] = frames[k].select(
                pl.when(pl.lit(r).is_not_null()).then(pl.lit(r)).when(_in_keys(held_keys)).then(pl.lit("same_row"))
                .alias("r")).to_series()


def _split(diff: Diff, reasons: dict[tuple[str, str], pl.Series]) -> tuple[Diff, Diff, pl.DataFrame | None]:
    """(applied part, held part, one reasons row per held row — None when nothing is held)."""
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
        return diff, Diff.empty(), None
    as_diff = lambda parts: Diff({t: TableDiff(**kinds) for t, kinds in parts.items()})  # noqa: E731
    return as_diff(applied), as_diff(held), pl.concat(rows).cast(REASONS_SCHEMA)


def _share_why(deleted: int, semantic: int, policy: HoldsConfig) -> str:
    pct = 100 * deleted / max(semantic, 1)
    return (f"the run deletes {deleted} of {semantic} semantic nodes ({pct:.1f} %; the policy "
            f"holds more than {100 * policy.max_delete_share:g} % or more than {policy.max_deletes})")


# -- approvals -----------------------------------------------------------------------------------
def close_selection(held: Diff, selected: Diff, shard: Shard) -> Diff:
    """The rows of ``held`` (a shard diff of held rows) an approval of ``selected`` (some of them) must
    apply so that what it applies is valid on its own (SPEC §9), by the closure of
    :func:`split_holds`: the held edge deletes touching a selected node delete, by either end (an
    edge goes with its node), every ``CLUSTERS`` insert and delete and the phase-4 update of a META
    node one of whose ``CLUSTERS`` rows or that update is selected (its member cap, its text), and
    every held row of a selected (scope, id) in the same table, whatever its phase.  The three rules
    are applied until nothing more is added (a fixpoint: a row one rule adds may need another's —
    a node's update takes its delete of another phase by ``same_row``, and that delete its edges).
    ``shard``: the run's snapshot, whose edges name an edge delete's ends."""
    key = ["scope_path", "id", "phase"]
    pick: dict[tuple[str, str], pl.Series] = {}
    for table, td in held.tables.items():
        for kind, frame in td.frames().items():
            if not frame.height:
                continue
            mine = selected.table(table).frames()[kind]
            marks = (mine.select("scope_path", pl.col("id").cast(pl.String), "phase").unique().with_columns(pl.lit(True).alias("p"))
                     if mine.height else pl.DataFrame(schema={"scope_path": pl.String, "id": pl.String, "phase": pl.String,
                                                              "p": pl.Boolean}))
            pick[(table, kind)] = (frame.select("scope_path", pl.col("id").cast(pl.String), "phase")
                                   .join(marks, on=key, how="left", maintain_order="left").get_column("p").fill_null(False))
    ends = _delete_ends(held, shard)
    picked = -1
    while picked != (now := sum(int(p.sum()) for p in pick.values())):
        picked = now
        _close_once(held, ends, pick)
    return Diff({t: TableDiff(**{k: (f.filter(pick[(t, k)]) if (t, k) in pick else f.head(0))
                                 for k, f in td.frames().items()}) for t, td in held.tables.items()})


def _close_once(held: Diff, ends: pl.DataFrame, pick: dict[tuple[str, str], pl.Series]) -> None:
    """One round of :func:`close_selection`'s rules over ``pick`` ((table, kind) → rows taken), in place."""
    nd = held.table("memory_nodes").deletes
    if nd.height and ends.height:
        chosen = _keys(nd.filter(pick[("memory_nodes", "deletes")]))
        pick[("memory_edges", "deletes")] |= ends.select(
            (_in_keys(chosen, "source_id") | _in_keys(chosen, "target_id")).fill_null(False)).to_series()
    ins = held.table("memory_edges").inserts
    if "relation" in ends.columns or (ins.height and "relation" in ins.columns):
        meta = []
        if ends.height and "relation" in ends.columns:
            meta.append(_keys(ends.filter(pick[("memory_edges", "deletes")] & (pl.col("relation") == "CLUSTERS")), "source_id"))
        if ins.height and "relation" in ins.columns:
            meta.append(_keys(ins.filter(pick[("memory_edges", "inserts")] & (pl.col("relation") == "CLUSTERS")), "source_id"))
        ups = held.table("memory_nodes").updates
        if ups.height and ("memory_nodes", "updates") in pick:  # a META node's own update names its members
            meta.append(_keys(ups.filter(pick[("memory_nodes", "updates")] & (pl.col("phase") == META_PHASE))))
        chosen_meta = pl.concat(meta).unique() if meta else pl.Series("k", [], dtype=_KEY_DTYPE)
        if chosen_meta.len():
            if ends.height and "relation" in ends.columns:
                pick[("memory_edges", "deletes")] |= ends.select(
                    ((pl.col("relation") == "CLUSTERS") & _in_keys(chosen_meta, "source_id")).fill_null(False)).to_series()
            if ins.height and "relation" in ins.columns:
                pick[("memory_edges", "inserts")] |= ins.select(
                    (pl.col("relation") == "CLUSTERS") & _in_keys(chosen_meta, "source_id")).to_series()
            if ups.height and ("memory_nodes", "updates") in pick:
                pick[("memory_nodes", "updates")] |= ups.select(
                    (pl.col("phase") == META_PHASE) & _in_keys(chosen_meta)).to_series()
    for table in {t for t, _ in pick}:
        kinds = [k for k in KINDS if (table, k) in pick]
        frames = held.table(table).frames()
        keys = pl.concat([_keys(frames[k].filter(pick[(table, k)])) for k in kinds]).unique()
        for k in kinds:
            pick[(table, k)] = pick[(table, k)] | frames[k].select(_in_keys(keys)).to_series()


# -- files -----------------------------------------------------------------------------------------
def read_held(diff_dir: str | Path, scope_path: str) -> tuple[Diff, pl.DataFrame]:
    """The held rows of one scope's run (a shard diff: every row with ``scope_path``) and their
    reasons; an empty diff when nothing is held.  Reads the layouts of ``<diff_dir>/held/``: this
    release's (every row with ``scope_path``, :meth:`HoldSplit.write`), and earlier releases' — a
    single-scope run's diff directory, and shards' per-scope folders ``held/<scope>/``.  ``diff_dir``
    may be a URL (a local copy of its ``held/`` is fetched)."""
    from deep_sleep.run.transform import as_shard_diff

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
        rows = pl.scan_parquet(reasons).filter(pl.col("scope_path") == scope_path).collect()
        if not rows.height:
            return empty
        return Diff.read(src, where=pl.col("scope_path") == scope_path), rows.cast(REASONS_SCHEMA)
    folder = src / quote(Scope.parse(scope_path).display(), safe="")
    if folder.is_dir():
        src, reasons = folder, folder / REASONS_FILE
    rows = pl.read_parquet(reasons) if reasons.exists() else empty[1].drop("scope_path")
    rows = rows.with_columns(pl.lit(scope_path).alias("scope_path")).select(list(REASONS_SCHEMA)).cast(REASONS_SCHEMA)
    return as_shard_diff(Diff.read(src), scope_path), rows


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


__all__ = ["CLOSURE_RULES", "HELD_DIR", "REASONS_FILE", "REASONS_SCHEMA", "RULES", "HoldSplit", "split_holds", "close_selection",
           "read_held", "only_phases", "phases_of", "summarize"]
