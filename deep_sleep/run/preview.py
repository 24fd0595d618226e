"""What a run would change, record by record: the plan's renderer (issue 16, SPEC §9 "Plan").

:func:`preview` turns a diff and the snapshot it was computed from into one row per changed
record — phase, table, kind, id, a human label, ``before → after`` of every changed column, and
the reason of a delete — and :func:`preview_markdown` summarises it for a terminal (counts per
phase and kind, then the first records of each) and for a Prefect Markdown artifact alike.  The
plan itself is the nightly pipeline without its apply stage (:func:`deep_sleep.run.stages.plan_scope`);
nothing here reads a store.

    >>> preview(snapshot, diff).columns   # doctest: +SKIP
    ['phase', 'table', 'kind', 'id', 'label', 'change', 'reason']
"""

from __future__ import annotations

import polars as pl

from deep_sleep.core.diff import Diff
from deep_sleep.core.snapshot import Snapshot

PREVIEW_FILE = "preview.parquet"
PREVIEW_SCHEMA = {"phase": pl.String, "table": pl.String, "kind": pl.String, "id": pl.String,
                  "label": pl.String, "change": pl.String, "reason": pl.String}
_KEY = ("id", "expected_version", "phase", "reason", "scope_path", "tenant_id")


def _short(expr: pl.Expr, n: int = 60) -> pl.Expr:
    text = expr.cast(pl.String)
    return pl.when(text.str.len_chars() > n).then(text.str.slice(0, n - 1) + "…").otherwise(text)


def _labels(snapshot: Snapshot, table: str, frame: pl.DataFrame) -> pl.Expr:
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


def _with_edge_ends(snapshot: Snapshot, frame: pl.DataFrame, diff: Diff) -> pl.DataFrame:
    """Edges get their ends' labels (from the snapshot, or from nodes the same diff inserts)."""
    nodes = snapshot.table("memory_nodes").select("id", "label")
    inserted = diff.table("memory_nodes").inserts
    if inserted.height and "label" in inserted.columns:
        nodes = pl.concat([nodes, inserted.select("id", "label")])
    for end in ("source", "target"):
        if f"{end}_id" in frame.columns:
            frame = frame.join(nodes.rename({"id": f"{end}_id", "label": f"_{end}_label"}), on=f"{end}_id", how="left")
    return frame


def preview(snapshot: Snapshot, diff: Diff) -> pl.DataFrame:
    """One row per record the diff changes (see the module docstring), in phase, table, kind, id order."""
    parts = []
    for table in diff.tables:
        td = diff.table(table)
        before = snapshot.table(table)
        if table == "memory_edges":
            before = _with_edge_ends(snapshot, before, diff)
        if td.inserts.height:
            rows = _with_edge_ends(snapshot, td.inserts, diff) if table == "memory_edges" else td.inserts
            shown = [c for c in ("importance", "weight", "status", "value", "relation") if c in rows.columns]
            change = pl.concat_str([pl.lit("new")] + [pl.lit(f"; {c} ") + _short(pl.col(c)) for c in shown],
                                   ignore_nulls=True)
            parts.append(rows.select(pl.col("phase"), pl.lit(table).alias("table"), pl.lit("insert").alias("kind"),
                                     pl.col("id").cast(pl.String), _labels(snapshot, table, rows).alias("label"),
                                     change.alias("change"), pl.lit(None, dtype=pl.String).alias("reason")))
        names = before.select(pl.col("id"), _labels(snapshot, table, before).alias("label"))
        if td.updates.height:
            changed = [c for c in td.updates.columns if c not in _KEY]
            old = before.select("id", *[pl.col(c).alias(f"_old_{c}") for c in changed if c in before.columns])
            rows = td.updates.join(old, on="id", how="left").join(names, on="id", how="left")
            pieces = [pl.when(pl.col(c).is_not_null()).then(
                pl.lit(f"{c} ") + (_short(pl.col(f"_old_{c}")).fill_null("null") if f"_old_{c}" in rows.columns else pl.lit("?"))
                + " → " + _short(pl.col(c))) for c in changed]
            parts.append(rows.select(pl.col("phase"), pl.lit(table).alias("table"), pl.lit("update").alias("kind"),
                                     pl.col("id").cast(pl.String), "label",
                                     pl.concat_str(pieces, separator="; ", ignore_nulls=True).alias("change"),
                                     pl.lit(None, dtype=pl.String).alias("reason")))
        if td.deletes.height:
            rows = td.deletes.join(names, on="id", how="left")
            parts.append(rows.select(pl.col("phase"), pl.lit(table).alias("table"), pl.lit("delete").alias("kind"),
                                     pl.col("id").cast(pl.String), "label",
                                     pl.lit("deleted (archived)").alias("change"), pl.col("reason").cast(pl.String)))
    if not parts:
        return pl.DataFrame(schema=PREVIEW_SCHEMA)
    return pl.concat([p.cast(PREVIEW_SCHEMA) for p in parts]).sort("phase", "table", "kind", "id")


def preview_markdown(records: pl.DataFrame, per_phase: int = 10, title: str = "What this run would change") -> str:
    """Counts per phase and kind, then the first ``per_phase`` records of each phase."""
    if not records.height:
        return f"### {title}\n\nnothing: the run would change no row"
    counts = records.group_by("phase", "table", "kind").len("rows").sort("phase", "table", "kind")
    lines = [f"### {title}", "", f"{records.height} record(s); complete list in `{PREVIEW_FILE}` beside the diff", "",
             "| phase | table | kind | rows |", "|---|---|---|---|"]
    lines += [f"| {r['phase']} | {r['table']} | {r['kind']} | {r['rows']} |" for r in counts.iter_rows(named=True)]
    for (phase,), rows in records.group_by("phase", maintain_order=True):
        lines += ["", f"**{phase}** ({rows.height})", "", "| kind | id | label | change | reason |", "|---|---|---|---|---|"]
        for r in rows.head(per_phase).iter_rows(named=True):
            cells = [r["table"].removeprefix("memory_") + " " + r["kind"], r["id"][:8], r["label"] or "", r["change"] or "",
                     r["reason"] or ""]
            lines.append("| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
        if rows.height > per_phase:
            lines.append(f"| … | {rows.height - per_phase} more | | | |")
    return "\n".join(lines)


_KIND = {"inserts": "insert", "updates": "update", "deletes": "delete"}


def with_holds(records: pl.DataFrame, held_rows: pl.DataFrame) -> pl.DataFrame:
    """``records`` with a ``held`` column: the rule that would hold the record for approval
    (:attr:`deep_sleep.run.holds.HoldSplit.rows`), null for a record the run would apply."""
    keys = held_rows.select(pl.col("phase"), pl.col("table"), pl.col("kind").replace_strict(_KIND, return_dtype=pl.String),
                            pl.col("id"), pl.col("reason").alias("held")).unique(["phase", "table", "kind", "id"])
    return records.join(keys, on=["phase", "table", "kind", "id"], how="left", nulls_equal=True, maintain_order="left")


def held_markdown(records: pl.DataFrame, why: tuple[str, ...] | list[str] = (), per_phase: int = 10) -> str:
    """The records a run would hold for approval (``records`` from :func:`with_holds`), and why."""
    held = records.filter(pl.col("held").is_not_null()) if "held" in records.columns else records.head(0)
    if not held.height:
        return "### Would be held for approval\n\nnothing: the holds policy lets every row apply"
    lines = ["### Would be held for approval", "", *(f"- {w}" for w in why), "",
             f"{held.height} record(s) would wait for `deep-sleep approve RUN_ID` (or `reject`); the rest applies.", "",
             "| phase | kind | id | label | rule |", "|---|---|---|---|---|"]
    for (phase,), rows in held.group_by("phase", maintain_order=True):
        for r in rows.head(per_phase).iter_rows(named=True):
            cells = [phase, r["table"].removeprefix("memory_") + " " + r["kind"], r["id"][:8], r["label"] or "", r["held"]]
            lines.append("| " + " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in cells) + " |")
        if rows.height > per_phase:
            lines.append(f"| {phase} | … | {rows.height - per_phase} more | | |")
    return "\n".join(lines)


__all__ = ["PREVIEW_FILE", "held_markdown", "preview", "preview_markdown", "with_holds"]
