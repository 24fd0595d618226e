-- Retention (issue 16): `deep-sleep gc` removes old run directories and archive rows.  A run whose
-- before-images were removed can no longer be undone, and the ledger says so (never a row that
-- points at a missing snapshot while claiming it can be undone).
ALTER TABLE consolidation_runs ADD COLUMN IF NOT EXISTS files_removed_at timestamptz;
ALTER TABLE consolidation_runs ADD COLUMN IF NOT EXISTS not_undoable text;  -- why, when it cannot be undone any more
