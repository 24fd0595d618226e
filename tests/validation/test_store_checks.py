"""The store suite's checks as values, from a catalog description (no database, no great-expectations)."""

from __future__ import annotations

from deep_sleep.validation.store_checks import CatalogTable, checks_for

NODES = CatalogTable("memory_nodes", {"id": "uuid", "scope_path": "text", "tenant_id": "text", "label": "text",
                                      "importance": "double precision", "properties": "jsonb", "version": "bigint"},
                     ("id",))
EDGES = CatalogTable("memory_edges", {"id": "uuid", "scope_path": "text", "tenant_id": "text", "source_id": "uuid",
                                      "target_id": "uuid", "weight": "double precision", "version": "bigint"}, ("id",))
KEYLESS = CatalogTable("audit", {"scope_path": "text", "version": "integer", "metadata": "json"}, ())


def test_checks_follow_the_catalog_in_a_stable_order():
    checks = checks_for({"memory_nodes": NODES, "memory_edges": EDGES, "audit": KEYLESS})
    assert [(c.name, c.table) for c in checks] == [
        ("importance_in_range", "memory_nodes"), ("importance_finite", "memory_nodes"), ("label_not_empty", "memory_nodes"),
        ("weight_non_negative", "memory_edges"), ("weight_finite", "memory_edges"), ("no_dangling_edges", "memory_edges"),
        ("rows_scoped", "audit"), ("scope_path_consistent", "audit"), ("version_positive", "audit"),
        ("rows_scoped", "memory_edges"), ("scope_path_consistent", "memory_edges"), ("version_positive", "memory_edges"),
        ("properties_is_object", "memory_nodes"), ("rows_scoped", "memory_nodes"), ("scope_path_consistent", "memory_nodes"),
        ("version_positive", "memory_nodes"),
    ]
    assert {c.kind for c in checks if c.between is not None} == {"column"}
    assert "metadata_is_object" not in {c.name for c in checks}  # json, not jsonb: jsonb_typeof does not apply


def test_a_range_check_on_a_table_without_a_key_column_runs_as_sql_naming_the_row():
    (version,) = [c for c in checks_for({"audit": KEYLESS}) if c.name == "version_positive"]
    assert version.kind == "column" and KEYLESS.key_column is None
    as_sql = version.as_sql(KEYLESS)
    assert as_sql.kind == "sql" and as_sql.name == version.name
    assert 'WHERE "version" IS NOT NULL AND NOT ("version" >= 1)' in as_sql.sql
    assert "left(row_to_json(r)::text, 200) AS id" in as_sql.sql
