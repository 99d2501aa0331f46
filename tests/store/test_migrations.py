"""The Alembic migrations build exactly the schema the models describe, and undo it cleanly.

Every test runs on SQLite and on PostgreSQL. The PostgreSQL tests use their own scratch database
(``aryl_mig_<random>``), never the session's shared ``postgres_database``, because they tear the schema
down and rebuild it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import make_url

from migrations import alembic_config, downgrade, upgrade
from scheduler_service.store.models import Base
from tests.harness import scratch_postgres

MODEL_TABLES = frozenset(Base.metadata.tables)
HEAD = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


@pytest.fixture
def scratch_postgres_url() -> Iterator[str]:
    """An empty, unmigrated PostgreSQL database of this test's own; dropped afterwards."""
    with scratch_postgres("aryl_mig") as url:
        yield url


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def empty_database_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """An empty database with no schema at all; the test runs once per dialect."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'aryl.db'}"
    return request.getfixturevalue("scratch_postgres_url")


def table_names(url: str) -> set[str]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return set(sa.inspect(conn).get_table_names())
    finally:
        engine.dispose()


def current_revision(url: str) -> str | None:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def schema_differences(url: str) -> list:
    """What Alembic autogenerate would change to make the database match the models."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn, opts={"compare_type": True, "compare_server_default": True}
            )
            return compare_metadata(context, Base.metadata)
    finally:
        engine.dispose()


def check_constraint_names(url: str) -> dict[str, set[str | None]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            inspector = sa.inspect(conn)
            return {
                table: {ck["name"] for ck in inspector.get_check_constraints(table)}
                for table in MODEL_TABLES
            }
    finally:
        engine.dispose()


def append_only_guard_objects(url: str) -> set[str]:
    """The triggers (and, on PostgreSQL, the trigger function) that keep ``events`` append-only."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            if engine.dialect.name == "postgresql":
                triggers = conn.scalars(sa.text("SELECT tgname FROM pg_trigger WHERE NOT tgisinternal"))
                functions = conn.scalars(
                    sa.text("SELECT proname FROM pg_proc WHERE proname = 'aryl_events_append_only'")
                )
                return set(triggers) | set(functions)
            return set(conn.scalars(sa.text("SELECT name FROM sqlite_master WHERE type = 'trigger'")))
    finally:
        engine.dispose()


def expected_guard_objects(url: str) -> set[str]:
    if make_url(url).get_backend_name() == "postgresql":
        return {"events_append_only", "aryl_events_append_only"}
    return {"events_no_update", "events_no_delete"}


def test_upgrade_from_empty_creates_every_model_table(empty_database_url: str) -> None:
    assert table_names(empty_database_url) == set()

    upgrade(empty_database_url)

    assert table_names(empty_database_url) == MODEL_TABLES | {"alembic_version"}
    assert current_revision(empty_database_url) == HEAD
    assert append_only_guard_objects(empty_database_url) == expected_guard_objects(empty_database_url)


def test_downgrade_to_base_removes_everything_and_upgrade_rebuilds_it(empty_database_url: str) -> None:
    upgrade(empty_database_url)

    downgrade(empty_database_url, "base")

    # alembic_version itself may stay behind (empty); nothing of Aryl's may.
    assert table_names(empty_database_url) <= {"alembic_version"}
    assert current_revision(empty_database_url) is None
    assert append_only_guard_objects(empty_database_url) == set()

    # Upgrading again would fail on anything the downgrade forgot (e.g. the PostgreSQL trigger function).
    upgrade(empty_database_url)

    assert table_names(empty_database_url) == MODEL_TABLES | {"alembic_version"}
    assert current_revision(empty_database_url) == HEAD
    assert schema_differences(empty_database_url) == []
    assert append_only_guard_objects(empty_database_url) == expected_guard_objects(empty_database_url)


def test_migrated_schema_matches_the_models(empty_database_url: str) -> None:
    upgrade(empty_database_url)

    # No filtering needed: SQLite reports no spurious differences for this schema (BigId maps to
    # INTEGER there on both sides, and nothing uses ALTER-only features).
    assert schema_differences(empty_database_url) == []


def test_migrated_check_constraints_match_the_models(empty_database_url: str) -> None:
    # Autogenerate does not compare CHECK constraints at all, so compare their names here: a CHECK added
    # to a model without a migration (or the reverse) would otherwise go unnoticed.
    upgrade(empty_database_url)

    expected = {
        table.name: {c.name for c in table.constraints if isinstance(c, sa.CheckConstraint)}
        for table in Base.metadata.sorted_tables
    }
    assert check_constraint_names(empty_database_url) == expected
