"""soul_corrections on a shard: each scope's own window (its own previous run), the latest edit per
(scope_path, key), profiles matched on (scope_path, key), rejections noted per scope."""

from __future__ import annotations

import json
from datetime import timedelta

import polars as pl
from deep_sleep.transforms._common import created_id

from deep_sleep.core import tables
from tests.transforms.shard_cases import AC, ACME, AS_OF, each_scope_alone, new_id, nodes, snapshot_of


def _edit(key: str, value, hours_ago: float) -> dict:
    props = {"_last_edited_by": "user_manual_edit", **({} if value is None else {"value": value})}
    return {"label": f"SOUL:{key}", "properties": json.dumps(props), "updated_at": AS_OF - timedelta(hours=hours_ago)}


def _profiles(scope: str, rows: dict[str, str]) -> pl.DataFrame:
    return tables.conform("soul_profiles", pl.DataFrame([
        {"id": new_id(), "scope_path": scope, "tenant_id": scope.split("\x1f")[1], "key": k, "value": v,
         "updated_at": AS_OF - timedelta(days=3), "version": 1} for k, v in rows.items()]))


def test_windows_latest_edits_and_profiles_are_per_scope():
    # ac ran 2 h ago: its 5-hour-old edit of "name" is outside its window; acme never ran, so its own
    # 5-hour-old edit is in.  Across scopes, acme's later "language" edit would win for ac too, ac's
    # "role" profile would hide that acme has none, and ac's rejected key would be noted for acme.
    ac = nodes(AC, [_edit("name", "Old", 5), _edit("language", "fr", 1.5), _edit("favourite", "tea", 1)])
    acme = nodes(ACME, [_edit("name", "Acme", 5), _edit("language", "de", 0.5), _edit("role", "guide", 3)])
    ac_profiles = _profiles(AC, {"role": "guide", "language": "en"})
    snaps = [snapshot_of(AC, AS_OF - timedelta(hours=2), memory_nodes=ac, soul_profiles=ac_profiles),
             snapshot_of(ACME, None, memory_nodes=acme, soul_profiles=_profiles(ACME, {"name": "Acme"}))]
    got = each_scope_alone(snaps, "soul_corrections")
    profiles = got.diff.table("soul_profiles")
    assert profiles.updates.select("scope_path", "key", "value").sort("scope_path").rows() == [(AC, "language", "fr")]
    assert profiles.inserts.select("scope_path", "tenant_id", "key", "value").sort("key").rows() == [
        (ACME, "acme", "language", "de"), (ACME, "acme", "role", "guide")]
    assert set(profiles.inserts.get_column("id")) == {created_id(ACME, "soul_corrections", k) for k in ("language", "role")}
    assert got.reports[AC].counters["soul_updates"] == 1 and got.reports[AC].counters["soul_rejected"] == 1
    assert got.reports[ACME].counters["soul_updates"] == 2 and got.reports[ACME].counters["soul_rejected"] == 0
    assert got.reports[AC].notes["soul_corrections"] == [
        f"rejected SOUL key 'favourite' (node {ac.item(2, 'id')}): only name, role, personality, language are honoured"]
    assert "soul_corrections" not in got.reports[ACME].notes


def test_a_scope_without_edits_beside_one_with():
    ac = nodes(AC, [{"label": "project: x"}])
    acme = nodes(ACME, [_edit("name", None, 1)])  # an edit without a value: rejected
    got = each_scope_alone([snapshot_of(AC, memory_nodes=ac), snapshot_of(ACME, memory_nodes=acme)], "soul_corrections")
    assert got.reports[AC].counters["soul_rejected"] == 0 and got.reports[AC].phases_run == ["soul_corrections"]
    assert got.reports[ACME].notes["soul_corrections"] == [
        f"rejected SOUL key 'name' (node {acme.item(0, 'id')}): the edit has no value"]
    assert not got.diff.has_changes
