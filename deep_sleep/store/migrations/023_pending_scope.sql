-- Every extract reads a scope's pending connections by scope_path alone (consumed or not: the
-- phases decide), which the partial index on open rows cannot serve: each night's extract of a
-- shard (and of each scope on the per-scope path) scanned the whole table -- 0.46 s per shard of
-- 1,352 scopes at 100,000 scopes, growing with the fleet.  A full index on scope_path serves the
-- extract and the open-row lookups (health) alike; the partial one goes.
CREATE INDEX IF NOT EXISTS pending_connections_scope ON pending_connections (scope_path);
DROP INDEX IF EXISTS pending_connections_scope_open;
