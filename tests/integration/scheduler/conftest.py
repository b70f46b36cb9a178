"""Fixtures for the scheduler tests: a fresh migrated database per test and the session's NATS."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from tfcommon import subjects
from tfcommon.bus import NatsEventBus
from tfcommon.ledger.sql import SqlLedger


@pytest.fixture
def database_url(migrated_database_url: str) -> str:
    """A migrated scratch ledger database of its own for each test (the shared fixture)."""
    return migrated_database_url


@pytest.fixture
async def ledger(database_url: str) -> AsyncIterator[SqlLedger]:
    sql_ledger = SqlLedger.create(database_url, pool_size=5)
    try:
        yield sql_ledger
    finally:
        await sql_ledger.close()


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[NatsEventBus]:
    nats_bus = await NatsEventBus.connect(nats_url, service="scheduler-test")
    await subjects.provision(nats_bus.js)
    try:
        yield nats_bus
    finally:
        await nats_bus.close()
