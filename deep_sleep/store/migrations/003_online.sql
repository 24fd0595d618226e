-- The online path (SPEC §5): live turns, recall, and the quick nap.

-- One row per scope that has recorded a turn.  record_turn bumps `turns` first thing in its
-- transaction, so the row lock also serialises the turns of one scope (two concurrent turns
-- cannot both insert the same new label) and `turns % quick_nap_interval = 0` picks exactly
-- one turn per interval to run the quick nap.
CREATE TABLE scope_turns (
    scope_path    text PRIMARY KEY,
    tenant_id     text NOT NULL,
    turns         bigint NOT NULL DEFAULT 0,
    last_turn_at  timestamptz
);

-- register_skill does not file the same skill name twice in one scope.
CREATE INDEX procedural_skills_scope_name ON procedural_skills (scope_path, lower(name));

-- The quick nap reads the recent SOUL: edits of a scope without walking all its recent nodes.
-- Partial, so it holds only protected identity nodes; `label` and `updated_at` are columns
-- consolidation never rewrites, so nightly importance updates stay HOT.
CREATE INDEX memory_nodes_soul_recent ON memory_nodes (scope_path, updated_at) WHERE label LIKE 'SOUL:%';
