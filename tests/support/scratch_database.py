"""`scratch_database`: a throw-away database on a test Postgres server, at the newest migration."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import psycopg
from sqlalchemy.engine import make_url
from tfcommon.ledger.migrate import upgrade_head


def libpq_conninfo(database_url: str) -> str:
    """`database_url` (a SQLAlchemy URL, any driver) as psycopg's connection string."""
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


def create_database(server_url: str, prefix: str = "test") -> str:
    """A new, empty database named `<prefix>_<random>` on `server_url`; returns its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(libpq_conninfo(server_url), autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def drop_database(server_url: str, database_url: str) -> None:
    """Drop `database_url`'s database, closing the connections still open to it."""
    name = make_url(database_url).database
    with psycopg.connect(libpq_conninfo(server_url), autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def scratch_database(server_url: str, prefix: str = "test", *, migrated: bool = True) -> Iterator[str]:
    """A new database on `server_url` (at the ledger's newest migration unless `migrated=False`);
    yields its URL and drops it on exit."""
    url = create_database(server_url, prefix)
    try:
        if migrated:
            upgrade_head(url)
        yield url
    finally:
        drop_database(server_url, url)
