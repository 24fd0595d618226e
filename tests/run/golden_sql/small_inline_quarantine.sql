-- golden case small_inline_quarantine: tests/run/test_statements.py (regenerate: DEEP_SLEEP_REGEN_GOLDEN=1)

-- 1. discard_temp
DISCARD TEMP;

-- 2. lock
-- $1 = 'org\x1fgolden\x1fbrand\x1fb1'
SELECT pg_advisory_xact_lock(hashtextextended($1, 0));

-- 3. delete memory_nodes.deletes: 1 row(s), inline JSON parameter
-- $1 = 'org\x1fgolden\x1fbrand\x1fb1'
-- $2 = '00000000-0000-4000-8000-000000000001'
-- $3 = JSON array of 1 row(s): id, expected_version, reason
WITH gone AS (DELETE FROM memory_nodes t USING (SELECT * FROM jsonb_to_recordset($3::jsonb) AS x("id" text, "expected_version" bigint, "reason" text)) s WHERE t.id = s.id::uuid AND t.scope_path = $1 AND (s.expected_version IS NULL OR t.version = s.expected_version) RETURNING t.*, s.reason AS _ds_reason), archived AS (INSERT INTO consolidation_archive (run_id, table_name, row_id, op, reason, row) SELECT $2::uuid, 'memory_nodes', gone.id::text, 'delete', gone._ds_reason, to_jsonb(gone) - '_ds_reason' FROM gone RETURNING 1) SELECT count(*) AS n FROM archived;

-- 4. delete memory_edges.deletes: 1 row(s), inline JSON parameter
-- $1 = 'org\x1fgolden\x1fbrand\x1fb1'
-- $2 = '00000000-0000-4000-8000-000000000001'
-- $3 = JSON array of 1 row(s): id, expected_version, reason
-- $4 = JSON array of 1 row(s): id, expected_version, reason
WITH kept AS (SELECT nd.id::uuid AS id FROM (SELECT * FROM jsonb_to_recordset($4::jsonb) AS x("id" text, "expected_version" bigint, "reason" text)) nd WHERE NOT EXISTS (SELECT 1 FROM consolidation_archive a WHERE a.run_id = $2::uuid AND a.table_name = 'memory_nodes' AND a.op = 'delete' AND a.row_id = nd.id::uuid::text)), gone AS (DELETE FROM memory_edges t USING (SELECT * FROM jsonb_to_recordset($3::jsonb) AS x("id" text, "expected_version" bigint, "reason" text)) s WHERE t.id = s.id::uuid AND t.scope_path = $1 AND (s.expected_version IS NULL OR t.version = s.expected_version) AND NOT EXISTS (SELECT 1 FROM kept k WHERE k.id = t.source_id) AND NOT EXISTS (SELECT 1 FROM kept k WHERE k.id = t.target_id) RETURNING t.*, s.reason AS _ds_reason), archived AS (INSERT INTO consolidation_archive (run_id, table_name, row_id, op, reason, row) SELECT $2::uuid, 'memory_edges', gone.id::text, 'delete', gone._ds_reason, to_jsonb(gone) - '_ds_reason' FROM gone RETURNING 1) SELECT count(*) AS n FROM archived;

-- 5. delete pending_connections.deletes: 1 row(s), inline JSON parameter
-- $1 = 'org\x1fgolden\x1fbrand\x1fb1'
-- $2 = '00000000-0000-4000-8000-000000000001'
-- $3 = JSON array of 1 row(s): id, expected_version, reason
WITH gone AS (DELETE FROM pending_connections t USING (SELECT * FROM jsonb_to_recordset($3::jsonb) AS x("id" text, "expected_version" bigint, "reason" text)) s WHERE t.id = s.id::uuid AND t.scope_path = $1 AND (s.expected_version IS NULL OR t.version = s.expected_version) RETURNING t.*, s.reason AS _ds_reason), archived AS (INSERT INTO consolidation_archive (run_id, table_name, row_id, op, reason, row) SELECT $2::uuid, 'pending_connections', gone.id::text, 'delete', gone._ds_reason, to_jsonb(gone) - '_ds_reason' FROM gone RETURNING 1) SELECT count(*) AS n FROM archived;

-- 6. update memory_nodes.updates: 3 row(s), inline JSON parameter
-- $1 = 'org\x1fgolden\x1fbrand\x1fb1'
-- $2 = JSON array of 3 row(s): id, expected_version, importance, last_decayed_at
WITH done AS (UPDATE memory_nodes t SET importance = COALESCE(s.importance, t.importance), last_decayed_at = COALESCE(s.last_decayed_at, t.last_decayed_at) FROM (SELECT * FROM jsonb_to_recordset($2::jsonb) AS x("id" text, "expected_version" bigint, "importance" double precision, "last_decayed_at" timestamptz)) s WHERE t.id = s.id::uuid AND t.scope_path = $1 AND (s.expected_version IS NULL OR t.version = s.expected_version) RETURNING 1) SELECT count(*) AS n FROM done;

-- 7. update episodic_events.updates: 2 row(s), inline JSON parameter
-- $1 = 'org\x1fgolden\x1fbrand\x1fb1'
-- $2 = JSON array of 2 row(s): id, expected_version, metadata
WITH done AS (UPDATE episodic_events t SET metadata = COALESCE(s.metadata::jsonb, t.metadata) FROM (SELECT * FROM jsonb_to_recordset($2::jsonb) AS x("id" text, "expected_version" bigint, "metadata" text)) s WHERE t.id = s.id::uuid AND t.scope_path = $1 AND (s.expected_version IS NULL OR t.version = s.expected_version) RETURNING 1) SELECT count(*) AS n FROM done;

-- 8. update pending_connections.updates: 2 row(s), inline JSON parameter
-- $1 = 'org\x1fgolden\x1fbrand\x1fb1'
-- $2 = JSON array of 2 row(s): id, expected_version, consumed_by_run, outcome
WITH done AS (UPDATE pending_connections t SET consumed_by_run = COALESCE(s.consumed_by_run::uuid, t.consumed_by_run), outcome = COALESCE(s.outcome, t.outcome) FROM (SELECT * FROM jsonb_to_recordset($2::jsonb) AS x("id" text, "expected_version" bigint, "consumed_by_run" text, "outcome" text)) s WHERE t.id = s.id::uuid AND t.scope_path = $1 AND (s.expected_version IS NULL OR t.version = s.expected_version) RETURNING 1) SELECT count(*) AS n FROM done;

-- 9. update soul_profiles.updates: 1 row(s), inline JSON parameter
-- $1 = 'org\x1fgolden\x1fbrand\x1fb1'
-- $2 = JSON array of 1 row(s): id, expected_version, value
WITH done AS (UPDATE soul_profiles t SET value = COALESCE(s.value, t.value) FROM (SELECT * FROM jsonb_to_recordset($2::jsonb) AS x("id" text, "expected_version" bigint, "value" text)) s WHERE t.id = s.id::uuid AND t.scope_path = $1 AND (s.expected_version IS NULL OR t.version = s.expected_version) RETURNING 1) SELECT count(*) AS n FROM done;

-- 10. insert memory_edges.inserts: 2 row(s), inline JSON parameter
-- $1 = 'org\x1fgolden\x1fbrand\x1fb1'
-- $2 = JSON array of 2 row(s): id, scope_path, tenant_id, source_id, target_id, relation, weight, properties, created_at, updated_at, valid_from, valid_to, version
WITH done AS (INSERT INTO memory_edges (id, scope_path, tenant_id, source_id, target_id, relation, weight, properties, created_at, updated_at, valid_from, valid_to, version) SELECT s.id::uuid, s.scope_path, s.tenant_id, s.source_id::uuid, s.target_id::uuid, s.relation, s.weight, s.properties::jsonb, s.created_at, s.updated_at, s.valid_from, s.valid_to, s.version FROM (SELECT * FROM jsonb_to_recordset($2::jsonb) AS x("id" text, "scope_path" text, "tenant_id" text, "source_id" text, "target_id" text, "relation" text, "weight" double precision, "properties" text, "created_at" timestamptz, "updated_at" timestamptz, "valid_from" timestamptz, "valid_to" timestamptz, "version" bigint)) s WHERE s.scope_path = $1 ON CONFLICT DO NOTHING RETURNING 1) SELECT count(*) AS n FROM done;

-- 11. insert soul_profiles.inserts: 1 row(s), inline JSON parameter
-- $1 = 'org\x1fgolden\x1fbrand\x1fb1'
-- $2 = JSON array of 1 row(s): id, scope_path, tenant_id, key, value, updated_at, version
WITH done AS (INSERT INTO soul_profiles (id, scope_path, tenant_id, key, value, updated_at, version) SELECT s.id::uuid, s.scope_path, s.tenant_id, s.key, s.value, s.updated_at, s.version FROM (SELECT * FROM jsonb_to_recordset($2::jsonb) AS x("id" text, "scope_path" text, "tenant_id" text, "key" text, "value" text, "updated_at" timestamptz, "version" bigint)) s WHERE s.scope_path = $1 ON CONFLICT DO NOTHING RETURNING 1) SELECT count(*) AS n FROM done;

-- 12. quarantine consolidation_quarantine: 1 row(s), ADBC COPY of an Arrow table into temporary table _ds_quarantine
-- $1 = Arrow table of 1 row(s): table, id, reason, row
-- (no SQL: ADBC ingest of $1 into TEMPORARY TABLE _ds_quarantine)

-- 13. quarantine consolidation_quarantine: 1 row(s), read from temporary table _ds_quarantine (staged above)
-- $1 = '00000000-0000-4000-8000-000000000001'
-- $2 = 'org\x1fgolden\x1fbrand\x1fb1'
WITH done AS (INSERT INTO consolidation_quarantine (run_id, scope_path, table_name, row_id, reason, row) SELECT $1::uuid, $2, s.table, s.id, s.reason, s.row::jsonb FROM _ds_quarantine s RETURNING 1) SELECT count(*) FROM done;

-- 14. ledger consolidation_runs
-- params: $1…$19 bound from the run's report after the writes (rows_changed, conflicts)
INSERT INTO consolidation_runs (run_id, scope_path, mode, as_of, started_at, finished_at, status, counters, phases_run, phases_skipped, timings, rows_changed, conflicts, diff_hash, snapshot_uri, diff_uri, errors, quarantined, recall_before, recall_after) VALUES ($1::uuid, $2, $3, $4, $5, now(), $6, $7::jsonb, $8::jsonb, $9::jsonb, $10::jsonb, $11::jsonb, $12, $13, $14, $15, $16::jsonb, $17::jsonb, $18::float8, $19::float8);
