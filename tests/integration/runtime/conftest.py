"""Fixtures for the runtime tests: a fresh database per test on the session's Postgres."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from uuid import uuid4

import psycopg
import pytest
from sqlalchemy.engine import make_url


def libpq_conninfo(database_url: str) -> str:
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


def create_database(server_url: str) -> str:
    name = f"runtime_{uuid4().hex[:12]}"
    with psycopg.connect(libpq_conninfo(server_url), autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def drop_database(server_url: str, database_url: str) -> None:
    name = make_url(database_url).database
    with psycopg.connect(libpq_conninfo(server_url), autocommit=True) as connection:
        connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def database_url(postgres_server_url: str) -> Iterator[str]:
    url = create_database(postgres_server_url)
    try:
        yield url
    finally:
        drop_database(postgres_server_url, url)


@pytest.fixture(name="drop_database")
def drop_database_fixture(postgres_server_url: str) -> Callable[[str], None]:
    """Drop a test database while a service still uses it (to make Postgres 'down' for that service)."""
    return lambda database_url: drop_database(postgres_server_url, database_url)
