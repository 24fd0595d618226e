"""The vectors a night gives the nodes it writes (SPEC §5 as amended, issue 30): golden cases for
:func:`deep_sleep.run.transform.embedded` and its place in the transform."""

from __future__ import annotations

from datetime import UTC, datetime

import numpy as np
import polars as pl

from deep_sleep.core import tables
from deep_sleep.core.diff import Diff
from deep_sleep.core.embedding import HashingEmbedder, node_text
from deep_sleep.core.shard import Shard
from deep_sleep.core.snapshot import Snapshot
from deep_sleep.run.transform import embedded, transform
from deep_sleep.transforms.config import load_config

SCOPE = "org\x1fembed\x1fbrand\x1fb1"
AS_OF = datetime(2026, 6, 1, 3, tzinfo=UTC)
HASHING = HashingEmbedder()


def _id(i: int) -> str:
    return f"00000000-0000-4000-8000-{i:012x}"


def _shard(nodes: list[dict]) -> Shard:
    frame = tables.conform("memory_nodes", pl.DataFrame(nodes)).select([c.name for c in tables.TABLES["memory_nodes"]])
    frames = {t: tables.empty(t) for t in tables.TABLES} | {"memory_nodes": frame}
    return Shard.from_snapshots([Snapshot(SCOPE, AS_OF, None, frames)])


def _node(i, label, props="{}", **kw):
    return {"id": _id(i), "scope_path": SCOPE, "tenant_id": "embed", "layer": "semantic", "label": label,
            "properties": props, "importance": 5.0, "access_count": 0, "created_at": AS_OF, "updated_at": AS_OF,
            "version": 1, **kw}


def test_an_insert_and_a_text_changing_update_get_the_configured_models_vector():
    shard = _shard([_node(1, "META:ada", '{"summary": "ada (3): old"}'), _node(2, "topic: kites", '{"owner": "Ada"}')])
    diff = Diff.combine([
        Diff.of("memory_nodes", "episodic_summary", inserts=pl.DataFrame(
            [{"id": _id(9), "scope_path": SCOPE, "label": "META:episodic_summary", "properties": '{"summary": "Ada: hi\\nBo: yo"}'}])),
        Diff.of("memory_nodes", "meta_nodes", updates=pl.DataFrame(
            [{"id": _id(1), "scope_path": SCOPE, "version": 1, "properties": '{"summary": "ada (4): new"}'}])),
        Diff.of("memory_nodes", "tag_risk", updates=pl.DataFrame(
            [{"id": _id(2), "scope_path": SCOPE, "version": 1, "properties": '{"owner": "Ada", "risk_node": true}'}])),
    ])
    out = embedded(diff, shard, load_config()).table("memory_nodes")
    ins = out.inserts.row(0, named=True)
    assert ins["embedding_model"] == HASHING.name
    assert np.array_equal(np.asarray(ins["embedding"], dtype=np.float32), HASHING.embed(["META:episodic_summary Ada: hi\nBo: yo"])[0])
    ups = {r["id"]: r for r in out.updates.iter_rows(named=True)}
    # the cluster's new text: its (unchanged, the shard's) label and its new summary
    assert np.array_equal(np.asarray(ups[_id(1)]["embedding"], dtype=np.float32), HASHING.embed(["META:ada ada (4): new"])[0])
    assert ups[_id(1)]["embedding_model"] == HASHING.name
    # a risk tag changes no text a vector embeds: the vector stays
    assert ups[_id(2)]["embedding"] is None and ups[_id(2)]["embedding_model"] is None
    assert node_text("META:ada", {"summary": "ada (4): new"}) == "META:ada ada (4): new"


def test_the_transform_embeds_deterministically_and_embed_false_leaves_the_phases_rows():
    events = pl.DataFrame([{"id": _id(100 + i), "scope_path": SCOPE, "tenant_id": "embed", "session_id": "s",
                            "content": f"Ada: turn {i}", "metadata": "{}", "created_at": AS_OF, "version": 1}
                           for i in range(120)])
    shard = _shard([_node(1, "topic: kites")])
    shard = Shard.from_snapshots([shard.scope(SCOPE).with_frames(
        {"episodic_events": tables.conform("episodic_events", events).select([c.name for c in tables.TABLES["episodic_events"]])})])
    a = transform(shard, load_config(), AS_OF, phases=["episodic_summary"])
    b = transform(shard, load_config(), AS_OF, phases=["episodic_summary"])
    plain = transform(shard, load_config(), AS_OF, phases=["episodic_summary"], embed=False)
    assert a.diff.content_hash() == b.diff.content_hash() != plain.diff.content_hash()
    summary = a.diff.table("memory_nodes").inserts
    assert summary.height == 1 and summary.get_column("embedding_model").to_list() == [HASHING.name]
    assert "embedding" not in plain.diff.table("memory_nodes").inserts.columns
