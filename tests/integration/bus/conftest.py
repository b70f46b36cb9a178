"""Fixtures for the bus tests: one provisioned connection to the session's real NATS JetStream."""

from __future__ import annotations

from collections.abc import AsyncIterator
from uuid import uuid4

import pytest
from tfcommon.bus import NatsEventBus
from tfcommon.subjects import provision


@pytest.fixture(scope="session")
async def nats_bus(nats_url: str) -> AsyncIterator[NatsEventBus]:
    bus = await NatsEventBus.connect(nats_url, service="bus-tests")
    await provision(bus.js)
    try:
        yield bus
    finally:
        await bus.close()


@pytest.fixture
def node() -> str:
    """A node name no other test uses, so node-command subjects isolate each test."""
    return f"test-{uuid4().hex[:12]}"
