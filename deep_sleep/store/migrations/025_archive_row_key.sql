-- A shard's edge delete keeps the edges of a node whose own delete this run skipped (a live write
-- changed the node): it probes the archive once per staged node delete for that node's before-image
-- (statements.shard_delete_sql).  The batch runs with hash joins off, so the probe is a subplan, and
-- on (run_id, table_name) each probe read every node the scope's run had archived — quadratic in a
-- scope's node deletes: a 100k-node scope in a shard with others took 9.0 s for its edge delete
-- against 0.16 s applied alone, and a 1M-node scope's ran for over 13 minutes.  With row_id in the
-- key each probe reads one entry.  The index replaces (run_id, table_name), a prefix of it (undo, gc
-- and the reports read the archive by run and table): one index to maintain per archived row, not
-- two.  (A separate partial index on (run_id, row_id) is not enough: the archive is nearly empty when
-- the statement is planned, and the planner then costs both indexes alike and may take the old one.)
CREATE INDEX consolidation_archive_run_row ON consolidation_archive (run_id, table_name, row_id);
DROP INDEX consolidation_archive_run;
