-- Holds and approval (issue 16, SPEC §9): rows a run held back are kept with the run (its diff
-- directory's held/ folder); the ledger says what was held and what was decided.

-- What the run held: the report's `held` (rows per table and kind, reasons, phases); '{}' for none.
ALTER TABLE consolidation_runs ADD COLUMN IF NOT EXISTS held jsonb NOT NULL DEFAULT '{}'::jsonb;
-- none | pending (nothing decided) | partial (some phases decided) | approved | rejected | decided (mixed).
ALTER TABLE consolidation_runs ADD COLUMN IF NOT EXISTS hold_status text NOT NULL DEFAULT 'none'
    CHECK (hold_status IN ('none', 'pending', 'partial', 'approved', 'rejected', 'decided'));
-- For a ledger row of an approval (mode 'approve'): the run whose held rows it applied.
ALTER TABLE consolidation_runs ADD COLUMN IF NOT EXISTS approval_of uuid REFERENCES consolidation_runs (run_id);

-- One row per (run, phase) decided: a phase's held rows are approved or rejected once.  One
-- `deep-sleep approve` of several phases writes one row per phase with the same decision_id;
-- applied_rows and conflicts are the decision's (all its phases together), and approval_run_id
-- is the ledger row (mode 'approve') of the guarded apply.
CREATE TABLE IF NOT EXISTS consolidation_decisions (
    decision_id      uuid NOT NULL,
    run_id           uuid NOT NULL REFERENCES consolidation_runs (run_id),
    phase            text NOT NULL,
    decision         text NOT NULL CHECK (decision IN ('approved', 'rejected')),
    decided_at       timestamptz NOT NULL DEFAULT now(),
    decided_by       text,
    held_rows        jsonb NOT NULL DEFAULT '{}'::jsonb,   -- this phase's held rows: table → kind → rows
    applied_rows     jsonb NOT NULL DEFAULT '{}'::jsonb,   -- the decision's rows that landed: table → kind → rows
    conflicts        bigint NOT NULL DEFAULT 0,
    approval_run_id  uuid REFERENCES consolidation_runs (run_id),
    PRIMARY KEY (run_id, phase)
);
CREATE INDEX IF NOT EXISTS consolidation_decisions_decision ON consolidation_decisions (decision_id);
