"""Snapshot validation and quarantine (SPEC §4): rows that break the store's own invariants are set
aside with a named reason, and the run goes on with the rest.

Nothing is deleted or repaired: a quarantined row stays in the store exactly as it is, is left
out of this run's snapshot (so no phase reads or writes it), and is recorded with its reason in
``consolidation_quarantine`` and in the report.  Each row gets the first reason that applies, in
the order of :data:`REASONS`.  Edges touching a quarantined node are quarantined too (otherwise
they would dangle in the clean snapshot).

    >>> clean, quarantined = quarantine(shard, as_of)      # doctest: +SKIP
    >>> quarantined.columns
    ['table', 'id', 'reason', 'row', 'scope_path']

It runs over a :class:`~deep_sleep.core.shard.Shard` (many scopes; a single scope is a shard of
one) in one pass per table, each rule reading the row's own scope (see :func:`quarantine`).

How it stays fast from a quick nap's 50-row frames to a nightly's million-row tables
------------------------------------------------------------------------------------
Every rule of a table is one boolean column of a single ``select`` (one Polars pass per table);
a row's reason is the first true column, in :data:`REASONS` order.  When no row of a table is
flagged — the normal case — the table is passed on as it is (no filter, no copy).

*JSON shape* (``properties`` / ``metadata`` must be a JSON object, ``steps`` an array).  The
reference semantics are DuckDB's: a text is good when ``json_valid`` accepts it and it is of the
required type.  Validity is always checked, whatever the source: rows extracted from PostgreSQL
``jsonb`` are valid JSON by construction, but a hand-written or edited snapshot directory may
hold anything.  Two paths give the same answer:

- frames of more than :data:`SMALL_ROWS` rows (big path): one DuckDB ``json_valid`` pass over the
  column, zero-copy from Arrow; the type is read from the first non-whitespace character (a valid
  JSON text that starts with ``{`` is an object, with ``[`` an array), which saves DuckDB a second
  parse for ``json_type``;
- smaller frames (small path, no DuckDB round trip): Python's ``json.loads`` *accepts* a text
  only where it provably agrees with DuckDB — it parsed, it holds no ``NaN``/``Infinity``
  constant and no ``\\uD800``–``\\uDFFF`` escape (DuckDB accepts the first and rejects lone
  surrogates; Python does the opposite), and it is not nested past Python's recursion limit;
  the type is then the decoded value's.  Every text Python does not accept (invalid, or one of
  those corner cases, where DuckDB is laxer: trailing commas, ``nan``/``inf`` in any case) is
  handed to the big path, so DuckDB still decides every text Python cannot vouch for, and bad
  rows cost a round trip only when there are some.

Both paths are tested (tests/validation/test_quarantine_paths.py) against the rule stated plainly
beside them, :func:`bad_json_plain` (DuckDB ``json_valid`` and ``json_type``), on corpora of bad
JSON and bad shapes, and the whole of :func:`quarantine` against :func:`quarantine_plain` (the same
rules as whole-frame Polars expressions) on generated snapshots.  The plain rule uses ``CASE``:
DuckDB does not short-circuit ``AND``, so ``json_valid(c) AND json_type(c::JSON) = …`` raised a
ConversionException on the first text that was not JSON at all.  Kept as it was, though PostgreSQL would reject them: DuckDB's
``json_valid`` accepts ``NaN``/``Infinity`` and trailing commas (``{"a": 1,}`` passes as an object).

*Duplicate ids* hash the id column once (``Series.hash``, u64): when all hashes differ, all ids
differ (equal ids hash equally) and the exact, far slower ``is_duplicated`` is skipped; any hash
collision falls back to it.  *Dangling edges* probe both endpoint columns against the live node
ids with one ``is_in`` (one hash table instead of two).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import lru_cache

import numpy as np
import polars as pl

from deep_sleep.core import lookup, tables
from deep_sleep.core.characters import HIDDEN
from deep_sleep.core.quarantine_config import QuarantineConfig
from deep_sleep.core.duck import registered
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot, utc

QUARANTINE_SCHEMA = {"table": pl.String(), "id": pl.String(), "reason": pl.String(), "row": pl.String()}
SHARD_QUARANTINE_SCHEMA = {**QUARANTINE_SCHEMA, "scope_path": pl.String()}
CONTROL = r"[\x00-\x1f\x7f]"
# HIDDEN (what makes a label render as something else than it holds: invisible characters, a misplaced
# presentation selector, a combining mark at the start) is the online checks' own definition
# (deep_sleep.core.characters): a label the live path accepts is never quarantined.
JSON_SHAPE = {"properties": "OBJECT", "metadata": "OBJECT", "steps": "ARRAY"}
TIMESTAMPS = ("created_at", "updated_at", "accessed_at")
SMALL_ROWS = 800  # JSON columns of frames up to this many rows are checked in Python (small path; crossover ~900 here)

REASONS = (
    "null id",
    "duplicate id",
    "null or empty key",
    "duplicate key",
    "scope_path differs from the run's scope",
    "tenant_id differs from the scope's root",
    "importance is not a finite number",
    "importance outside [1, 10]",
    "empty label",
    "control characters in label",
    "invisible or direction-changing characters in label",
    "label longer than max_label_chars",
    "unknown layer",
    "properties is not a JSON object",
    "metadata is not a JSON object",
    "steps is not a JSON array",
    "weight is negative or not finite",
    "empty content",
    "features must have 12 values",
    "similarity is not a finite number",
    "features are not finite numbers",
    "timestamp before min_timestamp",
    "timestamp in the future",
    "edge endpoint is quarantined",
    "dangling edge: endpoint not a node of this scope",
)

_OPENER = {"OBJECT": "{", "ARRAY": "["}
_PY_TYPE = {"OBJECT": dict, "ARRAY": list}
_JSON_WS = " \t\n\r"
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")


class _Unsure(Exception):
    """Python's verdict on a JSON text might differ from DuckDB's: let DuckDB decide."""


def _no_constants(name: str) -> float:
    raise _Unsure(name)  # NaN, Infinity, -Infinity: DuckDB accepts these (and more spellings)


_DECODE = json.JSONDecoder(parse_constant=_no_constants).decode  # json.loads(…, parse_constant=…) builds one per call


def _json_reason_for(column: str) -> str:
    return f"{column} is not a JSON {'array' if column == 'steps' else 'object'}"


def _bad_json_big(values: pl.Series, shape: str) -> pl.Series:
    """True where ``values`` is null, not valid JSON (DuckDB ``json_valid``) or not of ``shape``."""
    with registered(pl.DataFrame({"v": values}).to_arrow()) as (con, name):
        valid = con.sql(f"SELECT json_valid(v) AS ok FROM {name}").pl().get_column("ok")
    opens = values.str.starts_with(_OPENER[shape])
    if not opens.fill_null(True).all():  # leading whitespace is rare: strip only when some text needs it
        opens = values.str.strip_chars_start(_JSON_WS).str.starts_with(_OPENER[shape])
    return (~(valid & opens)).fill_null(True).alias(values.name)


def _bad_json_small(values: pl.Series, shape: str) -> pl.Series:
    """The same answer as :func:`_bad_json_big`, in Python; unsure texts go to the big path."""
    kind = _PY_TYPE[shape]
    out: list[bool] = []
    unsure: list[int] = []
    for i, text in enumerate(values.to_list()):
        if text is None:
            out.append(True)
            continue
        try:
            if "\\u" in text and _SURROGATE_ESCAPE.search(text):
                raise _Unsure("surrogate escape")
            out.append(not isinstance(_DECODE(text), kind))
        except (ValueError, RecursionError, _Unsure):  # JSONDecodeError is a ValueError
            out.append(True)
            unsure.append(i)
    if unsure:
        decided = _bad_json_big(values.gather(unsure), shape).to_list()
        for i, bad in zip(unsure, decided):
            out[i] = bad
    return pl.Series(values.name, out, dtype=pl.Boolean)


def bad_json(values: pl.Series, shape: str, small_rows: int = SMALL_ROWS) -> pl.Series:
    """Boolean Series: True where the JSON text is null, invalid or not of ``shape`` (``OBJECT`` or ``ARRAY``)."""
    return _bad_json_small(values, shape) if values.len() <= small_rows else _bad_json_big(values, shape)


def bad_json_plain(values: pl.Series, shape: str) -> pl.Series:
    """The rule :func:`bad_json` implements, stated plainly: DuckDB's ``json_valid`` and ``json_type``
    (a null or invalid text is bad; ``CASE`` parses only valid texts, where ``AND`` would not short-circuit)."""
    with registered(pl.DataFrame({"v": values}).to_arrow()) as (con, name):
        flags = con.sql(f"SELECT coalesce(NOT CASE WHEN json_valid(v) THEN json_type(v::JSON) = '{shape}' END, true) AS bad "
                        f"FROM {name}").pl()
    return flags.get_column("bad").alias(values.name)


def _duplicated(ids: pl.Series) -> pl.Series | None:
    """``ids.is_duplicated()``, or None when no id repeats."""
    return None if lookup.unique(ids) else ids.is_duplicated()


def _tenant_of(scope_path: str) -> str:
    """The tenant of a scope path: the id of its first level ("" for a path of no level)."""
    return scope_path.split("\x1f", 2)[1] if "\x1f" in scope_path else ""


@lru_cache(maxsize=256)
def _rule_plan(table: str, schema: tuple[tuple[str, pl.DataType], ...],
               config: QuarantineConfig) -> tuple[tuple[str, str, object], ...]:
    """``table``'s rules for a frame of ``schema``, in REASONS order, as (kind, reason, what):
    ``expr`` (a ready expression), or the per-call ones: ``dup`` (duplicate ids), ``dupkey``
    (duplicate keys per scope), ``json`` (``what`` = (column, shape)), ``future`` (``what`` = the
    timestamp columns), ``scope`` and ``tenant`` (the row's scope_path is a scope of the shard;
    tenant_id is that scope's tenant).  Built once per (table, schema, config): the expressions
    hold no data, so a nap's 50-row frames skip most of the cost of building them."""
    columns = dict(schema)
    rules: list[tuple[str, str, object]] = []
    if table == "soul_profiles":  # identified by (scope_path, key); the surrogate id is optional (SPEC §1)
        rules += [("expr", "null or empty key", pl.col("key").is_null() | (pl.col("key").str.strip_chars() == "")),
                  ("dupkey", "duplicate key", None)]
    elif table in tables.MUTABLE:  # the access log's identity column is not read by any phase
        rules += [("expr", "null id", pl.col("id").is_null()), ("dup", "duplicate id", None)]
    if "scope_path" in columns:
        rules.append(("scope", "scope_path differs from the run's scope", None))
    if "tenant_id" in columns:  # null: a frame built without the column
        rules.append(("tenant", "tenant_id differs from the scope's root", None))
    if "importance" in columns:
        rules += [
            ("expr", "importance is not a finite number", pl.col("importance").is_null() | ~pl.col("importance").is_finite()),
            ("expr", "importance outside [1, 10]", ~pl.col("importance").is_between(1.0, 10.0)),
        ]
    for label in ("label", "source_label", "target_label", "name"):
        if label in columns and columns[label] == pl.String:  # recall_events.label is a number
            rules += [
                ("expr", "empty label", pl.col(label).is_null() | (pl.col(label).str.strip_chars() == "")),
                ("expr", "control characters in label", pl.col(label).str.contains(CONTROL)),
                ("expr", "invisible or direction-changing characters in label", pl.col(label).str.contains(HIDDEN)),
                ("expr", "label longer than max_label_chars", pl.col(label).str.len_chars() > config.max_label_chars),
            ]
    if "layer" in columns:
        rules.append(("expr", "unknown layer", ~pl.col("layer").is_in(["semantic", "working"])))
    kinds = tables.columns(table)
    for column, shape in JSON_SHAPE.items():
        if column in columns and column in kinds and kinds[column].kind == "json":
            rules.append(("json", _json_reason_for(column), (column, shape)))
    if "weight" in columns:
        rules.append(("expr", "weight is negative or not finite", pl.col("weight").is_null() | ~pl.col("weight").is_finite() | (pl.col("weight") < 0)))
    if table == "episodic_events":
        rules.append(("expr", "empty content", pl.col("content").is_null() | (pl.col("content").str.strip_chars() == "")))
    if table == "recall_events":
        rules.append(("expr", "features must have 12 values", pl.col("features").list.len().fill_null(0) != 12))
        rules += [
            ("expr", "similarity is not a finite number", ~pl.col("similarity").is_finite()),  # null: not stored NaN
            ("expr", "features are not finite numbers",
             pl.col("features").list.eval(pl.element().is_null() | ~pl.element().is_finite()).list.any().fill_null(False)),
        ]
    stamps = tuple(c for c in TIMESTAMPS if c in columns)
    if stamps:
        floor = _micros_literal(utc(config.min_timestamp))
        rules.append(("expr", "timestamp before min_timestamp", pl.any_horizontal([pl.col(c) < floor for c in stamps]).fill_null(False)))
        rules.append(("future", "timestamp in the future", stamps))
    return tuple(rules)


def _micros_literal(at: datetime) -> pl.Expr:
    """``at`` as a literal of the snapshot's timestamp type (an integer cast: lit(datetime) costs ~0.3 ms)."""
    return pl.lit((at - _EPOCH) // timedelta(microseconds=1), dtype=pl.Int64).cast(tables.TS)


def future_limit(as_of: datetime, taken_at: datetime | None, tolerance: timedelta) -> datetime:
    """The latest timestamp a row may carry: the later of ``as_of`` and the extract's own time
    (``taken_at``), plus ``tolerance``.  A night run with an ``as_of`` in the past (``--as-of`` ten
    minutes ago, or a shard extracted late in a long night) reads rows live turns wrote since
    ``as_of``; those are not from the future, and quarantining them would report healthy rows as
    broken on every such run.  The last representable instant when the sum overflows (year 9999)."""
    at = utc(as_of) if taken_at is None else max(utc(as_of), utc(taken_at))
    try:
        return at + tolerance
    except OverflowError:
        return datetime.max.replace(tzinfo=UTC)


@dataclass(frozen=True)
class _Scopes:
    """The scopes of a shard, for the rules that name the row's own scope."""

    paths: tuple[str, ...]

    def tenant_of_rows(self, scope_paths: pl.Series) -> pl.Series:
        """The tenant of each row's scope_path; null where it is no scope of the shard (or null)."""
        if len(self.paths) == 1 and not scope_paths.null_count() and (scope_paths == self.paths[0]).all():
            # a shard of one whose rows are all its own (a nap's, a scope's run): no replace table to build
            return pl.repeat(_tenant_of(self.paths[0]), scope_paths.len(), dtype=pl.String, eager=True).alias(scope_paths.name)
        return scope_paths.replace_strict(list(self.paths), [_tenant_of(p) for p in self.paths], default=None,
                                          return_dtype=pl.String)


def _tests(table: str, frame: pl.DataFrame, scopes: _Scopes, limit: datetime, small_rows: int,
           config: QuarantineConfig) -> list[tuple[str, pl.Expr | pl.Series]]:
    """(reason, test) for every rule that applies to ``table``'s rows by themselves, in REASONS order.
    A test is an expression over ``frame`` or a ready boolean Series; null counts as false.  Every
    rule reads the row's own scope_path; ``limit``: :func:`future_limit`."""
    rules: list[tuple[str, pl.Expr | pl.Series]] = []
    tenants: list[pl.Series] = []  # the tenant of each row's scope, computed once

    def own_tenant() -> pl.Series:
        if not tenants:
            tenants.append(scopes.tenant_of_rows(frame.get_column("scope_path")))
        return tenants[0]

    for kind, reason, what in _rule_plan(table, tuple(frame.schema.items()), config):
        if kind == "expr":
            rules.append((reason, what))  # type: ignore[arg-type]
        elif kind == "dup":  # ids are unique in the whole store: the check is over all the shard's rows
            dup = _duplicated(frame.get_column("id"))
            if dup is not None:
                rules.append((reason, dup))
        elif kind == "dupkey":  # keys are unique per scope
            dup = _duplicated_keys(frame)
            if dup is not None:
                rules.append((reason, dup))
        elif kind == "scope":
            rules.append((reason, own_tenant().is_null()))  # null scope_path or no scope of the shard
        elif kind == "tenant":
            rules.append((reason, (frame.get_column("tenant_id") != own_tenant()).fill_null(False)))
        elif kind == "json":
            column, shape = what  # type: ignore[misc]
            rules.append((reason, bad_json(frame.get_column(column), shape, small_rows)))
        else:  # future: the limit as an integer literal cast to the column type
            at = _micros_literal(limit)
            rules.append((reason, pl.any_horizontal([pl.col(c) > at for c in what]).fill_null(False)))  # type: ignore[union-attr]
    return rules


def _duplicated_keys(frame: pl.DataFrame) -> pl.Series | None:
    """Rows whose (scope_path, key) repeats, or None when none does."""
    if "scope_path" not in frame.columns:
        dup = frame.get_column("key").is_duplicated()
    else:
        dup = frame.select(pl.struct("scope_path", "key").is_duplicated()).to_series()
    return dup if dup.any() else None


def _pair_member(scopes: pl.Series, ids: pl.Series, among_scopes: pl.Series, among_ids: pl.Series, *,
                 few: bool = False) -> pl.Series:
    """Whether each (scope, id) is one of the (among_scopes, among_ids) pairs; a null in either is False.
    The ids are probed first (:func:`lookup.member`; ``few`` as there), then only those found are
    joined on both."""
    hit = lookup.member(ids, among_ids, few=few)
    pos = hit.arg_true()
    if not pos.len() or _one_scope(scopes.gather(pos), among_scopes):
        return hit  # none found, or one scope on both sides (a single scope's night): the ids decide
    found = (pl.DataFrame({"_s": scopes.gather(pos), "_i": ids.gather(pos), "_p": pos})
             .join(pl.DataFrame({"_s": among_scopes, "_i": among_ids}), on=["_s", "_i"], how="semi"))
    out = np.zeros(ids.len(), dtype=bool)
    out[found.get_column("_p").to_numpy()] = True
    return pl.Series(ids.name, out)


def _one_scope(scopes: pl.Series, among_scopes: pl.Series) -> bool:
    """Every one of ``scopes`` and ``among_scopes`` is the same scope path (no null): the (scope, id)
    pairs then match exactly where the ids do.  Two comparisons with a constant (~10 ms a million
    rows) instead of a join on (scope, id) (~0.6 s for a million-node scope's 3M edge ends)."""
    if not among_scopes.len() or among_scopes.null_count() or scopes.null_count():
        return False
    first = among_scopes[0]
    return bool((among_scopes == first).all() and (scopes == first).all())


def _pair_member_plain(scopes: pl.Series, ids: pl.Series, among_scopes: pl.Series, among_ids: pl.Series) -> pl.Series:
    """The rule :func:`_pair_member` implements: a struct ``is_in``, null scopes or ids answered False."""
    pairs = pl.DataFrame({"s": among_scopes, "i": among_ids}).select(pl.struct("s", "i")).to_series().implode()
    return pl.DataFrame({"s": scopes, "i": ids}).select(
        (pl.struct("s", "i").is_in(pairs) & pl.col("s").is_not_null() & pl.col("i").is_not_null()).fill_null(False)
    ).to_series().alias(ids.name)


def _first_reasons(frame: pl.DataFrame, rules: list[tuple[str, pl.Expr | pl.Series]]) -> tuple[np.ndarray, list[str]]:
    """(indexes of the flagged rows, each one's first reason)."""
    exprs = [t.fill_null(False).alias(f"_t{i}") for i, (_, t) in enumerate(rules) if isinstance(t, pl.Expr)]
    evaluated = iter(frame.select(exprs).get_columns() if exprs else ())
    flags: list[np.ndarray] = []
    for _, test in rules:
        series = next(evaluated) if isinstance(test, pl.Expr) else test
        if series.null_count():
            series = series.fill_null(False)
        flags.append(series.to_numpy())
    if not flags:
        return np.empty(0, dtype=np.int64), []
    any_bad = np.logical_or.reduce(flags) if len(flags) > 1 else flags[0].copy()
    rows = np.flatnonzero(any_bad)
    if not len(rows):
        return rows, []
    first = np.column_stack([f[rows] for f in flags]).argmax(axis=1)  # first true = first reason in REASONS order
    return rows, [rules[j][0] for j in first]


def _row_json(frame: pl.DataFrame) -> pl.Expr:
    return pl.struct([c for c in frame.columns if not c.startswith("_")]).struct.json_encode().alias("row")


def quarantine(snapshot: Shard | Snapshot, as_of: datetime, config: QuarantineConfig | None = None, *,
               small_rows: int = SMALL_ROWS) -> tuple[Shard, pl.DataFrame] | tuple[Snapshot, pl.DataFrame]:
    """Split a shard into the clean shard and the quarantined rows (table, id, reason, row JSON,
    scope_path — the row's own), in one pass per table over every scope's rows.

    Each rule reads the row's own scope: the scope rule is "scope_path is one of the shard's
    scopes", the tenant rule "tenant_id is the tenant of the row's scope_path", keys (soul_profiles)
    are unique per (scope_path, key), an edge must join two clean nodes of its own scope, an edge
    endpoint is quarantined when it is a quarantined node of the edge's scope.  Ids are unique in
    the whole store, so duplicate ids are looked for over the whole shard, and ``held_nodes`` is
    the union of every scope's.  So every scope's clean rows, quarantined rows and held nodes are
    those of a shard of that scope alone (tests/validation/test_quarantine_shard.py).  A row whose
    scope_path is no scope of the shard (possible only in a hand-written shard: an extract reads the
    shard's scopes) belongs to none: it is quarantined, and as a quarantined node it counts for every
    scope's edges.  "In the future" is after :func:`future_limit` of ``as_of`` and the shard's
    ``taken_at``.

    A :class:`Snapshot` is checked as a shard of one; the answer is then the clean snapshot and its
    rows without ``scope_path``.  ``small_rows``: frames up to this many rows check JSON in Python
    (see the module notes; the answer does not depend on it)."""
    if isinstance(snapshot, Snapshot):
        clean, found = quarantine(Shard.of(snapshot), as_of, config, small_rows=small_rows)
        return replace(clean.scope(snapshot.scope_path), source=snapshot.source), found.drop("scope_path")
    config = config or QuarantineConfig()
    shard = snapshot
    scopes = _Scopes(shard.scope_paths)
    limit = future_limit(as_of, shard.taken_at, timedelta(seconds=config.future_tolerance_seconds))
    clean: dict[str, pl.DataFrame] = {}
    found = [pl.DataFrame(schema=SHARD_QUARANTINE_SCHEMA)]
    bad_nodes = pl.DataFrame(schema={"id": pl.String, "scope_path": pl.String})
    gone_edges = None
    for table in sorted(shard.frames, key=lambda t: t == "memory_edges"):  # nodes before edges
        frame = shard.frames[table]
        if not frame.height:
            clean[table] = frame
            continue
        rules = _tests(table, frame, scopes, limit, small_rows, config)
        if table == "memory_edges":
            rules += _edge_tests(frame, clean.get("memory_nodes", shard.table("memory_nodes")), bad_nodes, scopes)
        rows, reasons = _first_reasons(frame, rules)
        if not len(rows):
            clean[table] = frame  # nothing flagged: the frame goes on as it is
            continue
        bad = frame[rows]
        found.append(bad.select(
            pl.lit(table).alias("table"),
            pl.col("id").cast(pl.String) if "id" in bad.columns else pl.lit(None, pl.String).alias("id"),
            pl.Series("reason", reasons, dtype=pl.String),
            _row_json(bad),
            pl.col("scope_path"),
        ))
        if table == "memory_nodes":
            bad_nodes = bad.select("id", "scope_path")
        if table == "memory_edges":
            gone_edges = bad
        keep = np.ones(frame.height, dtype=bool)
        keep[rows] = False
        clean[table] = frame.filter(pl.Series(keep))
    return _result(shard, clean, found, _held_nodes(gone_edges, clean.get("memory_nodes"), scopes))


def _edge_tests(edges: pl.DataFrame, nodes: pl.DataFrame, bad_nodes: pl.DataFrame, scopes: _Scopes,
                member=None) -> list[tuple[str, pl.Expr | pl.Series]]:
    """The two rules that need the (clean) nodes, both reading the edge's own scope: an end
    quarantined (``bad_nodes``: the quarantined nodes' id and scope_path; one of no scope of the
    shard counts for every edge), an end not a live node of the edge's scope."""
    member = member or _pair_member
    n = edges.height
    scope = edges.get_column("scope_path")
    scopes_twice = pl.concat([scope, scope])
    ends = pl.concat([edges.get_column("source_id"), edges.get_column("target_id")])  # one probe, one hash table
    rules: list[tuple[str, pl.Expr | pl.Series]] = []
    if bad_nodes.height:
        stray = scopes.tenant_of_rows(bad_nodes.get_column("scope_path")).is_null()
        mine, loose = bad_nodes.filter(~stray), bad_nodes.filter(stray)
        hit = member(scopes_twice, ends, mine.get_column("scope_path"), mine.get_column("id"))
        if loose.height:
            hit = hit | lookup.member_plain(ends, loose.get_column("id"))
        rules.append(("edge endpoint is quarantined", hit.slice(0, n) | hit.slice(n, n)))
    live = member(scopes_twice, ends, nodes.get_column("scope_path"), nodes.get_column("id"))
    rules.append(("dangling edge: endpoint not a node of this scope", ~(live.slice(0, n) & live.slice(n, n))))
    return rules


def _held_nodes(gone: pl.DataFrame | None, nodes: pl.DataFrame | None, scopes: _Scopes, member=None) -> frozenset[str]:
    """The clean nodes of its own scope that a quarantined edge (``gone``) still touches (any clean
    node, for an edge of no scope of the shard): no phase may delete them (:attr:`Shard.held_nodes`)."""
    if gone is None or nodes is None or not gone.height:
        return frozenset()
    member = member or _pair_member
    scope = gone.get_column("scope_path")
    scopes_twice = pl.concat([scope, scope])
    ends = pl.concat([gone.get_column("source_id"), gone.get_column("target_id")])
    held = member(scopes_twice, ends, nodes.get_column("scope_path"), nodes.get_column("id"))
    stray = scopes.tenant_of_rows(scopes_twice).is_null()
    if stray.any():
        held = held | (stray & lookup.member_plain(ends, nodes.get_column("id")))
    return frozenset(ends.filter(held).drop_nulls().to_list())


def _result(shard: Shard, clean: dict[str, pl.DataFrame], found: list[pl.DataFrame],
            held: frozenset[str]) -> tuple[Shard, pl.DataFrame]:
    quarantined = pl.concat(found).sort("scope_path", "table", "id", "reason", maintain_order=True)
    if not quarantined.height:
        return shard, quarantined  # nothing flagged: the shard goes on as it is
    return replace(shard, frames={**shard.frames, **clean}, held_nodes=shard.held_nodes | held), quarantined


def quarantine_plain(snapshot: Shard | Snapshot, as_of: datetime, config: QuarantineConfig | None = None):
    """What :func:`quarantine` computes, stated plainly: the same rules (:func:`_rule_plan`, the two
    edge rules), each a Polars expression over the whole frame (``is_duplicated``, ``is_in`` of
    (scope_path, id) structs, :func:`bad_json_plain`, a tenant read from the scope_path text), the
    first reason by a ``when/then`` chain in REASONS order, the rows split by a filter.
    ``quarantine`` must give exactly this; tests/validation/test_quarantine_paths.py and
    test_quarantine_shard.py check it on generated corrupt snapshots and shards."""
    if isinstance(snapshot, Snapshot):
        clean, found = quarantine_plain(Shard.of(snapshot), as_of, config)
        return replace(clean.scope(snapshot.scope_path), source=snapshot.source), found.drop("scope_path")
    config = config or QuarantineConfig()
    shard = snapshot
    scopes = _Scopes(shard.scope_paths)
    paths = pl.Series(shard.scope_paths, dtype=pl.String).implode()
    limit = future_limit(as_of, shard.taken_at, timedelta(seconds=config.future_tolerance_seconds))
    clean: dict[str, pl.DataFrame] = {}
    found = [pl.DataFrame(schema=SHARD_QUARANTINE_SCHEMA)]
    bad_nodes = pl.DataFrame(schema={"id": pl.String, "scope_path": pl.String})
    gone_edges = None
    for table in sorted(shard.frames, key=lambda t: t == "memory_edges"):  # nodes before edges
        frame = shard.frames[table]
        if not frame.height:
            clean[table] = frame
            continue
        tests: list[tuple[str, pl.Expr | pl.Series]] = []
        for kind, reason, what in _rule_plan(table, tuple(frame.schema.items()), config):
            if kind == "expr":
                tests.append((reason, what))  # type: ignore[arg-type]
            elif kind == "dup":
                tests.append((reason, pl.col("id").is_duplicated()))
            elif kind == "dupkey":
                tests.append((reason, pl.struct("scope_path", "key").is_duplicated()))
            elif kind == "scope":
                tests.append((reason, ~pl.col("scope_path").is_in(paths).fill_null(False)))
            elif kind == "tenant":
                own = pl.when(pl.col("scope_path").str.contains("\x1f", literal=True)).then(
                    pl.col("scope_path").str.split("\x1f").list.get(1, null_on_oob=True)).otherwise(pl.lit(""))
                tests.append((reason, pl.col("tenant_id") != own))
            elif kind == "json":
                column, shape = what  # type: ignore[misc]
                tests.append((reason, bad_json_plain(frame.get_column(column), shape)))
            else:  # future (a new kind of rule needs its plain statement here too)
                tests.append((reason, pl.any_horizontal([pl.col(c) > limit for c in what])))  # type: ignore[union-attr]
        if table == "memory_edges":
            nodes = clean.get("memory_nodes", shard.table("memory_nodes"))
            tests += _edge_tests(frame, nodes, bad_nodes, scopes, member=_pair_member_plain)
        work = frame.with_columns(t.alias(f"_t{i}") for i, (_, t) in enumerate(tests) if isinstance(t, pl.Series))
        reason_of = pl.lit(None, dtype=pl.String)
        for i, (reason, test) in reversed(list(enumerate(tests))):
            flag = pl.col(f"_t{i}") if isinstance(test, pl.Series) else test
            reason_of = pl.when(flag.fill_null(False)).then(pl.lit(reason)).otherwise(reason_of)
        work = work.with_columns(reason_of.alias("_reason"))
        bad = work.filter(pl.col("_reason").is_not_null())
        if bad.height:
            found.append(bad.select(
                pl.lit(table).alias("table"),
                pl.col("id").cast(pl.String) if "id" in bad.columns else pl.lit(None, pl.String).alias("id"),
                pl.col("_reason").alias("reason"),
                _row_json(bad),
                pl.col("scope_path"),
            ))
            if table == "memory_nodes":
                bad_nodes = bad.select("id", "scope_path")
            if table == "memory_edges":
                gone_edges = bad.select(frame.columns)
        clean[table] = work.filter(pl.col("_reason").is_null()).select(frame.columns)
    return _result(shard, clean, found, _held_nodes(gone_edges, clean.get("memory_nodes"), scopes, member=_pair_member_plain))


def summarise(quarantined: pl.DataFrame) -> dict[str, dict[str, int]]:
    """table → reason → rows, for the report."""
    out: dict[str, dict[str, int]] = {}
    for row in quarantined.group_by("table", "reason").len().sort("table", "reason").iter_rows(named=True):
        out.setdefault(row["table"], {})[row["reason"]] = row["len"]
    return out


__all__ = ["QUARANTINE_SCHEMA", "REASONS", "SHARD_QUARANTINE_SCHEMA", "SMALL_ROWS", "bad_json", "bad_json_plain", "future_limit",
           "quarantine", "quarantine_plain", "summarise", "tables"]
