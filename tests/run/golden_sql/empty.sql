-- golden case empty: tests/run/test_statements.py (regenerate: DEEP_SLEEP_REGEN_GOLDEN=1)

-- 1. lock
-- $1 = 'org\x1fgolden\x1fbrand\x1fb1'
SELECT pg_advisory_xact_lock(hashtextextended($1, 0));

-- 2. ledger consolidation_runs
-- params: $1…$19 bound from the run's report after the writes (rows_changed, conflicts)
INSERT INTO consolidation_runs (run_id, scope_path, mode, as_of, started_at, finished_at, status, counters, phases_run, phases_skipped, timings, rows_changed, conflicts, diff_hash, snapshot_uri, diff_uri, errors, quarantined, recall_before, recall_after) VALUES ($1::uuid, $2, $3, $4, $5, now(), $6, $7::jsonb, $8::jsonb, $9::jsonb, $10::jsonb, $11::jsonb, $12, $13, $14, $15, $16::jsonb, $17::jsonb, $18::float8, $19::float8);
