"""Apply the ledger's Alembic migrations (sync; called by `tfctl migrate`, `tfctl up` and the tests).

Builds the Alembic configuration in code, so no `alembic.ini` is needed and an installed package
migrates from its own `migrations/` folder. Migrators take an advisory lock (see `migrations/env.py`).
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, pool

from tfcommon.ledger.urls import ledger_url

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"


def alembic_config(database_url: str) -> Config:
    """An Alembic `Config` for the ledger at `database_url` (for `alembic.command` calls)."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.attributes["database_url"] = ledger_url(database_url)
    return config


def upgrade_head(database_url: str) -> None:
    """Bring the ledger at `database_url` to the newest revision; does nothing when it is already there."""
    command.upgrade(alembic_config(database_url), "head")


def downgrade_base(database_url: str) -> None:
    """Undo every revision (drops the ledger's tables and data): for tests and a deliberate reset."""
    command.downgrade(alembic_config(database_url), "base")


def head_revision() -> str | None:
    """The newest revision shipped with this package."""
    return ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()


def current_revision(database_url: str) -> str | None:
    """The revision the ledger at `database_url` is at; None for an empty (never migrated) database."""
    engine = create_engine(ledger_url(database_url), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            return MigrationContext.configure(connection).get_current_revision()
    finally:
        engine.dispose()
