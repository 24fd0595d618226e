"""The optional Claude summaries (SPEC §7) through the real ``anthropic`` client, pointed at a local
HTTP server on 127.0.0.1 that speaks the Messages API, with the cache and the daily budget in the
real store."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, date, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import anthropic
import polars as pl
import pytest
from deep_sleep.transforms.config import ConsolidationConfig

from deep_sleep.core.errors import ConfigError
from deep_sleep.core.llm_config import LlmConfig
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.dev.seed import SeedSpec, generate, scopes_of
from deep_sleep.run.llm import ClaudeSummarizer, summarizer_for
from deep_sleep.run.transform import transform
from deep_sleep.run.pipeline import consolidate
from tests.storeutil import insert, node, scalar

AS_OF = datetime(2026, 11, 29, 3, 0, tzinfo=UTC)
TODAY = date(2026, 11, 29)
META_GROUPS, EPISODIC_BATCHES = 25, 1  # what the seeded scope below gives (asserted in the first test)


class MessagesAPI:
    """A loopback server answering ``POST /v1/messages``.  ``script`` holds what the next requests
    get ("ok", "malformed", "half", ("status", code, headers), ("sleep", seconds)); once it is empty,
    every request gets "ok": a JSON summary of each group it was sent."""

    def __init__(self):
        self.requests: list[dict] = []
        self.script: list = []
        api = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                api.requests.append({"path": self.path, "body": body, "headers": {k.lower(): v for k, v in self.headers.items()}})
                action = api.script.pop(0) if api.script else "ok"
                if isinstance(action, tuple) and action[0] == "sleep":
                    time.sleep(action[1])
                    action = "ok"
                if isinstance(action, tuple) and action[0] == "status":
                    _, code, headers = action
                    return self._send(code, {"type": "error", "error": {"type": "api_error", "message": f"scripted {code}"}},
                                      headers)
                groups = json.loads(body["messages"][0]["content"])["groups"]
                if action == "malformed":
                    text = "Sure! Here are your summaries: the groups look fine."
                else:
                    keep = groups[::2] if action == "half" else groups
                    text = json.dumps({"summaries": [
                        {"id": g["id"], "summary": f"Model: {g['kind']} of {len(g['items'])} item(s), first {g['items'][0]!r}"}
                        for g in keep]})
                self._send(200, {
                    "id": f"msg_{len(api.requests)}", "type": "message", "role": "assistant", "model": body["model"],
                    "content": [{"type": "text", "text": text}], "stop_reason": "end_turn", "stop_sequence": None,
                    "usage": {"input_tokens": 40 * len(groups), "output_tokens": 20 * len(groups)},
                })

            def _send(self, code, payload, headers=None):
                data = json.dumps(payload).encode()
                try:
                    self.send_response(code)
                    self.send_header("content-type", "application/json")
                    self.send_header("content-length", str(len(data)))
                    for k, v in (headers or {}).items():
                        self.send_header(k, v)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):  # the client timed out and left
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def group_counts(self) -> list[int]:
        return [len(json.loads(r["body"]["messages"][0]["content"])["groups"]) for r in self.requests]


@pytest.fixture
def api():
    server = MessagesAPI()
    server.thread.start()
    yield server
    server.server.shutdown()
    server.server.server_close()


@pytest.fixture
def snapshot(scope) -> Snapshot:
    """A seeded scope (300 nodes, 120 events) moved into this test's own scope (and so tenant)."""
    spec = SeedSpec(tenants=1, scopes_per_tenant=1, nodes_per_scope=300, seed=5, now=AS_OF)
    frames = generate(spec)
    seeded = scopes_of(spec)[-1].path
    mine = {}
    for table, frame in frames.items():
        if "scope_path" in frame.columns:
            frame = frame.filter(pl.col("scope_path") == seeded).with_columns(pl.lit(scope.path).alias("scope_path"))
            if "tenant_id" in frame.columns:
                frame = frame.with_columns(pl.lit(scope.tenant_id).alias("tenant_id"))
            mine[table] = frame
    return Snapshot(scope_path=scope.path, taken_at=AS_OF, frames=mine)


def _llm(api: MessagesAPI, **knobs) -> LlmConfig:
    return LlmConfig(enabled=True, base_url=api.url, **{"groups_per_request": 10, "backoff_seconds": 0.01,
                                                          "timeout_seconds": 5.0, **knobs})


def _summarizer(api, store, waits=None, **knobs) -> ClaudeSummarizer:
    cfg = _llm(api, **knobs)
    client = anthropic.Anthropic(api_key="test-key", base_url=api.url, max_retries=0, timeout=cfg.timeout_seconds)
    return ClaudeSummarizer(cfg, store, client, sleep=(waits.append if waits is not None else lambda s: None),
                            today=lambda: TODAY)


def _model_summaries(p) -> dict[str, str]:
    """META label/summary → model name, for the nodes the diff inserts with a model summary."""
    ins = p.diff.tables["memory_nodes"].inserts
    rows = ins.select("label", "properties").to_dicts()
    return {f"{r['label']}|{json.loads(r['properties'])['summary']}": json.loads(r["properties"]).get("summary_model")
            for r in rows if r["label"].startswith("META:") and json.loads(r["properties"]).get("summary_model")}


def _off_hash(snapshot) -> str:
    return transform(snapshot, ConsolidationConfig(), AS_OF).report.diff_hash


def test_batching_several_groups_per_request_and_the_diff_names_the_model(api, store, snapshot):
    p = transform(snapshot, ConsolidationConfig(), AS_OF, summarizer=_summarizer(api, store))
    assert api.group_counts() == [10, 10, 5, 1]  # 25 META groups 10 at a time, then phase 10's batch
    assert {r["path"] for r in api.requests} == {"/v1/messages"}
    assert all("test-key" in r["headers"].get("x-api-key", "") + r["headers"].get("authorization", "") for r in api.requests)
    marked = _model_summaries(p)
    assert len(marked) == META_GROUPS + EPISODIC_BATCHES and set(marked.values()) == {"claude-haiku-4-5"}
    assert len(_model_summaries(transform(snapshot, ConsolidationConfig(), AS_OF))) == 0
    assert all(k.split("|")[1].startswith("Model: ") for k in marked)
    assert p.report.llm == {"calls": 4, "retries": 0, "input_tokens": 40 * 26, "output_tokens": 20 * 26,
                            "cache_hits": 0, "model_summaries": 26, "fallbacks": 0, "fallback_budget": 0,
                            "fallback_error": 0, "fallback_malformed": 0, "fallback_cache_miss": 0}
    assert p.report.diff_hash != _off_hash(snapshot)
    assert scalar(store, "SELECT count(*) FROM llm_summary_cache WHERE tenant_id = %s", snapshot.scope.tenant_id) == 26
    assert scalar(store, "SELECT input_tokens + output_tokens FROM llm_token_usage WHERE tenant_id = %s AND day = %s",
                  snapshot.scope.tenant_id, TODAY) == 60 * 26


def test_cache_second_replay_makes_zero_calls_and_reproduces_the_hash(api, store, snapshot):
    first = transform(snapshot, ConsolidationConfig(), AS_OF, summarizer=_summarizer(api, store))
    calls = len(api.requests)
    again = transform(snapshot, ConsolidationConfig(), AS_OF, summarizer=_summarizer(api, store))  # a new process would do this
    assert len(api.requests) == calls == 4
    assert again.report.llm["calls"] == 0 and again.report.llm["cache_hits"] == 26
    assert again.report.diff_hash == first.report.diff_hash
    # Replay (offline): from the cache, the same hash; without it, the deterministic diff of the model off.
    offline = summarizer_for(_llm(api), store, offline=True, today=lambda: TODAY)
    replay = transform(snapshot, ConsolidationConfig(), AS_OF, summarizer=offline)
    assert replay.report.diff_hash == first.report.diff_hash and replay.report.llm["cache_hits"] == 26
    bare = transform(snapshot, ConsolidationConfig(), AS_OF, summarizer=summarizer_for(_llm(api), None, offline=True))
    assert bare.report.diff_hash == _off_hash(snapshot)
    assert bare.report.llm["fallback_cache_miss"] == 26 and len(api.requests) == 4


def test_run_budget_exhausted_stops_calling_and_falls_back(api, store, snapshot):
    # Room for the first request of 10 groups only: its worst case is ~2.8k tokens and it costs 600;
    # the second (worst case ~3k) does not fit in what is left, and then nothing more is sent.
    p = transform(snapshot, ConsolidationConfig(), AS_OF, summarizer=_summarizer(api, store, run_token_budget=3000))
    assert api.group_counts() == [10]
    assert p.report.llm["calls"] == 1 and p.report.llm["model_summaries"] == 10
    assert p.report.llm["fallback_budget"] == 16 and p.report.llm["fallbacks"] == 16


def test_tenant_daily_budget_spent_means_no_request(api, store, snapshot):
    with store.pg() as con:
        con.execute("INSERT INTO llm_token_usage VALUES (%s, %s, 9, 999000, 1000)", (snapshot.scope.tenant_id, TODAY))
        con.commit()
    p = transform(snapshot, ConsolidationConfig(), AS_OF, summarizer=_summarizer(api, store, tenant_daily_token_budget=1_000_000))
    assert api.requests == []
    assert p.report.llm["fallback_budget"] == 26 and p.report.diff_hash == _off_hash(snapshot)


def test_500_is_retried_with_backoff(api, store, snapshot):
    api.script = [("status", 500, {}), ("status", 503, {})]
    waits: list[float] = []
    p = transform(snapshot, ConsolidationConfig(), AS_OF, summarizer=_summarizer(api, store, waits, backoff_seconds=0.02))
    assert waits == [0.02, 0.04]  # exponential
    assert p.report.llm["retries"] == 2 and p.report.llm["calls"] == 6 and p.report.llm["fallbacks"] == 0


def test_429_honours_retry_after(api, store, snapshot):
    api.script = [("status", 429, {"retry-after": "0.3"})]
    waits: list[float] = []
    p = transform(snapshot, ConsolidationConfig(), AS_OF, summarizer=_summarizer(api, store, waits))
    assert waits == [0.3]
    assert p.report.llm["retries"] == 1 and p.report.llm["model_summaries"] == 26


def test_500s_past_the_retries_fall_back(api, store, snapshot):
    api.script = [("status", 500, {})] * 3
    p = transform(snapshot, ConsolidationConfig(), AS_OF, summarizer=_summarizer(api, store, max_retries=2))
    assert p.report.llm["fallback_error"] == 10 and p.report.llm["model_summaries"] == 16  # the other requests went through
    assert p.report.llm["calls"] == 6


def test_timeout_is_retried_then_falls_back(api, store, snapshot):
    api.script = [("sleep", 1.5), ("sleep", 1.5)]
    p = transform(snapshot, ConsolidationConfig(), AS_OF, phases=("episodic_summary",),
             summarizer=_summarizer(api, store, max_retries=1, timeout_seconds=0.3))
    assert len(api.requests) == 2
    assert p.report.llm["retries"] == 1 and p.report.llm["fallback_error"] == 1
    assert p.report.diff_hash == transform(snapshot, ConsolidationConfig(), AS_OF, phases=("episodic_summary",)).report.diff_hash


def test_malformed_output_falls_back(api, store, snapshot):
    api.script = ["malformed", "half"]
    p = transform(snapshot, ConsolidationConfig(), AS_OF, summarizer=_summarizer(api, store))
    # request 1 (10 groups): no JSON at all; request 2 (10 groups): only every other group answered
    assert p.report.llm["fallback_malformed"] == 15 and p.report.llm["model_summaries"] == 11
    assert len(_model_summaries(p)) == 11  # the others carry no summary_model: deterministic text
    assert scalar(store, "SELECT count(*) FROM llm_summary_cache WHERE tenant_id = %s", snapshot.scope.tenant_id) == 11


def test_flag_off_sends_nothing(api, store, scope, monkeypatch, tmp_path):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", api.url)
    assert summarizer_for(ConsolidationConfig(), store) is None
    now = datetime.now(UTC)
    insert(store, "memory_nodes", [node(scope, f"project: part {i}", now - timedelta(hours=2)) for i in range(4)])
    report = consolidate(store, scope, now, ConsolidationConfig(), runs_dir=tmp_path).report()
    assert report.counters["meta_nodes_created"] == 1 and report.llm == {}
    summary = scalar(store, "SELECT properties->>'summary' FROM memory_nodes WHERE scope_path = %s AND label = 'META:project'",
                     scope.path)
    assert summary.startswith("project (4): ")
    assert api.requests == []


def test_enabled_without_a_key_is_a_config_error(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ConfigError, match="ANTHROPIC_API_KEY"):
        summarizer_for(LlmConfig(enabled=True))


def test_enabled_through_a_run_counts_in_the_report(api, store, scope, monkeypatch, tmp_path):
    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    config = ConsolidationConfig(llm=_llm(api))
    now = datetime.now(UTC)
    insert(store, "memory_nodes", [node(scope, f"project: part {i}", now - timedelta(hours=2)) for i in range(4)])
    report = consolidate(store, scope, now, config, runs_dir=tmp_path).report()
    assert report.status == "applied" and report.llm["calls"] == 1 and report.llm["model_summaries"] == 1
    props = json.loads(scalar(store, "SELECT properties::text FROM memory_nodes WHERE scope_path = %s AND label = 'META:project'",
                              scope.path))
    assert props["summary_model"] == "claude-haiku-4-5" and props["summary"].startswith("Model: meta_nodes")


def test_a_rerun_with_the_cached_summaries_changes_nothing_and_the_model_off_takes_them_back(api, store, snapshot):
    """Idempotence holds with the model: fold the night's diff in, plan again at the same as_of with
    the cache → phases 4 and 10 change nothing; with the model off, META nodes lose summary_model."""
    phases = ("meta_nodes",)
    night = transform(snapshot, ConsolidationConfig(), AS_OF, phases=phases, summarizer=_summarizer(api, store))
    after = night.scope_diff().fold(snapshot)
    again = transform(after, ConsolidationConfig(), AS_OF, phases=phases, summarizer=_summarizer(api, store))
    assert not again.diff.has_changes and again.report.llm["cache_hits"] == META_GROUPS and len(api.requests) == 3
    off = transform(after, ConsolidationConfig(), AS_OF, phases=phases)
    updates = off.diff.tables["memory_nodes"].updates
    assert updates.height == META_GROUPS
    assert all("summary_model" not in json.loads(p) for p in updates["properties"])


@pytest.mark.flow
def test_the_nightly_flow_hands_the_model_to_the_phases(api, store, scope, monkeypatch, tmp_path, prefect_harness):
    """The Prefect nightly (not only pipeline.consolidate) builds the summarizer when the model is enabled."""
    from deep_sleep.flows.nightly import NightlyParameters, run_nightly

    monkeypatch.setenv("ANTHROPIC_API_KEY", "test-key")
    now = datetime.now(UTC)
    insert(store, "memory_nodes", [node(scope, f"project: part {i}", now - timedelta(hours=2)) for i in range(4)])
    summary = run_nightly(NightlyParameters(
        as_of=now, dsn=store.dsn, runs_dir=str(tmp_path), scopes=[scope.display()], data_quality=False,
        config={"llm": _llm(api).model_dump(), "health": {"enabled": False}}))
    assert summary["applied"] == 1, summary["rows"]
    assert api.group_counts() == [1]
    props = json.loads(scalar(store, "SELECT properties::text FROM memory_nodes WHERE scope_path = %s AND label = 'META:project'",
                              scope.path))
    assert props["summary_model"] == "claude-haiku-4-5"
