"""Configuration of the optional Claude summaries of phases 4 and 10 (SPEC §7).

Off by default, and on only with ``enabled = true`` *and* an API key in the environment variable
named by ``api_key_env``: enabling it sends the summarised memory content (member labels of a
META group, the contents of episodic events) to the Anthropic API.  The key itself is never part
of the configuration (so it never lands in a TOML file, a report or a ledger row).

    >>> LlmConfig().enabled
    False
    >>> LlmConfig(enabled=True, run_token_budget=0).run_token_budget
    0

In ``ConsolidationConfig`` this is the ``llm`` section: ``[llm]`` in the TOML file, or
``DEEP_SLEEP_LLM__ENABLED=true`` etc. in the environment.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class LlmConfig(BaseModel):
    """enabled: the explicit switch (default off: nothing is ever sent).
    api_key_env: the environment variable holding the API key.
    base_url: the Messages API's base URL (None: the SDK's default, or ``ANTHROPIC_BASE_URL``).
    model: the model asked; part of the cache key, and written into ``properties.summary_model``.
    groups_per_request: how many groups one Messages request summarises (batching).
    max_output_tokens_per_group: the output allowance per group (``max_tokens`` = this × groups).
    max_summary_chars: a longer model summary is cut to this length.
    run_token_budget: input + output tokens one run (one plan) may spend; 0 spends nothing.
    tenant_daily_token_budget: input + output tokens one tenant may spend per UTC day (kept in
        the store's ``llm_token_usage``); 0 spends nothing.
    max_retries: retries of one request on 429, 5xx, timeouts and connection errors.
    backoff_seconds, max_backoff_seconds: the wait before retry n is backoff × 2^n, at most
        the maximum; a 429's ``retry-after`` is honoured instead (also capped).
    timeout_seconds: per request.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = False
    api_key_env: str = "ANTHROPIC_API_KEY"
    base_url: str | None = None
    model: str = "claude-haiku-4-5"
    groups_per_request: int = Field(8, ge=1, le=100)
    max_output_tokens_per_group: int = Field(160, ge=16)
    max_summary_chars: int = Field(2000, ge=40)
    run_token_budget: int = Field(200_000, ge=0)
    tenant_daily_token_budget: int = Field(2_000_000, ge=0)
    max_retries: int = Field(3, ge=0, le=10)
    backoff_seconds: float = Field(1.0, ge=0)
    max_backoff_seconds: float = Field(30.0, ge=0)
    timeout_seconds: float = Field(30.0, gt=0)
