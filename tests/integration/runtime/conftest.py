"""Fixtures for the runtime tests: a fresh database per test on the session's Postgres."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest
from support.scratch_database import drop_database, scratch_database


@pytest.fixture
def database_url(postgres_server_url: str) -> Iterator[str]:
    with scratch_database(postgres_server_url, "runtime", migrated=False) as url:
        yield url


@pytest.fixture(name="drop_database")
def drop_database_fixture(postgres_server_url: str) -> Callable[[str], None]:
    """Drop a test database while a service still uses it (to make Postgres 'down' for that service)."""
    return lambda database_url: drop_database(postgres_server_url, database_url)
