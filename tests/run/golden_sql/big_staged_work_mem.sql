-- golden case big_staged_work_mem: tests/run/test_statements.py (regenerate: DEEP_SLEEP_REGEN_GOLDEN=1)

-- 1. discard_temp
DISCARD TEMP;

-- 2. work_mem
SET LOCAL work_mem = '1GB';

-- 3. lock
-- $1 = '["org\\u001fgolden\\u001fbrand\\u001fb1"]'
SELECT count(pg_advisory_xact_lock(hashtextextended(_s.p, 0))) FROM jsonb_array_elements_text($1::jsonb) WITH ORDINALITY AS _s(p, i);

-- 4. stage episodic_events.inserts: 3 row(s), JSON parameter into temporary table _ds_shard_episodic_events_inserts
-- $1 = JSON array of 3 row(s): id, scope_path, tenant_id, session_id, content, metadata, created_at, version, _ds_sig
CREATE TEMP TABLE _ds_shard_episodic_events_inserts AS SELECT * FROM (SELECT * FROM jsonb_to_recordset($1::jsonb) AS x("id" text, "scope_path" text, "tenant_id" text, "session_id" text, "content" text, "metadata" text, "created_at" timestamptz, "version" bigint, "_ds_sig" bigint)) s;

-- 5. stage memory_edges.deletes: 5 row(s), JSON parameter into temporary table _ds_shard_memory_edges_deletes
-- $1 = JSON array of 5 row(s): id, expected_version, reason, scope_path, _ds_run_id
CREATE TEMP TABLE _ds_shard_memory_edges_deletes AS SELECT * FROM (SELECT * FROM jsonb_to_recordset($1::jsonb) AS x("id" text, "expected_version" bigint, "reason" text, "scope_path" text, "_ds_run_id" text)) s;

-- 6. stage memory_nodes.updates: 10000 row(s), ADBC COPY of an Arrow table into temporary table _ds_shard_memory_nodes_updates
-- $1 = Arrow table of 10000 row(s): scope_path, id, expected_version, importance, last_decayed_at
-- (no SQL: ADBC ingest of $1 into TEMPORARY TABLE _ds_shard_memory_nodes_updates)

-- 7. stage memory_nodes.deletes: 5 row(s), JSON parameter into temporary table _ds_shard_memory_nodes_deletes
-- $1 = JSON array of 5 row(s): id, expected_version, reason, scope_path, _ds_run_id
CREATE TEMP TABLE _ds_shard_memory_nodes_deletes AS SELECT * FROM (SELECT * FROM jsonb_to_recordset($1::jsonb) AS x("id" text, "expected_version" bigint, "reason" text, "scope_path" text, "_ds_run_id" text)) s;

-- 8. planner
SET LOCAL enable_hashjoin = off;

-- 9. planner
SET LOCAL enable_mergejoin = off;

-- 10. delete memory_edges.deletes: 5 row(s), read from temporary table _ds_shard_memory_edges_deletes (staged above)
WITH kept AS (SELECT nd.id::uuid AS id, nd.scope_path FROM _ds_shard_memory_nodes_deletes nd JOIN memory_nodes n ON n.id = nd.id::uuid AND n.scope_path = nd.scope_path WHERE nd.expected_version IS NOT NULL AND n.version <> nd.expected_version), done AS (DELETE FROM memory_edges t USING _ds_shard_memory_edges_deletes s WHERE t.id = s.id::uuid AND t.scope_path = s.scope_path AND (s.expected_version IS NULL OR t.version = s.expected_version) AND NOT EXISTS (SELECT 1 FROM kept k WHERE k.id = t.source_id AND k.scope_path = t.scope_path) AND NOT EXISTS (SELECT 1 FROM kept k WHERE k.id = t.target_id AND k.scope_path = t.scope_path) RETURNING t.*, s.reason AS _ds_reason, s._ds_run_id AS _ds_run_id), archived AS (INSERT INTO consolidation_archive (run_id, table_name, row_id, op, reason, row) SELECT done._ds_run_id::uuid, 'memory_edges', done.id::text, 'delete', done._ds_reason, to_jsonb(done) - '_ds_reason' - '_ds_run_id' FROM done RETURNING 1) SELECT done.scope_path AS scope_path, count(*) AS n FROM done GROUP BY 1;

-- 11. delete memory_nodes.deletes: 5 row(s), read from temporary table _ds_shard_memory_nodes_deletes (staged above)
WITH done AS (DELETE FROM memory_nodes t USING _ds_shard_memory_nodes_deletes s WHERE t.id = s.id::uuid AND t.scope_path = s.scope_path AND (s.expected_version IS NULL OR t.version = s.expected_version) AND NOT EXISTS (SELECT 1 FROM memory_edges e WHERE e.scope_path = t.scope_path AND e.source_id = t.id) AND NOT EXISTS (SELECT 1 FROM memory_edges e WHERE e.scope_path = t.scope_path AND e.target_id = t.id) RETURNING t.*, s.reason AS _ds_reason, s._ds_run_id AS _ds_run_id), archived AS (INSERT INTO consolidation_archive (run_id, table_name, row_id, op, reason, row) SELECT done._ds_run_id::uuid, 'memory_nodes', done.id::text, 'delete', done._ds_reason, to_jsonb(done) - '_ds_reason' - '_ds_run_id' FROM done RETURNING 1) SELECT done.scope_path AS scope_path, count(*) AS n FROM done GROUP BY 1;

-- 12. update memory_nodes.updates: 10000 row(s), read from temporary table _ds_shard_memory_nodes_updates (staged above)
WITH done AS (UPDATE memory_nodes t SET importance = COALESCE(s.importance, t.importance), last_decayed_at = COALESCE(s.last_decayed_at, t.last_decayed_at) FROM _ds_shard_memory_nodes_updates s WHERE t.id = s.id::uuid AND t.scope_path = s.scope_path AND (s.expected_version IS NULL OR t.version = s.expected_version) RETURNING t.scope_path) SELECT scope_path AS scope_path, count(*) AS n FROM done GROUP BY 1;

-- 13. insert episodic_events.inserts: 3 row(s), read from temporary table _ds_shard_episodic_events_inserts (staged above)
WITH done AS (INSERT INTO episodic_events (id, scope_path, tenant_id, session_id, content, metadata, created_at, version) SELECT s.id::uuid, s.scope_path, s.tenant_id, s.session_id, s.content, s.metadata::jsonb, s.created_at, s.version FROM _ds_shard_episodic_events_inserts s WHERE s._ds_sig = 0 ON CONFLICT DO NOTHING RETURNING scope_path) SELECT scope_path AS scope_path, count(*) AS n FROM done GROUP BY 1;
-- fast path (the same rows and counts; the guarded insert above on a unique violation):
DO $ds$ BEGIN CREATE TEMP TABLE IF NOT EXISTS _ds_shard_landed (scope_path text, n bigint, guarded boolean); BEGIN WITH done AS (INSERT INTO episodic_events (id, scope_path, tenant_id, session_id, content, metadata, created_at, version) SELECT s.id::uuid, s.scope_path, s.tenant_id, s.session_id, s.content, s.metadata::jsonb, s.created_at, s.version FROM _ds_shard_episodic_events_inserts s WHERE s._ds_sig = 0 RETURNING scope_path) INSERT INTO _ds_shard_landed (scope_path, n, guarded) SELECT scope_path, count(*), false FROM done GROUP BY 1; EXCEPTION WHEN unique_violation THEN WITH done AS (INSERT INTO episodic_events (id, scope_path, tenant_id, session_id, content, metadata, created_at, version) SELECT s.id::uuid, s.scope_path, s.tenant_id, s.session_id, s.content, s.metadata::jsonb, s.created_at, s.version FROM _ds_shard_episodic_events_inserts s WHERE s._ds_sig = 0 ON CONFLICT DO NOTHING RETURNING scope_path) INSERT INTO _ds_shard_landed (scope_path, n, guarded) SELECT scope_path, count(*), true FROM done GROUP BY 1; INSERT INTO _ds_shard_landed (scope_path, n, guarded) VALUES (NULL, 0, true); END; END $ds$;

-- 14. ledger consolidation_runs
-- params: $1 = the ledger rows (JSON), bound from the reports after the writes (rows_changed, conflicts, held)
INSERT INTO consolidation_runs (run_id, scope_path, mode, as_of, started_at, status, counters, phases_run, phases_skipped, timings, rows_changed, conflicts, diff_hash, snapshot_uri, diff_uri, errors, quarantined, recall_before, recall_after, held, hold_status, approval_of, finished_at) SELECT x.run_id::uuid, x.scope_path, x.mode, x.as_of, x.started_at, x.status, x.counters, x.phases_run, x.phases_skipped, x.timings, x.rows_changed, x.conflicts, x.diff_hash, x.snapshot_uri, x.diff_uri, x.errors, x.quarantined, x.recall_before, x.recall_after, x.held, x.hold_status, x.approval_of::uuid, now() FROM jsonb_to_recordset($1::jsonb) AS x(run_id text, scope_path text, mode text, as_of timestamptz, started_at timestamptz, status text, counters jsonb, phases_run jsonb, phases_skipped jsonb, timings jsonb, rows_changed jsonb, conflicts bigint, diff_hash text, snapshot_uri text, diff_uri text, errors jsonb, quarantined jsonb, recall_before float8, recall_after float8, held jsonb, hold_status text, approval_of text);
