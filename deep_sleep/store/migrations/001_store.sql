-- Deep Sleep store, schema version 1 (SPEC §1).
--
-- Constraints hold what every writer must respect (ids, enums, uniqueness).  Value ranges that
-- legacy or buggy writers may have broken (importance, labels, JSON shape) are deliberately NOT
-- constraints: such rows must be readable so consolidation can quarantine and report them
-- instead of failing the whole scope.  The data-quality suite checks them at rest.
--
-- Every mutable table carries `version bigint`, bumped by a trigger on every UPDATE by anyone,
-- so the version-guarded apply can tell that a live writer touched a row after the snapshot.

CREATE EXTENSION IF NOT EXISTS vector;

CREATE OR REPLACE FUNCTION ds_bump_version() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    NEW.version := OLD.version + 1;
    RETURN NEW;
END
$$;

-- Semantic and working-memory graph nodes.  fillfactor 70 leaves room for HOT updates:
-- consolidation rewrites importance on a large share of nodes every night (FACTS.md).
CREATE TABLE memory_nodes (
    id               uuid PRIMARY KEY,
    scope_path       text,
    tenant_id        text NOT NULL,
    layer            text NOT NULL DEFAULT 'semantic' CHECK (layer IN ('semantic', 'working')),
    label            text NOT NULL,
    properties       jsonb NOT NULL DEFAULT '{}'::jsonb,
    importance       double precision NOT NULL DEFAULT 5.0,
    access_count     bigint NOT NULL DEFAULT 0,
    embedding        vector(256),
    created_at       timestamptz NOT NULL DEFAULT now(),
    updated_at       timestamptz NOT NULL DEFAULT now(),
    last_decayed_at  timestamptz,
    version          bigint NOT NULL DEFAULT 1
) WITH (fillfactor = 70);
CREATE INDEX memory_nodes_scope_updated ON memory_nodes (scope_path, updated_at);
CREATE INDEX memory_nodes_scope_label ON memory_nodes (scope_path, label);
CREATE INDEX memory_nodes_legacy_tenant ON memory_nodes (tenant_id) WHERE scope_path IS NULL;
CREATE INDEX memory_nodes_embedding_hnsw ON memory_nodes USING hnsw (embedding vector_cosine_ops);
CREATE TRIGGER memory_nodes_version BEFORE UPDATE ON memory_nodes
    FOR EACH ROW EXECUTE FUNCTION ds_bump_version();

CREATE TABLE memory_edges (
    id          uuid PRIMARY KEY,
    scope_path  text,
    tenant_id   text NOT NULL,
    source_id   uuid NOT NULL,
    target_id   uuid NOT NULL,
    relation    text NOT NULL,
    weight      double precision NOT NULL DEFAULT 1.0,
    properties  jsonb NOT NULL DEFAULT '{}'::jsonb,
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    valid_from  timestamptz,
    valid_to    timestamptz,
    version     bigint NOT NULL DEFAULT 1,
    CONSTRAINT memory_edges_natural_key UNIQUE NULLS NOT DISTINCT (scope_path, source_id, target_id, relation)
) WITH (fillfactor = 80);
CREATE INDEX memory_edges_scope_source ON memory_edges (scope_path, source_id);
CREATE INDEX memory_edges_scope_target ON memory_edges (scope_path, target_id);
CREATE INDEX memory_edges_legacy_tenant ON memory_edges (tenant_id) WHERE scope_path IS NULL;
CREATE TRIGGER memory_edges_version BEFORE UPDATE ON memory_edges
    FOR EACH ROW EXECUTE FUNCTION ds_bump_version();

CREATE TABLE episodic_events (
    id          uuid PRIMARY KEY,
    scope_path  text,
    tenant_id   text NOT NULL,
    session_id  text,
    content     text NOT NULL,
    metadata    jsonb NOT NULL DEFAULT '{}'::jsonb,
    embedding   vector(256),
    created_at  timestamptz NOT NULL DEFAULT now(),
    version     bigint NOT NULL DEFAULT 1
);
CREATE INDEX episodic_events_scope_created ON episodic_events (scope_path, created_at);
CREATE INDEX episodic_events_legacy_tenant ON episodic_events (tenant_id) WHERE scope_path IS NULL;
CREATE TRIGGER episodic_events_version BEFORE UPDATE ON episodic_events
    FOR EACH ROW EXECUTE FUNCTION ds_bump_version();

-- Append-only log: no version, never updated by consolidation.
CREATE TABLE memory_access_log (
    id           bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    scope_path   text,
    tenant_id    text NOT NULL,
    node_id      uuid NOT NULL,
    accessed_at  timestamptz NOT NULL DEFAULT now(),
    kind         text NOT NULL DEFAULT 'read' CHECK (kind IN ('read', 'write'))
);
CREATE INDEX memory_access_log_scope_at ON memory_access_log (scope_path, accessed_at);

CREATE TABLE procedural_skills (
    id           uuid PRIMARY KEY,
    scope_path   text,
    tenant_id    text NOT NULL,
    name         text NOT NULL,
    description  text NOT NULL DEFAULT '',
    steps        jsonb NOT NULL DEFAULT '[]'::jsonb,
    status       text NOT NULL DEFAULT 'draft' CHECK (status IN ('draft', 'active', 'archived', 'rejected')),
    source       text NOT NULL DEFAULT 'agent',
    pattern_key  text,
    occurrences  bigint NOT NULL DEFAULT 0,
    embedding    vector(256),
    created_at   timestamptz NOT NULL DEFAULT now(),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    version      bigint NOT NULL DEFAULT 1
);
CREATE UNIQUE INDEX procedural_skills_pattern ON procedural_skills (scope_path, pattern_key)
    NULLS NOT DISTINCT WHERE pattern_key IS NOT NULL;
CREATE TRIGGER procedural_skills_version BEFORE UPDATE ON procedural_skills
    FOR EACH ROW EXECUTE FUNCTION ds_bump_version();

CREATE TABLE prospective_triggers (
    id          uuid PRIMARY KEY,
    scope_path  text,
    tenant_id   text NOT NULL,
    condition   text NOT NULL,
    action      text NOT NULL,
    due_at      timestamptz,
    status      text NOT NULL DEFAULT 'pending',
    created_at  timestamptz NOT NULL DEFAULT now(),
    updated_at  timestamptz NOT NULL DEFAULT now(),
    version     bigint NOT NULL DEFAULT 1
);
CREATE INDEX prospective_triggers_scope ON prospective_triggers (scope_path, due_at);
CREATE TRIGGER prospective_triggers_version BEFORE UPDATE ON prospective_triggers
    FOR EACH ROW EXECUTE FUNCTION ds_bump_version();

CREATE TABLE soul_profiles (
    id          uuid PRIMARY KEY,
    scope_path  text,
    tenant_id   text NOT NULL,
    key         text NOT NULL,
    value       text NOT NULL,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    version     bigint NOT NULL DEFAULT 1,
    CONSTRAINT soul_profiles_key UNIQUE NULLS NOT DISTINCT (scope_path, tenant_id, key)
);
CREATE TRIGGER soul_profiles_version BEFORE UPDATE ON soul_profiles
    FOR EACH ROW EXECUTE FUNCTION ds_bump_version();

CREATE TABLE pending_connections (
    id               uuid PRIMARY KEY,
    scope_path       text,
    tenant_id        text NOT NULL,
    source_label     text NOT NULL,
    target_label     text NOT NULL,
    relation         text NOT NULL,
    weight           double precision NOT NULL DEFAULT 1.0,
    created_at       timestamptz NOT NULL DEFAULT now(),
    consumed_by_run  uuid,
    outcome          text,
    version          bigint NOT NULL DEFAULT 1
);
CREATE INDEX pending_connections_scope_open ON pending_connections (scope_path) WHERE consumed_by_run IS NULL;
CREATE TRIGGER pending_connections_version BEFORE UPDATE ON pending_connections
    FOR EACH ROW EXECUTE FUNCTION ds_bump_version();

CREATE TABLE recall_events (
    id            uuid PRIMARY KEY,
    scope_path    text,
    tenant_id     text NOT NULL,
    query         text NOT NULL,
    node_id       uuid NOT NULL,
    similarity    double precision NOT NULL,
    features      double precision[] NOT NULL,
    score         double precision NOT NULL,
    label         double precision,
    label_source  text,
    trained_at    timestamptz,
    created_at    timestamptz NOT NULL DEFAULT now(),
    version       bigint NOT NULL DEFAULT 1
);
CREATE INDEX recall_events_scope_created ON recall_events (scope_path, created_at);
CREATE TRIGGER recall_events_version BEFORE UPDATE ON recall_events
    FOR EACH ROW EXECUTE FUNCTION ds_bump_version();

CREATE TABLE reranker_models (
    id          uuid PRIMARY KEY,
    scope_path  text,
    tenant_id   text NOT NULL,
    weights     double precision[] NOT NULL,
    bias        double precision NOT NULL DEFAULT 0,
    steps       bigint NOT NULL DEFAULT 0,
    updated_at  timestamptz NOT NULL DEFAULT now(),
    version     bigint NOT NULL DEFAULT 1,
    CONSTRAINT reranker_models_scope UNIQUE NULLS NOT DISTINCT (scope_path, tenant_id)
);
CREATE TRIGGER reranker_models_version BEFORE UPDATE ON reranker_models
    FOR EACH ROW EXECUTE FUNCTION ds_bump_version();

-- The run ledger: one row per consolidation attempt of one scope.
CREATE TABLE consolidation_runs (
    run_id          uuid PRIMARY KEY,
    scope_path      text NOT NULL,
    mode            text NOT NULL,
    as_of           timestamptz NOT NULL,
    started_at      timestamptz NOT NULL,
    finished_at     timestamptz,
    status          text NOT NULL CHECK (status IN ('applied', 'failed', 'undone')),
    counters        jsonb NOT NULL DEFAULT '{}'::jsonb,
    phases_run      jsonb NOT NULL DEFAULT '[]'::jsonb,
    phases_skipped  jsonb NOT NULL DEFAULT '{}'::jsonb,
    timings         jsonb NOT NULL DEFAULT '{}'::jsonb,
    rows_changed    jsonb NOT NULL DEFAULT '{}'::jsonb,
    conflicts       bigint NOT NULL DEFAULT 0,
    diff_hash       text,
    snapshot_uri    text,
    diff_uri        text,
    sessions_seen   bigint NOT NULL DEFAULT 0,
    errors          jsonb NOT NULL DEFAULT '[]'::jsonb
);
CREATE INDEX consolidation_runs_scope_asof ON consolidation_runs (scope_path, as_of DESC);

-- Before-images.  Deleted rows are archived whole; for updated rows the prior values live in
-- the run's stored snapshot (consolidation_runs.snapshot_uri): writing half a million
-- before-images a night would double the apply's write cost (SPEC §2 step 4).
CREATE TABLE consolidation_archive (
    run_id       uuid NOT NULL,
    table_name   text NOT NULL,
    row_id       text NOT NULL,
    op           text NOT NULL DEFAULT 'delete',
    reason       text,
    row          jsonb NOT NULL,
    archived_at  timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX consolidation_archive_run ON consolidation_archive (run_id, table_name);
