"""The outbox relay sends a whole batch before awaiting its acks, and the stream keeps the ledger's order.

Real Postgres and real NATS JetStream. The relay's latency under load depends on the first property
(one round trip per batch, not one per event); consumers depend on the second.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from datetime import datetime
from uuid import UUID

import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from sqlalchemy import select
from tfcommon.bus import NatsEventBus
from tfcommon.events import AllocationCreated
from tfcommon.ledger import tables
from tfcommon.ledger.outbox import OutboxRelay
from tfcommon.ledger.records import Reserved
from tfcommon.ledger.sql import SqlLedger
from tfcommon.ledger.testing import GIB, a_node_with_gpus, a_reservation
from tfcommon.subjects import EVENTS, provision

pytestmark = pytest.mark.integration

DEADLINE_S = 20.0
MSG_ID = "Nats-Msg-Id"


@pytest.fixture(scope="module")
async def bus(nats_url: str) -> AsyncIterator[NatsEventBus]:
    event_bus = await NatsEventBus.connect(nats_url, service="ledger-pipelined-tests")
    await provision(event_bus.js, streams=[EVENTS], consumers=[])
    try:
        yield event_bus
    finally:
        await event_bus.close()


async def reserved_in_one_batch(ledger: SqlLedger, count: int) -> list[UUID]:
    """`count` reservations written in one transaction; returns their allocation ids in write order."""
    node, gpus = await a_node_with_gpus(ledger, gpus=4)
    results = await ledger.reserve_many(
        [a_reservation(node, {gpus[n % len(gpus)]: (1_000, GIB)}) for n in range(count)], commit=True
    )
    assert all(isinstance(result, Reserved) for result in results)
    return [result.allocation.allocation_id for result in results if isinstance(result, Reserved)]


async def pending_event_ids(ledger: SqlLedger) -> list[str]:
    outbox = tables.outbox.c
    async with ledger.engine.connect() as connection:
        rows = await connection.scalars(
            select(outbox.event_id).where(outbox.published_at.is_(None)).order_by(outbox.id)
        )
        return [str(event_id) for event_id in rows]


class AcksOnlyOnceAllAreSent:
    """A bus that acknowledges nothing until `expected` messages were handed to it: a relay that waits
    for one ack before sending the next message never finishes a pass."""

    def __init__(self, expected: int) -> None:
        self.expected = expected
        self.sent: list[str] = []
        self.all_sent = asyncio.Event()

    async def publish_raw(
        self,
        subject: str,
        payload: bytes,
        *,
        event_id: str,
        event_type: str,
        occurred_at: datetime,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.sent.append(event_id)
        if len(self.sent) == self.expected:
            self.all_sent.set()
        await self.all_sent.wait()


async def test_the_relay_sends_a_whole_batch_before_awaiting_the_first_ack(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    await OutboxRelay(ledger, bus, batch_size=1000).publish_pending()
    await reserved_in_one_batch(ledger, 20)
    waiting = await pending_event_ids(ledger)
    publisher = AcksOnlyOnceAllAreSent(expected=len(waiting))

    published = await asyncio.wait_for(
        OutboxRelay(ledger, publisher, batch_size=1000).publish_pending(), DEADLINE_S
    )

    assert published == len(waiting) == 20
    assert publisher.sent == waiting, "sent in the order the ledger wrote them"
    assert await pending_event_ids(ledger) == [], "every acknowledged event is marked published"


async def test_the_stream_stores_a_relayed_batch_in_the_order_the_ledger_wrote_it(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    await OutboxRelay(ledger, bus, batch_size=1000).publish_pending()
    await reserved_in_one_batch(ledger, 60)
    written = await pending_event_ids(ledger)

    assert await OutboxRelay(ledger, bus, batch_size=1000).publish_pending() == len(written)

    subscription = await bus.js.pull_subscribe(
        AllocationCreated.subject,
        stream=EVENTS.name,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE),
    )
    wanted = set(written)
    stored: list[str] = []
    try:
        remaining = (await subscription.consumer_info()).num_pending or 0
        while remaining > 0:
            batch = await subscription.fetch(batch=min(remaining, 256), timeout=DEADLINE_S)
            remaining -= len(batch)
            stored += [
                (message.headers or {})[MSG_ID]
                for message in batch
                if (message.headers or {}).get(MSG_ID) in wanted
            ]
    finally:
        await subscription.unsubscribe()
    assert stored == written
