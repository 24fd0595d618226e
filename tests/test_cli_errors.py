"""The CLI turns every error of ours (a ``DeepSleepError``) into exit 2 and one clean message that
names the bad input — never a traceback.  Run through the real ``deep-sleep`` entry point, in a
subprocess, against the real store."""

from __future__ import annotations

import subprocess
import sys
import uuid
from datetime import UTC, datetime

import pytest

from deep_sleep.cli import main
from deep_sleep.core.errors import DeepSleepError

NOW = datetime(2026, 11, 20, 3, 0, tzinfo=UTC)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "deep_sleep.cli", *args], capture_output=True, text=True, timeout=300)


def _refused(result: subprocess.CompletedProcess, command: str, *named: str) -> None:
    assert result.returncode == 2, (result.returncode, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr and "Traceback" not in result.stdout, result.stderr
    # the last line is the error (a command that reached a store names it on the line before)
    message = result.stderr.strip().splitlines()[-1]
    assert message.startswith(f"deep-sleep {command}: error: "), result.stderr
    assert all(line.startswith("deep-sleep") for line in result.stderr.strip().splitlines()), result.stderr
    for text in named:
        assert text in message, (text, message)


@pytest.fixture(scope="module")
def snapshot_dir(tmp_path_factory):
    from deep_sleep.core.snapshot import Snapshot

    out = tmp_path_factory.mktemp("cli") / "snapshot"
    Snapshot(scope_path="org\x1fcli\x1fbrand\x1fb1", taken_at=NOW, frames={}).write(out)
    return out


def test_a_bad_scope_exits_2_naming_it(store, tmp_path):
    _refused(_cli("--dsn", store.dsn, "snapshot", "org", "--out", str(tmp_path / "snap")), "snapshot", "'org'")


def test_a_bad_scope_or_config_for_the_flow_exits_2_before_the_flow_runs(store, tmp_path):
    """A flow run that fails logs its traceback: ``run`` refuses bad input before it starts one."""
    _refused(_cli("--dsn", store.dsn, "run", "org/acme/brand", "--runs-dir", str(tmp_path)), "run", "'org/acme/brand'")
    missing = tmp_path / "missing.toml"
    _refused(_cli("--dsn", store.dsn, "run", "org/acme", "--config", str(missing), "--runs-dir", str(tmp_path)), "run",
             str(missing))


def test_a_missing_config_file_exits_2_naming_it(snapshot_dir, tmp_path):
    missing = tmp_path / "nightly.toml"
    result = _cli("replay", str(snapshot_dir), "--as-of", NOW.isoformat(), "--out", str(tmp_path / "out"), "--config", str(missing))
    _refused(result, "replay", str(missing), "does not exist")


def test_an_invalid_config_file_exits_2_naming_it(snapshot_dir, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[strengthen\nincrement = 'a lot'\n")
    result = _cli("replay", str(snapshot_dir), "--as-of", NOW.isoformat(), "--out", str(tmp_path / "out"), "--config", str(bad))
    _refused(result, "replay", str(bad), "not valid TOML")
    knob = tmp_path / "knob.toml"
    knob.write_text("[strengthen]\nincrement = 'a lot'\n")
    result = _cli("replay", str(snapshot_dir), "--as-of", NOW.isoformat(), "--out", str(tmp_path / "out"), "--config", str(knob))
    _refused(result, "replay", str(knob), "increment")


def test_a_bad_as_of_exits_2_naming_it(snapshot_dir, tmp_path):
    result = _cli("replay", str(snapshot_dir), "--as-of", "last tuesday", "--out", str(tmp_path / "out"))
    _refused(result, "replay", "'last tuesday'", "ISO 8601")


def test_an_unknown_run_id_exits_2_naming_it(store):
    run_id = str(uuid.uuid4())
    _refused(_cli("--dsn", store.dsn, "undo", run_id), "undo", run_id, "not in the ledger")
    _refused(_cli("--dsn", store.dsn, "undo", "run-42"), "undo", "'run-42'", "not a UUID")


def test_only_our_errors_are_mapped(monkeypatch, capsys):
    """A bug (a bare ValueError) is not passed off as bad input: it propagates with its traceback."""
    import deep_sleep.cli as cli

    def boom(args):
        raise ValueError("a bug, not bad input")

    def ours(args):
        raise DeepSleepError("the store said no")

    monkeypatch.setattr(cli, "cmd_compare", boom)
    with pytest.raises(ValueError, match="a bug"):
        main(["compare", "a", "b"])
    monkeypatch.setattr(cli, "cmd_compare", ours)
    assert main(["compare", "a", "b"]) == 2
    assert capsys.readouterr().err == "deep-sleep compare: error: the store said no\n"


@pytest.fixture(scope="module")
def lookalike_store(admin_dsn):
    """A store of its own holding three scopes that all render as ``org/acme`` (a Cyrillic а, a Cyrillic
    е, a trailing U+202E), and none that is ``org/acme`` — as an old store may hold them."""
    from deep_sleep.core.scope import Scope
    from tests.storeutil import create_database, drop_database, insert, node

    name = f"ds_test_lookalike_{uuid.uuid4().hex[:8]}"
    store = create_database(admin_dsn, name)
    for path in ("org\x1f\u0430cme", "org\x1facm\u0435", "org\x1facme\u202e"):
        insert(store, "memory_nodes", [node(Scope.parse(path), "user: Ada", NOW)])
    yield store
    drop_database(admin_dsn, name)


def test_did_you_mean_shows_the_code_points_of_scopes_that_look_alike(lookalike_store, tmp_path):
    result = _cli("--dsn", lookalike_store.dsn, "snapshot", "org/acme", "--out", str(tmp_path / "snap"))
    _refused(result, "snapshot", "scope org/acme has no rows in this store", "Did you mean",
             "org/аcme [U+0430 CYRILLIC SMALL LETTER A at position 4]",
             "org/acmе [U+0435 CYRILLIC SMALL LETTER IE at position 7]",
             "org/acme\\u202e [U+202E RIGHT-TO-LEFT OVERRIDE at position 8]")
    assert "\u202e" not in result.stderr  # printed escaped: a raw override would reverse the terminal line


def test_a_lookalike_scope_that_does_not_exist_is_refused_showing_its_code_points(lookalike_store, tmp_path):
    result = _cli("--dsn", lookalike_store.dsn, "snapshot", "org/\u0430cm\u0435", "--out", str(tmp_path / "snap"))
    _refused(result, "snapshot", "has no rows in this store (scope level 0: id 'аcmе' mixes scripts (Cyrillic U+0430")


def test_an_existing_lookalike_scope_can_still_be_named_to_clean_it_up(lookalike_store, tmp_path):
    result = _cli("--dsn", lookalike_store.dsn, "snapshot", "org/\u0430cme", "--out", str(tmp_path / "snap"))
    assert result.returncode == 0, result.stderr
    assert "deep-sleep: warning: scope level 0: id 'аcme' mixes scripts (Cyrillic U+0430 CYRILLIC SMALL LETTER A" in result.stderr
    assert (tmp_path / "snap" / "manifest.json").is_file()


def test_a_snapshot_manifest_naming_a_file_outside_the_snapshot_exits_2_naming_it(tmp_path):
    import json

    from deep_sleep.core.snapshot import Snapshot

    snap = Snapshot(scope_path="org\x1fcli", taken_at=NOW, frames={}).write(tmp_path / "snapshot")
    manifest = json.loads((snap / "manifest.json").read_text())
    manifest["tables"]["memory_nodes"]["file"] = "/etc/passwd"
    (snap / "manifest.json").write_text(json.dumps(manifest))
    result = _cli("replay", str(snap), "--as-of", NOW.isoformat(), "--out", str(tmp_path / "out"))
    _refused(result, "replay", "tables.memory_nodes.file '/etc/passwd' is outside the snapshot directory")


@pytest.mark.parametrize(("write", "named"), [
    (lambda p: p.write_bytes(b"[strengthen]\nincrement = 0.75 # r\xe9glage\n"), "is not UTF-8 text (byte 0xe9 on line 2)"),
    (lambda p: p.mkdir(), "is a directory; give the path of a TOML file in it"),
    (lambda p: p.write_text('[strengthen]\nincrement = "0.5"\n'), "strengthen.increment: expected a number such as 0.5, got the string '0.5'"),
    (lambda p: p.write_text("[gating]\nmin_sessions = true\n"), "gating.min_sessions: expected an integer such as 3, got true"),
])
def test_a_config_file_that_cannot_be_read_or_has_wrong_types_exits_2_in_one_line(snapshot_dir, tmp_path, write, named):
    config = tmp_path / "deep-sleep.toml"
    write(config)
    result = _cli("replay", str(snapshot_dir), "--as-of", NOW.isoformat(), "--out", str(tmp_path / "out"), "--config", str(config))
    _refused(result, "replay", str(config), named)
    assert len(result.stderr.strip().splitlines()) == 1


def test_an_environment_variable_of_the_wrong_type_exits_2_naming_it(snapshot_dir, tmp_path):
    import os

    env = {**os.environ, "DEEP_SLEEP_LLM__ENABLED": "yes"}
    result = subprocess.run([sys.executable, "-m", "deep_sleep.cli", "replay", str(snapshot_dir), "--as-of", NOW.isoformat(),
                             "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=300, env=env)
    _refused(result, "replay", "environment variable DEEP_SLEEP_LLM__ENABLED='yes' is not true or false")


def test_an_as_of_past_the_calendar_in_utc_exits_2_naming_it(snapshot_dir, tmp_path):
    result = _cli("replay", str(snapshot_dir), "--as-of", "9999-12-31T23:59:59-12:00", "--out", str(tmp_path / "out"))
    _refused(result, "replay", "'9999-12-31T23:59:59-12:00' is outside years 1–9999 once converted to UTC")
    result = _cli("replay-range", "org/acme", "--from", "0001-01-01T00:00:00+01:00", "--to", "2026-01-02", "--runs-dir", str(tmp_path))
    _refused(result, "replay-range", "'0001-01-01T00:00:00+01:00' is outside years 1–9999")


@pytest.mark.parametrize("database", ["template1", "postgres", "template0"])
def test_a_maintenance_database_is_refused_by_name_and_nothing_is_written_there(admin_dsn, store, database):
    """Issue 37: ``--database template1`` was migrated and seeded, so every database created on that
    server afterwards started with 54 nodes and 2 ledger rows."""
    import psycopg

    from deep_sleep.store.db import StoreError, connect_store, with_database

    expected = (f"database {database!r} is one of PostgreSQL's maintenance databases (postgres, template0, template1); "
                "a store needs a database of its own")
    _refused(_cli("--dsn", store.dsn, "--database", database, "held"), "held", expected)
    with pytest.raises(StoreError, match="is one of PostgreSQL's maintenance databases"):
        connect_store(store.dsn, database=database)
    if database in ("template1", "postgres"):  # a DSN naming it (template0 takes no connections at all)
        _refused(_cli("--dsn", with_database(admin_dsn, database), "held"), "held", expected)
        for name in ("template1", "postgres"):
            with psycopg.connect(with_database(admin_dsn, name)) as con:
                assert con.execute("SELECT to_regclass('schema_migrations') IS NULL AND to_regclass('memory_nodes') IS NULL"
                                   ).fetchone()[0], name


@pytest.mark.parametrize("days", ["nan", "inf", "1e9", "-1"])
def test_older_than_that_is_no_number_of_days_exits_2_naming_it(store, days, capsys):
    """Issue 37: nan passed silently, inf and 1e9 crashed with OverflowError."""
    for command in ("held", "approve", "reject"):
        assert main(["--dsn", store.dsn, command, "--older-than", days]) == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
        shown = f"{float(days):g}"
        assert err == f"deep-sleep {command}: error: --older-than must be a number of days from 0 to 365,000, got {shown}"


def test_a_bulk_rejection_says_rejected(store, capsys):
    assert main(["--dsn", store.dsn, "reject", "--scope", f"org/t{uuid.uuid4().hex[:10]}"]) == 0
    assert capsys.readouterr().out.startswith("rejected 0 held row(s) in 0 run(s)")


def test_a_manifest_nested_far_too_deep_exits_2_naming_it(snapshot_dir, tmp_path):
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    _refused(_cli("replay", str(deep), "--as-of", NOW.isoformat(), "--out", str(tmp_path / "out")), "replay",
             f"{deep / 'manifest.json'}: nested far too deeply to read")


@pytest.mark.parametrize(("version", "shown"), [(10**30, "10000000000000000000… (31 digits)"), (2, "2"), ("1", '"1"'),
                                                 (True, "true")])
def test_a_snapshot_of_another_schema_version_exits_2_naming_it(tmp_path, version, shown):
    """Issue 37: schema_version 10^30 replayed silently (a shard manifest's was never checked)."""
    import json

    from deep_sleep.core.shard import Shard
    from deep_sleep.core.snapshot import Snapshot

    one = Snapshot(scope_path="org\x1fcli", taken_at=NOW, frames={}).write(tmp_path / "one")
    many = Shard(("org\x1fa", "org\x1fb"), NOW, {"org\x1fa": None, "org\x1fb": None}, {}).write(tmp_path / "many")
    for snap in (one, many):
        manifest = json.loads((snap / "manifest.json").read_text())
        manifest["schema_version"] = version
        (snap / "manifest.json").write_text(json.dumps(manifest))
        _refused(_cli("replay", str(snap), "--as-of", NOW.isoformat(), "--out", str(tmp_path / "out")), "replay",
                 f"schema_version {shown} is not supported; this build reads schema_version 1 only")


@pytest.mark.parametrize(("toml", "named"), [
    ('lookback_hours = 1e400', "lookback_hours: expected a finite number such as 0.5, got inf"),
    ('[episodic_summary]\nbatch_size = 100000000000000000000', "episodic_summary.batch_size: expected an integer within 64 bits"),
    ('[embedding]\nmodel = "sys:exit"', "embedding.model 'sys:exit': calling exit() to build the provider raised SystemExit"),
    ('[embedding]\nmodel = "nosuch"', "embedding.model 'nosuch' is not a known model"),
])
def test_a_config_that_would_crash_or_exit_silently_exits_2_naming_it(snapshot_dir, tmp_path, toml, named):
    """Issue 37: ``embedding.model = "sys:exit"`` made replay exit 0 silently and the nightly fail with SystemExit."""
    config = tmp_path / "deep-sleep.toml"
    config.write_text(toml + "\n")
    _refused(_cli("replay", str(snapshot_dir), "--as-of", NOW.isoformat(), "--out", str(tmp_path / "out"), "--config",
                  str(config)), "replay", named)


def test_a_batch_size_past_what_a_transaction_takes_exits_2_naming_it(store):
    _refused(_cli("--dsn", store.dsn, "reembed", "--batch-size", str(10**20)), "reembed",
             "reembed: batch_size must be an integer from 1 to 1,000,000")


def test_a_failed_scope_shows_no_changes_in_the_nights_table():
    from deep_sleep.run.console import SCOPE_TABLE, scope_table

    head, got = scope_table([{"scope": "org/a", "status": "failed", "changes": 26, "conflicts": 0, "quarantined": 0, "reason": "x"},
                             {"scope": "org/b", "status": "applied", "changes": 3, "conflicts": 1, "quarantined": 0, "reason": ""}])
    assert head == list(SCOPE_TABLE)
    pick = lambda row: [row[head.index(c)] for c in ("scope", "status", "changes", "conflicts", "quarantined", "reason")]  # noqa: E731
    assert [pick(r) for r in got] == [["org/a", "failed", "—", "—", "0", "x"], ["org/b", "applied", "3", "1", "0", ""]]