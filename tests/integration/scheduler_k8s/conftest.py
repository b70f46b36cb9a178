"""Fixtures for the scheduler's Kubernetes mode: a migrated database per test, the session's NATS, and a
stateful API server (kmock plus `tests/integration/cluster/cluster_apiserver.py`) reached over HTTP."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from tfcommon import subjects
from tfcommon.bus import NatsEventBus
from tfcommon.ledger.sql import SqlLedger

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))


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
    nats_bus = await NatsEventBus.connect(nats_url, service="scheduler-k8s-test")
    await subjects.provision(nats_bus.js)
    try:
        yield nats_bus
    finally:
        await nats_bus.close()
