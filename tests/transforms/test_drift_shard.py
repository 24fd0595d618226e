"""drift on a shard: every scope's traits step towards its own working memory, in its own window."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import polars as pl

from deep_sleep.transforms._common import created_id
from deep_sleep.transforms.config import ConsolidationConfig
from deep_sleep.transforms.drift import _fixed, _numbers, drift
from tests.transforms.shard_cases import AC, ACME, AS_OF, NESTED, assert_each_scope_alone, of_scope, interleaved_shard as shard_of, uid

ZED = "org\x1fzed"
RECENT = AS_OF - timedelta(hours=2)


def _note(scope: str, s: int, n: int, label: str, at=RECENT) -> dict:
    return {"id": uid(s, n), "scope_path": scope, "layer": "working", "label": label, "updated_at": at, "created_at": at}


def _fixture():
    nodes = [
        _note(ACME, 2, 1, "please verify the backup"),  # caution, formality
        _note(AC, 1, 1, "thanks, glad it worked"),  # warmth
        _note(ACME, 2, 2, "thanks!", at=AS_OF - timedelta(hours=10)),  # before ACME's previous run: not counted
        _note(AC, 1, 2, "deploy done"),
        _note(ZED, 4, 1, "thanks", at=AS_OF - timedelta(days=3)),  # working memory, none in the window
        {"id": uid(3, 1), "scope_path": NESTED, "label": "semantic only"},
    ]
    traits = [
        {"id": uid(1, 50), "scope_path": AC, "key": "trait:warmth", "value": "0.5000"},
        {"id": uid(1, 49), "scope_path": AC, "key": "trait:warmth", "value": "0.9000"},  # the smaller id is the row
        {"id": uid(2, 50), "scope_path": ACME, "key": "trait:caution", "value": "high"},
        {"id": uid(2, 10), "scope_path": ACME, "key": "trait:warmth", "value": "0.2000"},  # a smaller id than AC's
        {"id": uid(2, 51), "scope_path": ACME, "key": "trait:curiosity", "value": "0.0000"},  # stays where it is
    ]
    return shard_of({"memory_nodes": nodes, "soul_profiles": traits}, (AC, ACME, NESTED, ZED),
                    previous={ACME: AS_OF - timedelta(hours=5)})


def _values(result, scope: str) -> dict[str, str]:
    d = result.diff.tables["soul_profiles"]
    ids = {uid(1, 49): "trait:warmth", uid(2, 50): "trait:caution", uid(2, 51): "trait:curiosity", uid(2, 10): "trait:warmth"}
    got = {ids[i]: v for i, v in d.updates.filter(pl.col("id").str.ends_with(f"{ {AC: 1, ACME: 2}[scope]:012x}"))
           .select("id", "value").iter_rows()}
    return {**got, **dict(of_scope(d.inserts, scope).select("key", "value").iter_rows())}


def test_each_scope_drifts_towards_its_own_notes():
    shard, snaps = _fixture()
    result = drift(shard, ConsolidationConfig().phase("drift"), AS_OF, 24.0)
    # AC: warmth in 1 of 2 notes: 0.9 + 0.05 (0.5 - 0.9); the others from 0.5 towards 0
    assert _values(result, AC) == {"trait:warmth": "0.8800", "trait:caution": "0.4750", "trait:curiosity": "0.4750",
                                   "trait:directness": "0.4750", "trait:formality": "0.4750"}
    # ACME: one note in its window (caution and formality); "high" restarts from 0.5; curiosity is unchanged
    assert _values(result, ACME) == {"trait:caution": "0.5250", "trait:formality": "0.5250", "trait:warmth": "0.1900",
                                     "trait:directness": "0.4750"}
    assert dict(result.scope_notes) == {ACME: ("trait 'trait:caution' held 'high', not a number in [0, 1]; restarted from 0.5",)}
    assert result.skipped_scopes == {NESTED: "missing input: no working memory",
                                     ZED: "missing input: no working memory in the window"}
    assert dict(result.by_scope.select("scope_path", "identity_drifts").iter_rows()) == {AC: 5, ACME: 4}
    ins = result.diff.tables["soul_profiles"].inserts
    assert set(ins.filter(pl.col("scope_path") == AC).get_column("id")) == {
        created_id(AC, "drift", f"trait:{t}") for t in ("caution", "curiosity", "directness", "formality")}
    assert set(ins.get_column("tenant_id")) == {"ac", "acme"}
    assert_each_scope_alone(shard, snaps, ("drift",))


def test_four_decimals_and_stored_numbers_read_as_python_does():
    rng = np.random.default_rng(7)
    values = np.concatenate([rng.random(20_000), np.arange(33) / 32, np.arange(20_001) / 20_000 + 0.00005,
                             np.nextafter(np.arange(20_001) / 20_000, 2), [0.0, 1.0, 5e-324, 1.99995, 2.0, -0.0, np.inf]])
    assert _fixed(values).to_list() == [f"{v:.4f}" for v in values]
    texts = ["0.5", "1", "00.25", "1.7", "high", " 0.5", "5e-1", "nan", "inf", "+0.5", "-0", "0_5", "1.", ".5", "", None,
             "0.30000000000000004", *(repr(v) for v in rng.random(2_000))]

    def py(t):
        try:
            v = float(t)
        except (TypeError, ValueError):
            return None
        return v if 0 <= v <= 1 else None

    assert _numbers(pl.Series(texts, dtype=pl.String)).to_list() == [py(t) for t in texts]
