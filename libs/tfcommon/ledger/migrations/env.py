"""Alembic environment of the ledger, driven by `tfcommon.ledger.migrate` (no alembic.ini needed).

Runs online only, on the connection or URL that `migrate.py` puts in `config.attributes`, under a
Postgres advisory lock so two processes migrating at once run one after the other.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, pool, text

from tfcommon.ledger.tables import metadata

MIGRATION_LOCK_KEY = 0x7466_6C65_6467_6572  # "tfledger": the advisory lock every migrator takes


def _include_name(name: str | None, type_: str, parent_names: object) -> bool:
    # Autogenerate compares the tables this package declares; other revisions may own other tables.
    return type_ != "table" or name in metadata.tables


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        compare_type=True,
        include_name=_include_name,
    )
    with context.begin_transaction():
        connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        context.run_migrations()


def run_migrations_online() -> None:
    config = context.config
    connection: Connection | None = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    database_url = config.attributes.get("database_url") or config.get_main_option("sqlalchemy.url")
    if not database_url:
        raise RuntimeError("no database: run migrations through tfcommon.ledger.migrate (tfctl migrate)")
    engine = create_engine(database_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as new_connection:
            _run(new_connection)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise RuntimeError("offline (--sql) migrations are not supported; run tfctl migrate against a database")
run_migrations_online()
