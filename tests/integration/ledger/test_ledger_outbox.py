"""The outbox relay on real Postgres and real NATS JetStream: committed events reach the stream once.

The kill tests run the relay as its own process (`python -m tfcommon.ledger.outbox`) with the
documented test hook `TF_OUTBOX_TEST_PAUSE_AT`, which parks it after it claimed the event and before
(or after) publishing it; the test then SIGKILLs it there and starts a fresh relay.
"""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from datetime import datetime
from pathlib import Path
from uuid import UUID

import nats.aio.msg
import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from sqlalchemy import select
from tfcommon.bus import NatsEventBus
from tfcommon.events import AllocationCreated, decode, derived_event_id
from tfcommon.ledger import tables
from tfcommon.ledger.outbox import PAUSE_AT_ENV, PAUSE_MARKER_ENV, OutboxRelay
from tfcommon.ledger.records import Reserved
from tfcommon.ledger.sql import SqlLedger
from tfcommon.ledger.testing import GIB, a_node_with_gpus, a_reservation
from tfcommon.subjects import EVENTS, provision

pytestmark = pytest.mark.integration

SUBJECT = AllocationCreated.subject
DEADLINE_S = 20.0
MSG_ID = "Nats-Msg-Id"


@pytest.fixture(scope="module")
async def bus(nats_url: str) -> AsyncIterator[NatsEventBus]:
    event_bus = await NatsEventBus.connect(nats_url, service="ledger-tests")
    await provision(event_bus.js, streams=[EVENTS], consumers=[])
    try:
        yield event_bus
    finally:
        await event_bus.close()


async def stored_copies(bus: NatsEventBus, event_id: UUID) -> list[nats.aio.msg.Msg]:
    """Every message in the events stream whose Nats-Msg-Id is `event_id`, as a fresh consumer sees them."""
    subscription = await bus.js.pull_subscribe(
        SUBJECT,
        stream=EVENTS.name,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE),
    )
    found = []
    try:
        remaining = (await subscription.consumer_info()).num_pending or 0
        while remaining > 0:
            batch = await subscription.fetch(batch=min(remaining, 256), timeout=DEADLINE_S)
            remaining -= len(batch)
            found += [message for message in batch if (message.headers or {}).get(MSG_ID) == str(event_id)]
    finally:
        await subscription.unsubscribe()
    return found


async def published_at_is_set(ledger: SqlLedger, event_id: UUID) -> bool:
    async with ledger.engine.connect() as connection:
        published_at = await connection.scalar(
            select(tables.outbox.c.published_at).where(tables.outbox.c.event_id == event_id)
        )
    return published_at is not None


async def until(
    condition_name: str, check: Callable[[], Awaitable[bool]], deadline_s: float = DEADLINE_S
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + deadline_s
    while not await check():
        if loop.time() > deadline:
            raise AssertionError(f"{condition_name} did not happen within {deadline_s:.0f}s")
        await asyncio.sleep(0.05)


async def a_committed_reservation(ledger: SqlLedger) -> UUID:
    node, (gpu,) = await a_node_with_gpus(ledger)
    result = await ledger.reserve(a_reservation(node, {gpu: (10_000, 8 * GIB)}))
    assert isinstance(result, Reserved)
    return derived_event_id(result.allocation.allocation_id, AllocationCreated)


async def start_relay(database_url: str, nats_url: str, **environment: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tfcommon.ledger.outbox",
        "--database-url",
        database_url,
        "--nats-url",
        nats_url,
        env={**os.environ, **environment},
        stdin=asyncio.subprocess.DEVNULL,
    )


async def stop_relay(relay: asyncio.subprocess.Process) -> None:
    if relay.returncode is None:
        relay.terminate()
        assert await asyncio.wait_for(relay.wait(), DEADLINE_S) == 0


async def test_the_relay_publishes_a_committed_event_with_its_id_and_cloudevents_headers(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    event_id = await a_committed_reservation(ledger)
    relay = OutboxRelay(ledger, bus)

    assert await relay.publish_pending() >= 1
    assert await relay.publish_pending() == 0

    (message,) = await stored_copies(bus, event_id)
    headers = message.headers or {}
    assert headers["ce-id"] == str(event_id)
    assert headers["ce-type"] == AllocationCreated.event_type()
    event = decode(message.subject, message.data)
    assert isinstance(event, AllocationCreated)
    assert event.event_id == event_id
    assert await published_at_is_set(ledger, event_id)


async def test_the_running_relay_wakes_on_commit_without_waiting_for_its_poll(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    stop = asyncio.Event()
    relay = asyncio.create_task(OutboxRelay(ledger, bus, poll_interval_s=60.0).run(stop))
    try:
        await until("relay idle", lambda: _no_pending(ledger))
        event_id = await a_committed_reservation(ledger)

        await until("event published", lambda: published_at_is_set(ledger, event_id), deadline_s=10.0)
    finally:
        stop.set()
        await asyncio.wait_for(relay, DEADLINE_S)
    assert len(await stored_copies(bus, event_id)) == 1


async def _no_pending(ledger: SqlLedger) -> bool:
    async with ledger.engine.connect() as connection:
        pending = await connection.scalar(
            select(tables.outbox.c.id).where(tables.outbox.c.published_at.is_(None)).limit(1)
        )
    return pending is None


@pytest.mark.parametrize("pause_at", ["before-publish", "after-publish"])
async def test_a_relay_killed_between_commit_and_mark_still_delivers_the_event_exactly_once(
    ledger: SqlLedger,
    bus: NatsEventBus,
    ledger_database_url: str,
    nats_url: str,
    tmp_path: Path,
    pause_at: str,
) -> None:
    await until("older events published", lambda: _drain(ledger, bus))
    event_id = await a_committed_reservation(ledger)
    marker = tmp_path / "paused"

    doomed = await start_relay(
        ledger_database_url, nats_url, **{PAUSE_AT_ENV: pause_at, PAUSE_MARKER_ENV: str(marker)}
    )
    try:
        await until("relay paused", lambda: _exists(marker))
    finally:
        doomed.kill()
        await doomed.wait()
    assert str(event_id) in marker.read_text().split()
    assert not await published_at_is_set(ledger, event_id)
    expected_before_restart = 0 if pause_at == "before-publish" else 1
    assert len(await stored_copies(bus, event_id)) == expected_before_restart

    relay = await start_relay(ledger_database_url, nats_url)
    try:
        await until("event marked published", lambda: published_at_is_set(ledger, event_id))
    finally:
        await stop_relay(relay)

    copies = await stored_copies(bus, event_id)
    assert len(copies) == 1
    event = decode(copies[0].subject, copies[0].data)
    assert isinstance(event, AllocationCreated)
    assert event.event_id == event_id


async def _drain(ledger: SqlLedger, bus: NatsEventBus) -> bool:
    await OutboxRelay(ledger, bus).publish_pending()
    return await _no_pending(ledger)


async def _exists(path: Path) -> bool:
    return await asyncio.to_thread(path.exists)


class FailingOnSecondPublish:
    """A publisher whose bus goes away after one message."""

    def __init__(self) -> None:
        self.published: list[str] = []

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
        if self.published:
            raise ConnectionError("bus unavailable")
        self.published.append(event_id)


async def test_events_published_before_a_bus_failure_stay_published_and_the_rest_stay_pending(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    await until("older events published", lambda: _drain(ledger, bus))
    first, second = await a_committed_reservation(ledger), await a_committed_reservation(ledger)
    publisher = FailingOnSecondPublish()

    with pytest.raises(ConnectionError, match="bus unavailable"):
        await OutboxRelay(ledger, publisher).publish_pending()

    assert publisher.published == [str(first)]
    assert await published_at_is_set(ledger, first)
    assert not await published_at_is_set(ledger, second)


async def test_pruning_removes_old_published_events_and_never_pending_ones(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    published = await a_committed_reservation(ledger)
    await until("event published", lambda: _drain(ledger, bus))
    pending = await a_committed_reservation(ledger)
    relay = OutboxRelay(ledger, bus)

    assert await relay.prune_published(older_than_s=3600.0) == 0
    assert await relay.prune_published(older_than_s=0.0) >= 1

    async with ledger.engine.connect() as connection:
        remaining = set(
            await connection.scalars(
                select(tables.outbox.c.event_id).where(tables.outbox.c.event_id.in_([published, pending]))
            )
        )
    assert remaining == {pending}
