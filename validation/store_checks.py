"""What the store suite checks, independent of great-expectations: the catalog, and the checks
that apply to it (:func:`checks_for`), each a column range or an SQL query of unexpected rows.

What is checked (every check is one expectation over a whole table, never per scope):

================================  ===========================  ==================================
check                             tables                       expectation
================================  ===========================  ==================================
``importance_in_range``           ``memory_nodes``             ``ExpectColumnValuesToBeBetween``
                                                               1..10 (PostgreSQL sorts NaN above
                                                               every number, so NaN fails it too)
``importance_finite``             ``memory_nodes``             SQL: importance is NaN or ±Infinity
``weight_non_negative``           ``memory_edges``             ``ExpectColumnValuesToBeBetween``
                                                               min 0
``weight_finite``                 ``memory_edges``             SQL: weight is NaN or ±Infinity
                                                               (``NaN >= 0`` is *true* in
                                                               PostgreSQL: the range check alone
                                                               would let it through)
``no_dangling_edges``             ``memory_edges``             SQL: source or target missing from
                                                               ``memory_nodes``, or in another
                                                               scope than the edge
``version_positive``              every table with            ``ExpectColumnValuesToBeBetween``
                                  ``version``                  min 1
``rows_scoped``                   every table with            SQL: neither ``scope_path`` nor
                                  ``scope_path``               (legacy) ``tenant_id`` set
``scope_path_consistent``         every table with            SQL: a ``scope_path`` that is not
                                  ``scope_path``               non-empty ``kind\\x1fid`` pairs, or
                                                               whose root id is not the row's
                                                               ``tenant_id``
``no_active_consolidation_skill`` ``procedural_skills``        SQL: ``source = 'consolidation'``
                                                               and ``status = 'active'``
``label_not_empty``               ``memory_nodes``             SQL: label null, empty or blank
``properties_is_object``,         tables with a jsonb          SQL: ``jsonb_typeof`` is not
``metadata_is_object``            ``properties`` / ``metadata`` ``'object'``
================================  ===========================  ==================================

Tables and columns are discovered from ``information_schema`` at run time, so a table added by a
later migration gets the generic checks (scope, version) without touching this module.

Semantics decided here (SPEC is silent):

* *Scoped* means a usable owner: ``scope_path`` non-null and non-empty, or — legacy rows — a
  non-empty ``tenant_id``.  An empty string counts as missing.
* The scope of a legacy row (``scope_path`` NULL) is ``tenant\\x1f<tenant_id>`` (SPEC §1); the
  dangling-edge check compares these *effective* scopes, so a legacy edge must point at legacy
  nodes of the same tenant, and an edge and its nodes half-way through the scope backfill still
  match.
* A blank label (only whitespace) is as empty as ``''``.
* Examples: at most 5 offending rows per expectation, each a dict whose ``id`` is the row's key
  (``id``; else the single-column primary key; else the composite key joined by ``/``; else
  the row as JSON, cut at 200 characters) plus the offending values (``scope_path`` raw, with
  its ``\x1f`` separators; a ``problem`` column where a check has several reasons).  For SQL
  checks the rows come ordered by key, so the examples are deterministic.  ``unexpected_count``
  is always the full count.
* A check that cannot run (SQL error, missing column) fails with ``error`` set; it never passes.
"""

from __future__ import annotations

from dataclasses import dataclass

import psycopg

__all__ = ["CatalogTable", "StoreCheck", "checks_for", "discover"]

_SEP_SQL = "chr(31)"  # the scope separator \x1f, spelled in SQL
# Every SQL check reads its table as `r`: GX substitutes {batch} with an aliased subquery whose
# alias is its own business, so we wrap it once more under a name we control.
_ROWS = "(SELECT * FROM {batch}) AS r"


@dataclass(frozen=True)
class CatalogTable:
    """A base table as the catalog describes it: columns (name → ``information_schema`` data type), primary key."""

    name: str
    columns: dict[str, str]  # name -> information_schema data_type
    pk: tuple[str, ...]

    def has(self, *cols: str) -> bool:
        return all(c in self.columns for c in cols)

    @property
    def key_column(self) -> str | None:
        """A single real column identifying a row (for GX's unexpected_index_column_names)."""
        if "id" in self.columns:
            return "id"
        return self.pk[0] if len(self.pk) == 1 else None

    @property
    def key_sql(self) -> str:
        """An SQL expression giving a row's key as text (aliased ``id`` in the examples)."""
        if self.key_column:
            return f"r.{_q(self.key_column)}::text"
        if self.pk:
            return "concat_ws('/', " + ", ".join(f"r.{_q(c)}::text" for c in self.pk) + ")"
        return "left(row_to_json(r)::text, 200)"  # no key at all: the row itself names it


@dataclass(frozen=True)
class StoreCheck:
    """One expectation over one whole table: a column range (``between``, run as GX's
    ``ExpectColumnValuesToBeBetween``) or an SQL query of the unexpected rows (``sql``, over ``{batch}``)."""

    name: str
    table: str
    description: str
    column: str | None = None
    between: tuple[float | None, float | None] | None = None  # built-in column range check
    sql: str | None = None  # UnexpectedRowsExpectation query (uses {batch})

    @property
    def kind(self) -> str:
        return "column" if self.between is not None else "sql"

    def as_sql(self, t: CatalogTable) -> StoreCheck:
        """The same range check as an SQL check (for a table without a single key column)."""
        lo, hi = self.between  # type: ignore[misc]
        col = _q(self.column)  # type: ignore[arg-type]
        ok = " AND ".join(p for p in (f"{col} >= {lo}" if lo is not None else "",
                                       f"{col} <= {hi}" if hi is not None else "") if p)
        return StoreCheck(self.name, self.table, self.description, column=self.column,
                      sql=f"SELECT {t.key_sql} AS id, {col}::text AS {col} FROM {_ROWS} "
                          f"WHERE {col} IS NOT NULL AND NOT ({ok}) ORDER BY 1")


def _q(ident: str) -> str:
    return '"' + ident.replace('"', '""') + '"'


def discover(dsn: str) -> dict[str, CatalogTable]:
    """Base tables of the current schema with their columns and primary keys (one round trip)."""
    sql = """
        SELECT c.table_name, c.column_name, c.data_type,
               coalesce((SELECT array_agg(a.attname::text ORDER BY array_position(i.indkey, a.attnum))
                           FROM pg_index i
                           JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY (i.indkey)
                          WHERE i.indisprimary
                            AND i.indrelid = (quote_ident(c.table_schema) || '.' || quote_ident(c.table_name))::regclass),
                        '{}') AS pk
          FROM information_schema.columns c
          JOIN information_schema.tables t USING (table_schema, table_name)
         WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'
         ORDER BY c.table_name, c.ordinal_position
    """
    tables: dict[str, dict] = {}
    with psycopg.connect(dsn, autocommit=True) as con:
        for table, column, dtype, pk in con.execute(sql):
            entry = tables.setdefault(table, {"columns": {}, "pk": tuple(pk)})
            entry["columns"][column] = dtype
    return {name: CatalogTable(name, t["columns"], t["pk"]) for name, t in tables.items()}


def checks_for(tables: dict[str, CatalogTable]) -> list[StoreCheck]:
    """Every check that applies to the discovered schema, in a stable order."""
    out: list[StoreCheck] = []
    nodes, edges = tables.get("memory_nodes"), tables.get("memory_edges")

    def finite(t: CatalogTable, col: str) -> StoreCheck:
        return StoreCheck(
            f"{col}_finite", t.name, f"{t.name}.{col} is a finite number (not NaN, not ±Infinity)", column=col,
            sql=f"SELECT {t.key_sql} AS id, {_q(col)}::text AS {_q(col)} FROM {_ROWS} "
                f"WHERE {_q(col)} IN ('NaN'::float8, 'Infinity'::float8, '-Infinity'::float8) ORDER BY 1",
        )

    if nodes and nodes.has("importance"):
        out.append(StoreCheck("importance_in_range", nodes.name, "memory_nodes.importance is within [1, 10] (NaN fails)",
                          column="importance", between=(1.0, 10.0)))
        out.append(finite(nodes, "importance"))
    if nodes and nodes.has("label"):
        out.append(StoreCheck(
            "label_not_empty", nodes.name, "memory_nodes.label is not null, empty or blank", column="label",
            sql=f"SELECT {nodes.key_sql} AS id, scope_path, label FROM {_ROWS} "
                "WHERE label IS NULL OR label = '' "
                # blank = only ASCII whitespace; ascii() (first character) spares btrim on most rows
                "OR (ascii(label) IN (9, 10, 11, 12, 13, 32) AND btrim(label, E' \\t\\n\\r\\f\\x0b') = '') "
                "ORDER BY 1",
        ))
    if edges and edges.has("weight"):
        out.append(StoreCheck("weight_non_negative", edges.name, "memory_edges.weight is ≥ 0",
                          column="weight", between=(0.0, None)))
        out.append(finite(edges, "weight"))
    if nodes and edges and edges.has("source_id", "target_id") and nodes.has("id"):
        out.append(StoreCheck(
            "no_dangling_edges", edges.name,
            "every edge's source and target exist in memory_nodes, in the edge's own scope "
            "(legacy rows: scope tenant\\x1f<tenant_id>)",
            sql=_dangling_sql(edges, nodes),
        ))
    if (skills := tables.get("procedural_skills")) and skills.has("source", "status"):
        out.append(StoreCheck(
            "no_active_consolidation_skill", skills.name,
            "no procedural skill created by consolidation is active (drafts are never auto-activated)",
            sql=f"SELECT {skills.key_sql} AS id, scope_path, name, status, source FROM {_ROWS} "
                "WHERE source = 'consolidation' AND status = 'active' ORDER BY 1",
        ))
    for t in sorted(tables.values(), key=lambda t: t.name):
        for col in ("properties", "metadata"):
            if t.columns.get(col) == "jsonb":
                out.append(StoreCheck(
                    f"{col}_is_object", t.name, f"{t.name}.{col} is a JSON object", column=col,
                    sql=f"SELECT {t.key_sql} AS id, jsonb_typeof({_q(col)}) AS json_type, "
                        f"left({_q(col)}::text, 200) AS {_q(col)} FROM {_ROWS} "
                        f"WHERE jsonb_typeof({_q(col)}) IS DISTINCT FROM 'object' ORDER BY 1",
                ))
        if t.has("scope_path"):
            out.extend(_scope_checks(t))
        if t.has("version") and t.columns["version"] in ("bigint", "integer", "smallint", "numeric"):
            out.append(StoreCheck("version_positive", t.name, f"{t.name}.version is ≥ 1",
                              column="version", between=(1, None)))
    return out


def _effective_scope(alias: str, has_tenant: bool) -> str:
    if not has_tenant:
        return f"{alias}.scope_path"
    return f"coalesce({alias}.scope_path, 'tenant' || {_SEP_SQL} || {alias}.tenant_id)"


def _dangling_sql(edges: CatalogTable, nodes: CatalogTable) -> str:
    e_scope = _effective_scope("e", edges.has("tenant_id"))
    s_scope = _effective_scope("s", nodes.has("tenant_id"))
    t_scope = _effective_scope("t", nodes.has("tenant_id"))
    return f"""SELECT e.id::text AS id, e.scope_path, e.source_id::text AS source_id, e.target_id::text AS target_id,
       concat_ws('; ',
         CASE WHEN s.id IS NULL THEN 'source missing'
              WHEN {s_scope} IS DISTINCT FROM {e_scope} THEN 'source in scope ' || coalesce({s_scope}, 'NULL') END,
         CASE WHEN t.id IS NULL THEN 'target missing'
              WHEN {t_scope} IS DISTINCT FROM {e_scope} THEN 'target in scope ' || coalesce({t_scope}, 'NULL') END
       ) AS problem
  FROM {{batch}} e
  LEFT JOIN memory_nodes s ON s.id = e.source_id
  LEFT JOIN memory_nodes t ON t.id = e.target_id
 WHERE s.id IS NULL OR t.id IS NULL
    OR {s_scope} IS DISTINCT FROM {e_scope}
    OR {t_scope} IS DISTINCT FROM {e_scope}
 ORDER BY 1"""


def _scope_checks(t: CatalogTable) -> list[StoreCheck]:
    has_tenant = t.has("tenant_id")
    unscoped = "coalesce(scope_path, '') = ''"
    if has_tenant:
        unscoped += " AND coalesce(tenant_id, '') = ''"
    tenant_cols = ", tenant_id" if has_tenant else ""
    checks = [StoreCheck(
        "rows_scoped", t.name,
        f"every {t.name} row has a scope_path" + (" or (legacy) a tenant_id" if has_tenant else ""),
        sql=f"SELECT {t.key_sql} AS id, scope_path{tenant_cols} FROM {_ROWS} WHERE {unscoped} ORDER BY 1",
    )]
    # Well formed: non-empty kind/id pairs joined by \x1f, i.e. an odd number of separators, none
    # leading, trailing or doubled.  Plain byte-string functions: string_to_array or a regex per
    # row made this the slowest check (3x and 6x slower at 100k rows).
    sep = _SEP_SQL
    malformed = (f"((octet_length(scope_path) - octet_length(replace(scope_path, {sep}, ''))) % 2 = 0"
                 f" OR strpos({sep} || scope_path || {sep}, {sep} || {sep}) > 0)")
    problem = f"CASE WHEN {malformed} THEN 'malformed scope_path'"
    where = f"scope_path <> '' AND ({malformed}"
    if has_tenant:
        root_id = f"split_part(scope_path, {_SEP_SQL}, 2)"
        problem += f" WHEN tenant_id IS DISTINCT FROM {root_id} THEN 'tenant_id is not the scope root id ' || {root_id}"
        where += f" OR tenant_id IS DISTINCT FROM {root_id}"
    problem += " END"
    where += ")"
    checks.append(StoreCheck(
        "scope_path_consistent", t.name,
        f"every {t.name}.scope_path is kind\\x1fid pairs" + (" whose root id is the row's tenant_id" if has_tenant else ""),
        sql=f"SELECT {t.key_sql} AS id, scope_path{tenant_cols}, "
            f"{problem} AS problem FROM {_ROWS} WHERE {where} ORDER BY 1",
    ))
    return checks
