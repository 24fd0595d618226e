-- golden case staged: tests/run/test_statements.py (regenerate: DEEP_SLEEP_REGEN_GOLDEN=1)

-- 1. discard_temp
DISCARD TEMP;

-- 2. lock
-- $1 = 'org\x1fgolden\x1fbrand\x1fb1'
SELECT pg_advisory_xact_lock(hashtextextended($1, 0));

-- 3. stage memory_edges.deletes: 3 row(s), JSON parameter into temporary table _ds_memory_edges_deletes
-- $1 = JSON array of 3 row(s): id, expected_version, reason
CREATE TEMP TABLE _ds_memory_edges_deletes AS SELECT * FROM (SELECT * FROM jsonb_to_recordset($1::jsonb) AS x("id" text, "expected_version" bigint, "reason" text)) s;

-- 4. stage memory_nodes.updates: 2100 row(s), ADBC COPY of an Arrow table into temporary table _ds_memory_nodes_updates
-- $1 = Arrow table of 2100 row(s): id, expected_version, importance, last_decayed_at
-- (no SQL: ADBC ingest of $1 into TEMPORARY TABLE _ds_memory_nodes_updates)

-- 5. stage memory_nodes.deletes: 2 row(s), JSON parameter into temporary table _ds_memory_nodes_deletes
-- $1 = JSON array of 2 row(s): id, expected_version, reason
CREATE TEMP TABLE _ds_memory_nodes_deletes AS SELECT * FROM (SELECT * FROM jsonb_to_recordset($1::jsonb) AS x("id" text, "expected_version" bigint, "reason" text)) s;

-- 6. stage pending_connections.inserts: 2 row(s), JSON parameter into temporary table _ds_pending_connections_inserts
-- $1 = JSON array of 2 row(s): id, scope_path, tenant_id, source_label, target_label, relation, weight, created_at, consumed_by_run, outcome, version
CREATE TEMP TABLE _ds_pending_connections_inserts AS SELECT * FROM (SELECT * FROM jsonb_to_recordset($1::jsonb) AS x("id" text, "scope_path" text, "tenant_id" text, "source_label" text, "target_label" text, "relation" text, "weight" double precision, "created_at" timestamptz, "consumed_by_run" text, "outcome" text, "version" bigint)) s;

-- 7. stage prospective_triggers.updates: 2 row(s), JSON parameter into temporary table _ds_prospective_triggers_updates
-- $1 = JSON array of 2 row(s): id, expected_version, status
CREATE TEMP TABLE _ds_prospective_triggers_updates AS SELECT * FROM (SELECT * FROM jsonb_to_recordset($1::jsonb) AS x("id" text, "expected_version" bigint, "status" text)) s;

-- 8. delete memory_nodes.deletes: 2 row(s), read from temporary table _ds_memory_nodes_deletes (staged above)
-- $1 = 'org\x1fgolden\x1fbrand\x1fb1'
-- $2 = '00000000-0000-4000-8000-000000000001'
WITH gone AS (DELETE FROM memory_nodes t USING _ds_memory_nodes_deletes s WHERE t.id = s.id::uuid AND t.scope_path = $1 AND (s.expected_version IS NULL OR t.version = s.expected_version) RETURNING t.*, s.reason AS _ds_reason), archived AS (INSERT INTO consolidation_archive (run_id, table_name, row_id, op, reason, row) SELECT $2::uuid, 'memory_nodes', gone.id::text, 'delete', gone._ds_reason, to_jsonb(gone) - '_ds_reason' FROM gone RETURNING 1) SELECT count(*) AS n FROM archived;

-- 9. delete memory_edges.deletes: 3 row(s), read from temporary table _ds_memory_edges_deletes (staged above)
-- $1 = 'org\x1fgolden\x1fbrand\x1fb1'
-- $2 = '00000000-0000-4000-8000-000000000001'
WITH kept AS (SELECT nd.id::uuid AS id FROM _ds_memory_nodes_deletes nd WHERE NOT EXISTS (SELECT 1 FROM consolidation_archive a WHERE a.run_id = $2::uuid AND a.table_name = 'memory_nodes' AND a.op = 'delete' AND a.row_id = nd.id::uuid::text)), gone AS (DELETE FROM memory_edges t USING _ds_memory_edges_deletes s WHERE t.id = s.id::uuid AND t.scope_path = $1 AND (s.expected_version IS NULL OR t.version = s.expected_version) AND NOT EXISTS (SELECT 1 FROM kept k WHERE k.id = t.source_id) AND NOT EXISTS (SELECT 1 FROM kept k WHERE k.id = t.target_id) RETURNING t.*, s.reason AS _ds_reason), archived AS (INSERT INTO consolidation_archive (run_id, table_name, row_id, op, reason, row) SELECT $2::uuid, 'memory_edges', gone.id::text, 'delete', gone._ds_reason, to_jsonb(gone) - '_ds_reason' FROM gone RETURNING 1) SELECT count(*) AS n FROM archived;

-- 10. update memory_nodes.updates: 2100 row(s), read from temporary table _ds_memory_nodes_updates (staged above)
-- $1 = 'org\x1fgolden\x1fbrand\x1fb1'
WITH done AS (UPDATE memory_nodes t SET importance = COALESCE(s.importance, t.importance), last_decayed_at = COALESCE(s.last_decayed_at, t.last_decayed_at) FROM _ds_memory_nodes_updates s WHERE t.id = s.id::uuid AND t.scope_path = $1 AND (s.expected_version IS NULL OR t.version = s.expected_version) RETURNING 1) SELECT count(*) AS n FROM done;

-- 11. update prospective_triggers.updates: 2 row(s), read from temporary table _ds_prospective_triggers_updates (staged above)
-- $1 = 'org\x1fgolden\x1fbrand\x1fb1'
WITH done AS (UPDATE prospective_triggers t SET status = COALESCE(s.status, t.status) FROM _ds_prospective_triggers_updates s WHERE t.id = s.id::uuid AND t.scope_path = $1 AND (s.expected_version IS NULL OR t.version = s.expected_version) RETURNING 1) SELECT count(*) AS n FROM done;

-- 12. insert pending_connections.inserts: 2 row(s), read from temporary table _ds_pending_connections_inserts (staged above)
-- $1 = 'org\x1fgolden\x1fbrand\x1fb1'
WITH done AS (INSERT INTO pending_connections (id, scope_path, tenant_id, source_label, target_label, relation, weight, created_at, consumed_by_run, outcome, version) SELECT s.id::uuid, s.scope_path, s.tenant_id, s.source_label, s.target_label, s.relation, s.weight, s.created_at, s.consumed_by_run::uuid, s.outcome, s.version FROM _ds_pending_connections_inserts s WHERE s.scope_path = $1 ON CONFLICT DO NOTHING RETURNING 1) SELECT count(*) AS n FROM done;

-- 13. ledger consolidation_runs
-- params: $1…$19 bound from the run's report after the writes (rows_changed, conflicts)
INSERT INTO consolidation_runs (run_id, scope_path, mode, as_of, started_at, finished_at, status, counters, phases_run, phases_skipped, timings, rows_changed, conflicts, diff_hash, snapshot_uri, diff_uri, errors, quarantined, recall_before, recall_after) VALUES ($1::uuid, $2, $3, $4, $5, now(), $6, $7::jsonb, $8::jsonb, $9::jsonb, $10::jsonb, $11::jsonb, $12, $13, $14, $15, $16::jsonb, $17::jsonb, $18::float8, $19::float8);
