-- golden case small_inline_quarantine: tests/run/test_statements.py (regenerate: DEEP_SLEEP_REGEN_GOLDEN=1)

-- 1. discard_temp
DISCARD TEMP;

-- 2. lock
-- $1 = '["org\\u001fgolden\\u001fbrand\\u001fb1"]'
SELECT count(pg_advisory_xact_lock(hashtextextended(_s.p, 0))) FROM jsonb_array_elements_text($1::jsonb) WITH ORDINALITY AS _s(p, i);

-- 3. delete memory_edges.deletes: 1 row(s), inline JSON parameter
-- $1 = JSON array of 1 row(s): id, expected_version, reason, scope_path, _ds_run_id
-- $2 = JSON array of 1 row(s): id, expected_version, reason, scope_path, _ds_run_id
WITH kept AS (SELECT nd.id::uuid AS id, nd.scope_path FROM (SELECT * FROM jsonb_to_recordset($2::jsonb) AS x("id" text, "expected_version" bigint, "reason" text, "scope_path" text, "_ds_run_id" text)) nd JOIN memory_nodes n ON n.id = nd.id::uuid AND n.scope_path = nd.scope_path WHERE nd.expected_version IS NOT NULL AND n.version <> nd.expected_version), done AS (DELETE FROM memory_edges t USING (SELECT * FROM jsonb_to_recordset($1::jsonb) AS x("id" text, "expected_version" bigint, "reason" text, "scope_path" text, "_ds_run_id" text)) s WHERE t.id = s.id::uuid AND t.scope_path = s.scope_path AND (s.expected_version IS NULL OR t.version = s.expected_version) AND NOT EXISTS (SELECT 1 FROM kept k WHERE k.id = t.source_id AND k.scope_path = t.scope_path) AND NOT EXISTS (SELECT 1 FROM kept k WHERE k.id = t.target_id AND k.scope_path = t.scope_path) RETURNING t.*, s.reason AS _ds_reason, s._ds_run_id AS _ds_run_id), archived AS (INSERT INTO consolidation_archive (run_id, table_name, row_id, op, reason, row) SELECT done._ds_run_id::uuid, 'memory_edges', done.id::text, 'delete', done._ds_reason, to_jsonb(done) - '_ds_reason' - '_ds_run_id' FROM done RETURNING 1) SELECT done.scope_path AS scope_path, count(*) AS n FROM done GROUP BY 1;

-- 4. delete memory_nodes.deletes: 1 row(s), inline JSON parameter
-- $1 = JSON array of 1 row(s): id, expected_version, reason, scope_path, _ds_run_id
WITH done AS (DELETE FROM memory_nodes t USING (SELECT * FROM jsonb_to_recordset($1::jsonb) AS x("id" text, "expected_version" bigint, "reason" text, "scope_path" text, "_ds_run_id" text)) s WHERE t.id = s.id::uuid AND t.scope_path = s.scope_path AND (s.expected_version IS NULL OR t.version = s.expected_version) AND NOT EXISTS (SELECT 1 FROM memory_edges e WHERE e.scope_path = t.scope_path AND e.source_id = t.id) AND NOT EXISTS (SELECT 1 FROM memory_edges e WHERE e.scope_path = t.scope_path AND e.target_id = t.id) RETURNING t.*, s.reason AS _ds_reason, s._ds_run_id AS _ds_run_id), archived AS (INSERT INTO consolidation_archive (run_id, table_name, row_id, op, reason, row) SELECT done._ds_run_id::uuid, 'memory_nodes', done.id::text, 'delete', done._ds_reason, to_jsonb(done) - '_ds_reason' - '_ds_run_id' FROM done RETURNING 1) SELECT done.scope_path AS scope_path, count(*) AS n FROM done GROUP BY 1;

-- 5. delete pending_connections.deletes: 1 row(s), inline JSON parameter
-- $1 = JSON array of 1 row(s): id, expected_version, reason, scope_path, _ds_run_id
WITH done AS (DELETE FROM pending_connections t USING (SELECT * FROM jsonb_to_recordset($1::jsonb) AS x("id" text, "expected_version" bigint, "reason" text, "scope_path" text, "_ds_run_id" text)) s WHERE t.id = s.id::uuid AND t.scope_path = s.scope_path AND (s.expected_version IS NULL OR t.version = s.expected_version) RETURNING t.*, s.reason AS _ds_reason, s._ds_run_id AS _ds_run_id), archived AS (INSERT INTO consolidation_archive (run_id, table_name, row_id, op, reason, row) SELECT done._ds_run_id::uuid, 'pending_connections', done.id::text, 'delete', done._ds_reason, to_jsonb(done) - '_ds_reason' - '_ds_run_id' FROM done RETURNING 1) SELECT done.scope_path AS scope_path, count(*) AS n FROM done GROUP BY 1;

-- 6. update memory_nodes.updates: 3 row(s), inline JSON parameter
-- $1 = JSON array of 3 row(s): scope_path, id, expected_version, importance, last_decayed_at
WITH done AS (UPDATE memory_nodes t SET importance = COALESCE(s.importance, t.importance), last_decayed_at = COALESCE(s.last_decayed_at, t.last_decayed_at) FROM (SELECT * FROM jsonb_to_recordset($1::jsonb) AS x("scope_path" text, "id" text, "expected_version" bigint, "importance" double precision, "last_decayed_at" timestamptz)) s WHERE t.id = s.id::uuid AND t.scope_path = s.scope_path AND (s.expected_version IS NULL OR t.version = s.expected_version) RETURNING t.scope_path) SELECT scope_path AS scope_path, count(*) AS n FROM done GROUP BY 1;

-- 7. update episodic_events.updates: 2 row(s), inline JSON parameter
-- $1 = JSON array of 2 row(s): scope_path, id, expected_version, metadata
WITH done AS (UPDATE episodic_events t SET metadata = COALESCE(s.metadata::jsonb, t.metadata) FROM (SELECT * FROM jsonb_to_recordset($1::jsonb) AS x("scope_path" text, "id" text, "expected_version" bigint, "metadata" text)) s WHERE t.id = s.id::uuid AND t.scope_path = s.scope_path AND (s.expected_version IS NULL OR t.version = s.expected_version) RETURNING t.scope_path) SELECT scope_path AS scope_path, count(*) AS n FROM done GROUP BY 1;

-- 8. update pending_connections.updates: 2 row(s), inline JSON parameter
-- $1 = JSON array of 2 row(s): scope_path, id, expected_version, consumed_by_run, outcome
WITH done AS (UPDATE pending_connections t SET consumed_by_run = COALESCE(s.consumed_by_run::uuid, t.consumed_by_run), outcome = COALESCE(s.outcome, t.outcome) FROM (SELECT * FROM jsonb_to_recordset($1::jsonb) AS x("scope_path" text, "id" text, "expected_version" bigint, "consumed_by_run" text, "outcome" text)) s WHERE t.id = s.id::uuid AND t.scope_path = s.scope_path AND (s.expected_version IS NULL OR t.version = s.expected_version) RETURNING t.scope_path) SELECT scope_path AS scope_path, count(*) AS n FROM done GROUP BY 1;

-- 9. update soul_profiles.updates: 1 row(s), inline JSON parameter
-- $1 = JSON array of 1 row(s): scope_path, id, expected_version, value
WITH done AS (UPDATE soul_profiles t SET value = COALESCE(s.value, t.value) FROM (SELECT * FROM jsonb_to_recordset($1::jsonb) AS x("scope_path" text, "id" text, "expected_version" bigint, "value" text)) s WHERE t.id = s.id::uuid AND t.scope_path = s.scope_path AND (s.expected_version IS NULL OR t.version = s.expected_version) RETURNING t.scope_path) SELECT scope_path AS scope_path, count(*) AS n FROM done GROUP BY 1;

-- 10. insert memory_edges.inserts: 2 row(s), inline JSON parameter
-- $1 = JSON array of 2 row(s): id, scope_path, tenant_id, source_id, target_id, relation, weight, properties, created_at, updated_at, version, _ds_sig
WITH done AS (INSERT INTO memory_edges (id, scope_path, tenant_id, source_id, target_id, relation, weight, properties, created_at, updated_at, version) SELECT s.id::uuid, s.scope_path, s.tenant_id, s.source_id::uuid, s.target_id::uuid, s.relation, s.weight, s.properties::jsonb, s.created_at, s.updated_at, s.version FROM (SELECT * FROM jsonb_to_recordset($1::jsonb) AS x("id" text, "scope_path" text, "tenant_id" text, "source_id" text, "target_id" text, "relation" text, "weight" double precision, "properties" text, "created_at" timestamptz, "updated_at" timestamptz, "version" bigint, "_ds_sig" bigint)) s WHERE s._ds_sig = 0 AND EXISTS (SELECT 1 FROM memory_nodes n WHERE n.id = s.source_id::uuid AND n.scope_path = s.scope_path FOR KEY SHARE) AND EXISTS (SELECT 1 FROM memory_nodes n WHERE n.id = s.target_id::uuid AND n.scope_path = s.scope_path FOR KEY SHARE) ON CONFLICT DO NOTHING RETURNING scope_path) SELECT scope_path AS scope_path, count(*) AS n FROM done GROUP BY 1;

-- 11. insert soul_profiles.inserts: 1 row(s), inline JSON parameter
-- $1 = JSON array of 1 row(s): id, scope_path, tenant_id, key, value, updated_at, version, _ds_sig
WITH done AS (INSERT INTO soul_profiles (id, scope_path, tenant_id, key, value, updated_at, version) SELECT s.id::uuid, s.scope_path, s.tenant_id, s.key, s.value, s.updated_at, s.version FROM (SELECT * FROM jsonb_to_recordset($1::jsonb) AS x("id" text, "scope_path" text, "tenant_id" text, "key" text, "value" text, "updated_at" timestamptz, "version" bigint, "_ds_sig" bigint)) s WHERE s._ds_sig = 0 ON CONFLICT DO NOTHING RETURNING scope_path) SELECT scope_path AS scope_path, count(*) AS n FROM done GROUP BY 1;

-- 12. quarantine consolidation_quarantine: 1 row(s), inline JSON parameter
-- $1 = JSON array of 1 row(s): table, id, reason, row, scope_path, _ds_run_id
WITH done AS (INSERT INTO consolidation_quarantine (run_id, scope_path, table_name, row_id, reason, row) SELECT s._ds_run_id::uuid, s.scope_path, s.table, s.id, s.reason, s.row::jsonb FROM (SELECT * FROM jsonb_to_recordset($1::jsonb) AS x("table" text, "id" text, "reason" text, "row" text, "scope_path" text, "_ds_run_id" text)) s RETURNING 1) SELECT count(*) FROM done;

-- 13. ledger consolidation_runs
-- params: $1 = the ledger rows (JSON), bound from the reports after the writes (rows_changed, conflicts, held)
INSERT INTO consolidation_runs (run_id, scope_path, mode, as_of, started_at, status, counters, phases_run, phases_skipped, timings, rows_changed, conflicts, diff_hash, snapshot_uri, diff_uri, errors, quarantined, recall_before, recall_after, held, hold_status, approval_of, finished_at) SELECT x.run_id::uuid, x.scope_path, x.mode, x.as_of, x.started_at, x.status, x.counters, x.phases_run, x.phases_skipped, x.timings, x.rows_changed, x.conflicts, x.diff_hash, x.snapshot_uri, x.diff_uri, x.errors, x.quarantined, x.recall_before, x.recall_after, x.held, x.hold_status, x.approval_of::uuid, now() FROM jsonb_to_recordset($1::jsonb) AS x(run_id text, scope_path text, mode text, as_of timestamptz, started_at timestamptz, status text, counters jsonb, phases_run jsonb, phases_skipped jsonb, timings jsonb, rows_changed jsonb, conflicts bigint, diff_hash text, snapshot_uri text, diff_uri text, errors jsonb, quarantined jsonb, recall_before float8, recall_after float8, held jsonb, hold_status text, approval_of text);
