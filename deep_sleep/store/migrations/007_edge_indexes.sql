-- memory_edges_natural_key (scope_path, source_id, target_id, relation) already serves every lookup
-- by (scope_path, source_id) as its leading columns, so the separate index only cost writes: one
-- more index entry per inserted edge (~200k a night at a million nodes) and per non-HOT update.
DROP INDEX IF EXISTS memory_edges_scope_source;
