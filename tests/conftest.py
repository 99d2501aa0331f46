"""Shared fixtures: real databases (PostgreSQL and SQLite) migrated by Alembic.

PostgreSQL: ``ARYL_TEST_DATABASE_URL`` (default: the local server's ``test`` database). Each test
session creates its own scratch database next to it and drops it at the end. Under ``CI=true`` the
PostgreSQL tests fail instead of skipping when the server is unreachable.
"""

from __future__ import annotations

# isort: off
import node_agent  # noqa: F401 -- first: it turns gRPC's fork handlers off before grpc is imported
# isort: on
import os
import signal
import sys
from collections.abc import Iterator

import grpc
import pytest
import sqlalchemy as sa
import structlog

from migrations import upgrade
from scheduler_service.store.models import Base
from tests.harness import scheduler_config, scratch_postgres, security_env
from tests.helpers import TIMEOUT_FACTOR, TIMEOUT_FACTOR_ENV

# A shell runs a background command (`make test &`, a CI step detached from a terminal) with SIGINT
# ignored, and an ignored signal stays ignored in every process started from it: the tests that stop
# `arylctl --follow`/`-w` with Ctrl-C (SIGINT) would wait forever. Restore the usual disposition.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# In-process schedulers log through structlog: send it to stderr, never into a command's stdout.
# (structlog's other defaults stay: no level filter and no logger caching, so capture_logs() works.)
structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))


def pytest_report_header() -> str:
    return f"aryl: waits sized for an idle machine x{TIMEOUT_FACTOR:g} ({TIMEOUT_FACTOR_ENV})"


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for this test session; yields its URL."""
    with scratch_postgres("aryl_test") as url:
        yield url


@pytest.fixture(scope="session")
def migrated_postgres(postgres_database: str) -> str:
    upgrade(postgres_database)
    return postgres_database


def _truncate_all(url: str) -> None:
    engine = sa.create_engine(url)
    tables = [t.name for t in Base.metadata.sorted_tables]
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            # TRUNCATE does not fire the events table's row-level append-only triggers.
            conn.execute(sa.text(f"TRUNCATE {', '.join(tables)} RESTART IDENTITY CASCADE"))
        else:
            raise AssertionError("SQLite databases are created per test")
    engine.dispose()


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A migrated, empty database; the test runs once on SQLite and once on PostgreSQL."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'aryl.db'}"
        upgrade(url)
        return url
    url = request.getfixturevalue("migrated_postgres")
    _truncate_all(url)
    return url


@pytest.fixture
def postgres_url(migrated_postgres: str) -> str:
    """A migrated, empty PostgreSQL database (for tests that only make sense on PostgreSQL)."""
    _truncate_all(migrated_postgres)
    return migrated_postgres


# ---------------------------------------------------------------------------------------------
# A real scheduler gRPC server on loopback (port chosen by the OS), over the migrated database
# (configured by ``tests.harness.scheduler_config``).


@pytest.fixture
def scheduler_factory(database_url: str):
    """Start schedulers on the test's database (several in turn, e.g. to test a restart)."""
    from scheduler_service.server import serve_in_background

    handles = []

    def start(**sections: dict):
        handle = serve_in_background(scheduler_config(database_url, **sections))
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.stop()


@pytest.fixture
def scheduler(scheduler_factory):
    """A running scheduler; ``.address`` is "127.0.0.1:PORT". Runs on SQLite and PostgreSQL."""
    return scheduler_factory()


@pytest.fixture(scope="session", autouse=True)
def secure_by_default_environment() -> Iterator[None]:
    """Every process a test starts (aryl-scheduler, aryl-agent, aryl-router, arylctl) and every
    ArylClient runs with TLS and a token, as by default: the session's development CA and the admin's
    token (``tests.harness.TestPki``). A test that wants plaintext says so (``--insecure``, ARYL_INSECURE)."""
    saved = dict(os.environ)
    os.environ.update(security_env())
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(scope="session", autouse=True)
def grpc_event_engine_kept() -> Iterator[None]:
    """One idle channel held for the whole session, so that closing any other channel never releases the
    last reference to gRPC's event engine. That last release quiesces the engine while holding the GIL,
    which deadlocks against an engine thread that destroys a call-credentials plugin (our bearer token)
    and waits for the GIL (grpc/grpc#42247): seen once here as a test hung for good in Channel.close."""
    channel = grpc.insecure_channel("127.0.0.1:9")  # never used for a call: it only holds the engine
    yield
    channel.close()


@pytest.fixture(scope="session", autouse=True)
def compiled_solvers() -> None:
    """Compile the numba kernels once, up front (a cold on-disk cache costs seconds), so that no
    test's timing-sensitive wait absorbs the compile."""
    from scheduler_service.solvers import warm_up

    warm_up()
