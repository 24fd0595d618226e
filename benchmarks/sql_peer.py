"""The in-database peer: what a competent team would write instead of Deep Sleep — a loop over the
scopes, each scope's night as set-based SQL statements in one transaction (issue 38 item 4).

    python -m benchmarks.sql_peer --database hf_fleet --as-of 2026-11-20T03:00:00+00:00
    python -m benchmarks.sql_peer --database hf_fleet --as-of … --night     # and the night, on a twin clone

Eight of the night's sixteen phases, each one statement (or two) per scope, parameterised by the
scope and ``as_of``, on the store's own indexes:

1. **strengthen** — nodes read or written in the 24 h before ``as_of`` gain ``0.5 · ln(1 + accesses)``
   importance (at most 10) and their access count;
2. **co-occurrence** — nodes accessed within 900 s of each other in those 24 h get a ``CO_OCCURRED``
   edge, or +0.1 weight on the one they have (``ON CONFLICT`` on the edges' natural key);
3. **risk tags** — untagged nodes whose label holds a risk word (``risk``, ``danger``, ``failure``,
   ``loss``, ``negative``, ``decline``, ``warning``, ``critical``, ``error``, ``threat`` at a word
   start, case-insensitive) get ``risk_node`` and ``risk_tagged_at``;
4. **prune** — ordinary semantic nodes below importance 4, untouched for 8 days, with at most one
   edge, are deleted with their edges;
5. **META create** — each label prefix with at least 5 ordinary nodes and no cluster yet gets a
   ``META:cluster:<prefix>`` node listing its members, its vector the members' mean (pgvector ``avg``:
   the HNSW index is paid for, as the night pays it);
6. **working TTL** — working nodes past their ``ttl_hours`` (24 by default) are deleted;
7. **decay** — ordinary semantic nodes untouched for 30 days and not decayed in the last day lose 2 %
   a day since (at least 1.0);
8. **one summary batch** — the scope's 50 oldest events older than 7 days become one
   ``META:episodic_summary`` node (their text, ids and mean vector) and are deleted.

Written as the night writes (benchmarks/README.md, FACTS): strengthen, risk tags and decay leave
``updated_at`` (an indexed column) alone, so their updates stay heap-only — touching it made every
updated row a new entry in every index, the HNSW one included (strengthen 148 s of a 379 s peer on
the 3,000-scope fleet).  No snapshot, no diff, no validation, no holds, no ledger, no undo: the peer is the floor that the
night's guarantees are measured against.  It runs on a clone of the fleet (``CREATE DATABASE …
TEMPLATE``: the fleet itself is left as it was), and prints ms/scope; with ``--night`` it also runs
``deep-sleep nightly`` on a second clone (a child process, timed as a whole, its stage times read
from its console) and prints the ratio night ms/scope ÷ peer ms/scope.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
from datetime import datetime

import psycopg

PROTECTED = "label NOT LIKE 'SOUL:%%' AND label NOT LIKE 'AGENT_IDENTITY:%%' AND label NOT LIKE 'META:%%'"
RISK = r"\m(risk|danger|failure|loss|negative|decline|warning|critical|error|threat)"

#: (phase, statement): every statement takes %(s)s (the scope) and %(t)s (as_of).
PHASES: tuple[tuple[str, str], ...] = (
    ("strengthen", """
        WITH acc AS (SELECT node_id, count(*) AS c FROM memory_access_log
                      WHERE scope_path = %(s)s AND accessed_at > %(t)s - interval '24 hours' AND accessed_at <= %(t)s
                      GROUP BY node_id)
        UPDATE memory_nodes n SET importance = least(10.0, n.importance + 0.5 * ln(1 + acc.c)),
               access_count = n.access_count + acc.c
          FROM acc WHERE n.id = acc.node_id AND n.scope_path = %(s)s"""),
    ("cooccurrence", """
        WITH acc AS (SELECT DISTINCT node_id, accessed_at FROM memory_access_log
                      WHERE scope_path = %(s)s AND accessed_at > %(t)s - interval '24 hours' AND accessed_at <= %(t)s),
             pairs AS (SELECT DISTINCT a.node_id AS source_id, b.node_id AS target_id FROM acc a JOIN acc b
                         ON a.node_id < b.node_id AND b.accessed_at BETWEEN a.accessed_at - interval '900 seconds'
                                                                        AND a.accessed_at + interval '900 seconds'
                       JOIN memory_nodes x ON x.id = a.node_id JOIN memory_nodes y ON y.id = b.node_id)
        INSERT INTO memory_edges AS e (id, scope_path, tenant_id, source_id, target_id, relation, weight,
                                       created_at, updated_at, valid_from)
        SELECT gen_random_uuid(), %(s)s, split_part(%(s)s, chr(31), 2), source_id, target_id, 'CO_OCCURRED', 1.0,
               %(t)s, %(t)s, %(t)s FROM pairs
        ON CONFLICT ON CONSTRAINT memory_edges_natural_key
        DO UPDATE SET weight = e.weight + 0.1, updated_at = EXCLUDED.updated_at"""),
    ("risk_tags", f"""
        UPDATE memory_nodes SET properties = properties || jsonb_build_object('risk_node', true,
                                                                              'risk_tagged_at', %(t)s::text)
         WHERE scope_path = %(s)s AND NOT (properties ? 'risk_node') AND label ~* '{RISK}'"""),
    ("prune", f"""
        WITH weak AS (SELECT n.id FROM memory_nodes n
                       WHERE n.scope_path = %(s)s AND n.layer = 'semantic' AND {PROTECTED}
                         AND n.importance < 4.0 AND n.updated_at < %(t)s - interval '8 days'
                         AND (SELECT count(*) FROM memory_edges e WHERE e.scope_path = %(s)s
                                 AND (e.source_id = n.id OR e.target_id = n.id)) <= 1),
             gone AS (DELETE FROM memory_edges e USING weak w WHERE e.scope_path = %(s)s
                        AND (e.source_id = w.id OR e.target_id = w.id) RETURNING 1)
        DELETE FROM memory_nodes n USING weak w WHERE n.id = w.id"""),
    ("meta_create", f"""
        WITH members AS (SELECT split_part(split_part(label, ':', 1), ' ', 1) AS prefix, id, label, embedding
                           FROM memory_nodes WHERE scope_path = %(s)s AND layer = 'semantic' AND {PROTECTED}),
             groups AS (SELECT prefix, jsonb_agg(id::text ORDER BY id) AS ids,
                               string_agg(label, '; ' ORDER BY label) AS text, avg(embedding) AS embedding
                          FROM members GROUP BY prefix HAVING count(*) >= 5)
        INSERT INTO memory_nodes (id, scope_path, tenant_id, layer, label, properties, importance, embedding,
                                  embedding_model, created_at, updated_at)
        SELECT gen_random_uuid(), %(s)s, split_part(%(s)s, chr(31), 2), 'semantic', 'META:cluster:' || g.prefix,
               jsonb_build_object('member_ids', g.ids, 'summary', left(g.text, 2000)), 5.0, g.embedding,
               'hashing-char3gram-blake2b-256', %(t)s, %(t)s
          FROM groups g
         WHERE NOT EXISTS (SELECT 1 FROM memory_nodes m WHERE m.scope_path = %(s)s
                              AND m.label = 'META:cluster:' || g.prefix)"""),
    ("working_ttl", """
        DELETE FROM memory_nodes WHERE scope_path = %(s)s AND layer = 'working'
           AND updated_at + make_interval(hours => coalesce((properties->>'ttl_hours')::int, 24)) <= %(t)s"""),
    ("decay", f"""
        UPDATE memory_nodes SET importance = greatest(1.0, importance * power(0.98, greatest(1.0,
                   extract(epoch FROM %(t)s - coalesce(last_decayed_at, updated_at)) / 86400.0))),
               last_decayed_at = %(t)s
         WHERE scope_path = %(s)s AND layer = 'semantic' AND {PROTECTED}
           AND updated_at < %(t)s - interval '30 days'
           AND (last_decayed_at IS NULL OR last_decayed_at < %(t)s - interval '1 day')"""),
    ("summary_batch", """
        WITH batch AS (SELECT id, content, embedding, created_at FROM episodic_events
                        WHERE scope_path = %(s)s AND created_at < %(t)s - interval '7 days'
                        ORDER BY created_at, id LIMIT 50),
             summary AS (INSERT INTO memory_nodes (id, scope_path, tenant_id, layer, label, properties, importance,
                                                   embedding, embedding_model, created_at, updated_at)
                         SELECT gen_random_uuid(), %(s)s, split_part(%(s)s, chr(31), 2), 'semantic',
                                'META:episodic_summary',
                                jsonb_build_object('summary', string_agg(content, E'\\n' ORDER BY created_at, id),
                                                   'source_ids', jsonb_agg(id::text ORDER BY created_at, id)),
                                5.0, avg(embedding), 'hashing-char3gram-blake2b-256', %(t)s, %(t)s
                           FROM batch HAVING count(*) > 0 RETURNING 1)
        DELETE FROM episodic_events e USING batch b WHERE e.id = b.id"""),
)


def scopes_of(con) -> list[str]:
    return [r[0] for r in con.execute("SELECT DISTINCT scope_path FROM memory_nodes WHERE scope_path IS NOT NULL "
                                      "ORDER BY 1").fetchall()]


def peer_night(dsn: str, as_of: datetime) -> dict:
    """Run the peer over every scope of the store at ``dsn``: seconds, ms/scope, rows and seconds per phase."""
    per_phase = {name: 0.0 for name, _ in PHASES}
    rows = {name: 0 for name, _ in PHASES}
    with psycopg.connect(dsn) as con:
        scopes = scopes_of(con)
        con.commit()
        t0 = time.perf_counter()
        for s in scopes:
            with con.transaction():
                cur = con.cursor()
                for name, sql in PHASES:
                    t = time.perf_counter()
                    cur.execute(sql, {"s": s, "t": as_of})
                    per_phase[name] += time.perf_counter() - t
                    rows[name] += max(cur.rowcount, 0)
        seconds = time.perf_counter() - t0
    return {"scopes": len(scopes), "seconds": round(seconds, 2),
            "ms_per_scope": round(1000 * seconds / max(1, len(scopes)), 2),
            "phase_seconds": {k: round(v, 2) for k, v in per_phase.items()}, "rows": rows}


def clone(admin_dsn: str, src: str, dst: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as con:
        con.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname IN (%s, %s) "
                    "AND pid <> pg_backend_pid()", (src, dst))
        con.execute(f'DROP DATABASE IF EXISTS "{dst}"')
        con.execute(f'CREATE DATABASE "{dst}" TEMPLATE "{src}"')


def drop(admin_dsn: str, name: str) -> None:
    with psycopg.connect(admin_dsn, autocommit=True) as con:
        con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


_TIME = re.compile(r"^time: (.*)$", re.M)


def night(database: str, as_of: datetime, runs_dir: str, extra: list[str]) -> dict:
    """``deep-sleep nightly`` on ``database`` in a child process: its wall seconds and its console's
    ``time:`` line (seconds in the shards and in each step after them)."""
    cmd = [sys.executable, "-m", "deep_sleep.cli", "--database", database, "nightly", "--as-of", as_of.isoformat(),
           "--runs-dir", runs_dir, *extra]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True)
    seconds = time.perf_counter() - t0
    out = done.stdout
    parts = {}
    if m := _TIME.search(out):
        for item in m.group(1).split(", "):
            value, _, name = item.partition(" s ")
            try:
                parts[name.strip()] = float(value)
            except ValueError:
                pass
    return {"exit": done.returncode, "seconds": round(seconds, 2), "parts": parts,
            "console": [line for line in out.splitlines() if not line.startswith("|")][-12:],
            "stderr_tail": done.stderr.splitlines()[-3:]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--database", required=True, help="the fleet (left as it is: both runs take clones of it)")
    ap.add_argument("--as-of", required=True)
    ap.add_argument("--night", action="store_true", help="also run deep-sleep nightly on a second clone, and the ratio")
    ap.add_argument("--runs-dir", default="bench-data/peer-runs")
    ap.add_argument("--keep-clones", action="store_true")
    ap.add_argument("nightly_args", nargs="*", help="after --: extra arguments of deep-sleep nightly")
    args = ap.parse_args(argv)
    from deep_sleep.store.db import embedded_dsn

    as_of = datetime.fromisoformat(args.as_of)
    admin = embedded_dsn(database="postgres")
    out: dict = {"measured_at": datetime.now().astimezone().isoformat(timespec="seconds"), "database": args.database,
                 "load": open("/proc/loadavg").read().split()[:3]}
    peer_db, night_db = f"{args.database}_peer", f"{args.database}_night"
    clone(admin, args.database, peer_db)
    try:
        out["peer"] = peer_night(embedded_dsn(database=peer_db), as_of)
        print(f"peer: {out['peer']['scopes']:,} scopes in {out['peer']['seconds']} s = {out['peer']['ms_per_scope']} "
              f"ms/scope; {out['peer']['phase_seconds']}", flush=True)
        if args.night:
            clone(admin, args.database, night_db)
            n = out["night"] = night(night_db, as_of, args.runs_dir, args.nightly_args)
            scopes = out["peer"]["scopes"]
            n["ms_per_scope"] = round(1000 * n["seconds"] / scopes, 2)
            shards = n["parts"].get("in the shards")
            n["shards_ms_per_scope"] = round(1000 * shards / scopes, 2) if shards else None
            out["ratio_night_to_peer"] = round(n["ms_per_scope"] / out["peer"]["ms_per_scope"], 2)
            out["ratio_shards_to_peer"] = (round(n["shards_ms_per_scope"] / out["peer"]["ms_per_scope"], 2)
                                           if shards else None)
            print("\n".join(n["console"]))
            print(f"night: {n['seconds']} s = {n['ms_per_scope']} ms/scope (shards {n['shards_ms_per_scope']} ms/scope, "
                  f"outside them {round(n['seconds'] - (shards or 0), 1)} s); night ÷ peer = "
                  f"{out['ratio_night_to_peer']} (shards ÷ peer {out['ratio_shards_to_peer']})", flush=True)
    finally:
        if not args.keep_clones:
            for name in (peer_db, night_db):
                drop(admin, name)
    out["load_after"] = open("/proc/loadavg").read().split()[:3]
    print(json.dumps(out, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
