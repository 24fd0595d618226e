-- Each tenant's embedding model (issue 37): a turn recorded with another model's embedder was accepted,
-- and from then on every recall of that scope refused.  A recall reads a scope and its ancestors, never
-- another tenant, so one model per tenant keeps every recall's candidates comparable.  Every writer of
-- vectors (record_turn, a night's or an approval's apply) checks its tenant's row and claims it when
-- there is none; recall checks it; `deep-sleep reembed` sets it (for the tenants of the scopes it
-- rewrites, or all) before it rewrites their vectors.  Tenants that already hold vectors take the
-- model of their vectors (one full pass over the three tables, once).
CREATE TABLE IF NOT EXISTS embedding_models (
    tenant_id text PRIMARY KEY,
    model text NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);

INSERT INTO embedding_models (tenant_id, model)
SELECT DISTINCT ON (tenant_id) tenant_id, embedding_model FROM (
    SELECT tenant_id, embedding_model FROM memory_nodes WHERE embedding_model IS NOT NULL AND embedding IS NOT NULL
    UNION ALL
    SELECT tenant_id, embedding_model FROM episodic_events WHERE embedding_model IS NOT NULL AND embedding IS NOT NULL
    UNION ALL
    SELECT tenant_id, embedding_model FROM procedural_skills WHERE embedding_model IS NOT NULL AND embedding IS NOT NULL
) found
WHERE tenant_id IS NOT NULL
ORDER BY tenant_id, embedding_model
ON CONFLICT (tenant_id) DO NOTHING;
