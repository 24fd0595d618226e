"""Issue 13: the operator's first hour at the command line — bad input gets a clean message (exit 2,
no traceback), no credential is ever printed, nothing is changed that should not be."""

from __future__ import annotations

import json
import os
import re
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import polars as pl
import psycopg
import pytest

from deep_sleep import cli
from deep_sleep.cli import main
from deep_sleep.core.scope import Scope
from deep_sleep.run.layout import run_dir
from deep_sleep.run.pipeline import consolidate
from tests.storeutil import insert, node, scalar, small_graph

SECRET = "hunter2"
BAD_DSNS = [
    f"host=127.0.0.1 port=1 user=ops password={SECRET} dbname=x connect_timeout=2",
    f"host=127.0.0.1 port=1 user=ops password='{SECRET}' connect_timeout=2",
    f"postgresql://ops:{SECRET}@127.0.0.1:1/x?connect_timeout=2",
    f"mysql://ops:{SECRET}@127.0.0.1/x",
    f"garbage{SECRET}",
]
DSN_COMMANDS = [
    ["seed", "--tenants", "1"],
    ["run", "org/acme"],
    ["snapshot", "org/acme", "--out", "{tmp}/snap"],
    ["replay-range", "org/acme", "--from", "2026-01-01", "--to", "2026-01-02", "--ledger", "--runs-dir", "{tmp}"],
    ["undo", "abcd1234"],
    ["report"],
    ["nightly"],
    ["backfill", "--dry-run", "--no-progress"],
    ["demo"],
]


@pytest.fixture
def clean_env(monkeypatch):
    """Commands hand DSNs to flows through DEEP_SLEEP_DSN: restore it after each test."""
    for name in ("DEEP_SLEEP_DSN", "DEEP_SLEEP_DATABASE", "DEEP_SLEEP_KEEP_SERVER"):  # set by main(): restored after
        monkeypatch.setenv(name, "placeholder")
        monkeypatch.delenv(name)
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    return monkeypatch


def _no_prefect(monkeypatch):
    """Fail the test if a command starts Prefect's machinery."""
    def boom(*_a, **_k):
        raise AssertionError("Prefect was started")
    monkeypatch.setattr(cli.common, "_quiet_prefect", boom)
    monkeypatch.setattr(cli.common, "_run_flow", boom)


# -- item 6: no credential ever printed -------------------------------------------------------

@pytest.mark.parametrize("dsn", BAD_DSNS, ids=["keyword", "keyword-quoted", "url", "mysql", "garbage"])
@pytest.mark.parametrize("command", DSN_COMMANDS, ids=[c[0] for c in DSN_COMMANDS])
def test_no_command_prints_a_password(command, dsn, tmp_path, capsys, clean_env):
    _no_prefect(clean_env)
    argv = ["--dsn", dsn, *[a.replace("{tmp}", str(tmp_path)) for a in command]]
    assert main(argv) == 2
    out = capsys.readouterr()
    assert SECRET not in out.out + out.err
    assert "Traceback" not in out.err and "error:" in out.err
    assert SECRET not in os.environ.get("DEEP_SLEEP_DSN", "")


def test_serve_against_an_unreachable_prefect_api_is_a_clean_error(capsys, clean_env):
    clean_env.setenv("PREFECT_API_URL", "http://127.0.0.1:1/api")
    assert main(["--dsn", BAD_DSNS[2], "serve"]) == 2
    err = capsys.readouterr().err
    assert "does not answer" in err and SECRET not in err


# -- item 7: scope ids containing '/' ---------------------------------------------------------

def test_scope_ids_with_a_slash_never_display_or_file_alike():
    theirs = Scope.root("org", "acme/brand/b1")
    ours = Scope.root("org", "acme").child("brand", "b1")
    assert theirs.display() != ours.display()
    assert Scope.coerce(theirs.display()) == theirs and Scope.coerce(ours.display()) == ours
    at = datetime(2026, 1, 1, tzinfo=UTC)
    assert run_dir("r", theirs, at, "x").parent != run_dir("r", ours, at, "x").parent
    assert Scope.coerce(Scope.root("org", "50%off").display()).levels == (("org", "50%off"),)


def test_typing_the_other_tenants_display_does_not_reach_it(store, capsys, clean_env):
    _no_prefect(clean_env)
    tag = uuid.uuid4().hex[:8]
    theirs = Scope.root("org", f"{tag}/brand/b1")
    insert(store, "memory_nodes", [node(theirs, "project: x", datetime.now(UTC) - timedelta(hours=1))])
    assert main(["--dsn", store.dsn, "run", f"org/{tag}/brand/b1"]) == 2
    err = capsys.readouterr().err
    assert "has no rows" in err and theirs.display() in err  # did you mean: the escaped spelling
    assert scalar(store, "SELECT count(*) FROM consolidation_runs WHERE scope_path = %s", theirs.path) == 0


# -- items 8 and 12: one store for every command, found from any directory -----------------------

def test_data_directory_is_one_well_known_place(tmp_path, clean_env):
    from deep_sleep.store import db

    clean_env.delenv("DEEP_SLEEP_DATA_DIR", raising=False)
    clean_env.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    clean_env.chdir(tmp_path)
    here = db.data_dir()
    (tmp_path / "elsewhere").mkdir()
    clean_env.chdir(tmp_path / "elsewhere")
    assert db.data_dir() == here == (tmp_path / "xdg" / "deep-sleep" / "pgdata").resolve()
    clean_env.setenv("DEEP_SLEEP_DATA_DIR", "relative/pg")
    assert db.data_dir() == (tmp_path / "elsewhere" / "relative" / "pg").resolve()


def test_demo_then_every_command_on_the_same_store_with_no_flags(admin_dsn, tmp_path, capsys, clean_env):
    from deep_sleep.store.db import create_database, drop_database

    _no_prefect(clean_env)
    name = f"ds_demo_{os.getpid()}"
    demo = create_database(admin_dsn, name)
    try:
        clean_env.setenv("DEEP_SLEEP_DSN", demo.dsn)  # the operator's one store
        clean_env.chdir(tmp_path)
        assert main(["demo", "--tenants", "1", "--scopes-per-tenant", "1", "--nodes", "40"]) == 0
        out = capsys.readouterr()
        assert "deep-sleep: store" in out.err and "org/acme" in out.out
        assert main(["report"]) == 0
        assert "org/acme" in capsys.readouterr().out
        assert main(["run", "org/acme"]) == 0
        assert "applied" in capsys.readouterr().out
        # a second demo leaves a store with data alone unless asked
        assert main(["demo", "--tenants", "1", "--scopes-per-tenant", "1", "--nodes", "40"]) == 2
        assert "--reset" in capsys.readouterr().err
        assert main(["demo", "--tenants", "1", "--scopes-per-tenant", "1", "--nodes", "40", "--reset"]) == 0
        capsys.readouterr()
        assert main(["report", "--markdown"]) == 0
        assert capsys.readouterr().out.count("| applied |") == 2  # the fresh demo's two runs only
    finally:
        drop_database(admin_dsn, name)


def test_readme_examples_are_the_demo_scopes():
    from deep_sleep.dev.seed import SeedSpec, scopes_of

    demo = {s.display() for s in scopes_of(SeedSpec(tenants=2, scopes_per_tenant=2, nodes_per_scope=300, seed=7,
                                                    now=datetime(2026, 1, 1, tzinfo=UTC)))}
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    commands = readme.split("## Commands", 1)[1].split("## Architecture", 1)[0]
    quick = readme.split("## Quick start", 1)[1].split("## Commands", 1)[0]
    examples = set(re.findall(r"\borg/[\w/]+", commands + quick))
    assert examples and examples <= demo, examples - demo


# -- item 9: unknown scopes -------------------------------------------------------------------

def test_run_of_an_unknown_scope_names_the_nearest_ones_and_records_nothing(store, scope, capsys, clean_env):
    _no_prefect(clean_env)
    small_graph(store, scope, datetime.now(UTC))
    typo = Scope.coerce(scope.display().replace("brand", "brnd"))
    runs = scalar(store, "SELECT count(*) FROM consolidation_runs")
    assert main(["--dsn", store.dsn, "run", typo.display()]) == 2
    err = capsys.readouterr().err
    assert "did you mean" in err.lower() and scope.display() in err
    assert scalar(store, "SELECT count(*) FROM consolidation_runs") == runs


# -- items 10 and 11: a one-scope run answers without Prefect, and says what happened ---------------

def test_one_scope_run_needs_no_prefect_and_shows_files_and_quarantine(store, scope, tmp_path, capsys, clean_env):
    _no_prefect(clean_env)
    now = datetime.now(UTC)
    small_graph(store, scope, now)
    insert(store, "memory_nodes", [node(scope, "project: broken", now - timedelta(hours=1), importance=float("nan"))])
    assert main(["--dsn", store.dsn, "run", scope.display(), "--runs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr()
    assert "quarantined 1 row(s)" in out.out and "importance is not a finite number" in out.out
    snap = re.search(r"^snapshot: (.+)$", out.out, re.M).group(1)
    diff = re.search(r"^diff and report.json: (.+)$", out.out, re.M).group(1)
    assert (Path(snap) / "manifest.json").is_file() and (Path(diff) / "report.json").is_file()
    assert "deep-sleep: store" in out.err


def test_bad_input_to_run_and_nightly_is_refused_before_prefect(store, scope, capsys, clean_env):
    _no_prefect(clean_env)
    for argv in (["run", scope.display(), "--as-of", "yesterday"], ["nightly", "--as-of", "yesterday"],
                 ["run", "org"], ["run", scope.display(), "--config", "/does/not/exist.toml"],
                 ["nightly", "--as-of", "2036-01-01T00:00:00Z"]):
        assert main(["--dsn", store.dsn, *argv]) == 2, argv
        err = capsys.readouterr().err
        assert "Traceback" not in err and "error:" in err, argv


def test_nightly_exits_1_when_data_quality_fails():
    ok = {"failed": 0, "data_quality": {"success": True}}
    assert cli.nightly_exit_code(ok) == 0
    assert cli.nightly_exit_code({**ok, "data_quality": {"success": False}}) == 1
    assert cli.nightly_exit_code({**ok, "failed": 2}) == 1
    assert cli.nightly_exit_code({"failed": 0, "data_quality": None}) == 0
    alert = {"scope_path": "org\x1fa", "check": "gated_too_long", "message": "…"}
    assert cli.nightly_exit_code({**ok, "health": []}) == 0  # a healthy night
    assert cli.nightly_exit_code({**ok, "health": [alert]}) == 1
    assert cli.nightly_exit_code({**ok, "health": [alert]}, fail_on_alerts=False) == 0  # health.fail_nightly off
    assert cli.nightly_exit_code({**ok, "failed": 1, "health": [alert]}, fail_on_alerts=False) == 1


def test_report_fits_a_terminal_and_undo_takes_its_short_run_ids(store, scope, tmp_path, capsys, clean_env):
    from deep_sleep.jobs.errors import LedgerError
    from deep_sleep.jobs.ledger import resolve_run_id

    _no_prefect(clean_env)
    now = datetime.now(UTC).replace(microsecond=0)
    small_graph(store, scope, now)
    reports = [consolidate(store, scope, now + timedelta(seconds=i), runs_dir=tmp_path).report() for i in range(6)]
    assert main(["--dsn", store.dsn, "report", scope.display()]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 120
    short = reports[-1].run_id[:8]
    assert short in out
    assert resolve_run_id(store, short) == reports[-1].run_id
    with pytest.raises(LedgerError, match="no run id starts with"):
        resolve_run_id(store, "ffffffff-ffff")
    with pytest.raises(LedgerError, match="not a UUID"):
        resolve_run_id(store, "not-an-id!")
    assert main(["--dsn", store.dsn, "undo", short]) in (0, 1)
    assert "undo" in capsys.readouterr().out.lower()
    assert scalar(store, "SELECT count(*) FROM consolidation_runs WHERE undo_of = %s", reports[-1].run_id) == 1


def test_ambiguous_run_id_prefix_is_refused(store, scope):
    from deep_sleep.core.report import ConsolidationReport
    from deep_sleep.jobs.errors import LedgerError
    from deep_sleep.jobs.ledger import resolve_run_id
    from deep_sleep.run.apply import record_run

    prefix = uuid.uuid4().hex[:8]
    ids = [f"{prefix}-{tail}" for tail in ("1000-4000-8000-000000000001", "2000-4000-8000-000000000002")]
    for rid in ids:
        record_run(store, ConsolidationReport(scope_path=scope.path, as_of="2026-03-01T12:00:00Z", run_id=rid),
                   "nightly", datetime.now(UTC), "failed")
    with pytest.raises(LedgerError, match="ambiguous"):
        resolve_run_id(store, prefix)
    assert resolve_run_id(store, f"{prefix}-2") == ids[1]


# -- item 13: --as-of bounds --------------------------------------------------------------------

def test_as_of_far_ahead_or_before_the_last_run_is_refused_unless_forced(store, scope, tmp_path, capsys, clean_env):
    _no_prefect(clean_env)
    now = datetime.now(UTC).replace(microsecond=0)
    small_graph(store, scope, now)
    base = ["--dsn", store.dsn, "run", scope.display(), "--runs-dir", str(tmp_path)]
    assert main([*base, "--as-of", "2036-01-01T00:00:00Z"]) == 2
    assert "after the wall clock" in capsys.readouterr().err
    assert main([*base, "--as-of", now.isoformat()]) == 0
    capsys.readouterr()
    earlier = (now - timedelta(days=1)).isoformat()
    assert main([*base, "--as-of", earlier]) == 2
    assert "earlier than" in capsys.readouterr().err
    applied = scalar(store, "SELECT count(*) FROM consolidation_runs WHERE scope_path = %s", scope.path)
    assert main([*base, "--as-of", earlier, "--force"]) == 0
    assert scalar(store, "SELECT count(*) FROM consolidation_runs WHERE scope_path = %s", scope.path) == applied + 1


# -- item 14: tracebacks where a clean message belongs; wrong types named -------------------------

def _snapshot(tmp_path, frame: pl.DataFrame, table: str = "memory_nodes") -> Path:
    d = tmp_path / "snap"
    d.mkdir()
    frame.write_parquet(d / f"{table}.parquet")
    (d / "manifest.json").write_text(json.dumps({"scope_path": "org\x1fhand", "taken_at": "2026-03-01T12:00:00Z",
                                                 "tables": {table: {"file": f"{table}.parquet", "rows": frame.height}}}))
    return d


GOOD = {"id": [str(uuid.uuid4())], "layer": ["semantic"], "label": ["project: a"], "properties": ["{}"],
        "importance": [5.0], "updated_at": [datetime(2026, 3, 1, tzinfo=UTC)]}


@pytest.mark.parametrize(("change", "message"), [
    ({"updated_at": [1_700_000_000]}, "column updated_at holds Int64, expected timestamp"),
    ({"id": [42]}, "column id holds Int64, expected canonical lowercase UUID text"),
    ({"properties": [1.5]}, "column properties holds Float64, expected UTF-8 JSON text"),
    ({"label": None}, "column(s) label missing"),
])
def test_wrong_types_in_a_hand_written_snapshot_name_file_column_and_types(change, message, tmp_path, capsys):
    data = {**GOOD, **change}
    data = {k: v for k, v in data.items() if v is not None}
    d = _snapshot(tmp_path, pl.DataFrame(data))
    assert main(["replay", str(d), "--as-of", "2026-03-01T12:00:00Z", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert message in err and "memory_nodes.parquet" in err


@pytest.mark.parametrize("damage", ["array", "random", "truncated", "out-file"])
def test_damaged_snapshots_and_bad_out_are_clean_errors(damage, tmp_path, capsys):
    d = _snapshot(tmp_path, pl.DataFrame(GOOD))
    out = tmp_path / "o"
    if damage == "array":
        (d / "manifest.json").write_text("[1, 2, 3]")
    elif damage == "random":
        (d / "manifest.json").write_bytes(os.urandom(256) + b"\xff\xfe")
    elif damage == "truncated":
        data = (d / "memory_nodes.parquet").read_bytes()
        (d / "memory_nodes.parquet").write_bytes(data[: len(data) // 2])
    else:
        out.write_text("I am a file")
    assert main(["replay", str(d), "--as-of", "2026-03-01T12:00:00Z", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    named = {"array": "manifest.json", "random": "manifest.json", "truncated": "memory_nodes.parquet", "out-file": "existing file"}
    assert named[damage] in err and "Traceback" not in err


def test_snapshot_out_pointing_at_a_file_is_refused(store, scope, tmp_path, capsys):
    target = tmp_path / "f"
    target.write_text("x")
    assert main(["--dsn", store.dsn, "snapshot", scope.display(), "--out", str(target)]) == 2
    assert "existing file" in capsys.readouterr().err


# -- issue 32 item 4: a night's floor ----------------------------------------------------------------

_NIGHT_PROBE = """
import json, sys
from deep_sleep.cli import main
rc = main(sys.argv[1:])
print("PROBE " + json.dumps({"rc": rc, "imported": sorted(m for m in ("prefect", "great_expectations",
      "deep_sleep.flows.nightly", "deep_sleep.run.pipeline", "prefect.server.api.server") if m in sys.modules)}))
"""


def _night_env(tmp_path: Path) -> dict[str, str]:
    """The environment of an operator with no Prefect server configured: no PREFECT_API_URL, a Prefect
    home of its own (no profile), run from a directory with no settings file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_") and k != "DEEP_SLEEP_DSN"}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false", DO_NOT_TRACK="1")
    return env


def _night_in_a_process(tmp_path: Path, dsn: str, as_of: datetime | None, timeout: float = 120) -> tuple[dict, str]:
    import subprocess
    import sys

    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    when = ["--as-of", as_of.isoformat()] if as_of else []
    done = subprocess.run([sys.executable, "-c", _NIGHT_PROBE, "--dsn", dsn, "nightly", *when,
                           "--runs-dir", str(tmp_path / "runs")], cwd=cwd, env=_night_env(tmp_path), capture_output=True,
                          text=True, timeout=timeout)  # a server left running would keep the pipes open: a timeout
    probe = re.search(r"^PROBE (.+)$", done.stdout, re.M)
    assert probe, done.stdout + done.stderr
    return json.loads(probe.group(1)), done.stdout


def _ledger_row(store, scope: Scope, as_of: datetime, changed: int = 1, conflicts: int = 0) -> None:
    with store.pg() as con:
        con.execute("INSERT INTO consolidation_runs (run_id, scope_path, mode, as_of, started_at, status, rows_changed, "
                    "conflicts) VALUES (%s, %s, 'nightly', %s, %s, 'applied', %s, %s)",
                    (str(uuid.uuid4()), scope.path, as_of, as_of, json.dumps({"memory_nodes": {"updates": changed}}),
                     conflicts))
        con.commit()


@pytest.fixture
def own_store(admin_dsn):
    """A store of the test's own: a night considers every scope of its store."""
    from tests.storeutil import create_database, drop_database

    name = f"ds_floor_{uuid.uuid4().hex[:8]}"
    yield create_database(admin_dsn, name)
    drop_database(admin_dsn, name)


def test_a_night_with_no_due_scope_needs_neither_prefect_nor_great_expectations(own_store, tmp_path):
    """With no Prefect server configured and every scope gated, the night is reported (every scope
    skipped, with its reason), run health is evaluated, and nothing of Prefect, the pipeline or
    great-expectations is imported; a health alert still fails the night."""
    now = datetime.now(UTC).replace(microsecond=0)
    calm, busy = Scope.root("org", "calm").child("agent", "a"), Scope.root("org", "busy").child("agent", "a")
    for s in (calm, busy):
        small_graph(own_store, s, now - timedelta(hours=3))
        _ledger_row(own_store, s, now - timedelta(hours=1))
    probe, out = _night_in_a_process(tmp_path, own_store.dsn, None)  # as_of: the wall clock
    assert probe == {"rc": 0, "imported": []}, out
    assert "2 scopes: 0 due, 0 applied, 0 failed, 2 skipped" in out and "gated: last run 1.0 h ago" in out
    assert "data quality" not in out

    _ledger_row(own_store, busy, now - timedelta(minutes=30), changed=10, conflicts=90)  # health: conflict_rate
    probe, out = _night_in_a_process(tmp_path, own_store.dsn, now)
    assert probe == {"rc": 1, "imported": []}, out
    assert "conflict_rate" in out and "org/busy/agent/a" in out


def test_a_due_night_without_a_prefect_server_runs_the_flow_on_a_temporary_one(own_store, tmp_path):
    """The flow runs on the temporary server ``deep-sleep nightly`` starts (not Prefect's own, whose
    server package it never imports), which is stopped when the night ends."""
    now = datetime.now(UTC).replace(microsecond=0)
    scopes = [Scope.root("org", "due").child("agent", str(i)) for i in range(2)]
    for s in scopes:
        small_graph(own_store, s, now - timedelta(hours=3))
    probe, out = _night_in_a_process(tmp_path, own_store.dsn, now, timeout=400)
    assert probe["rc"] == 0, out
    assert "prefect" in probe["imported"] and "prefect.server.api.server" not in probe["imported"]
    assert "2 scopes: 2 due, 2 applied, 0 failed, 0 skipped; data quality passed" in out
    assert scalar(own_store, "SELECT count(*) FROM consolidation_runs WHERE status = 'applied'") == 2
    assert scalar(own_store, "SELECT count(*) FROM data_quality_runs WHERE success") == 1


_API_PROBE = """
import json, sys
from deep_sleep.cli.night import standing_api_url
print(json.dumps({"url": standing_api_url(), "prefect": "prefect" in sys.modules}))
"""


@pytest.mark.parametrize("where", ["nowhere", "environment", "profile"])
def test_standing_api_url_reads_prefect_settings_only_when_something_may_set_it(where, tmp_path):
    import subprocess
    import sys

    env = _night_env(tmp_path)
    url = "http://127.0.0.1:4999/api"
    if where == "environment":
        env["PREFECT_API_URL"] = url
    elif where == "profile":
        (tmp_path / "prefect-home").mkdir()
        (tmp_path / "prefect-home" / "profiles.toml").write_text(
            f'active = "ops"\n\n[profiles.ops]\nPREFECT_API_URL = "{url}"\n')
    done = subprocess.run([sys.executable, "-c", _API_PROBE], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, check=True)
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"nowhere": {"url": None, "prefect": False}, "environment": {"url": url, "prefect": False},
                   "profile": {"url": url, "prefect": True}}[where]


def test_database_picks_a_database_on_the_server_and_a_bad_name_is_refused(admin_dsn, tmp_path, capsys, clean_env):
    """``--database`` (issue 30 item 5): the same command on another database of the same server; the
    environment carries it to every store the command opens.  A name that is not a database name is an
    input error before anything connects."""
    from deep_sleep.store.db import create_database, drop_database

    _no_prefect(clean_env)
    name = f"ds_cli_db_{os.getpid()}"
    other = create_database(admin_dsn, name)
    try:
        clean_env.chdir(tmp_path)
        assert main(["--dsn", admin_dsn, "--database", name, "demo", "--tenants", "1", "--scopes-per-tenant", "1",
                     "--nodes", "30"]) == 0
        assert name in capsys.readouterr().err                    # the store line names the database used
        with psycopg.connect(other.dsn) as con:
            assert con.execute("SELECT count(*) FROM consolidation_runs").fetchone()[0] == 2  # the demo's two scopes
        assert os.environ["DEEP_SLEEP_DATABASE"] == name
        assert main(["--dsn", admin_dsn, "--database", 'x"; DROP DATABASE postgres; --', "report"]) == 2
        assert "database name" in capsys.readouterr().err
    finally:
        drop_database(admin_dsn, name)


def test_reembed_from_the_command_line(store, scope, capsys, clean_env):
    from deep_sleep.online.turn import record_turn

    record_turn(store, scope, [{"op": "upsert_node", "label": "topic: kites"}], nap=False)
    assert main(["--dsn", store.dsn, "reembed", "--scope", scope.display(), "--model",
                 "tests.online.test_recall_everything:MIRRORED"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["model"] == "mirrored-hashing-test" and out["rewritten"]["memory_nodes"] == 1
    assert main(["--dsn", store.dsn, "reembed", "--model", "no_such_module:thing"]) == 2
    assert "no_such_module" in capsys.readouterr().err
