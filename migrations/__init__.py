"""Alembic migrations: the only way Aryl's database schema is created or changed.

``upgrade(url)`` / ``downgrade(url, rev)`` run them programmatically (the scheduler calls ``upgrade``
at start-up when ``database.auto_migrate`` is on); ``alembic -c migrations/alembic.ini`` works too,
with the URL from ``ARYL_DATABASE__URL``.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

MIGRATIONS_DIR = Path(__file__).resolve().parent


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    # ConfigParser interpolation: a literal '%' in a password must be doubled.
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str) -> None:
    command.downgrade(alembic_config(url), revision)
