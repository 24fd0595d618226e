"""What every command shares: argument checks before anything starts (scope known, --as-of in bounds,
--out usable, DSN reachable), the store a command uses, and running one scope."""

from __future__ import annotations

import os
import sys
from datetime import UTC, datetime
from pathlib import Path


def _quiet_prefect() -> None:
    # Before Prefect is imported: no telemetry (the network is closed here), quiet logs.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "WARNING")
    # The temporary local server migrates its SQLite database on first start; on a busy 2-core
    # machine that can take longer than Prefect's default 20 s.
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
    # Tasks waiting for an apply slot poll at most every 0.5 s (Prefect's default 30 s idles slots).
    os.environ.setdefault("PREFECT_SERVER_CONCURRENCY_MAXIMUM_CONCURRENCY_SLOT_WAIT_SECONDS", "0.5")


def _as_of(value: str | None) -> datetime | None:
    """An ISO 8601 argument as an aware UTC time; an InputError naming it when it is not one, or when it
    leaves the calendar once in UTC (``9999-12-31T23:59:59-12:00`` is year 10000 there)."""
    from deep_sleep.core.errors import InputError
    from deep_sleep.core.snapshot import utc

    try:
        return utc(value) if value else None
    except OverflowError:
        raise InputError(f"{value!r} is outside years 1–9999 once converted to UTC; give a time within them "
                         "(e.g. 2026-11-29T03:00:00Z)") from None


def config_of(path: str | None, overrides: dict | None = None):
    """The configuration of ``path`` (``--config``; defaults < file < environment < ``overrides``), with
    its embedder built: a bad knob or an ``embedding.model`` that names no embedder (``sys:exit``,
    ``nosuch``) is refused here, before any run, snapshot or flow starts (exit 2)."""
    from deep_sleep.core.embedding import embedder_for
    from deep_sleep.transforms.config import load_config

    config = load_config(path, overrides)
    embedder_for(config)
    return config


def _store(dsn: str | None):
    """Connect (checking the DSN first) and say on stderr which store this command uses."""
    from deep_sleep.store.db import connect_store, describe

    store = connect_store(dsn)
    print(f"deep-sleep: store {describe(store)}", file=sys.stderr)
    return store


def _hide_dsn(dsn: str | None) -> None:
    """Hand a DSN to the flows through the environment, never as a flow parameter: Prefect keeps
    parameters in its database and shows them in the UI."""
    if dsn:
        os.environ["DEEP_SLEEP_DSN"] = dsn


def _out_dir(value: str, what: str = "--out") -> Path:
    from deep_sleep.core.errors import InputError

    out = Path(value)
    if out.exists() and not out.is_dir():
        raise InputError(f"{what} {out} is an existing file; give a directory (it is created if missing)")
    return out


_SCOPED = ("memory_nodes", "episodic_events", "memory_edges", "recall_events", "procedural_skills", "soul_profiles",
           "pending_connections", "prospective_triggers", "memory_access_log")


def known_scopes(store) -> list[str]:
    """Every scope_path that holds a row of any table, sorted."""
    sql = " UNION ".join(f"SELECT DISTINCT scope_path FROM {t} WHERE scope_path IS NOT NULL" for t in _SCOPED)
    with store.pg() as con:
        return sorted(r[0] for r in con.execute(sql))


def require_scope(store, text: str):
    """The scope ``text`` names, if the store holds rows of it; else an error naming the nearest
    existing scopes ("did you mean").

    A scope whose kinds or ids look like something else (``Scope.lookalikes``: a Cyrillic ``а`` in a
    Latin id, a bidi override) is accepted when it exists — naming it is how an operator cleans it
    up — with one warning line per problem on stderr.  Suggestions are matched by what they look
    like (``characters.skeleton``), and every suggestion that renders like another one, or like
    what was typed, is followed by the code points that tell them apart."""
    from deep_sleep.core.characters import shown
    from deep_sleep.core.errors import InputError
    from deep_sleep.core.scope import Scope

    scope = Scope.coerce(text)
    exists = " OR ".join(f"EXISTS (SELECT 1 FROM {t} WHERE scope_path = %(p)s)" for t in _SCOPED)
    if scope.depth == 1 and scope.levels[0][0] == "tenant":  # legacy rows (scope_path NULL) read as tenant/<id> (SPEC §1)
        exists += " OR EXISTS (SELECT 1 FROM memory_nodes WHERE scope_path IS NULL AND tenant_id = %(t)s)"
    with store.pg() as con:
        if con.execute(f"SELECT {exists}", {"p": scope.path, "t": scope.tenant_id}).fetchone()[0]:
            for problem in scope.lookalikes:
                print(f"deep-sleep: warning: {problem}", file=sys.stderr)
            return scope
    near = did_you_mean(scope.display(), [Scope.parse(p).display() for p in known_scopes(store)])
    hint = f" Did you mean {', '.join(near)}?" if near else " The store holds no scope at all: seed one with `deep-sleep demo`."
    typed = f" ({scope.lookalikes[0]})" if scope.lookalikes else ""
    raise InputError(f"scope {shown(scope.display())} has no rows in this store{typed}; nothing to consolidate.{hint}")


def did_you_mean(wanted: str, names: list[str], n: int = 3) -> list[str]:
    """Up to ``n`` of ``names`` nearest to ``wanted`` by what they look like, ready to print: each one
    that looks like another suggestion or like ``wanted`` is followed by its code points in brackets
    (``org/аcme [U+0430 CYRILLIC SMALL LETTER A at position 4]``), and nothing unprintable is printed.

        >>> print(*did_you_mean("org/acme", ["org/\\u0430cme", "org/acme\\u202e", "org/b1"]), sep="\\n")
        org/аcme [U+0430 CYRILLIC SMALL LETTER A at position 4]
        org/acme\\u202e [U+202E RIGHT-TO-LEFT OVERRIDE at position 8]
        org/b1
    """
    import difflib

    from deep_sleep.core.characters import codepoints, shown, skeleton

    by_look: dict[str, list[str]] = {}
    for name in names:
        by_look.setdefault(skeleton(name), []).append(name)
    looks = difflib.get_close_matches(skeleton(wanted), list(by_look), n=n, cutoff=0.4) or list(by_look)[:n]
    near = [name for look in looks for name in by_look[look]][:n]
    out = []
    for name in near:
        alike = [x for x in (*near, wanted) if x != name and skeleton(x) == skeleton(name)]
        plain = name.isascii() and name.isprintable()
        out.append(shown(name) if not alike else f"{shown(name)} [{'plain ASCII' if plain else codepoints(name)}]")
    return out


AS_OF_MARGIN_HOURS = float(os.environ.get("DEEP_SLEEP_AS_OF_MARGIN_HOURS", "1"))


def check_as_of(store, as_of: datetime | None, scope=None, *, force: bool = False,
                margin_hours: float | None = None, now: datetime | None = None) -> None:
    """Refuse an ``as_of`` more than ``margin_hours`` (``DEEP_SLEEP_AS_OF_MARGIN_HOURS``, 1) past the
    wall clock, or earlier than ``scope``'s last applied run, unless ``force``."""
    from datetime import timedelta

    from deep_sleep.core.errors import InputError

    if as_of is None or force:
        return
    margin = AS_OF_MARGIN_HOURS if margin_hours is None else margin_hours
    now = now or datetime.now(UTC)
    if as_of > now + timedelta(hours=margin):
        raise InputError(f"--as-of {as_of.isoformat()} is {(as_of - now).total_seconds() / 3600:.1f} h after the wall clock "
                         f"(the margin is {margin:g} h, DEEP_SLEEP_AS_OF_MARGIN_HOURS); a run there would decay and prune "
                         "as if that time had come. Pass --force if you mean it.")
    if scope is not None:
        with store.pg() as con:
            last = con.execute("SELECT max(as_of) FROM consolidation_runs WHERE scope_path = %s AND status = 'applied'",
                               (scope.path,)).fetchone()[0]
        if last is not None and as_of < last:
            raise InputError(f"--as-of {as_of.isoformat()} is earlier than {scope.display()}'s last applied run "
                             f"(as_of {last.isoformat()}); its window would re-consolidate what that run did. "
                             "Pass --force if you mean it.")


def _consolidate(store, scope, as_of: datetime | None, config_file: str | None, dsn: str | None, runs_dir: str | None,
                 prefect: bool):
    """One scope's run: through the Prefect flow when ``prefect`` (or PREFECT_API_URL is set), else the
    very same stages in this process (:func:`deep_sleep.run.pipeline.consolidate`) — no temporary
    Prefect server to start, so a one-scope run answers in seconds."""
    from deep_sleep.core.report import ConsolidationReport
    from deep_sleep.run.layout import runs_dir as local_runs_dir
    from deep_sleep.run.pipeline import consolidate

    if prefect or os.environ.get("PREFECT_API_URL"):
        _hide_dsn(dsn)
        from deep_sleep.core.errors import ValidationFailed

        try:
            return ConsolidationReport.from_dict(_run_flow(scope.display(), as_of, config_file, None, runs_dir))
        except ValidationFailed as exc:
            print(f"deep-sleep run: {exc}", file=sys.stderr)
            return None
    local_runs_dir(runs_dir)  # a one-scope run keeps its files on local disk: a URL is refused by name
    from deep_sleep.run.pipeline import NIGHT
    from deep_sleep.run.slots import DEFAULT_APPLY_SLOTS, in_slots

    # its apply holds one of the store's apply slots, as a nightly's and the deep_sleep flow's do; force:
    # check_as_of and require_scope checked both (and --force is the operator's)
    return consolidate(store, scope, as_of, config_of(config_file), runs_dir=runs_dir, force=True,
                       stages=in_slots(NIGHT, DEFAULT_APPLY_SLOTS)).report(scope.path)


def _print_run(report) -> None:
    """Where a run's files went and what quarantine set aside — on every run's terminal output."""
    if report.quarantined:
        rows = sum(n for reasons in report.quarantined.values() for n in reasons.values())
        print(f"\nquarantined {rows} row(s) (left untouched in the store, not consolidated):")
        for table, reasons in sorted(report.quarantined.items()):
            for reason, n in sorted(reasons.items()):
                print(f"  {table}: {n} × {reason}")
    if report.snapshot_uri:
        print(f"snapshot: {report.snapshot_uri}")
    if report.diff_uri:
        print(f"diff and report.json: {report.diff_uri}")


def _run_flow(scope: str, as_of: datetime | None, config_file: str | None, dsn: str | None, runs_dir: str | None):
    from deep_sleep.core.scope import Scope

    # Bad input is refused here, before the flow starts: a failing flow run logs its traceback.
    Scope.coerce(scope)
    config_of(config_file)
    _quiet_prefect()
    from deep_sleep.flows.consolidate import DeepSleepParameters, deep_sleep

    return deep_sleep(DeepSleepParameters(scope=scope, as_of=as_of, config_file=config_file, dsn=dsn, runs_dir=runs_dir))
