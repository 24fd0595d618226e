"""``deep-sleep`` — the command line.

    deep-sleep demo                                   seed a small store, consolidate every scope
    deep-sleep seed --tenants 3 --nodes 200           seed synthetic scopes
    deep-sleep run org/acme                           one scope's run (the same stages as the flow; Prefect if asked)
    deep-sleep snapshot org/acme --out DIR            extract a snapshot directory
    deep-sleep replay DIR --as-of ISO --out DIFF_DIR  transform + validate a stored snapshot (no database)
    deep-sleep approve RUN_ID [--phase P]             apply a run's held rows (holds, SPEC §9); reject discards them
    deep-sleep reembed [--model M]                    give every stored vector the configured embedder's

Scopes are written ``kind/id/kind/id`` (or as the raw ``\\x1f``-joined scope_path); a ``/`` inside
an id is written ``%2F``.  Every argument is checked — scope known to the store, ``--as-of`` within
bounds, ``--out`` usable, DSN reachable — before any Prefect machinery starts; every command that
touches a store says which one on stderr, and no message ever shows a password.
"""

from __future__ import annotations

import argparse
import os
import sys

from deep_sleep.cli.review import (
    cmd_approve,
    cmd_compare,
    cmd_gc,
    cmd_health,
    cmd_held,
    cmd_plan,
    cmd_reembed,
    cmd_reject,
    cmd_replay,
    cmd_replay_range,
    cmd_report,
    cmd_undo,
)
from deep_sleep.cli.runs import (
    cmd_backfill,
    cmd_demo,
    cmd_nightly,
    cmd_run,
    cmd_seed,
    cmd_serve,
    cmd_snapshot,
    nightly_exit_code,
)

__all__ = ['build_parser', 'main', 'nightly_exit_code']


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="deep-sleep", description="Offline memory consolidation for agent memory stores.")
    p.add_argument("--dsn", default=None, help="PostgreSQL DSN (default: $DEEP_SLEEP_DSN, else the embedded server)")
    p.add_argument("--database", default=None,
                   help="the database on that server (default: $DEEP_SLEEP_DATABASE, else the DSN's, or deep_sleep on "
                        "the embedded server, created there if missing)")
    p.add_argument("--keep-server", action="store_true",
                   help="leave the embedded server running when the command exits (default: $DEEP_SLEEP_KEEP_SERVER; "
                        "otherwise it stops with the last process using it)")
    sub = p.add_subparsers(dest="command", required=True)

    d = sub.add_parser("demo", help="seed a small realistic store and consolidate every scope")
    d.add_argument("--tenants", type=int, default=2)
    d.add_argument("--scopes-per-tenant", type=int, default=2)
    d.add_argument("--nodes", type=int, default=300, help="nodes per scope")
    d.add_argument("--seed", type=int, default=7)
    d.add_argument("--runs-dir", default=None)
    d.add_argument("--reset", action="store_true", help="drop and recreate the store's database first")
    d.add_argument("--prefect", action="store_true", help="run each scope through the Prefect flow")
    d.set_defaults(func=cmd_demo)

    s = sub.add_parser("seed", help="generate and bulk-load synthetic scopes, as the live path writes them: every node "
                                    "and event with the configured embedder's vector, the recall log with feedback")
    s.add_argument("--tenants", type=int, default=3)
    s.add_argument("--scopes-per-tenant", type=int, default=2)
    s.add_argument("--nodes", type=int, default=200, help="nodes per scope")
    s.add_argument("--seed", type=int, default=7)
    s.add_argument("--now", default=None, help="ISO time the synthetic history ends at (default: now)")
    s.add_argument("--fleet", type=int, default=None, metavar="SCOPES",
                   help="instead: a fleet of SCOPES small scopes (org/fNNNNNN/agent/aNNNNNNN, 20 to a tenant; --nodes "
                        "each, e.g. --fleet 100000 --nodes 100), generated vectorized and bulk-loaded in chunks of "
                        "10,000 scopes in one transaction")
    s.add_argument("--config", default=None, help="TOML configuration file: its embedding.model embeds (default hashing)")
    s.set_defaults(func=cmd_seed)

    r = sub.add_parser("run", help="run the deep_sleep flow for one scope")
    r.add_argument("scope")
    r.add_argument("--as-of", default=None)
    r.add_argument("--config", default=None, help="TOML configuration file")
    r.add_argument("--runs-dir", default=None)
    r.add_argument("--force", action="store_true", help="accept an --as-of before the last applied run or far in the future")
    r.add_argument("--prefect", action="store_true",
                   help="run through the Prefect flow even without PREFECT_API_URL (starts a temporary server: ~20 s)")
    r.set_defaults(func=cmd_run)

    n = sub.add_parser("snapshot", help="extract one scope into a snapshot directory")
    n.add_argument("scope")
    n.add_argument("--out", required=True)
    n.set_defaults(func=cmd_snapshot)

    y = sub.add_parser("replay", help="transform + validate a snapshot directory into a diff directory (no database)")
    y.add_argument("snapshot_dir")
    y.add_argument("--as-of", required=True)
    y.add_argument("--out", required=True)
    y.add_argument("--config", default=None)
    y.add_argument("--compare-config", default=None, help="replay again under this config and compare (per phase)")
    y.add_argument("--explain", action="store_true", help="also print the statements an apply of the diff would run")
    y.add_argument("--scope", default=None, help="for a shard snapshot (many scopes): the scope to replay")
    y.set_defaults(func=cmd_replay)

    rr = sub.add_parser("replay-range", help="replay the stored snapshots of a scope over a date range (no writes)")
    rr.add_argument("scope")
    rr.add_argument("--from", dest="from_", required=True)
    rr.add_argument("--to", required=True)
    rr.add_argument("--runs-dir", default=None)
    rr.add_argument("--config", default=None)
    rr.add_argument("--compare-config", default=None)
    rr.add_argument("--out", default=None)
    rr.add_argument("--ledger", action="store_true", help="take each run's as_of and recorded hash from the store's ledger")
    rr.set_defaults(func=cmd_replay_range)

    c = sub.add_parser("compare", help="compare two diff directories per phase")
    c.add_argument("diff_a")
    c.add_argument("diff_b")
    c.add_argument("--out", default=None)
    c.add_argument("--markdown", action="store_true")
    c.add_argument("--scope", default=None, help="for shard diff directories (many scopes): the scope to compare")
    c.set_defaults(func=cmd_compare)

    u = sub.add_parser("undo", help="restore a run's before-images unless rows changed since")
    u.add_argument("run_id")
    u.set_defaults(func=cmd_undo)

    def selection_flags(a: argparse.ArgumentParser) -> None:
        a.add_argument("--reason", default=None, help="only the rows held for this reason (used_node, soul_change, "
                                                       "delete_share, delete_count, gate_failed, ...)")
        a.add_argument("--scope", default=None, help="a scope and every scope below it")
        a.add_argument("--older-than", type=float, default=None, metavar="DAYS", help="runs at least this many days old")

    for name, func, what in (("approve", cmd_approve, "apply a run's held rows through the version guard"),
                             ("reject", cmd_reject, "discard a run's held rows (recorded in the ledger)")):
        a = sub.add_parser(name, help=what + "; or of every run a selection names (see `deep-sleep held`)")
        a.add_argument("run_id", nargs="?", default=None,
                       help="the run's id or an unambiguous prefix (`deep-sleep report`); or give a selection instead")
        a.add_argument("--phase", default=None, help="only this phase's held rows (default: every pending phase)")
        selection_flags(a)
        a.add_argument("--include-superseded", action="store_true",
                       help="reject with a selection: also the expired rows of runs a newer run of the same scope "
                            "and phase superseded (never approved)")
        a.add_argument("--by", default=None, help="who decides (recorded in consolidation_decisions.decided_by)")
        a.set_defaults(func=func)

    hq = sub.add_parser("held", help="the held queue across runs and scopes: counts by reason, phase and scope")
    hq.add_argument("--phase", default=None)
    selection_flags(hq)
    hq.add_argument("--runs", action="store_true", help="also one line per run (oldest first)")
    hq.add_argument("--limit", type=int, default=50, help="scopes and runs shown (default 50)")
    hq.add_argument("--json", action="store_true", help="the grouped counts and the runs as JSON")
    hq.set_defaults(func=cmd_held)

    pl_ = sub.add_parser("plan", help="what tonight's run of SCOPE would change, record by record (applies nothing)")
    pl_.add_argument("scope")
    pl_.add_argument("--as-of", default=None)
    pl_.add_argument("--config", default=None)
    pl_.add_argument("--per-phase", type=int, default=10, help="records shown per phase (all are in preview.parquet)")
    pl_.add_argument("--runs-dir", default=None)
    pl_.set_defaults(func=cmd_plan)

    g = sub.add_parser("gc", help="remove run directories and archive rows older than --keep-days "
                                  "(runs that can still be undone are kept unless --force)")
    g.add_argument("--keep-days", type=float, required=True)
    g.add_argument("--force", action="store_true", help="also remove what an undoable run needs; it is then "
                                                          "marked not undoable in the ledger")
    g.add_argument("--dry-run", action="store_true", help="list what would be removed, remove nothing")
    g.add_argument("--runs-dir", default=None)
    g.set_defaults(func=cmd_gc)

    re_ = sub.add_parser("reembed", help="rewrite every stored vector that the configured embedder (embedding.model) "
                                         "did not make: nodes, events, skills; needed after changing the model")
    re_.add_argument("--model", default=None, help="the model to embed with (default: the configuration's embedding.model)")
    re_.add_argument("--scope", action="append", default=None, help="only this scope (repeatable; default: every scope)")
    re_.add_argument("--batch-size", type=int, default=1000, help="rows per transaction (default 1000)")
    re_.add_argument("--config", default=None)
    re_.set_defaults(func=cmd_reembed)

    h = sub.add_parser("health", help="run-health alerts over the ledger and the store (exit 1 when one fires)")
    h.add_argument("--as-of", default=None)
    h.add_argument("--scope", default=None, help="only this scope's alerts")
    h.add_argument("--config", default=None)
    h.set_defaults(func=cmd_health)

    rp = sub.add_parser("report", help="the last runs from the ledger")
    rp.add_argument("scope", nargs="?", default=None)
    rp.add_argument("--limit", type=int, default=20)
    rp.add_argument("--markdown", action="store_true")
    rp.set_defaults(func=cmd_report)

    ni = sub.add_parser("nightly", help="one night over every due scope (deep_sleep_nightly)")
    ni.add_argument("--as-of", default=None)
    ni.add_argument("--config", default=None)
    ni.add_argument("--runs-dir", default=None)
    ni.add_argument("--force", action="store_true", help="accept an --as-of far in the future")
    ni.add_argument("--max-workers", type=int, default=2, help="shards consolidated at once")
    ni.add_argument("--shard-rows", type=int, default=500_000, help="at most this many rows per shard")
    ni.add_argument("--shard-scopes", type=int, default=5_000, help="at most this many scopes per shard")
    ni.add_argument("--plan", action="store_true", help="plan only: what the night would change; apply nothing")
    ni.add_argument("--plan-scopes", type=int, default=20,
                    help="with --plan: scopes shown record by record, most records first (all are in preview.parquet)")
    ni.add_argument("--per-phase", type=int, default=5, help="with --plan: records shown per phase of each scope")
    ni.add_argument("--apply-concurrency", type=int, default=2)
    ni.add_argument("--no-data-quality", action="store_true")
    ni.add_argument("--prefect-apply-limit", action=argparse.BooleanOptionalAction, default=False,
                    help="also cap shard tasks with the Prefect tag limit 'deep-sleep-apply' (default: off; the store's "
                         "apply slots always cap applies, and a killed run's slot is freed with its connection)")
    ni.add_argument("--task-runner", choices=["auto", "threads", "processes", "dask"], default="auto",
                    help="auto (default: processes for a night of >= 2M due rows in 2+ shards with --max-workers "
                         ">= 2, else threads), threads (one process), processes (--max-workers worker processes: "
                         "no shared GIL, faster for large nights) or dask")
    ni.add_argument("--dask-address", default=None)
    ni.add_argument("--table", action="store_true",
                    help="also print the per-scope table (one row per scope; always written to the night's scopes.csv)")
    ni.set_defaults(func=cmd_nightly)

    bf = sub.add_parser("backfill", help="write scope_path for legacy rows (resumable, small batches)")
    bf.add_argument("--job", default="scope-backfill", help="checkpoint name: rerun with the same name to resume")
    bf.add_argument("--batch-size", type=int, default=5000)
    bf.add_argument("--lock-timeout-ms", type=int, default=200)
    bf.add_argument("--pause-ms", type=int, default=0, help="sleep between batches, to yield to live traffic")
    bf.add_argument("--max-retries", type=int, default=50)
    bf.add_argument("--table", action="append", default=None, help="only this table (repeatable)")
    bf.add_argument("--dry-run", action="store_true", help="count legacy rows per table and tenant; write nothing")
    bf.add_argument("--validate-only", action="store_true")
    bf.add_argument("--json", action="store_true")
    bf.add_argument("--no-progress", action="store_true")
    bf.set_defaults(func=cmd_backfill)

    sv = sub.add_parser("serve", help="serve the nightly/replay/backfill deployments (needs PREFECT_API_URL)")
    sv.add_argument("--cron", default="0 3 * * *", help="nightly schedule (default 03:00 UTC)")
    sv.add_argument("--runs-dir", default=None)
    sv.set_defaults(func=cmd_serve)
    return p


def main(argv: list[str] | None = None) -> int:
    from deep_sleep.core.errors import DeepSleepError

    args = build_parser().parse_args(argv)
    try:
        # through the environment, so that every store this command opens (and the Prefect flows it starts,
        # in other processes) is the one asked for
        if args.database is not None:
            from deep_sleep.store.db import check_store_database

            os.environ["DEEP_SLEEP_DATABASE"] = check_store_database(args.database)
        if args.keep_server:
            os.environ["DEEP_SLEEP_KEEP_SERVER"] = "1"
        return args.func(args)
    except DeepSleepError as exc:  # ours, raised on purpose: the message names the input and the fix
        print(f"deep-sleep {args.command}: error: {exc}", file=sys.stderr)
        return 2


