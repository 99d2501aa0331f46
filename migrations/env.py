"""Alembic environment: runs migrations online against ``sqlalchemy.url`` (or ARYL_DATABASE__URL)."""

from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine

from scheduler_service.store.models import Base

config = context.config
target_metadata = Base.metadata


def database_url() -> str:
    url = config.get_main_option("sqlalchemy.url") or os.environ.get("ARYL_DATABASE__URL")
    if not url:
        raise SystemExit("no database URL: set ARYL_DATABASE__URL or sqlalchemy.url")
    return url


def run_migrations_online() -> None:
    connectable = config.attributes.get("connection")
    if connectable is not None:
        _run(connectable)
        return
    engine = create_engine(database_url())
    with engine.connect() as connection:
        _run(connection)
    engine.dispose()


def _run(connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


run_migrations_online()
