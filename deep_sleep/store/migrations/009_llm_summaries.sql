-- Optional Claude summaries of phases 4 and 10 (SPEC §7): the cache and the token spend.
--
-- llm_summary_cache: one model summary per (tenant, content hash); the hash covers the model,
-- the prompt version, the phase and the texts summarised (deep_sleep.core.summary), so a rerun
-- or a replay of the same content reads the summary back instead of paying for it twice.
-- Tenants never share an entry: a hit must not tell one tenant what another one stored.
CREATE TABLE IF NOT EXISTS llm_summary_cache (
    tenant_id      text NOT NULL,
    content_hash   text NOT NULL,
    kind           text NOT NULL,
    model          text NOT NULL,
    summary        text NOT NULL,
    input_tokens   bigint NOT NULL DEFAULT 0,
    output_tokens  bigint NOT NULL DEFAULT 0,
    created_at     timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (tenant_id, content_hash)
);

-- llm_token_usage: tokens spent per tenant per UTC day, for the per-tenant daily budget.
CREATE TABLE IF NOT EXISTS llm_token_usage (
    tenant_id      text NOT NULL,
    day            date NOT NULL,
    calls          bigint NOT NULL DEFAULT 0,
    input_tokens   bigint NOT NULL DEFAULT 0,
    output_tokens  bigint NOT NULL DEFAULT 0,
    PRIMARY KEY (tenant_id, day)
);
