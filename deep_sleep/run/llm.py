"""Claude summaries for phases 4 and 10 (SPEC §7): the client, the cache, the budget, the fallback.

The phases stay pure: they build the deterministic text, ask a
:class:`~deep_sleep.core.summary.Summarizer` for a better one and keep theirs whenever the answer
is ``None``.  :class:`ClaudeSummarizer` is the summarizer with side effects, built by the runner
(:func:`summarizer_for`) and handed to :func:`deep_sleep.run.transform.transform`:

1. **Cache** — each group's content hash (model, prompt version, phase, texts;
   :meth:`SummaryRequest.content_hash`) is looked up in ``llm_summary_cache`` (per tenant).  A hit
   costs nothing, so a rerun or a replay never pays twice and gets the same text: the same diff hash.
2. **Batching** — the misses of one tenant go out ``groups_per_request`` at a time, several groups
   in one Messages request, answered as one JSON object.  Not the Message Batches API: its results
   come back within 24 h, after the run that needs them has applied its diff; a synchronous request
   per ~8 groups keeps the plan one step, and a night of small scopes has only a few groups each.
3. **Budget** — before a request, its worst case (input estimated at 1 token per 3 characters, plus
   the output allowance) must fit in what is left of the run's budget and of the tenant's budget for
   the UTC day (``llm_token_usage``); otherwise the request is not sent, its groups fall back, and
   no further request is sent for that run (or that tenant and day).  What a request really cost
   (the response's ``usage``) is what is spent.
4. **Retries** — on 429 (waiting the ``retry-after`` header), 5xx, timeouts and connection errors,
   up to ``max_retries`` times with exponential backoff; other errors are not retried.
5. **Fallback** — a request that still fails, an answer that is not the JSON asked for, a group
   missing from it or an empty summary: those groups keep the deterministic text.  Nothing here
   ever fails the run.

Replay (:func:`summarizer_for` with ``offline=True``) never calls the API: it answers from the
cache alone, so a replay with the cache reproduces the night's diff hash, and without it (another
database, a cleared cache) every group falls back — the diff hash is then that of a run with the
model off.  The counters (:meth:`ClaudeSummarizer.counters`) go into ``report.llm``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime

from deep_sleep.transforms.config import ConsolidationConfig
from deep_sleep.core.errors import ConfigError, DeepSleepError
from deep_sleep.core.llm_config import LlmConfig
from deep_sleep.core.scope import Scope
from deep_sleep.core.summary import Summarizer, Summary, SummaryRequest
from deep_sleep.store.db import Store

log = logging.getLogger(__name__)

PROMPT_VERSION = "deep-sleep-summaries-v1"
CHARS_PER_TOKEN = 3  # a pessimistic estimate for the budget check (English runs ~4)
PROMPT_OVERHEAD_TOKENS = 200
COUNTER_NAMES = ("calls", "retries", "input_tokens", "output_tokens", "cache_hits", "model_summaries",
                 "fallbacks", "fallback_budget", "fallback_error", "fallback_malformed", "fallback_cache_miss")

SYSTEM = (
    "You write short factual summaries of an AI agent's memories. You receive numbered groups; each is "
    "either a group of related memory labels (kind meta_nodes) or a batch of episodic events (kind "
    "episodic_summary). Summarise each group in one to three sentences, using only what it says. Answer "
    'with one JSON object and nothing else: {"summaries": [{"id": "<group id>", "summary": "<text>"}]}, '
    "one entry per group."
)


def _prompt(batch: Sequence[SummaryRequest]) -> str:
    groups = [{"id": f"g{i}", "kind": r.kind, "items": list(r.items)} for i, r in enumerate(batch)]
    return json.dumps({"groups": groups}, ensure_ascii=False, indent=1)


class MalformedAnswer(DeepSleepError, ValueError):
    """The model's answer is not of the asked shape (its groups then fall back to the deterministic text)."""


def _parse(text: str, n: int, max_chars: int) -> list[str | None]:
    """The summaries of ``g0``…``g{n-1}`` in ``text`` (None for each one missing or empty).

    Raises ValueError when ``text`` holds no JSON object of the asked shape."""
    match = re.search(r"\{.*\}", text, re.DOTALL)  # tolerate a sentence or a code fence around it
    if not match:
        raise MalformedAnswer("no JSON object in the answer")
    data = json.loads(match.group(0))
    entries = data.get("summaries") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise MalformedAnswer('the answer has no "summaries" list')
    out: list[str | None] = [None] * n
    for entry in entries:
        if not isinstance(entry, dict):
            continue
        gid, summary = entry.get("id"), entry.get("summary")
        if isinstance(gid, str) and re.fullmatch(r"g\d+", gid) and int(gid[1:]) < n and isinstance(summary, str):
            summary = " ".join(summary.split())
            if summary:
                out[int(gid[1:])] = summary[:max_chars]
    return out


class SummaryCache:
    """Model summaries by (tenant, content hash) in the store's ``llm_summary_cache``."""

    def __init__(self, store: Store):
        self.store = store

    def get(self, tenant_id: str, hashes: Sequence[str]) -> dict[str, Summary]:
        if not hashes:
            return {}
        with self.store.pg() as con:
            rows = con.execute(
                "SELECT content_hash, summary, model FROM llm_summary_cache WHERE tenant_id = %s AND content_hash = ANY(%s)",
                (tenant_id, list(hashes)),
            ).fetchall()
        return {h: Summary(text, model) for h, text, model in rows}

    def put(self, tenant_id: str, rows: Sequence[tuple[str, str, Summary]], input_tokens: int, output_tokens: int) -> None:
        """Store ``(content hash, kind, summary)`` rows; a request's tokens are shared out over its rows."""
        if not rows:
            return
        n = len(rows)
        with self.store.pg() as con, con.transaction():
            con.cursor().executemany(
                "INSERT INTO llm_summary_cache (tenant_id, content_hash, kind, model, summary, input_tokens, output_tokens) "
                "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (tenant_id, content_hash) DO NOTHING",
                [(tenant_id, h, kind, s.model, s.text, input_tokens // n, output_tokens // n) for h, kind, s in rows],
            )


class TokenUsage:
    """Tokens spent per tenant per UTC day, in the store's ``llm_token_usage``."""

    def __init__(self, store: Store):
        self.store = store

    def spent(self, tenant_id: str, day: date) -> int:
        with self.store.pg() as con:
            row = con.execute(
                "SELECT input_tokens + output_tokens FROM llm_token_usage WHERE tenant_id = %s AND day = %s",
                (tenant_id, day),
            ).fetchone()
        return int(row[0]) if row else 0

    def add(self, tenant_id: str, day: date, input_tokens: int, output_tokens: int) -> None:
        with self.store.pg() as con, con.transaction():
            con.execute(
                "INSERT INTO llm_token_usage AS u (tenant_id, day, calls, input_tokens, output_tokens) VALUES (%s, %s, 1, %s, %s) "
                "ON CONFLICT (tenant_id, day) DO UPDATE SET calls = u.calls + 1, "
                "input_tokens = u.input_tokens + EXCLUDED.input_tokens, output_tokens = u.output_tokens + EXCLUDED.output_tokens",
                (tenant_id, day, input_tokens, output_tokens),
            )


@dataclass
class _Answer:
    text: str
    input_tokens: int
    output_tokens: int


class ClaudeSummarizer:
    """A :class:`~deep_sleep.core.summary.Summarizer` backed by Claude, the store's cache and budget.

    config: the ``llm`` section.
    store: where the cache and the daily usage live; None keeps both in this object only (then the
        per-tenant daily budget counts only this object's spend).
    client: an ``anthropic.Anthropic`` (built from the config and the API key when None).
    offline: answer from the cache only, never call the API (replay).
    sleep, today: the wait between retries and the UTC day of the spend (tests pass their own).
    """

    def __init__(self, config: LlmConfig, store: Store | None = None, client=None, *, offline: bool = False,
                 api_key: str | None = None, sleep: Callable[[float], None] = time.sleep,
                 today: Callable[[], date] = lambda: datetime.now(UTC).date()):
        self.config = config
        self.offline = offline
        self.cache = SummaryCache(store) if store is not None else None
        self.usage = TokenUsage(store) if store is not None else None
        self._memo: dict[tuple[str, str], Summary] = {}
        self._day_spend: dict[tuple[str, date], int] = {}
        self._run_spent = 0
        self._run_exhausted = False
        self._tenant_exhausted: set[tuple[str, date]] = set()
        self._sleep, self._today = sleep, today
        self._counts = dict.fromkeys(COUNTER_NAMES, 0)
        if client is None and not offline:
            import anthropic

            client = anthropic.Anthropic(api_key=api_key, base_url=config.base_url, max_retries=0,
                                         timeout=config.timeout_seconds)
        self.client = client

    # -- the Summarizer protocol -----------------------------------------------------------------
    def summarize(self, requests: Sequence[SummaryRequest]) -> list[Summary | None]:
        out: list[Summary | None] = [None] * len(requests)
        by_tenant: dict[str, list[int]] = {}
        for i, r in enumerate(requests):
            by_tenant.setdefault(Scope.coerce(r.scope_path).tenant_id, []).append(i)
        for tenant, idx in by_tenant.items():
            hashes = {i: requests[i].content_hash(self.config.model, PROMPT_VERSION) for i in idx}
            found = self._cached(tenant, sorted(set(hashes.values())))
            misses = []
            for i in idx:
                if hashes[i] in found:
                    out[i] = found[hashes[i]]
                    self._counts["cache_hits"] += 1
                else:
                    misses.append(i)
            if self.offline:
                self._fallback("fallback_cache_miss", len(misses))
                continue
            step = self.config.groups_per_request
            for start in range(0, len(misses), step):
                chunk = misses[start:start + step]
                for i, s in zip(chunk, self._ask(tenant, [requests[i] for i in chunk], [hashes[i] for i in chunk]),
                                strict=True):
                    out[i] = s
        self._counts["model_summaries"] += sum(s is not None for s in out)
        return out

    def counters(self) -> dict[str, int]:
        """Cumulative: calls (Messages requests sent, each retry counted), retries, input/output tokens,
        cache hits, model summaries (from the API or the cache), fallbacks and their reasons."""
        return dict(self._counts)

    # -- the parts ---------------------------------------------------------------------------------
    def _fallback(self, reason: str, n: int) -> None:
        self._counts["fallbacks"] += n
        self._counts[reason] += n

    def _cached(self, tenant: str, hashes: list[str]) -> dict[str, Summary]:
        found = {h: self._memo[(tenant, h)] for h in hashes if (tenant, h) in self._memo}
        rest = [h for h in hashes if h not in found]
        if self.cache is not None and rest:
            try:
                found.update(self.cache.get(tenant, rest))
            except Exception as e:  # a cache we cannot read is a miss, not a failed run
                log.warning("llm summary cache not readable (%s): treating as misses", e)
        return found

    def _spent_today(self, tenant: str, day: date) -> int:
        if self.usage is not None:
            try:
                return self.usage.spent(tenant, day)
            except Exception as e:
                log.warning("llm token usage not readable (%s): not calling", e)
                return self.config.tenant_daily_token_budget  # unknown spend: assume spent
        return self._day_spend.get((tenant, day), 0)

    def _estimate(self, batch: Sequence[SummaryRequest]) -> int:
        chars = len(SYSTEM) + len(_prompt(batch))
        return PROMPT_OVERHEAD_TOKENS + -(-chars // CHARS_PER_TOKEN) + self.config.max_output_tokens_per_group * len(batch)

    def _ask(self, tenant: str, batch: list[SummaryRequest], hashes: list[str]) -> list[Summary | None]:
        n = len(batch)
        estimate, day = self._estimate(batch), self._today()
        if self._run_exhausted or (tenant, day) in self._tenant_exhausted:
            self._fallback("fallback_budget", n)
            return [None] * n
        if self._run_spent + estimate > self.config.run_token_budget:
            self._run_exhausted = True  # spent: no more requests in this run, even smaller ones
        elif self._spent_today(tenant, day) + estimate > self.config.tenant_daily_token_budget:
            self._tenant_exhausted.add((tenant, day))
        if self._run_exhausted or (tenant, day) in self._tenant_exhausted:
            self._fallback("fallback_budget", n)
            return [None] * n
        answer = self._call(batch)
        if answer is None:
            self._fallback("fallback_error", n)
            return [None] * n
        self._run_spent += answer.input_tokens + answer.output_tokens
        self._counts["input_tokens"] += answer.input_tokens
        self._counts["output_tokens"] += answer.output_tokens
        self._day_spend[(tenant, day)] = self._day_spend.get((tenant, day), 0) + answer.input_tokens + answer.output_tokens
        if self.usage is not None:
            try:
                self.usage.add(tenant, day, answer.input_tokens, answer.output_tokens)
            except Exception as e:
                log.warning("llm token usage not recorded (%s)", e)
        try:
            texts = _parse(answer.text, n, self.config.max_summary_chars)
        except ValueError as e:
            log.warning("llm answer malformed (%s): %d group(s) keep the deterministic summary", e, n)
            self._fallback("fallback_malformed", n)
            return [None] * n
        out = [Summary(t, self.config.model) if t else None for t in texts]
        self._fallback("fallback_malformed", sum(s is None for s in out))
        fresh = [(h, r.kind, s) for h, r, s in zip(hashes, batch, out, strict=True) if s is not None]
        for h, _, s in fresh:
            self._memo[(tenant, h)] = s
        if self.cache is not None:
            try:
                self.cache.put(tenant, fresh, answer.input_tokens, answer.output_tokens)
            except Exception as e:
                log.warning("llm summaries not cached (%s)", e)
        return out

    def _call(self, batch: Sequence[SummaryRequest]) -> _Answer | None:
        """One Messages request with retries; None once it has failed for good."""
        import anthropic

        cfg = self.config
        for attempt in range(cfg.max_retries + 1):
            self._counts["calls"] += 1
            if attempt:
                self._counts["retries"] += 1
            try:
                resp = self.client.messages.create(
                    model=cfg.model, max_tokens=cfg.max_output_tokens_per_group * len(batch) + 64, system=SYSTEM,
                    messages=[{"role": "user", "content": _prompt(batch)}],
                )
            except anthropic.RateLimitError as e:
                wait = _retry_after(e.response.headers) if e.response is not None else None
                reason = f"429 rate limited (retry-after {wait})"
            except anthropic.APIStatusError as e:
                if e.status_code < 500:  # 400, 401, 403, 404…: asking again gives the same answer
                    log.warning("llm request refused (%s %s): falling back", e.status_code, e.message)
                    return None
                wait, reason = None, f"{e.status_code} server error"
            except (anthropic.APITimeoutError, anthropic.APIConnectionError) as e:
                wait, reason = None, type(e).__name__
            else:
                text = "".join(getattr(b, "text", "") for b in resp.content if getattr(b, "type", "") == "text")
                return _Answer(text, int(resp.usage.input_tokens or 0), int(resp.usage.output_tokens or 0))
            if attempt == cfg.max_retries:
                log.warning("llm request failed after %d attempt(s) (%s): falling back", attempt + 1, reason)
                return None
            backoff = cfg.backoff_seconds * 2**attempt if wait is None else wait
            self._sleep(min(backoff, cfg.max_backoff_seconds))
        return None


def _retry_after(headers) -> float | None:
    for name, scale in (("retry-after-ms", 0.001), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is not None:
            try:
                return max(0.0, float(value) * scale)
            except ValueError:
                continue
    return None


def summarizer_for(config: ConsolidationConfig | LlmConfig, store: Store | None = None, *, offline: bool = False,
                   client=None, **kwargs) -> Summarizer | None:
    """The summarizer a run should hand its phases: None (the deterministic text) unless the model
    is enabled.  Enabled without an API key is an error that says how to fix it; ``offline`` (replay)
    needs no key and never calls the API."""
    llm = config.llm if isinstance(config, ConsolidationConfig) else config
    if not llm.enabled:
        return None
    key = None
    if not offline and client is None:
        key = os.environ.get(llm.api_key_env)
        if not key:
            raise ConfigError(
                f"llm.enabled is true but ${llm.api_key_env} is empty: set the API key in {llm.api_key_env} "
                "(enabling the model sends memory content to the Anthropic API), or set llm.enabled = false"
            )
    return ClaudeSummarizer(llm, store, client, offline=offline, api_key=key, **kwargs)


__all__ = ["ClaudeSummarizer", "PROMPT_VERSION", "SummaryCache", "TokenUsage", "summarizer_for"]
