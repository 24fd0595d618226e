"""What a run would change, record by record: the plan's renderer (issue 16, SPEC §9 "Plan").

:func:`preview` turns a diff and the snapshot it was computed from into one row per changed
record — phase, table, kind, id, a human label, ``before → after`` of every changed column, and
the reason of a delete — and :func:`preview_markdown` summarises it for a terminal (counts per
phase and kind, then the first records of each) and for a Prefect Markdown artifact alike.  The
plan itself is the nightly's stages without the apply (:data:`deep_sleep.run.pipeline.PLAN`) and
the :class:`Preview` stage; nothing here reads a store.

A shard (many scopes in one set of frames; a single scope is a shard of one) is previewed in one
pass, each scope's rows exactly those of a shard of that scope alone.  :func:`plan_preview` adds
what the Hold stage split off for approval.  A fleet's plan (``nightly --plan``) hands each
shard's :class:`PreviewDigest` — counts, and :func:`head_records` of its top scopes — to
:func:`night_plan_markdown`, which renders the same sections as ``deep-sleep plan`` per scope.

    >>> preview(shard, diff).columns   # doctest: +SKIP
    ['scope_path', 'phase', 'table', 'kind', 'id', 'label', 'change', 'reason']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import polars as pl

from deep_sleep.core.diff import Diff
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot

if TYPE_CHECKING:
    from deep_sleep.run.pipeline import Context, State

PREVIEW_FILE = "preview.parquet"
PREVIEW_SCHEMA = {"phase": pl.String, "table": pl.String, "kind": pl.String, "id": pl.String,
                  "label": pl.String, "change": pl.String, "reason": pl.String}
SHARD_PREVIEW_SCHEMA = {"scope_path": pl.String, **PREVIEW_SCHEMA}
_KEY = ("id", "expected_version", "phase", "reason", "scope_path", "tenant_id")


def _short(expr: pl.Expr, n: int = 60, dtype: pl.DataType | None = None) -> pl.Expr:
    """``expr`` as text of at most ``n`` characters; a list column (a reranker's ``weights``, recall
    ``features``) reads ``[a, b, …]`` — a list cannot be cast to text."""
    if dtype is not None and isinstance(dtype, (pl.List, pl.Array)):
        inner = expr.arr.to_list() if isinstance(dtype, pl.Array) else expr
        text = "[" + inner.list.eval(pl.element().cast(pl.String)).list.join(", ") + "]"
    elif dtype is not None and isinstance(dtype, pl.Struct):
        text = expr.struct.json_encode()
    else:
        text = expr.cast(pl.String)
    return pl.when(text.str.len_chars() > n).then(text.str.slice(0, n - 1) + "…").otherwise(text)


def _labels(table: str, frame: pl.DataFrame) -> pl.Expr:
    """A human name for a row of ``table`` (``frame`` holds the row's columns, before or inserted)."""
    have = set(frame.columns)
    pick = {"memory_nodes": "label", "episodic_events": "content", "procedural_skills": "name",
            "prospective_triggers": "condition", "soul_profiles": "key", "recall_events": "query"}.get(table)
    if table == "pending_connections" and {"source_label", "target_label"} <= have:
        return _short(pl.col("source_label")) + " → " + _short(pl.col("target_label"))
    if table == "memory_edges" and {"_source_label", "_target_label", "relation"} <= have:
        return (_short(pl.col("_source_label"), 40) + " -[" + pl.col("relation").cast(pl.String) + "]-> "
                + _short(pl.col("_target_label"), 40))
    if pick and pick in have:
        return _short(pl.col(pick))
    return pl.lit(None, dtype=pl.String)


def _keyed(frame: pl.DataFrame, by: list[str]) -> pl.DataFrame:
    """``frame`` with the key columns ``by`` (``scope_path`` in a shard) as strings, so joins match."""
    return frame.with_columns([pl.col(c).cast(pl.String) for c in by if c in frame.columns])


def _with_edge_ends(source: Snapshot | Shard, frame: pl.DataFrame, diff: Diff, by: list[str]) -> pl.DataFrame:
    """Edges get their ends' labels (from the snapshot, or from nodes the same diff inserts); in a
    shard the ends are looked up within the edge's own scope (``by`` = ``["scope_path"]``)."""
    nodes = _keyed(source.table("memory_nodes").select(*by, "id", "label"), by)
    inserted = diff.table("memory_nodes").inserts
    if inserted.height and "label" in inserted.columns:
        nodes = pl.concat([nodes, _keyed(inserted.select(*by, "id", "label"), by)], how="vertical_relaxed")
    frame = _keyed(frame, by)
    for end in ("source", "target"):
        if f"{end}_id" in frame.columns:
            ends = nodes.rename({"id": f"{end}_id", "label": f"_{end}_label"}).unique([*by, f"{end}_id"], keep="first")
            frame = frame.join(ends, on=[*by, f"{end}_id"], how="left")
    return frame


def _records(source: Snapshot | Shard, diff: Diff, by: list[str]) -> list[pl.DataFrame]:
    """The preview's rows per (table, kind), unsorted; ``by`` are the join keys beside ``id``
    (``[]`` for one scope, ``["scope_path"]`` for a shard, whose every frame has that column)."""
    parts = []
    lead = [pl.col(c) for c in by]
    for table in diff.tables:
        td = diff.table(table)
        before = _keyed(source.table(table), by)
        if table == "memory_edges":
            before = _with_edge_ends(source, before, diff, by)
        if td.inserts.height:
            rows = _with_edge_ends(source, td.inserts, diff, by) if table == "memory_edges" else td.inserts
            shown = [c for c in ("importance", "weight", "status", "value", "relation") if c in rows.columns]
            change = pl.concat_str([pl.lit("new")] + [pl.lit(f"; {c} ") + _short(pl.col(c), dtype=rows.schema[c]) for c in shown],
                                   ignore_nulls=True)
            parts.append(rows.select(*lead, pl.col("phase"), pl.lit(table).alias("table"), pl.lit("insert").alias("kind"),
                                     pl.col("id").cast(pl.String), _labels(table, rows).alias("label"),
                                     change.alias("change"), pl.lit(None, dtype=pl.String).alias("reason")))
        names = before.select(*lead, pl.col("id"), _labels(table, before).alias("label"))
        if td.updates.height:
            changed = [c for c in td.updates.columns if c not in _KEY]
            old = before.select(*lead, "id", *[pl.col(c).alias(f"_old_{c}") for c in changed if c in before.columns])
            rows = _keyed(td.updates, by).join(old, on=[*by, "id"], how="left").join(names, on=[*by, "id"], how="left")
            pieces = [pl.when(pl.col(c).is_not_null()).then(
                pl.lit(f"{c} ") + (_short(pl.col(f"_old_{c}"), dtype=rows.schema[f"_old_{c}"]).fill_null("null")
                                   if f"_old_{c}" in rows.columns else pl.lit("?"))
                + " → " + _short(pl.col(c), dtype=rows.schema[c])) for c in changed]
            parts.append(rows.select(*lead, pl.col("phase"), pl.lit(table).alias("table"), pl.lit("update").alias("kind"),
                                     pl.col("id").cast(pl.String), "label",
                                     pl.concat_str(pieces, separator="; ", ignore_nulls=True).alias("change"),
                                     pl.lit(None, dtype=pl.String).alias("reason")))
        if td.deletes.height:
            rows = _keyed(td.deletes, by).join(names, on=[*by, "id"], how="left")
            parts.append(rows.select(*lead, pl.col("phase"), pl.lit(table).alias("table"), pl.lit("delete").alias("kind"),
                                     pl.col("id").cast(pl.String), "label",
                                     pl.lit("deleted (archived)").alias("change"), pl.col("reason").cast(pl.String)))
    return parts


def preview(shard: Shard | Snapshot, diff: Diff) -> pl.DataFrame:
    """One row per record the diff changes (see the module docstring) of every scope of ``shard`` in
    one pass (``diff``: the shard's, every frame with ``scope_path``): a ``scope_path`` column first,
    then each scope's rows in phase, table, kind, id order.  Every lookup (a row's before-image, an
    edge's end labels) is joined on (``scope_path``, id), so a scope never sees another's rows.  A
    :class:`Snapshot` is a shard of one, and its rows come without ``scope_path``."""
    if isinstance(shard, Snapshot):
        from deep_sleep.run.transform import as_shard_diff

        return preview(Shard.of(shard), as_shard_diff(diff, shard.scope_path)).drop("scope_path")
    parts = _records(shard, diff, ["scope_path"])
    if not parts:
        return pl.DataFrame(schema=SHARD_PREVIEW_SCHEMA)
    return (pl.concat([p.cast(SHARD_PREVIEW_SCHEMA) for p in parts])
            .sort("scope_path", "phase", "table", "kind", "id", maintain_order=True))


COUNTS_SCHEMA = {"phase": pl.String, "table": pl.String, "kind": pl.String, "rows": pl.Int64, "held": pl.Int64}


def record_counts(records: pl.DataFrame, by: tuple[str, ...] = ()) -> pl.DataFrame:
    """Rows per (phase, table, kind) — per ``by`` too, e.g. ``("scope_path",)`` — and how many of
    them the holds policy would hold (``held``: 0 when ``records`` has no ``held`` column)."""
    held = pl.col("held").is_not_null().sum() if "held" in records.columns else pl.lit(0)
    keys = [*by, "phase", "table", "kind"]
    schema = {**{c: pl.String for c in by}, **COUNTS_SCHEMA}
    if not records.height:
        return pl.DataFrame(schema=schema)
    return (records.group_by(keys).agg(pl.len().alias("rows"), held.alias("held")).cast(schema).sort(keys))


def head_records(records: pl.DataFrame, per_phase: int, by: tuple[str, ...] = ()) -> pl.DataFrame:
    """The records :func:`preview_markdown` and :func:`held_markdown` show of ``records`` (sorted as
    :func:`preview` sorts them): the first ``per_phase`` of each phase and the first ``per_phase`` held
    ones of each phase (per ``by``, e.g. per scope).  Rendered with the counts of the whole
    (:func:`record_counts`), they give the very text the whole gives, so a fleet's plan carries
    these few rows per scope, not every record."""
    groups = [*by, "phase"]
    keep = pl.int_range(pl.len()).over(groups) < per_phase
    if "held" in records.columns:
        held = pl.col("held").is_not_null()
        keep = keep | (held & (held.cast(pl.Int64).cum_sum().over(groups) <= per_phase))
    return records.filter(keep)


def _cells(values: list) -> str:
    return "| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in values) + " |"


def preview_markdown(records: pl.DataFrame, per_phase: int = 10, title: str = "What this run would change", *,
                     counts: pl.DataFrame | None = None, where: str | None = None) -> str:
    """Counts per phase and kind, then the first ``per_phase`` records of each phase.

    ``counts`` (:func:`record_counts` of the complete records) lets ``records`` be just
    :func:`head_records` of them; ``where`` names the complete file (default: ``preview.parquet``
    beside the diff)."""
    counts = record_counts(records) if counts is None else counts
    total = int(counts.get_column("rows").sum()) if counts.height else 0
    if not total:
        return f"### {title}\n\nnothing: the run would change no row"
    where = where or f"`{PREVIEW_FILE}` beside the diff"
    per = dict(counts.group_by("phase").agg(pl.col("rows").sum()).iter_rows())
    lines = [f"### {title}", "", f"{total} record(s); complete list in {where}", "",
             "| phase | table | kind | rows |", "|---|---|---|---|"]
    lines += [f"| {r['phase']} | {r['table']} | {r['kind']} | {r['rows']} |" for r in counts.iter_rows(named=True)]
    for (phase,), rows in records.group_by("phase", maintain_order=True):
        n = int(per.get(phase, rows.height))
        lines += ["", f"**{phase}** ({n})", "", "| kind | id | label | change | reason |", "|---|---|---|---|---|"]
        for r in rows.head(per_phase).iter_rows(named=True):
            lines.append(_cells([r["table"].removeprefix("memory_") + " " + r["kind"], r["id"][:8], r["label"] or "",
                                 r["change"] or "", r["reason"] or ""]))
        if n > per_phase:
            lines.append(f"| … | {n - per_phase} more | | | |")
    return "\n".join(lines)


_KIND = {"inserts": "insert", "updates": "update", "deletes": "delete"}


def with_holds(records: pl.DataFrame, held_rows: pl.DataFrame) -> pl.DataFrame:
    """``records`` with a ``held`` column: the rule that would hold the record for approval
    (:attr:`deep_sleep.run.holds.HoldSplit.rows`), null for a record the run would apply.  A shard's
    records and held rows (both with ``scope_path``) are matched within each scope."""
    by = ["scope_path"] if "scope_path" in records.columns and "scope_path" in held_rows.columns else []
    keys = held_rows.select(*by, pl.col("phase"), pl.col("table"),
                            pl.col("kind").replace_strict(_KIND, return_dtype=pl.String),
                            pl.col("id"), pl.col("reason").alias("held")).unique([*by, "phase", "table", "kind", "id"])
    return records.join(keys, on=[*by, "phase", "table", "kind", "id"], how="left", nulls_equal=True,
                        maintain_order="left")


def held_markdown(records: pl.DataFrame, why: tuple[str, ...] | list[str] = (), per_phase: int = 10, *,
                  counts: pl.DataFrame | None = None) -> str:
    """The records a run would hold for approval (``records`` from :func:`with_holds`), and why;
    ``counts`` as for :func:`preview_markdown`."""
    held = records.filter(pl.col("held").is_not_null()) if "held" in records.columns else records.head(0)
    counts = record_counts(held) if counts is None else counts
    total = int(counts.get_column("held").sum()) if counts.height else 0
    if not total:
        return "### Would be held for approval\n\nnothing: the holds policy lets every row apply"
    per = dict(counts.group_by("phase").agg(pl.col("held").sum()).iter_rows())
    lines = ["### Would be held for approval", "", *(f"- {w}" for w in why), "",
             f"{total} record(s) would wait for `deep-sleep approve RUN_ID` (or `reject`); the rest applies.", "",
             "| phase | kind | id | label | rule |", "|---|---|---|---|---|"]
    for (phase,), rows in held.group_by("phase", maintain_order=True):
        n = int(per.get(phase, rows.height))
        for r in rows.head(per_phase).iter_rows(named=True):
            lines.append(_cells([phase, r["table"].removeprefix("memory_") + " " + r["kind"], r["id"][:8],
                                 r["label"] or "", r["held"]]))
        if n > per_phase:
            lines.append(f"| {phase} | … | {n - per_phase} more | | |")
    return "\n".join(lines)


# -- a shard's plan, and a fleet's ---------------------------------------------------------------
@dataclass(frozen=True)
class PlanPreview:
    """Every record a shard's validated plan would change (:func:`preview` with the ``held``
    column of :func:`with_holds`), and why the holds policy would hold rows, per scope."""

    records: pl.DataFrame
    why: dict[str, tuple[str, ...]] = field(default_factory=dict)

    def scope(self, scope_path: str) -> pl.DataFrame:
        """One scope's records, as :func:`preview` + :func:`with_holds` of that scope alone give them."""
        return self.records.filter(pl.col("scope_path") == scope_path).drop("scope_path")

    def write(self, diff_dir: str | Path, single: bool) -> Path:
        """``<diff_dir>/preview.parquet``: a single-scope directory's without ``scope_path`` (the
        layout ``deep-sleep plan`` writes), a shard's with it (every scope's records)."""
        out = Path(diff_dir) / PREVIEW_FILE
        (self.records.drop("scope_path") if single else self.records).write_parquet(out)
        return out

    def per_scope(self) -> dict[str, tuple[int, int]]:
        """scope → (records, held records)."""
        if not self.records.height:
            return {}
        held = pl.col("held").is_not_null().sum() if "held" in self.records.columns else pl.lit(0)
        rows = self.records.group_by("scope_path").agg(pl.len().alias("n"), held.alias("h"))
        return {s: (int(n), int(h)) for s, n, h in rows.iter_rows()}

    def digest(self, planned: set[str] | frozenset[str], max_scopes: int, per_phase: int) -> PreviewDigest:
        """The bounded part a fleet's plan needs of this shard: the counts over its ``planned`` scopes
        (those that passed validation), and of its ``max_scopes`` scopes with the most records their
        counts and :func:`head_records` — the fleet's top scopes are among the shards' top scopes."""
        wanted = pl.Series(sorted(planned), dtype=pl.String).implode()
        mine = self.records.filter(pl.col("scope_path").is_in(wanted))
        by_scope = record_counts(mine, ("scope_path",))
        top = (by_scope.group_by("scope_path").agg(pl.col("rows").sum())
               .sort(["rows", "scope_path"], descending=[True, False]).head(max_scopes).get_column("scope_path"))
        chosen = pl.col("scope_path").is_in(top.implode())
        return PreviewDigest(counts=_sum_counts(by_scope.drop("scope_path")), top=by_scope.filter(chosen),
                             head=head_records(mine.filter(chosen), per_phase, ("scope_path",)),
                             why={s: w for s, w in self.why.items() if s in set(top.to_list())})


def _sum_counts(counts: pl.DataFrame) -> pl.DataFrame:
    keys = ["phase", "table", "kind"]
    if not counts.height:
        return pl.DataFrame(schema=COUNTS_SCHEMA)
    return counts.group_by(keys).agg(pl.col("rows").sum(), pl.col("held").sum()).cast(COUNTS_SCHEMA).sort(keys)


@dataclass(frozen=True)
class PreviewDigest:
    """What crosses a fleet's task boundary of a shard's plan (small: counts, and a few records of a
    few scopes).  counts: rows and held rows per (phase, table, kind) over the planned scopes; top:
    the same per scope, of the scopes shown; head: the records shown of them; why: their hold reasons."""

    counts: pl.DataFrame
    top: pl.DataFrame
    head: pl.DataFrame
    why: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @classmethod
    def merge(cls, digests: list[PreviewDigest]) -> PreviewDigest:
        """One digest of many shards' (counts summed; top and head concatenated)."""
        if not digests:
            return cls(pl.DataFrame(schema=COUNTS_SCHEMA), pl.DataFrame(schema={"scope_path": pl.String, **COUNTS_SCHEMA}),
                       pl.DataFrame(schema={**SHARD_PREVIEW_SCHEMA, "held": pl.String}))
        why: dict[str, tuple[str, ...]] = {}
        for d in digests:
            why.update(d.why)
        return cls(_sum_counts(pl.concat([d.counts for d in digests])), pl.concat([d.top for d in digests]),
                   pl.concat([d.head for d in digests], how="diagonal_relaxed"), why)


def plan_preview(state: State) -> PlanPreview:
    """The records of a run's plan (:func:`preview` of its shard and diff) with what its Hold stage
    split off for approval (``held``: the rule; :attr:`deep_sleep.run.holds.HoldSplit.rows`) — the
    plan stops here, where the apply would start."""
    records = preview(state.transformed.shard, state.transformed.diff)
    if state.split is None or not state.split.rows.height:
        return PlanPreview(records.with_columns(pl.lit(None, dtype=pl.String).alias("held")), {})
    ok = set(state.ok)
    rows = state.split.rows.filter(pl.col("scope_path").is_in(pl.Series(sorted(ok), dtype=pl.String).implode()))
    return PlanPreview(with_holds(records, rows), {s: w for s, w in state.split.why.items() if s in ok})


@dataclass(frozen=True)
class Preview:
    """The plan's last stage: every record of the diff and what would be held
    (:func:`plan_preview`), kept in the state and written to ``<diff>/preview.parquet``."""

    name: ClassVar[str] = "preview"

    def run(self, ctx: Context, state: State) -> State:
        from dataclasses import replace

        found = plan_preview(state)
        if ctx.diff_dir is not None:
            found.write(ctx.diff_dir, single=len(state.reports) == 1)
        return replace(state, preview=found)

    def describe(self, ctx: Context) -> str:
        return "preview: every record the run would change, and what it would hold"


def _display(scope_path: str) -> str:
    from deep_sleep.core.scope import Scope

    return Scope.parse(scope_path).display()


def night_plan_markdown(title: str, scopes: list[dict], digest: PreviewDigest, *, considered: int, skipped: int,
                        max_scopes: int = 20, per_phase: int = 5, max_dirs: int = 10) -> str:
    """A fleet's plan (``nightly --plan``): the summary over the fleet, then per scope — most records
    first, at most ``max_scopes`` — :func:`preview_markdown` and :func:`held_markdown` of its records
    (at most ``per_phase`` per phase), then how many scopes were left out and where every record is.

    ``scopes``: one dict per due scope — ``scope_path``, ``status`` (planned / failed), ``records``,
    ``held``, ``diff_uri``, ``reason``; ``digest``: :meth:`PreviewDigest.merge` of the shards'.  The
    text is bounded by ``max_scopes`` × phases × ``per_phase`` rows, whatever the fleet's size."""
    planned = [r for r in scopes if r["status"] == "planned"]
    failed = [r for r in scopes if r["status"] != "planned"]
    changing = sorted((r for r in planned if r.get("records")), key=lambda r: (-r["records"], r["scope_path"]))
    total = sum(r.get("records") or 0 for r in planned)
    held = sum(r.get("held") or 0 for r in planned)
    lines = [f"# {title}", "",
             (f"{considered} scope(s): {len(scopes)} due ({len(planned)} planned, {len(failed)} failed), {skipped} skipped "
              "(not due); nothing was applied."),
             (f"{total} record(s) would change in {len(changing)} scope(s), {len(planned) - len(changing)} scope(s) would "
              f"change nothing; {held} record(s) would be held for approval."), "",
             "## Over the fleet", ""]
    if digest.counts.height:
        lines += ["| phase | table | kind | rows | held |", "|---|---|---|---|---|"]
        lines += [_cells([r["phase"], r["table"], r["kind"], r["rows"], r["held"]]) for r in digest.counts.iter_rows(named=True)]
    else:
        lines.append("nothing: the night would change no row")
    if failed:
        lines += ["", f"## Failed ({len(failed)}): these scopes would apply nothing", "", "| scope | reason |", "|---|---|"]
        lines += [_cells([_display(r["scope_path"]), (r.get("reason") or "")[:300]]) for r in failed[:max_scopes]]
        if len(failed) > max_scopes:
            lines.append(f"| … {len(failed) - max_scopes} more | |")
    shown = changing[:max_scopes]
    if shown:
        lines += ["", f"## Per scope, most records first ({len(shown)} of {len(changing)})"]
    for r in shown:
        s = r["scope_path"]
        recs = digest.head.filter(pl.col("scope_path") == s).drop("scope_path")
        counts = digest.top.filter(pl.col("scope_path") == s).drop("scope_path")
        where = f"`{PREVIEW_FILE}` of `{r['diff_uri']}`"
        lines += ["", preview_markdown(recs, per_phase, title=_display(s),
                                       counts=counts, where=where)]
        if r.get("held"):
            lines += ["", held_markdown(recs, digest.why.get(s, ()), per_phase, counts=counts)]
    rest = changing[max_scopes:]
    if rest:
        lines += ["", f"{len(rest)} more scope(s) with changes are not shown ({sum(r['records'] for r in rest)} record(s))."]
    dirs = sorted({r["diff_uri"] for r in scopes if r.get("diff_uri")})
    if dirs:
        lines += ["", (f"Every record of every scope is in `{PREVIEW_FILE}` of its diff directory (a shard's holds all "
                       "its scopes' records, with `scope_path`; `held` names the rule that would hold a record):"), ""]
        lines += [f"- `{d}`" for d in dirs[:max_dirs]]
        if len(dirs) > max_dirs:
            lines.append(f"- … and {len(dirs) - max_dirs} more diff directories (listed per scope in the night's summary)")
    return "\n".join(lines)


__all__ = ["PREVIEW_FILE", "PlanPreview", "PreviewDigest", "head_records", "held_markdown", "night_plan_markdown",
           "plan_preview", "preview", "preview_markdown", "record_counts", "with_holds", "Preview"]
