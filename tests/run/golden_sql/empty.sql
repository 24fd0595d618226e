-- golden case empty: tests/run/test_statements.py (regenerate: DEEP_SLEEP_REGEN_GOLDEN=1)

-- 1. lock
-- $1 = '["org\\u001fgolden\\u001fbrand\\u001fb1"]'
SELECT count(pg_advisory_xact_lock(hashtextextended(_s.p, 0))) FROM jsonb_array_elements_text($1::jsonb) WITH ORDINALITY AS _s(p, i);

-- 2. ledger consolidation_runs
-- params: $1 = the ledger rows (JSON), bound from the reports after the writes (rows_changed, conflicts, held)
INSERT INTO consolidation_runs (run_id, scope_path, mode, as_of, started_at, status, counters, phases_run, phases_skipped, timings, rows_changed, conflicts, diff_hash, snapshot_uri, diff_uri, errors, quarantined, recall_before, recall_after, held, hold_status, approval_of, finished_at) SELECT x.run_id::uuid, x.scope_path, x.mode, x.as_of, x.started_at, x.status, x.counters, x.phases_run, x.phases_skipped, x.timings, x.rows_changed, x.conflicts, x.diff_hash, x.snapshot_uri, x.diff_uri, x.errors, x.quarantined, x.recall_before, x.recall_after, x.held, x.hold_status, x.approval_of::uuid, now() FROM jsonb_to_recordset($1::jsonb) AS x(run_id text, scope_path text, mode text, as_of timestamptz, started_at timestamptz, status text, counters jsonb, phases_run jsonb, phases_skipped jsonb, timings jsonb, rows_changed jsonb, conflicts bigint, diff_hash text, snapshot_uri text, diff_uri text, errors jsonb, quarantined jsonb, recall_before float8, recall_after float8, held jsonb, hold_status text, approval_of text);
