-- Decisions by row (issue 37 items 2-4): a decision takes exactly the held rows it selects (by phase
-- and by reason) plus the graph closure they need, so a phase's rows may be decided by several
-- decisions (`approve --reason used_node`, then `reject --reason delete_share`).  Each decided row is
-- one row here, written in the deciding transaction; its primary key is what two racing decisions of
-- the same row collide on (the loser rolls back having written nothing), as the (run, phase) key of
-- consolidation_decisions did.  `closure`: the row was not selected, the closure of the selection
-- needed it (an edge goes with its node, a META node's rows go together, every row of an id goes
-- together); `reason` is the rule that held it (held/reasons.parquet).
CREATE TABLE IF NOT EXISTS consolidation_decided_rows (
    run_id       uuid NOT NULL REFERENCES consolidation_runs (run_id),
    table_name   text NOT NULL,
    kind         text NOT NULL CHECK (kind IN ('inserts', 'updates', 'deletes')),
    row_id       text NOT NULL,
    phase        text NOT NULL,
    reason       text NOT NULL,
    decision     text NOT NULL CHECK (decision IN ('approved', 'rejected')),
    decision_id  uuid NOT NULL,
    closure      boolean NOT NULL DEFAULT false,
    PRIMARY KEY (run_id, table_name, kind, row_id, phase)
);
CREATE INDEX IF NOT EXISTS consolidation_decided_rows_decision ON consolidation_decided_rows (decision_id);

-- consolidation_decisions keeps one row per (decision, phase) it touched: a phase may now be decided
-- in parts, so (run, phase) is no longer unique.  `by_rows`: the decision's rows are listed in
-- consolidation_decided_rows; false for the decisions of earlier releases (and a rejection of a run
-- whose held files are gone), which decided their whole phase — at most one such per (run, phase).
ALTER TABLE consolidation_decisions ADD COLUMN IF NOT EXISTS by_rows boolean NOT NULL DEFAULT false;
ALTER TABLE consolidation_decisions DROP CONSTRAINT IF EXISTS consolidation_decisions_pkey;
ALTER TABLE consolidation_decisions ADD PRIMARY KEY (run_id, phase, decision_id);
CREATE UNIQUE INDEX IF NOT EXISTS consolidation_decisions_whole_phase ON consolidation_decisions (run_id, phase)
    WHERE NOT by_rows;
