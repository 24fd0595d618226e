"""Shared fixtures: a real PostgreSQL + pgvector (embedded, or $DEEP_SLEEP_TEST_DSN) with a fresh
database per test session, and Prefect's test harness started once per session (only when a test
asks for it)."""

from __future__ import annotations

import os
import uuid

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
# A task waiting for an apply slot (tag concurrency limit) polls at most this often; Prefect's 30 s
# default would leave slots idle for most of a night of small scopes.
os.environ.setdefault("PREFECT_SERVER_CONCURRENCY_MAXIMUM_CONCURRENCY_SLOT_WAIT_SECONDS", "0.5")

import pytest
from hypothesis import settings

# `make test` (and so CI) draws the same examples on every run: a red build always means a change
# broke something.  `make fuzz` draws fresh random examples (HYPOTHESIS_PROFILE=fuzz) to look for
# new counterexamples; each one found becomes a fixed test case.
settings.register_profile("default", derandomize=True, database=None)
settings.register_profile("fuzz", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

from deep_sleep.core.scope import Scope
from deep_sleep.store.db import create_database, drop_database, embedded_dsn


@pytest.fixture(scope="session")
def admin_dsn() -> str:
    """A superuser DSN: $DEEP_SLEEP_TEST_DSN, else the embedded server under .deep_sleep/test-pgdata."""
    dsn = os.environ.get("DEEP_SLEEP_TEST_DSN")
    if dsn:
        return dsn
    return embedded_dsn(data_dir=os.path.join(".deep_sleep", "test-pgdata"), database="postgres")


@pytest.fixture(scope="session")
def store(admin_dsn: str):
    """A migrated store on a database of its own, dropped after the session."""
    name = f"ds_test_{os.getpid()}"
    yield create_database(admin_dsn, name)
    drop_database(admin_dsn, name)


@pytest.fixture
def scope() -> Scope:
    """A scope no other test writes to."""
    return Scope.root("org", f"t{uuid.uuid4().hex[:10]}").child("brand", "b1")


@pytest.fixture(scope="session")
def prefect_harness():
    """Prefect's local test harness (a temporary API + database), once per session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture
def runs_dir(tmp_path):
    return tmp_path / "runs"


# -- a local S3 (issue 12 item 7: the runs directory on an object store) ---------------------------
S3_ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
          "AWS_EC2_METADATA_DISABLED": "true"}


@pytest.fixture(scope="session")
def s3_endpoint():
    """moto's S3 server in this process, on 127.0.0.1 and a free port (loopback only: no network),
    and s3fs pointed at it through the environment for the session; stopped after.

    ``AWS_ENDPOINT_URL_S3`` is botocore's own setting, read each time a client is made (so also by
    s3fs clients made after this fixture, and by worker processes started with this environment);
    ``FSSPEC_S3_ENDPOINT_URL`` is fsspec's, read once when fsspec is imported — set here for child
    processes.  Yields the endpoint URL."""
    import logging

    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one log line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    env = {**S3_ENV, "AWS_ENDPOINT_URL_S3": endpoint, "FSSPEC_S3_ENDPOINT_URL": endpoint}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield endpoint
    finally:
        import s3fs

        s3fs.S3FileSystem.clear_instance_cache()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


@pytest.fixture
def s3_bucket(s3_endpoint) -> str:
    """A fresh bucket on the local S3 (its name)."""
    from tests.s3util import new_bucket

    return new_bucket(s3_endpoint)
