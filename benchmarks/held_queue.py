"""Issue 37 items 2-4 on a small fleet, through the CLI: three nights a day apart, then the held queue's
counts by reason, a decision by reason, and the counts again.

    .venv/bin/python -m benchmarks.held_queue --scopes 300            # this checkout
    PYTHONPATH=/tmp/old .venv/bin/python -m benchmarks.held_queue ...  # another release's code (git archive)

Each run seeds a fresh database (``--database heldq_<tag>``) on its own embedded server
(``DEEP_SLEEP_DATA_DIR``, default /tmp/ds-held-queue; stopped at the end), seeds ``deep-sleep seed
--fleet N`` (SOUL edits, used nodes and explicit feedback in the scopes; ``HELD_QUEUE_OLD_SEED=1`` adds the
``--recalls`` an older release needs), runs ``deep-sleep nightly`` at
three ``--as-of`` a day apart, and prints JSON: the ledger's pending runs and rows, the *current*
ones (per scope and phase the newest run that held rows of it — computed here from the ledger alone,
not by the queue), ``held``'s counts by reason, and after ``approve --reason R`` the counts again and
what the decision took (``consolidation_decisions``' rows; by reason and closure from
``consolidation_decided_rows`` where the release has it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

NIGHTS = ("2026-12-02T03:00:00+00:00", "2026-12-03T03:00:00+00:00", "2026-12-04T03:00:00+00:00")
SEED_NOW = "2026-12-02T02:00:00+00:00"

#: edges whose endpoint is gone (issue 37 item 1: must stay 0 through nights and decisions)
DANGLING_SQL = """
SELECT count(*) FROM memory_edges e
WHERE NOT EXISTS (SELECT 1 FROM memory_nodes n WHERE n.id = e.source_id)
   OR NOT EXISTS (SELECT 1 FROM memory_nodes n WHERE n.id = e.target_id)
"""

CURRENT_SQL = """
WITH held AS (
    SELECT r.run_id, r.scope_path, r.as_of, r.started_at, r.hold_status, p.phase, p.n::bigint AS n
    FROM consolidation_runs r, jsonb_each_text(r.held -> 'phases') p(phase, n)
    WHERE r.status = 'applied' AND r.mode NOT IN ('approve', 'undo') AND r.hold_status <> 'none'),
newest AS (SELECT DISTINCT ON (scope_path, phase) run_id, phase FROM held
           ORDER BY scope_path, phase, as_of DESC, started_at DESC)
SELECT (SELECT count(DISTINCT run_id) FROM held WHERE hold_status IN ('pending', 'partial')) AS pending_runs,
       (SELECT coalesce(sum(n), 0) FROM held WHERE hold_status IN ('pending', 'partial')) AS pending_rows,
       (SELECT count(DISTINCT h.run_id) FROM held h JOIN newest USING (run_id, phase)
        WHERE h.hold_status IN ('pending', 'partial')) AS current_runs,
       (SELECT coalesce(sum(h.n), 0) FROM held h JOIN newest USING (run_id, phase)
        WHERE h.hold_status IN ('pending', 'partial')) AS current_rows
"""


def ds(*args: str, env: dict[str, str]) -> str:
    out = subprocess.run([sys.executable, "-m", "deep_sleep.cli", *args], env=env, capture_output=True, text=True)
    if out.returncode not in (0, 1):
        raise SystemExit(f"deep-sleep {' '.join(args)} exited {out.returncode}:\n{out.stderr[-3000:]}")
    return out.stdout


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scopes", type=int, default=300)
    ap.add_argument("--nodes", type=int, default=60)
    ap.add_argument("--reason", default="used_node", help="the reason approved after the third night")
    ap.add_argument("--data-dir", default=os.environ.get("DEEP_SLEEP_DATA_DIR", "/tmp/ds-held-queue"))
    args = ap.parse_args()
    db = f"heldq_{uuid.uuid4().hex[:8]}"
    env = {**os.environ, "DEEP_SLEEP_DATA_DIR": args.data_dir, "DEEP_SLEEP_KEEP_SERVER": "1"}
    runs = Path(tempfile.mkdtemp(prefix="ds-held-queue-runs-"))
    base = ["--database", db]
    report: dict = {"scopes": args.scopes, "database": db, "code": os.environ.get("PYTHONPATH") or "this checkout"}
    try:
        # the fleet seeder writes explicit feedback on a tenth of its recalls (no --recalls flag since issue 38);
        # an older release takes --recalls for the same
        seed = [*base, "seed", "--fleet", str(args.scopes), "--nodes", str(args.nodes), "--now", SEED_NOW]
        if os.environ.get("HELD_QUEUE_OLD_SEED"):
            seed.insert(seed.index("--now"), "--recalls")
        ds(*seed, env=env)
        for night in NIGHTS:
            ds(*base, "nightly", "--as-of", night, "--runs-dir", str(runs), env=env)
        from deep_sleep.store.db import embedded_dsn

        dsn = embedded_dsn(args.data_dir, db, keep=True)
        import psycopg

        def ledger() -> dict:
            with psycopg.connect(dsn) as con:
                row = con.execute(CURRENT_SQL).fetchone()
                dangling = con.execute(DANGLING_SQL).fetchone()[0]
            return {**dict(zip(("pending_runs", "pending_rows", "current_runs", "current_rows"), map(int, row), strict=True)),
                    "dangling_edges": int(dangling)}

        def held() -> dict:
            shown = json.loads(ds(*base, "held", "--json", env=env))
            return {r["reason"]: r["rows"] for r in shown["reason"]}

        report["ledger_before"] = ledger()
        report["held_by_reason_before"] = before = held()
        report["held_rows_before"] = sum(before.values())
        text = ds(*base, "approve", "--reason", args.reason, "--by", "bench", env=env)
        report["approve_output"] = text.strip().splitlines()[:3]
        with psycopg.connect(dsn) as con:
            taken = con.execute(
                "SELECT coalesce(sum((v.value)::bigint), 0) FROM consolidation_decisions d, jsonb_each(d.held_rows) t,"
                " jsonb_each(t.value) v WHERE d.decided_by = 'bench'").fetchone()[0]
            phases = con.execute("SELECT count(*) FROM consolidation_decisions WHERE decided_by = 'bench'").fetchone()[0]
            by_reason = {}
            try:
                by_reason = dict(con.execute(
                    "SELECT reason || CASE WHEN closure THEN ' (closure)' ELSE '' END, count(*)"
                    " FROM consolidation_decided_rows r JOIN consolidation_decisions d USING (decision_id, run_id, phase)"
                    " WHERE d.decided_by = 'bench' GROUP BY 1 ORDER BY 1").fetchall())
            except psycopg.errors.UndefinedTable:  # an earlier release decides whole phases
                pass
        report["decided"] = {"phase_decisions": int(phases), "rows": int(taken), "rows_by_reason": by_reason}
        report["ledger_after"] = ledger()
        report["held_by_reason_after"] = after = held()
        report["held_rows_after"] = sum(after.values())
    finally:
        import shutil

        import signal

        shutil.rmtree(runs, ignore_errors=True)
        try:  # the server this run started (kept between commands): a fast shutdown by its postmaster pid
            os.kill(int((Path(args.data_dir) / "postmaster.pid").read_text().split("\n", 1)[0]), signal.SIGINT)
        except (OSError, ValueError):
            pass
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
