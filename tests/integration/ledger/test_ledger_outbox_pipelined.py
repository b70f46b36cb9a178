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


class RecordingPublisher:
    """Publishes through the real bus and remembers which events were sent, waking whoever waits."""

    def __init__(self, bus: NatsEventBus) -> None:
        self.bus = bus
        self.sent: list[str] = []
        self.changed = asyncio.Event()

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
        await self.bus.publish_raw(
            subject,
            payload,
            event_id=event_id,
            event_type=event_type,
            occurred_at=occurred_at,
            headers=headers,
        )
        self.sent.append(event_id)
        self.changed.set()

    async def until_sent(self, event_ids: list[str]) -> None:
        while not set(event_ids) <= set(self.sent):
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), DEADLINE_S)


async def test_an_event_written_while_the_last_pass_marks_is_published_without_waiting_for_the_mark(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    """The relay's next pass starts once the last pass's events are acknowledged; marking them (its
    rows stay locked) runs meanwhile. Here the mark of the first event is held up by a lock the test
    holds: the second event still goes out, and both end up marked once the lock is let go."""
    await OutboxRelay(ledger, bus, batch_size=1000).publish_pending()
    await reserved_in_one_batch(ledger, 1)
    [first] = await pending_event_ids(ledger)
    lock_key = 424242
    async with ledger.engine.begin() as connection:
        await connection.exec_driver_sql(
            f"""CREATE FUNCTION hold_up_outbox_mark() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN PERFORM pg_advisory_xact_lock({lock_key}); RETURN NEW; END $$"""
        )
        await connection.exec_driver_sql(
            f"CREATE TRIGGER hold_up_outbox_mark BEFORE UPDATE ON outbox FOR EACH ROW "
            f"WHEN (OLD.event_id = '{first}') EXECUTE FUNCTION hold_up_outbox_mark()"
        )
    publisher = RecordingPublisher(bus)
    relay = OutboxRelay(ledger, publisher, batch_size=1000)
    stop = asyncio.Event()
    holder = await ledger.engine.connect()
    running = None
    try:
        await holder.exec_driver_sql(f"SELECT pg_advisory_lock({lock_key})")
        running = asyncio.create_task(relay.run(stop))
        await publisher.until_sent([first])
        await reserved_in_one_batch(ledger, 1)
        [_, second] = await pending_event_ids(ledger)

        await publisher.until_sent([second])

        assert first in await pending_event_ids(ledger), "the first pass is still marking"
        await holder.exec_driver_sql(f"SELECT pg_advisory_unlock({lock_key})")
        await holder.commit()
        stop.set()
        await asyncio.wait_for(running, DEADLINE_S)
    finally:
        await holder.close()
        if running is not None and not running.done():
            running.cancel()
            await asyncio.wait({running})
        async with ledger.engine.begin() as connection:
            await connection.exec_driver_sql("DROP TRIGGER hold_up_outbox_mark ON outbox")
            await connection.exec_driver_sql("DROP FUNCTION hold_up_outbox_mark()")
    assert publisher.sent == [first, second]
    assert await pending_event_ids(ledger) == []
