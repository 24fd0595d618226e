-- golden case staged_fast_inserts: tests/run/test_statements.py (regenerate: DEEP_SLEEP_REGEN_GOLDEN=1)

-- 1. discard_temp
DISCARD TEMP;

-- 2. lock
-- $1 = 'org\x1fgolden\x1fbrand\x1fb1'
SELECT pg_advisory_xact_lock(hashtextextended($1, 0));

-- 3. scope_setting
-- $1 = 'org\x1fgolden\x1fbrand\x1fb1'
SELECT set_config('deep_sleep.apply_scope', $1, true);

-- 4. stage episodic_events.inserts: 3 row(s), JSON parameter into temporary table _ds_episodic_events_inserts
-- $1 = JSON array of 3 row(s): id, scope_path, tenant_id, session_id, content, metadata, created_at, version
CREATE TEMP TABLE _ds_episodic_events_inserts AS SELECT * FROM (SELECT * FROM jsonb_to_recordset($1::jsonb) AS x("id" text, "scope_path" text, "tenant_id" text, "session_id" text, "content" text, "metadata" text, "created_at" timestamptz, "version" bigint)) s;

-- 5. stage memory_nodes.inserts: 2100 row(s), ADBC COPY of an Arrow table into temporary table _ds_memory_nodes_inserts
-- $1 = Arrow table of 2100 row(s): id, scope_path, tenant_id, layer, label, properties, importance, access_count, created_at, updated_at, last_decayed_at, version
-- (no SQL: ADBC ingest of $1 into TEMPORARY TABLE _ds_memory_nodes_inserts)

-- 6. insert memory_nodes.inserts: 2100 row(s), read from temporary table _ds_memory_nodes_inserts (staged above)
-- $1 = 'org\x1fgolden\x1fbrand\x1fb1'
WITH done AS (INSERT INTO memory_nodes (id, scope_path, tenant_id, layer, label, properties, importance, access_count, created_at, updated_at, last_decayed_at, version) SELECT s.id::uuid, s.scope_path, s.tenant_id, s.layer, s.label, s.properties::jsonb, s.importance, s.access_count, s.created_at, s.updated_at, s.last_decayed_at, s.version FROM _ds_memory_nodes_inserts s WHERE s.scope_path = $1 ON CONFLICT DO NOTHING RETURNING 1) SELECT count(*) AS n FROM done;
-- fast path, run instead of the statement above (the same rows and counts):
DO $ds$ DECLARE n bigint; guarded boolean := false; BEGIN BEGIN WITH done AS (INSERT INTO memory_nodes (id, scope_path, tenant_id, layer, label, properties, importance, access_count, created_at, updated_at, last_decayed_at, version) SELECT s.id::uuid, s.scope_path, s.tenant_id, s.layer, s.label, s.properties::jsonb, s.importance, s.access_count, s.created_at, s.updated_at, s.last_decayed_at, s.version FROM _ds_memory_nodes_inserts s WHERE s.scope_path = current_setting('deep_sleep.apply_scope') RETURNING 1) SELECT count(*) INTO n FROM done; EXCEPTION WHEN unique_violation THEN WITH done AS (INSERT INTO memory_nodes (id, scope_path, tenant_id, layer, label, properties, importance, access_count, created_at, updated_at, last_decayed_at, version) SELECT s.id::uuid, s.scope_path, s.tenant_id, s.layer, s.label, s.properties::jsonb, s.importance, s.access_count, s.created_at, s.updated_at, s.last_decayed_at, s.version FROM _ds_memory_nodes_inserts s WHERE s.scope_path = current_setting('deep_sleep.apply_scope') ON CONFLICT DO NOTHING RETURNING 1) SELECT count(*) INTO n FROM done; guarded := true; END; PERFORM set_config('deep_sleep.apply_landed', n || ' ' || guarded, true); END $ds$;

-- 7. insert episodic_events.inserts: 3 row(s), read from temporary table _ds_episodic_events_inserts (staged above)
-- $1 = 'org\x1fgolden\x1fbrand\x1fb1'
WITH done AS (INSERT INTO episodic_events (id, scope_path, tenant_id, session_id, content, metadata, created_at, version) SELECT s.id::uuid, s.scope_path, s.tenant_id, s.session_id, s.content, s.metadata::jsonb, s.created_at, s.version FROM _ds_episodic_events_inserts s WHERE s.scope_path = $1 ON CONFLICT DO NOTHING RETURNING 1) SELECT count(*) AS n FROM done;

-- 8. ledger consolidation_runs
-- params: $1…$19 bound from the run's report after the writes (rows_changed, conflicts)
INSERT INTO consolidation_runs (run_id, scope_path, mode, as_of, started_at, finished_at, status, counters, phases_run, phases_skipped, timings, rows_changed, conflicts, diff_hash, snapshot_uri, diff_uri, errors, quarantined, recall_before, recall_after) VALUES ($1::uuid, $2, $3, $4, $5, now(), $6, $7::jsonb, $8::jsonb, $9::jsonb, $10::jsonb, $11::jsonb, $12, $13, $14, $15, $16::jsonb, $17::jsonb, $18::float8, $19::float8);
