"""Validate a diff against its snapshot with pandera (polars backend, lazy) — SPEC §4.

Each (table, kind) frame is first *annotated* with what the checks need from the snapshot
(the row's snapshot version, its label, whether it is deleted elsewhere in the diff, how many
surviving edges still point at it), then validated by a pandera schema.  Every failure names the
check, the table, the phase, the offending row and its scope:

    >>> failures = validate_diff(diff, shard)       # doctest: +SKIP
    >>> failures.select("check", "table", "phase", "id", "scope_path")  # doctest: +SKIP

Small diffs (a quick nap's) are dominated by pandera's per-check overhead (a collect per check),
so each schema is built once per (table, kind, caps) and carries, next to every check, the
polars expression it evaluates.  A frame is first tried against all of them in one ``select``
(:func:`_vouched`): every column present with exactly the schema's dtype, no nulls (or NaN, as
pandera counts them) where the column is not nullable, and every check true or null on every row
(pandera passes a null check output).  Only when that pre-check cannot vouch for the frame does
pandera validate it — so every failure is still found and reported by pandera, in its format;
the pre-check only skips pandera where pandera could not fail.

The diff is a shard's (many scopes — a single scope is a shard of one — every frame with a
``scope_path`` column), validated in one pass per frame: the annotations look rows up by
(scope_path, id) and count caps and degrees per scope, and the schemas' scope rules read the row's
own scope, so each scope gets the verdict a shard of that scope alone gets.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import lru_cache

import pandera.polars as pa
import polars as pl
from deep_sleep.transforms._common import PROTECTED_PREFIXES
from deep_sleep.transforms.config import ConsolidationConfig
from pandera.errors import SchemaErrors

from deep_sleep.core import lookup, tables
from deep_sleep.core.diff import Diff
from deep_sleep.core.errors import DiffError
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.validation.quarantine import _pair_member, _Scopes

FAILURE_SCHEMA = {
    "check": pl.String(),
    "table": pl.String(),
    "kind": pl.String(),
    "phase": pl.String(),
    "id": pl.String(),
    "column": pl.String(),
    "value": pl.String(),
    "scope_path": pl.String(),
}


def _rule(expr: pl.Expr, message: str) -> pa.Check:
    """A frame-level check: ``expr`` must be true on every row; ``message`` names it in failures."""
    check = pa.Check(lambda data, e=expr: data.lazyframe.select(e), error=message)
    check._ds_expr = expr  # what the pre-check evaluates (see _vouched)
    return check


def _column_rule(test: Callable[[pl.Expr], pl.Expr], message: str) -> pa.Check:
    """A column check: ``test(column)`` must be true on every row of the column."""
    check = pa.Check(lambda d, t=test: d.lazyframe.select(t(pl.col(d.key)).alias(d.key)), error=message)
    check._ds_column_test = test
    return check


def _value_checks(table: str, kind: str) -> dict[str, pa.Column]:
    """Column checks on values a phase writes (null = unchanged in updates)."""
    cols: dict[str, pa.Column] = {"id": pa.Column(str, nullable=False)}
    present = tables.diff_columns(table)
    if "importance" in present:
        cols["importance"] = pa.Column(
            float, _column_rule(lambda c: c.is_between(1.0, 10.0) & c.is_finite(), "importance within [1, 10]"),
            nullable=kind == "updates", required=False,
        )
    if "weight" in present:
        cols["weight"] = pa.Column(
            float, _column_rule(lambda c: (c >= 0) & c.is_finite(), "weight >= 0"),
            nullable=kind == "updates", required=False,
        )
    if table == "procedural_skills":
        cols["status"] = pa.Column(
            str, _column_rule(lambda c: c != "active", "consolidation never creates or activates a skill"),
            nullable=kind == "updates", required=False,
        )
    return cols


def _cap_checks(table: str, kind: str, caps: tuple[int, int, int, int]) -> list[pa.Check]:
    """Degree and per-run caps of SPEC §3 (``_phase_rows`` = rows of the same phase in this frame);
    ``caps`` = :func:`_caps` of the configuration."""
    max_pairs, max_promotions, max_summarised, max_neighbours = caps
    per_phase = {
        ("memory_edges", "inserts", "synthetic_links"): max_pairs,
        ("procedural_skills", "inserts", "procedural_promotion"): max_promotions,
        ("episodic_events", "deletes", "episodic_summary"): max_summarised,
    }
    checks = [
        _rule((pl.col("phase") != phase) | (pl.col("_phase_rows") <= cap), f"per-run cap of {phase}: at most {cap} {table} {kind}")
        for (t, k, phase), cap in per_phase.items() if (t, k) == (table, kind)
    ]
    if (table, kind) == ("memory_edges", "inserts"):
        cap = max_neighbours
        checks.append(_rule(pl.col("_co_degree").fill_null(0) <= cap, f"no node over {cap} CO_OCCURRED neighbours"))
    return checks


def _caps(config: ConsolidationConfig) -> tuple[int, int, int, int]:
    """The configuration values the schemas depend on (their cache key)."""
    es = config.episodic_summary
    return (config.synthetic_links.max_pairs, config.procedural_promotion.max_per_run,
            es.batch_size * es.max_batches, config.cooccurrence.max_neighbours)


def _schema(table: str, kind: str, config: ConsolidationConfig) -> pa.DataFrameSchema:
    return _cached_schema(table, kind, _caps(config), threading.get_ident())


@lru_cache(maxsize=1024)
def _cached_schema(table: str, kind: str, caps: tuple[int, int, int, int], thread: int) -> pa.DataFrameSchema:
    """The schema of one (table, kind) frame of a shard's diff, where every per-scope rule reads the
    row's own scope (annotations of :func:`_annotate`: per-scope counts and degrees,
    ``_scope_known``, ``_tenant``); built once per arguments and per thread (a nightly validates
    shards on a thread pool; schemas are not shared across it)."""
    cols = _value_checks(table, kind)
    checks = [_rule(pl.struct("scope_path", "id", "phase").is_unique(), "one row per id and phase"),
              *_cap_checks(table, kind, caps)]
    if kind in ("updates", "deletes"):
        # Membership is by id; a row whose snapshot version is null (a hand-written snapshot of a
        # table SPEC §1 gives no version) is referenced with a null expected_version (SPEC §8).
        cols["expected_version"] = pa.Column(int, nullable=True)
        checks += [
            _rule(pl.col("_in_snapshot_row").fill_null(False), "references a row of the snapshot"),
            _rule(~pl.col("_in_snapshot_row").fill_null(False)
                  | (pl.col("expected_version").is_null() & pl.col("_snapshot_version").is_null())
                  | (pl.col("expected_version") == pl.col("_snapshot_version")).fill_null(False),
                  "expected_version equals the snapshot's version"),
        ]
    if kind == "updates":
        checks += [
            _rule(~pl.col("_deleted"), "no row both updated and deleted"),
            _rule(~pl.col("_rewrites_scope"), "updates never change scope_path or tenant_id"),
        ]
    if kind == "deletes":
        cols["reason"] = pa.Column(str, nullable=False)
        if table == "memory_nodes":
            checks += [
                _rule(~pl.any_horizontal(pl.col("_label").fill_null("").str.starts_with(p) for p in PROTECTED_PREFIXES),
                      "protected labels (SOUL:, AGENT_IDENTITY:) are never deleted"),
                _rule(pl.col("_dangling_edges") == 0, "no surviving edge points at a deleted node"),
            ]
    if kind == "inserts":  # the row's scope is one of the shard's; its tenant is that scope's
        cols["scope_path"] = pa.Column(str, _column_rule(lambda c: pl.col("_scope_known"), "scope_path equals the run's scope"),
                                       nullable=False)
        cols["tenant_id"] = pa.Column(str, _column_rule(lambda c: c == pl.col("_tenant"), "tenant_id equals the run's tenant"),
                                      nullable=False, required=False)
        checks.append(_rule(~pl.col("_in_snapshot"), "inserted id is new (not already in the snapshot)"))
        if table == "memory_edges":
            checks.append(_rule(pl.col("_ends_exist"), "edge ends are live nodes of the scope"))
    return pa.DataFrameSchema(cols, checks=checks, name=f"{table}.{kind}", strict=False)


def _annotate(table: str, kind: str, frame: pl.DataFrame, diff: Diff, shard: Shard, scopes: _Scopes) -> pl.DataFrame:
    """What the checks need from the shard, beside each row of one (table, kind) frame: every lookup
    is by (scope_path, id) — a row names rows of its own scope only — and every count and degree is
    per scope.  The fast path: hash probes, and the edges narrowed to those touching the ids asked
    about (:func:`_annotate_plain` states the same plainly; tests/validation/test_diff_checks_paths.py)."""
    snap = shard.table(table)
    out = frame.with_row_index("_row").with_columns(pl.len().over("scope_path", "phase").alias("_phase_rows"))
    if kind in ("updates", "deletes"):
        ref = snap.select("scope_path", "id", pl.col("version").alias("_snapshot_version"), pl.lit(True).alias("_in_snapshot_row"),
                          *([pl.col("label").alias("_label")] if "label" in snap.columns else []))
        out = out.join(ref, on=["scope_path", "id"], how="left", maintain_order="left")
    if kind == "updates":
        out = out.with_columns(_in(out.get_column("scope_path"), out.get_column("id"), diff.table(table).deletes, few=True)
                               .alias("_deleted"))
        out = out.with_columns(_rewrites_scope(out).alias("_rewrites_scope"))
    if kind == "deletes" and table == "memory_nodes":
        ends = _surviving_ends(diff, shard, out.get_column("id"))
        counts = ends.group_by("scope_path", "id").len("_dangling_edges")
        out = out.join(counts, on=["scope_path", "id"], how="left", maintain_order="left").with_columns(
            pl.col("_dangling_edges").fill_null(0))
    if kind == "inserts":
        tenant = scopes.tenant_of_rows(out.get_column("scope_path"))
        out = out.with_columns(
            _in(out.get_column("scope_path"), out.get_column("id"), snap, few=True).alias("_in_snapshot"),
            pl.when(pl.col("scope_path").is_not_null()).then(tenant.is_not_null()).alias("_scope_known"),
            tenant.alias("_tenant"),
        )
        if table == "memory_edges":
            n = out.height
            scope = out.get_column("scope_path")
            live = _live_nodes(pl.concat([scope, scope]), pl.concat([out.get_column("source_id"), out.get_column("target_id")]),
                               diff, shard)
            out = out.with_columns((live.slice(0, n) & live.slice(n, n)).alias("_ends_exist"))
            out = _with_co_degree(out, diff, shard)
    return out


def _rewrites_scope(updates: pl.DataFrame) -> pl.Expr:
    """An update that sets tenant_id rewrites its row's scope (scope_path is the row's own: plan adds it)."""
    return pl.col("tenant_id").is_not_null() if "tenant_id" in updates.columns else pl.lit(False)


def _in(scopes: pl.Series, ids: pl.Series, rows: pl.DataFrame, *, few: bool = False) -> pl.Series:
    """Whether each (scope, id) is the (scope_path, id) of one of ``rows``."""
    if not rows.height:
        return pl.Series(ids.name, [False] * ids.len(), dtype=pl.Boolean)
    return _pair_member(scopes, ids, rows.get_column("scope_path"), rows.get_column("id"), few=few)


def _touching(edges: pl.DataFrame, ids: pl.Series) -> pl.DataFrame:
    """The ``edges`` with an end among ``ids``, flagged ``_s`` / ``_t`` by which end (few edges
    touch the ids asked about here, so hashes are probed first)."""
    n = edges.height
    hit = lookup.member(pl.concat([edges.get_column("source_id"), edges.get_column("target_id")]), ids, few=True)
    return edges.with_columns(_s=hit.slice(0, n), _t=hit.slice(n, n)).filter(pl.col("_s") | pl.col("_t"))


def _live_nodes(scopes: pl.Series, ids: pl.Series, diff: Diff, shard: Shard) -> pl.Series:
    """Whether each (scope, id) is a node of that scope after the diff: in the shard and not deleted, or inserted."""
    nodes = diff.table("memory_nodes")
    live = _in(scopes, ids, shard.table("memory_nodes"))
    if nodes.deletes.height:
        live = live & ~_in(scopes, ids, nodes.deletes, few=True)
    if nodes.inserts.height:
        live = live | _in(scopes, ids, nodes.inserts, few=True)
    return live


def _kept_edges(edges: pl.DataFrame, diff: Diff) -> pl.DataFrame:
    """``edges`` (snapshot rows) less those the diff deletes in their own scope."""
    gone = diff.table("memory_edges").deletes
    if not gone.height or not edges.height:
        return edges
    return edges.filter(~_in(edges.get_column("scope_path"), edges.get_column("id"), gone, few=True))


def _surviving_ends(diff: Diff, shard: Shard, deleted: pl.Series) -> pl.DataFrame:
    """(scope_path, id): the ends among the ``deleted`` node ids of every edge the diff leaves
    (snapshot edges it does not delete, and edges it inserts), with the edge's scope (the caller
    joins on both) — one row per edge end."""
    edges = diff.table("memory_edges")
    cols = ("id", "scope_path", "source_id", "target_id")
    touching = [_kept_edges(_touching(shard.table("memory_edges").select(cols), deleted), diff)]
    if edges.inserts.height:
        touching.append(_touching(edges.inserts.select(cols), deleted))
    return pl.concat([
        t.filter(flag).select("scope_path", pl.col(end).alias("id"))
        for t in touching for flag, end in (("_s", "source_id"), ("_t", "target_id"))
    ])


def _with_co_degree(inserts: pl.DataFrame, diff: Diff, shard: Shard) -> pl.DataFrame:
    """For inserted CO_OCCURRED edges: the larger final CO_OCCURRED degree of its two ends, counting
    the CO_OCCURRED edges of the edge's own scope (stored ones the diff keeps, and the new ones)."""
    co = pl.col("relation") == "CO_OCCURRED"
    new = inserts.filter(co).select("scope_path", "source_id", "target_id")
    ends = pl.concat([new.get_column("source_id"), new.get_column("target_id")])
    old = _touching(shard.table("memory_edges").lazy().filter(co).select("id", "scope_path", "source_id", "target_id").collect(), ends)
    old = _kept_edges(old, diff)
    pairs = pl.concat([  # (a = an end of an inserted edge, b = its neighbour)
        old.filter("_s").select("scope_path", a=pl.col("source_id"), b=pl.col("target_id")),
        old.filter("_t").select("scope_path", a=pl.col("target_id"), b=pl.col("source_id")),
        new.select("scope_path", a=pl.col("source_id"), b=pl.col("target_id")),
        new.select("scope_path", a=pl.col("target_id"), b=pl.col("source_id")),
    ])
    return _co_degree_of(inserts, pairs)


def _co_degree_of(inserts: pl.DataFrame, pairs: pl.DataFrame) -> pl.DataFrame:
    """``inserts`` with ``_co_degree``: for a CO_OCCURRED edge, the larger number of distinct
    neighbours (``pairs``: scope_path, a, b) of its two ends."""
    co = pl.col("relation") == "CO_OCCURRED"
    degree = pairs.filter(pl.col("a") != pl.col("b")).unique().group_by("scope_path", "a").len("deg")
    out = inserts.join(degree.rename({"a": "source_id", "deg": "_d_src"}), on=["scope_path", "source_id"], how="left",
                       maintain_order="left")
    out = out.join(degree.rename({"a": "target_id", "deg": "_d_tgt"}), on=["scope_path", "target_id"], how="left",
                   maintain_order="left")
    return out.with_columns(
        pl.when(co).then(pl.max_horizontal("_d_src", "_d_tgt")).otherwise(None).alias("_co_degree")
    ).drop("_d_src", "_d_tgt")


def _annotate_plain(table: str, kind: str, frame: pl.DataFrame, diff: Diff, shard: Shard, scopes: _Scopes) -> pl.DataFrame:
    """The annotations :func:`_annotate` computes, stated plainly: every lookup a join on
    (scope_path, id) over whole tables, no hash probes, no narrowing to the edges that touch the ids
    asked about.  ``_annotate`` must give exactly this frame (tests/validation/test_diff_checks_paths.py)."""
    key = ["scope_path", "id"]
    snap = shard.table(table)
    out = frame.with_row_index("_row").with_columns(pl.len().over("scope_path", "phase").alias("_phase_rows"))

    def keys(frame: pl.DataFrame) -> pl.DataFrame:  # an empty frame of Diff.table() has no scope_path
        return frame.select(key) if frame.height else pl.DataFrame(schema={k: pl.String for k in key})

    def flag(rows: pl.DataFrame, name: str, on: list[str] = key, cols: list[str] = key) -> pl.DataFrame:
        marks = rows.select([pl.col(c).alias(o) for c, o in zip(cols, on, strict=True)]).unique().with_columns(pl.lit(True).alias(name))
        return marks

    if kind in ("updates", "deletes"):
        ref = snap.select(*key, pl.col("version").alias("_snapshot_version"), pl.lit(True).alias("_in_snapshot_row"),
                          *([pl.col("label").alias("_label")] if "label" in snap.columns else []))
        out = out.join(ref, on=key, how="left", maintain_order="left")
    if kind == "updates":
        out = (out.join(flag(keys(diff.table(table).deletes), "_deleted"), on=key, how="left", maintain_order="left")
               .with_columns(pl.col("_deleted").fill_null(False)))
        out = out.with_columns(_rewrites_scope(out).alias("_rewrites_scope"))
    edges = diff.table("memory_edges")
    kept_edges = shard.table("memory_edges").join(keys(edges.deletes), on=key, how="anti")  # the edges the diff leaves
    if kind == "deletes" and table == "memory_nodes":
        final = kept_edges.select("scope_path", "source_id", "target_id")
        if edges.inserts.height:
            final = pl.concat([final, edges.inserts.select("scope_path", "source_id", "target_id")])
        ends = pl.concat([final.select("scope_path", pl.col("source_id").alias("id")),
                          final.select("scope_path", pl.col("target_id").alias("id"))])
        counts = ends.join(out.select(key), on=key, how="semi").group_by(key).len("_dangling_edges")
        out = out.join(counts, on=key, how="left", maintain_order="left").with_columns(pl.col("_dangling_edges").fill_null(0))
    if kind == "inserts":
        tenant = scopes.tenant_of_rows(out.get_column("scope_path"))
        out = (out.join(flag(snap, "_in_snapshot"), on=key, how="left", maintain_order="left")
               .with_columns(pl.col("_in_snapshot").fill_null(False),
                             pl.when(pl.col("scope_path").is_not_null()).then(tenant.is_not_null()).alias("_scope_known"),
                             tenant.alias("_tenant")))
        if table == "memory_edges":
            nodes = diff.table("memory_nodes")
            live = shard.table("memory_nodes").select(key).join(keys(nodes.deletes), on=key, how="anti")
            if nodes.inserts.height:
                live = pl.concat([live, nodes.inserts.select(key)])
            for end, name in (("source_id", "_src_live"), ("target_id", "_tgt_live")):
                out = (out.join(flag(live, name, on=["scope_path", end]), on=["scope_path", end], how="left", maintain_order="left")
                       .with_columns(pl.col(name).fill_null(False)))
            out = out.with_columns((pl.col("_src_live") & pl.col("_tgt_live")).alias("_ends_exist")).drop("_src_live", "_tgt_live")
            co = pl.col("relation") == "CO_OCCURRED"
            final = pl.concat([kept_edges.filter(co).select("scope_path", "source_id", "target_id"),
                               out.filter(co).select("scope_path", "source_id", "target_id")])
            pairs = pl.concat([final.select("scope_path", a=pl.col("source_id"), b=pl.col("target_id")),
                               final.select("scope_path", a=pl.col("target_id"), b=pl.col("source_id"))])
            out = _co_degree_of(out, pairs)
    return out


def _vouched(schema: pa.DataFrameSchema, frame: pl.DataFrame) -> bool:
    """True only if pandera's ``schema.validate(frame)`` cannot fail (see the module notes); False
    means "ask pandera" (a failing row, or anything the pre-check does not know how to judge)."""
    present = frame.schema
    tests: list[pl.Expr] = []
    for name, column in schema.columns.items():
        if name not in present:
            if column.required:
                return False
            continue
        if column.dtype is None or present[name] != column.dtype.type:
            return False
        if not column.nullable:
            ok = pl.col(name).is_not_null()
            tests.append((ok & pl.col(name).is_not_nan() if present[name].is_float() else ok).all())
        for check in column.checks:
            test = getattr(check, "_ds_column_test", None)
            if test is None:
                return False
            tests.append(test(pl.col(name)).fill_null(True).all())
    for check in schema.checks:
        expr = getattr(check, "_ds_expr", None)
        if expr is None:
            return False
        tests.append(expr.fill_null(True).all())
    if not tests:
        return True
    try:
        return all(frame.select(t.alias(f"_ok{i}") for i, t in enumerate(tests)).row(0))
    except Exception:  # a check that cannot even be evaluated: pandera reports it
        return False


_NEVER_DROPPED = ("id", "expected_version", "phase")  # Diff.by_scope keeps these even when null


def _failures(table: str, kind: str, annotated: pl.DataFrame, errors: SchemaErrors) -> pl.DataFrame:
    """pandera's failure cases as rows of :data:`FAILURE_SCHEMA`, each with its ``scope_path``: a
    row's failure is its scope's; a failure of the whole frame (a column's type, a missing column) is
    every scope whose rows hold a value in that column (Diff.by_scope leaves a column without a value
    out of a scope's diff)."""
    cases = errors.failure_cases
    out = cases.select(
        pl.col("check").cast(pl.String),
        pl.lit(table).alias("table"),
        pl.lit(kind).alias("kind"),
        pl.col("column").cast(pl.String),
        pl.col("failure_case").cast(pl.String).alias("value"),
        pl.col("index").cast(pl.UInt32).alias("_row"),
    ).join(annotated.select("_row", "id", "phase", "scope_path"), on="_row", how="left")
    wide = out.filter(pl.col("_row").is_null())
    parts = [out.filter(pl.col("_row").is_not_null())]
    for i, column in enumerate(wide.get_column("column").to_list()):  # one per failing column, not per row
        holding = (annotated.filter(pl.col(column).is_not_null()) if column in annotated.columns and column not in _NEVER_DROPPED
                   else annotated)
        scopes = holding.select(pl.col("scope_path").unique(maintain_order=True))
        parts.append(wide.slice(i, 1).drop("scope_path").join(scopes, how="cross"))
    return pl.concat(parts, how="diagonal").select(list(FAILURE_SCHEMA)).cast(FAILURE_SCHEMA)  # type: ignore[arg-type]


# The snapshot columns validate_diff reads.
SNAPSHOT_COLUMNS = ("scope_path", "id", "version", "label", "source_id", "target_id", "relation", "key")


def validate_diff(diff: Diff, shard: Shard | Snapshot, config: ConsolidationConfig | None = None, *,
                  precheck: bool = True, annotate=None) -> pl.DataFrame:
    """All failing checks of a shard's ``diff`` against the ``shard`` it was planned on (empty frame =
    valid), in ONE pandera pass per (table, kind) frame over all scopes.  Columns: check, table,
    kind, phase, id, column, value, scope_path (the scope a failing row belongs to: its own).

    A single scope is a shard of one: a :class:`Snapshot` is validated as ``Shard.of(snapshot)``,
    and a diff whose updates and deletes carry no ``scope_path`` (a single scope's, as
    :meth:`Diff.by_scope` or a single-scope directory gives it) gets the shard's one scope.

    Every per-scope rule reads the row's own scope: an insert's scope_path must be one of the
    shard's scopes and its tenant_id that scope's tenant; an update or delete must name a row of
    the snapshot *of its scope* with that row's version; ids are unique per (scope_path, id,
    phase); edges join live nodes of their own scope; degree caps and the per-run caps of phases
    10–12 count per scope.  So a failing check fails only the scopes whose rows fail it
    (:func:`failed_scopes`), and each scope gets the verdict a shard of that scope alone gets.

    ``config`` supplies the caps (default: the default configuration).  ``precheck=False`` sends
    every frame through pandera (the answer is the same; tests compare the two); ``annotate``: the
    annotation function (:func:`_annotate`, or :func:`_annotate_plain` in tests).

    Nullability is judged over the shard's frame: ``Diff.by_scope`` leaves out of a scope's diff a
    column null on all of that scope's rows, so a required column (a delete's ``reason``) null on
    all of one scope's rows is a ``not_nullable`` failure here."""
    from deep_sleep.core.diff import TableDiff

    if isinstance(shard, Snapshot):
        shard = Shard.of(shard)
    config = config or ConsolidationConfig()
    annotate = annotate or _annotate
    scopes = _Scopes(shard.scope_paths)
    tables_ = {}
    for table, td in diff.tables.items():
        frames = td.frames()
        for kind, frame in frames.items():
            if frame.height and "scope_path" not in frame.columns:
                if len(shard.scope_paths) != 1:
                    raise DiffError(f"{table}.{kind}: a shard's diff needs a scope_path on every row (plan adds it)")
                frames[kind] = frame.with_columns(pl.lit(shard.scope_paths[0]).alias("scope_path"))
        tables_[table] = TableDiff(**frames)
    diff = Diff(tables_)
    found = [pl.DataFrame(schema=FAILURE_SCHEMA)]
    for table, td in sorted(diff.tables.items()):
        for kind, frame in td.frames().items():
            if not frame.height:
                continue
            annotated = annotate(table, kind, frame, diff, shard, scopes)
            checks = _schema(table, kind, config)
            if precheck and _vouched(checks, annotated):
                continue
            try:
                checks.validate(annotated, lazy=True)
            except SchemaErrors as errors:
                found.append(_failures(table, kind, annotated, errors))
    return found[0] if len(found) == 1 else pl.concat(found).unique(maintain_order=True)


def failed_scopes(failures: pl.DataFrame, shard: Shard) -> frozenset[str]:
    """The scopes of ``shard`` that :func:`validate_diff`'s ``failures`` fail: each failure fails its
    own scope; a failure whose scope_path is null or no scope of the shard names a row no scope can
    own, so it fails every scope (what it would have changed is unknown)."""
    if not failures.height:
        return frozenset()
    named = set(failures.get_column("scope_path").to_list())
    if None in named or not named <= set(shard.scope_paths):
        return frozenset(shard.scope_paths)
    return frozenset(named)
