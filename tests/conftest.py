"""Shared fixtures: real databases (PostgreSQL and SQLite) migrated by Alembic.

PostgreSQL: ``ARYL_TEST_DATABASE_URL`` (default: the local server's ``test`` database). Each test
session creates its own scratch database next to it and drops it at the end. Under ``CI=true`` the
PostgreSQL tests fail instead of skipping when the server is unreachable.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url

from migrations import upgrade
from scheduler_service.store.models import Base

DEFAULT_PG_URL = "postgresql+psycopg2://postgres@127.0.0.1:5432/test"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def postgres_admin_url() -> str:
    return os.environ.get("ARYL_TEST_DATABASE_URL", DEFAULT_PG_URL)


def _postgres_unavailable(reason: str) -> None:
    if IN_CI:
        pytest.fail(f"PostgreSQL is required under CI=true but unreachable: {reason}", pytrace=False)
    pytest.skip(f"PostgreSQL unreachable ({reason}); set ARYL_TEST_DATABASE_URL")


@pytest.fixture(scope="session")
def postgres_database() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for this test session; yields its URL."""
    admin_url = make_url(postgres_admin_url())
    admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
    name = f"aryl_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as exc:
        admin.dispose()
        _postgres_unavailable(str(exc.orig).strip().splitlines()[0])
    url = admin_url.set(database=name).render_as_string(hide_password=False)
    try:
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


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
