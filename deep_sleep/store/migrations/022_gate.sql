-- The recall-quality gate (issue 16, SPEC §9): recall@k of the used memories of the scope's
-- replayed recall queries, before and after the run's diff (0–1; null when the gate was off or
-- the scope had no used query).
ALTER TABLE consolidation_runs ADD COLUMN IF NOT EXISTS recall_before float8;
ALTER TABLE consolidation_runs ADD COLUMN IF NOT EXISTS recall_after float8;
