"""Fixtures for the ledger tests: a fresh, migrated database per test module on the session's Postgres."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from support.scratch_database import scratch_database
from tfcommon.ledger.sql import SqlLedger


@pytest.fixture(scope="module")
def empty_database_url(postgres_server_url: str) -> Iterator[str]:
    with scratch_database(postgres_server_url, "ledger_empty", migrated=False) as url:
        yield url


@pytest.fixture(scope="module")
def ledger_database_url(postgres_server_url: str) -> Iterator[str]:
    with scratch_database(postgres_server_url, "ledger") as url:
        yield url


@pytest.fixture(scope="module")
async def ledger(ledger_database_url: str) -> AsyncIterator[SqlLedger]:
    sql_ledger = SqlLedger.create(ledger_database_url, pool_size=20)
    try:
        yield sql_ledger
    finally:
        await sql_ledger.close()
