-- An approval's decision rows are written inside its apply's own transaction, before its writes
-- (SPEC §9; issue 31): two approvals of one run race on the rows' primary key, and the loser rolls
-- back having written nothing.  What an approval applied and its conflicts are then its own ledger
-- row's (mode 'approve', rows_changed, conflicts), which decisions name by approval_run_id; the
-- decision rows no longer keep a copy (it could only be written after the writes).
ALTER TABLE consolidation_decisions DROP COLUMN IF EXISTS applied_rows;
ALTER TABLE consolidation_decisions DROP COLUMN IF EXISTS conflicts;
CREATE INDEX IF NOT EXISTS consolidation_decisions_approval ON consolidation_decisions (approval_run_id);
-- The decision rows come first in the approval's transaction (right after the scope's lock: the race
-- is decided before any write), before the approval's own ledger row, which they name: the check of
-- that reference waits for the commit.
ALTER TABLE consolidation_decisions ALTER CONSTRAINT consolidation_decisions_approval_run_id_fkey
    DEFERRABLE INITIALLY DEFERRED;
