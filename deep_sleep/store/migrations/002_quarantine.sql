-- Quarantine (SPEC §4): rows a run set aside because they break the store's invariants.
-- The rows themselves stay where they are, untouched; this is the record of what was skipped and why.
CREATE TABLE consolidation_quarantine (
    run_id          uuid NOT NULL,
    scope_path      text NOT NULL,
    table_name      text NOT NULL,
    row_id          text,
    reason          text NOT NULL,
    row             jsonb NOT NULL,
    quarantined_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX consolidation_quarantine_run ON consolidation_quarantine (run_id);
CREATE INDEX consolidation_quarantine_scope ON consolidation_quarantine (scope_path, quarantined_at);

ALTER TABLE consolidation_runs ADD COLUMN quarantined jsonb NOT NULL DEFAULT '{}'::jsonb;
