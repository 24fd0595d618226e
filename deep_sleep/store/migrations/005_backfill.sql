-- The scope backfill (SPEC §6): write scope_path on legacy rows (scope_path IS NULL).

-- One row per (job, table): where the job's current pass over the table has got to.  A batch's
-- rows and this row's counters commit in the same transaction, so a killed job resumes after
-- the last committed key and no row is ever counted twice.
CREATE TABLE scope_backfill_checkpoints (
    job             text NOT NULL,
    table_name      text NOT NULL,
    pass            integer NOT NULL DEFAULT 1,   -- passes over the table (a sweep or a rerun starts another)
    last_key        text,                         -- primary key of the last row the pass handled (NULL: start)
    rows_done       bigint NOT NULL DEFAULT 0,    -- rows this job has backfilled in the table, all passes
    batches         bigint NOT NULL DEFAULT 0,
    started_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    finished_at     timestamptz,                  -- the current pass reached the end of the table
    PRIMARY KEY (job, table_name)
);

-- Legacy rows the backfill left alone on purpose: the target path would collide with a row
-- already there under a unique key, or the tenant_id is not a valid scope id.  Neither row is
-- overwritten or dropped; the operator resolves them (and a rerun then backfills the row).
CREATE TABLE scope_backfill_conflicts (
    job          text NOT NULL,
    table_name   text NOT NULL,
    row_id       text NOT NULL,
    reason       text NOT NULL CHECK (reason IN ('collision', 'invalid_tenant_id')),
    existing_id  text,            -- the row already at the target path (collision)
    target_path  text,
    index_name   text,            -- the unique index that would be violated
    found_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (job, table_name, row_id)
);

-- Keyset pagination over the legacy rows of every table that can hold them (a nullable
-- scope_path, a tenant_id and a one-column primary key; found in the catalog, so tables of
-- earlier migrations are covered without listing them).  Partial: the index holds only rows
-- still without a path, so it costs live writers of scoped rows nothing and empties as the
-- backfill proceeds; INCLUDE (tenant_id) lets the dry run count per tenant from the index.
DO $$
DECLARE
    t record;
BEGIN
    FOR t IN
        SELECT c.relname, a.attname AS pk
        FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = current_schema()
        JOIN pg_index x ON x.indrelid = c.oid AND x.indisprimary AND x.indnkeyatts = 1
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = x.indkey[0]
        WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
          AND EXISTS (SELECT 1 FROM pg_attribute s WHERE s.attrelid = c.oid AND s.attname = 'scope_path'
                      AND NOT s.attnotnull AND NOT s.attisdropped)
          AND EXISTS (SELECT 1 FROM pg_attribute s WHERE s.attrelid = c.oid AND s.attname = 'tenant_id'
                      AND NOT s.attisdropped)
        ORDER BY c.relname
    LOOP
        EXECUTE format('CREATE INDEX IF NOT EXISTS %I ON %I (%I) INCLUDE (tenant_id) WHERE scope_path IS NULL',
                       t.relname || '_legacy_key', t.relname, t.pk);
    END LOOP;
END
$$;
