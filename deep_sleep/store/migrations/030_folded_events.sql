-- Folded turns stay findable one by one (SPEC §3 phase 10 and §5 as amended 2026-12-06; issue 36).
--
-- Phase 10 folds a scope's oldest episodic events into a META:episodic_summary node: the events
-- leave the hot table (whose rows recall scans and ranks on every query) and the apply moves each
-- of them here, whole, under the summary that now carries it.  Recall never scans this table: it
-- finds the summary (whose word key, properties.keywords, holds every folded turn's words, and whose
-- vector embeds them), then reads only that summary's rows here (summary_id's index) and hands back
-- the lines that best match the query, each with its own event id.  So a night shrinks what recall
-- searches per query, not what it can find.  The rows are immutable; the undo of the fold deletes
-- them as it re-inserts the events (the before-images stay in consolidation_archive as for any delete).
CREATE TABLE IF NOT EXISTS episodic_folded (
    id              uuid PRIMARY KEY,          -- the event's own id
    summary_id      uuid NOT NULL,             -- the META:episodic_summary node that carries it
    run_id          uuid NOT NULL,             -- the run whose apply folded it
    scope_path      text,
    tenant_id       text NOT NULL,
    session_id      text,
    content         text NOT NULL,
    metadata        jsonb NOT NULL DEFAULT '{}'::jsonb,
    embedding       vector(256),
    embedding_model text,
    created_at      timestamptz NOT NULL,
    folded_at       timestamptz NOT NULL DEFAULT now(),
    search          tsvector,                  -- the event's own (no index: read by summary_id only)
    version         bigint NOT NULL DEFAULT 1
);
-- never changed by a night; `deep-sleep reembed` and the scope backfill are the writers, version-bumped as everywhere
CREATE TRIGGER episodic_folded_version BEFORE UPDATE ON episodic_folded FOR EACH ROW EXECUTE FUNCTION ds_bump_version();
CREATE INDEX IF NOT EXISTS episodic_folded_summary ON episodic_folded (summary_id, created_at);
CREATE INDEX IF NOT EXISTS episodic_folded_scope ON episodic_folded (scope_path);
-- a legacy scope's night folds legacy events (scope_path null): the scope backfill pages them as it
-- pages every table's (migration 005's index shape)
CREATE INDEX IF NOT EXISTS episodic_folded_legacy_tenant ON episodic_folded (tenant_id) WHERE scope_path IS NULL;
CREATE INDEX IF NOT EXISTS episodic_folded_legacy_key ON episodic_folded (id) INCLUDE (tenant_id) WHERE scope_path IS NULL;

-- A summary node's word key is its label, its digest and its folded turns' words (properties.keywords).
CREATE OR REPLACE FUNCTION ds_node_search() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.label IS DISTINCT FROM OLD.label
       OR NEW.properties->>'summary' IS DISTINCT FROM OLD.properties->>'summary'
       OR NEW.properties->>'keywords' IS DISTINCT FROM OLD.properties->>'keywords'
       OR NEW.scope_path IS DISTINCT FROM OLD.scope_path THEN
        NEW.search := ds_scope_lexeme(NEW.scope_path, NEW.tenant_id)
                      || to_tsvector('english', NEW.label || ' ' || coalesce(NEW.properties->>'summary', '')
                                     || ' ' || coalesce(NEW.properties->>'keywords', ''));
    END IF;
    RETURN NEW;
END
$$;
