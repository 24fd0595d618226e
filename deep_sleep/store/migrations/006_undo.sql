-- Undo (SPEC §6): an undo is a ledger row of its own (mode 'undo', status 'applied') that names the
-- run it undid; the undone run's status becomes 'undone' (already allowed by the status CHECK).

-- The run an undo row undid.  Unique: a run is undone at most once, even by two racing undos.
ALTER TABLE consolidation_runs ADD COLUMN undo_of uuid REFERENCES consolidation_runs (run_id);
CREATE UNIQUE INDEX consolidation_runs_undo_of ON consolidation_runs (undo_of) WHERE undo_of IS NOT NULL;

-- What an undo could not restore: table → kind of the undone change → reason → rows.
ALTER TABLE consolidation_runs ADD COLUMN not_restored jsonb NOT NULL DEFAULT '{}'::jsonb;
