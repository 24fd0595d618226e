"""Snapshot validation and quarantine (SPEC §4): rows that break the store's own invariants are set
aside with a named reason, and the run goes on with the rest.

Nothing is deleted or repaired: a quarantined row stays in the store exactly as it is, is left
out of this run's snapshot (so no phase reads or writes it), and is recorded with its reason in
``consolidation_quarantine`` and in the report.  Each row gets the first reason that applies, in
the order of :data:`REASONS`.  Edges touching a quarantined node are quarantined too (otherwise
they would dangle in the clean snapshot).

    >>> clean, quarantined = quarantine(snapshot, as_of)      # doctest: +SKIP
    >>> quarantined.columns
    ['table', 'id', 'reason', 'row']
"""

from __future__ import annotations

from datetime import datetime, timedelta

import polars as pl

from deep_sleep import tables
from deep_sleep.duck import registered
from deep_sleep.snapshot import Snapshot, utc

QUARANTINE_SCHEMA = {"table": pl.String(), "id": pl.String(), "reason": pl.String(), "row": pl.String()}
FUTURE_TOLERANCE = timedelta(minutes=5)
CONTROL = r"[\x00-\x1f\x7f]"
JSON_SHAPE = {"properties": "OBJECT", "metadata": "OBJECT", "steps": "ARRAY"}
TIMESTAMPS = ("created_at", "updated_at", "accessed_at")

REASONS = (
    "null id",
    "duplicate id",
    "scope_path differs from the run's scope",
    "importance is not a finite number",
    "importance outside [1, 10]",
    "empty label",
    "control characters in label",
    "unknown layer",
    "properties is not a JSON object",
    "metadata is not a JSON object",
    "steps is not a JSON array",
    "weight is negative or not finite",
    "empty content",
    "features must have 12 values",
    "timestamp in the future",
    "edge endpoint is quarantined",
    "dangling edge: endpoint not a node of this scope",
)


def _json_shape_flags(table: str, frame: pl.DataFrame) -> dict[str, pl.Series]:
    """column → boolean Series: True where the JSON text is not of the required shape (DuckDB json_type)."""
    kinds = tables.columns(table)
    cols = [c for c in JSON_SHAPE if c in frame.columns and c in kinds and kinds[c].kind == "json"]
    if not cols or not frame.height:
        return {}
    exprs = ", ".join(
        f"coalesce(NOT (json_valid({c}) AND json_type({c}::JSON) = '{JSON_SHAPE[c]}'), true) AS {c}" for c in cols
    )
    with registered(frame.select(cols).to_arrow()) as (con, name):
        flags = con.sql(f"SELECT {exprs} FROM {name}").pl()
    return {c: flags.get_column(c) for c in cols}


def _reasons(table: str, frame: pl.DataFrame, scope_path: str, as_of: datetime) -> pl.Expr:
    """One expression giving each row's first failing reason (null = clean), for the rules that
    need only the row itself and its table."""
    rules: list[tuple[str, pl.Expr]] = []
    if table in tables.MUTABLE:  # the access log's identity column is not read by any phase
        rules += [("null id", pl.col("id").is_null()), ("duplicate id", pl.col("id").is_duplicated())]
    if "scope_path" in frame.columns:
        rules.append(("scope_path differs from the run's scope", pl.col("scope_path").fill_null("") != scope_path))
    if "importance" in frame.columns:
        rules += [
            ("importance is not a finite number", pl.col("importance").is_null() | ~pl.col("importance").is_finite()),
            ("importance outside [1, 10]", ~pl.col("importance").is_between(1.0, 10.0)),
        ]
    for label in ("label", "source_label", "target_label", "name"):
        if label in frame.columns and frame.schema[label] == pl.String:  # recall_events.label is a number
            rules += [
                ("empty label", pl.col(label).is_null() | (pl.col(label).str.strip_chars() == "")),
                ("control characters in label", pl.col(label).str.contains(CONTROL)),
            ]
    if "layer" in frame.columns:
        rules.append(("unknown layer", ~pl.col("layer").is_in(["semantic", "working"])))
    for column, flag in (("properties", "_bad_properties"), ("metadata", "_bad_metadata"), ("steps", "_bad_steps")):
        if flag in frame.columns:
            rules.append((f"{column} is not a JSON {'array' if column == 'steps' else 'object'}", pl.col(flag)))
    if "weight" in frame.columns:
        rules.append(("weight is negative or not finite", pl.col("weight").is_null() | ~pl.col("weight").is_finite() | (pl.col("weight") < 0)))
    if table == "episodic_events":
        rules.append(("empty content", pl.col("content").is_null() | (pl.col("content").str.strip_chars() == "")))
    if table == "recall_events":
        rules.append(("features must have 12 values", pl.col("features").list.len().fill_null(0) != 12))
    limit = utc(as_of) + FUTURE_TOLERANCE
    future = [pl.col(c) > limit for c in TIMESTAMPS if c in frame.columns]
    if future:
        rules.append(("timestamp in the future", pl.any_horizontal(future).fill_null(False)))
    expr = pl.lit(None, dtype=pl.String)
    for reason, test in reversed(rules):
        expr = pl.when(test.fill_null(False)).then(pl.lit(reason)).otherwise(expr)
    return expr.alias("_reason")


def _row_json(frame: pl.DataFrame) -> pl.Expr:
    return pl.struct([c for c in frame.columns if not c.startswith("_")]).struct.json_encode().alias("row")


def quarantine(snapshot: Snapshot, as_of: datetime) -> tuple[Snapshot, pl.DataFrame]:
    """Split ``snapshot`` into the clean snapshot and the quarantined rows (table, id, reason, row JSON)."""
    clean: dict[str, pl.DataFrame] = {}
    found = [pl.DataFrame(schema=QUARANTINE_SCHEMA)]
    order = sorted(snapshot.frames, key=lambda t: t == "memory_edges")  # nodes before edges
    bad_nodes = pl.Series("id", [], dtype=pl.String)
    for table in order:
        frame = snapshot.frames[table]
        if not frame.height:
            clean[table] = frame
            continue
        flags = _json_shape_flags(table, frame)
        work = frame.with_columns(*(s.alias(f"_bad_{c}") for c, s in flags.items()))
        work = work.with_columns(_reasons(table, work, snapshot.scope_path, as_of))
        if table == "memory_edges":
            nodes = clean.get("memory_nodes", snapshot.table("memory_nodes"))
            live = nodes.get_column("id").implode()
            touched = pl.col("source_id").is_in(bad_nodes.implode()) | pl.col("target_id").is_in(bad_nodes.implode())
            dangling = ~(pl.col("source_id").is_in(live) & pl.col("target_id").is_in(live))
            work = work.with_columns(
                pl.coalesce(
                    pl.col("_reason"),
                    pl.when(touched).then(pl.lit("edge endpoint is quarantined")),
                    pl.when(dangling).then(pl.lit("dangling edge: endpoint not a node of this scope")),
                ).alias("_reason")
            )
        bad = work.filter(pl.col("_reason").is_not_null())
        if bad.height:
            found.append(bad.select(
                pl.lit(table).alias("table"), pl.col("id").cast(pl.String) if "id" in bad.columns else pl.lit(None, pl.String).alias("id"), pl.col("_reason").alias("reason"), _row_json(bad)
            ))
            if table == "memory_nodes":
                bad_nodes = bad.get_column("id")
        clean[table] = work.filter(pl.col("_reason").is_null()).select(frame.columns)
    quarantined = pl.concat(found).sort("table", "id", "reason")
    return snapshot.with_frames(clean), quarantined


def summarise(quarantined: pl.DataFrame) -> dict[str, dict[str, int]]:
    """table → reason → rows, for the report."""
    out: dict[str, dict[str, int]] = {}
    for row in quarantined.group_by("table", "reason").len().sort("table", "reason").iter_rows(named=True):
        out.setdefault(row["table"], {})[row["reason"]] = row["len"]
    return out


__all__ = ["QUARANTINE_SCHEMA", "REASONS", "quarantine", "summarise", "tables"]
