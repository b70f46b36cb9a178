"""Fixtures for the ledger tests: a fresh, migrated database per test module on the session's Postgres."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from uuid import uuid4

import psycopg
import pytest
from sqlalchemy.engine import make_url
from tfcommon.ledger.migrate import upgrade_head
from tfcommon.ledger.sql import SqlLedger


def libpq_conninfo(database_url: str) -> str:
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


def create_database(server_url: str, prefix: str) -> str:
    """Create an empty database with a unique name on `server_url`; returns its SQLAlchemy URL."""
    name = f"{prefix}_{uuid4().hex[:12]}"
    with psycopg.connect(libpq_conninfo(server_url), autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def drop_database(server_url: str, database_url: str) -> None:
    name = make_url(database_url).database
    with psycopg.connect(libpq_conninfo(server_url), autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def empty_database_url(postgres_server_url: str) -> Iterator[str]:
    url = create_database(postgres_server_url, "ledger_empty")
    try:
        yield url
    finally:
        drop_database(postgres_server_url, url)


@pytest.fixture(scope="module")
def ledger_database_url(postgres_server_url: str) -> Iterator[str]:
    url = create_database(postgres_server_url, "ledger")
    upgrade_head(url)
    try:
        yield url
    finally:
        drop_database(postgres_server_url, url)


@pytest.fixture(scope="module")
async def ledger(ledger_database_url: str) -> AsyncIterator[SqlLedger]:
    sql_ledger = SqlLedger.create(ledger_database_url, pool_size=20)
    try:
        yield sql_ledger
    finally:
        await sql_ledger.close()
