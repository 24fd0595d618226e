"""Issue 13, items 10 and 11: a long command shows progress — the nightly prints scopes done / due,
rows changed and elapsed seconds to stderr as applies finish — and its summary counts quarantined rows."""

from __future__ import annotations

import re
import uuid
from datetime import UTC, datetime, timedelta

from deep_sleep.core.scope import Scope
from tests.storeutil import insert, node, small_graph

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


def test_nightly_prints_progress(prefect_harness, store, tmp_path, capfd):
    from deep_sleep.flows.nightly import NightlyParameters, run_nightly

    tag = uuid.uuid4().hex[:8]
    scopes = [Scope.root("org", f"prog{tag}").child("brand", f"b{i}") for i in range(2)]
    for s in scopes:
        small_graph(store, s, NOW)
    insert(store, "memory_nodes", [node(scopes[0], "project: broken", NOW - timedelta(hours=1), importance=float("nan"))])
    summary = run_nightly(NightlyParameters(as_of=NOW, dsn=store.dsn, runs_dir=str(tmp_path / "runs"),
                                            scopes=[s.display() for s in scopes], data_quality=False, progress=True))
    assert summary["applied"] == 2, summary["rows"]
    err = capfd.readouterr().err
    lines = re.findall(r"deep-sleep nightly: (\d+)/2 scopes done, ([\d,]+) rows changed, [\d.]+ s", err)
    assert [int(done) for done, _ in lines] == [1, 2]
    assert int(lines[-1][1].replace(",", "")) > 0
    by_scope = {r["scope"]: r["quarantined"] for r in summary["rows"]}  # the summary the CLI prints
    assert by_scope == {scopes[0].display(): 1, scopes[1].display(): 0}
