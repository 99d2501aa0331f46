"""Shared fixtures: real databases (PostgreSQL and SQLite) migrated by Alembic.

PostgreSQL: ``ARYL_TEST_DATABASE_URL`` (default: the local server's ``test`` database). Each test
session creates its own scratch database next to it and drops it at the end. Under ``CI=true`` the
PostgreSQL tests fail instead of skipping when the server is unreachable.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa
import structlog
from sqlalchemy.engine import make_url

from migrations import upgrade
from scheduler_service.config import SchedulerConfig
from scheduler_service.store.models import Base

# In-process schedulers log through structlog: send it to stderr, never into a command's stdout.
# (structlog's other defaults stay: no level filter and no logger caching, so capture_logs() works.)
structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))

DEFAULT_PG_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def postgres_admin_url() -> str:
    return os.environ.get("ARYL_TEST_DATABASE_URL", DEFAULT_PG_URL)


def _postgres_unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"PostgreSQL is required under CI=true but unreachable: {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL unreachable ({reason}); set ARYL_TEST_DATABASE_URL")


@contextmanager
def scratch_postgres(prefix: str) -> Iterator[str]:
    """Create an empty PostgreSQL database named ``<prefix>_<random>`` next to the admin URL's
    database; yield its URL; drop it afterwards. Skips (fails under CI=true) when unreachable."""
    admin_url = make_url(postgres_admin_url())
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as exc:
        admin.dispose()
        _postgres_unavailable(str(exc.orig).strip().splitlines()[0])
    try:
        yield admin_url.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


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
# A real scheduler gRPC server on loopback (port chosen by the OS), over the migrated database.


def scheduler_config(database_url: str, **sections: dict) -> SchedulerConfig:
    base = {
        "server": {"listen": "127.0.0.1:0", "shutdown_grace_s": 0.5, "worker_threads": 8},
        "database": {"url": database_url, "auto_migrate": False},
        "scheduling": {"cycle_interval_s": 0.2},
        "agents": {"report_interval_s": 0.5, "telemetry_write_s": 0.2},
        "logging": {"level": "warning"},
    }
    for name, values in sections.items():
        base.setdefault(name, {}).update(values)
    return SchedulerConfig(**base)


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
def compiled_solvers() -> None:
    """Compile the numba kernels once, up front (a cold on-disk cache costs seconds), so that no
    test's timing-sensitive wait absorbs the compile."""
    from scheduler_service.solvers import warm_up

    warm_up()
