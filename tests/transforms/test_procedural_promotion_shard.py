"""procedural_promotion on a shard: patterns, the existing-skill and cosine dedup and the 5-per-run cap
are per scope."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest

from deep_sleep.core.embedding import default_embedder
from deep_sleep.transforms.config import ConsolidationConfig, load_config
from deep_sleep.transforms.procedural_promotion import _greedy_by_scope, _greedy_distinct, procedural_promotion
from tests.transforms.shard_cases import AC, ACME, AS_OF, NESTED, assert_each_scope_alone, of_scope, interleaved_shard as shard_of, uid

ZED = "org\x1fzed"
RECENT = AS_OF - timedelta(days=2)
AC_ACTIONS = ["deploy_billing", "rotate_keys", "run_backups", "patch_kernel", "scale_workers", "close_tickets", "send_digest"]


def _events(scope: str, s: int, actions: list[str], times: int = 3) -> list[dict]:
    return [{"id": uid(s, 10 * k + i), "scope_path": scope, "session_id": "s", "content": f"did {a}",
             "metadata": f'{{"action_type": "{a}"}}', "created_at": RECENT + timedelta(minutes=10 * k + i)}
            for k, a in enumerate(actions) for i in range(times + (len(actions) - k > 5))]


def _fixture():
    events = [*_events(AC, 1, AC_ACTIONS), *_events(ACME, 2, ["rotate_keys", "deploy_billing_service", "renew_certs"])]
    events.sort(key=lambda e: e["created_at"])  # the scopes' events interleaved
    skills = [  # ACME already has these; AC does not
        {"id": uid(2, 500), "scope_path": ACME, "name": "Renew certs", "pattern_key": "renew_certs", "status": "rejected"},
        {"id": uid(2, 501), "scope_path": ACME, "name": "Deploy billing", "pattern_key": "deploy", "status": "active"},
        {"id": uid(3, 500), "scope_path": NESTED, "name": "Rotate keys", "pattern_key": "rotate_keys", "status": "active"},
    ]
    return shard_of({"episodic_events": events, "procedural_skills": skills}, (AC, ACME, NESTED, ZED))


def _keys(result, scope: str) -> set[str]:
    return set(of_scope(result.diff.tables["procedural_skills"].inserts, scope).get_column("pattern_key"))


def test_caps_and_duplicates_are_per_scope():
    shard, snaps = _fixture()
    result = procedural_promotion(shard, ConsolidationConfig().phase("procedural_promotion"), AS_OF, default_embedder())
    # AC: 7 patterns, the 2 seen 4 times first, then ties by key; 5 per run in AC alone
    assert _keys(result, AC) == {"deploy_billing", "rotate_keys", "close_tickets", "patch_kernel", "run_backups"}
    # ACME: renew_certs exists (rejected); "Deploy billing service" is within 0.65 of ACME's "Deploy billing";
    # rotate_keys is promoted although AC promotes it too and NESTED has it
    assert _keys(result, ACME) == {"rotate_keys"}
    assert result.skipped_scopes == {NESTED: "missing input: no episodic events", ZED: "missing input: no episodic events"}
    assert dict(result.by_scope.select("scope_path", "draft_skills_promoted").iter_rows()) == {AC: 5, ACME: 1}
    ins = result.diff.tables["procedural_skills"].inserts
    assert dict(ins.select("scope_path", "tenant_id").unique().iter_rows()) == {AC: "ac", ACME: "acme"}
    assert_each_scope_alone(shard, snaps, ("procedural_promotion",))


def test_the_cap_of_one_scope_is_not_used_up_by_another():
    config = load_config(overrides={"procedural_promotion": {"max_per_run": 1}})
    shard, snaps = _fixture()
    result = procedural_promotion(shard, config.phase("procedural_promotion"), AS_OF, default_embedder())
    assert _keys(result, AC) == {"deploy_billing"} and _keys(result, ACME) == {"rotate_keys"}
    assert_each_scope_alone(shard, snaps, ("procedural_promotion",), config)


def _unit(rows: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(rows, axis=1, keepdims=True)
    return np.where(norms > 0, rows / np.where(norms > 0, norms, 1), 0.0)


@pytest.mark.parametrize("seed", range(6))
def test_the_vectorized_greedy_is_each_scopes_greedy(seed):
    rng = np.random.default_rng(seed)
    n_scopes, dim = 40, 8
    group = np.sort(rng.integers(0, n_scopes, 400))
    base = rng.normal(size=(n_scopes, dim))  # each scope's candidates cluster, so the dedup matters
    cands = _unit(base[group] + rng.normal(scale=0.8, size=(len(group), dim)))
    cands[rng.random(len(group)) < 0.05] = 0.0  # zero vectors (a text with nothing to embed)
    ex_group = rng.integers(0, n_scopes, 60)
    existing = _unit(base[ex_group] + rng.normal(scale=0.8, size=(len(ex_group), dim)))
    if seed % 2:  # exact duplicates and cosines at the threshold: the scopes redone exactly
        cands[1::7] = cands[::7][: len(cands[1::7])]
        existing[:10] = cands[group.searchsorted(ex_group[:10])]
    threshold, limit = [0.65, 0.3, 0.9, 1.0, 0.0, 0.65][seed], [5, 3, 10, 5, 2, 0][seed]
    got = set(_greedy_by_scope(group, cands, ex_group, existing, threshold, limit).tolist())
    want = set()
    for g in range(n_scopes):
        mine = np.flatnonzero(group == g)
        want |= set(mine[_greedy_distinct(cands[mine], existing[ex_group == g], threshold, limit)].tolist())
    assert got == want
