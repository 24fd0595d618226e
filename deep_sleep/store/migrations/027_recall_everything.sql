-- Recall over everything remembered, with one embedder (SPEC §5 as amended 2026-12-04; issue 30).
--
-- Each stored vector records the model that made it: comparing vectors of two models is an error,
-- never a silent score.  Every vector stored before this migration came from the hashing embedder.
ALTER TABLE memory_nodes ADD COLUMN IF NOT EXISTS embedding_model text;
ALTER TABLE episodic_events ADD COLUMN IF NOT EXISTS embedding_model text;
ALTER TABLE procedural_skills ADD COLUMN IF NOT EXISTS embedding_model text;

-- A recall's hit is a node or an event (recall_events.node_id holds either's id).
ALTER TABLE recall_events ADD COLUMN IF NOT EXISTS item_kind text NOT NULL DEFAULT 'node'
    CHECK (item_kind IN ('node', 'event'));

-- Lexical candidates: PostgreSQL full-text search, which recall fuses with vector similarity.  The
-- text of a node is its label and, for the summaries and clusters consolidation writes, its
-- properties.summary; of an event, its content.  The scope is a lexeme of the same vector ('s' and
-- the md5 of its path; a legacy row's path reads tenant<US>id, SPEC §1), so one GIN index answers
-- "these words in these scopes": GIN's fast scan starts from the scope's short posting list, not
-- from every scope's rows that hold a common word.  The vector is stored (recall ranks with it:
-- recomputing it from an 8,000-character summary on every query would cost milliseconds) and kept
-- by a trigger only when the text changes: decay and strengthen, which set importance alone, never
-- recompute it and stay heap-only updates.
ALTER TABLE memory_nodes ADD COLUMN IF NOT EXISTS search tsvector;
ALTER TABLE episodic_events ADD COLUMN IF NOT EXISTS search tsvector;

CREATE OR REPLACE FUNCTION ds_scope_lexeme(scope_path text, tenant_id text) RETURNS tsvector
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS
$$ SELECT to_tsvector('simple', 's' || md5(coalesce(scope_path, 'tenant' || chr(31) || tenant_id))) $$;

CREATE OR REPLACE FUNCTION ds_node_search() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.label IS DISTINCT FROM OLD.label
       OR NEW.properties->>'summary' IS DISTINCT FROM OLD.properties->>'summary'
       OR NEW.scope_path IS DISTINCT FROM OLD.scope_path THEN
        NEW.search := ds_scope_lexeme(NEW.scope_path, NEW.tenant_id)
                      || to_tsvector('english', NEW.label || ' ' || coalesce(NEW.properties->>'summary', ''));
    END IF;
    RETURN NEW;
END
$$;

CREATE OR REPLACE FUNCTION ds_event_search() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.content IS DISTINCT FROM OLD.content OR NEW.scope_path IS DISTINCT FROM OLD.scope_path THEN
        NEW.search := ds_scope_lexeme(NEW.scope_path, NEW.tenant_id) || to_tsvector('english', NEW.content);
    END IF;
    RETURN NEW;
END
$$;

CREATE TRIGGER memory_nodes_search BEFORE INSERT OR UPDATE OF label, properties, scope_path ON memory_nodes
    FOR EACH ROW EXECUTE FUNCTION ds_node_search();
CREATE TRIGGER episodic_events_search BEFORE INSERT OR UPDATE OF content, scope_path ON episodic_events
    FOR EACH ROW EXECUTE FUNCTION ds_event_search();

-- The rows already stored: a schema change, not an update by anyone (SPEC §1): versions stay as they were.
ALTER TABLE memory_nodes DISABLE TRIGGER memory_nodes_version;
ALTER TABLE episodic_events DISABLE TRIGGER episodic_events_version;
ALTER TABLE procedural_skills DISABLE TRIGGER procedural_skills_version;
UPDATE memory_nodes SET embedding_model = 'hashing-char3gram-blake2b-256' WHERE embedding IS NOT NULL AND embedding_model IS NULL;
UPDATE episodic_events SET embedding_model = 'hashing-char3gram-blake2b-256' WHERE embedding IS NOT NULL AND embedding_model IS NULL;
UPDATE procedural_skills SET embedding_model = 'hashing-char3gram-blake2b-256' WHERE embedding IS NOT NULL AND embedding_model IS NULL;
UPDATE memory_nodes SET search = ds_scope_lexeme(scope_path, tenant_id)
    || to_tsvector('english', label || ' ' || coalesce(properties->>'summary', '')) WHERE search IS NULL;
UPDATE episodic_events SET search = ds_scope_lexeme(scope_path, tenant_id) || to_tsvector('english', content)
    WHERE search IS NULL;
ALTER TABLE memory_nodes ENABLE TRIGGER memory_nodes_version;
ALTER TABLE episodic_events ENABLE TRIGGER episodic_events_version;
ALTER TABLE procedural_skills ENABLE TRIGGER procedural_skills_version;
CREATE INDEX IF NOT EXISTS memory_nodes_search ON memory_nodes USING gin (search);
CREATE INDEX IF NOT EXISTS episodic_events_search ON episodic_events USING gin (search);
-- A scope's nearest events are read exactly (a scope keeps few events: phase 10 folds the rest into
-- summary nodes), through (scope_path, created_at): no vector index to maintain on every turn.
