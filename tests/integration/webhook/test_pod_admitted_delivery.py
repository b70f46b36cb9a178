"""`PodAdmitted` reaches real JetStream at least once, and exactly once in the stream thanks to dedup.

Faults are injected around the real bus: a publish refused before it reaches NATS, and a publish that
JetStream stored but whose acknowledgement was lost (the retry is then deduplicated by the event id).
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from tfcommon.bus import NatsEventBus
from tfcommon.config_source import ConfigSource
from tfcommon.events import Message, PodAdmitted
from tfcommon.subjects import EVENTS, provision
from tfwebhook.http import EVENT_NAMESPACE, AdmissionService
from tfwebhook.testing import a_gpu_container, a_pod, a_review

pytestmark = pytest.mark.integration

MSG_ID = "Nats-Msg-Id"


@pytest.fixture(scope="module")
async def bus(nats_url: str) -> AsyncIterator[NatsEventBus]:
    event_bus = await NatsEventBus.connect(nats_url, service="webhook-delivery-tests")
    await provision(event_bus.js, streams=[EVENTS], consumers=[])
    try:
        yield event_bus
    finally:
        await event_bus.close()


class FaultyBus:
    """The real bus behind injected faults: the first `refused` publishes fail before reaching NATS,
    the next `ack_lost` are stored by JetStream and then reported as failed."""

    def __init__(self, bus: NatsEventBus, *, refused: int = 0, ack_lost: int = 0) -> None:
        self.bus = bus
        self.refused = refused
        self.ack_lost = ack_lost
        self.attempts = 0

    async def publish(self, event: Message) -> None:
        self.attempts += 1
        if self.refused > 0:
            self.refused -= 1
            raise ConnectionError("NATS unreachable")
        await self.bus.publish(event)
        if self.ack_lost > 0:
            self.ack_lost -= 1
            raise TimeoutError("PubAck lost")

    async def publish_raw(self, subject: str, payload: bytes, **attributes: Any) -> None:
        raise AssertionError("the webhook publishes typed events only")


def gpu_pod(name: str) -> dict[str, Any]:
    return a_pod(
        name=name,
        labels={"tensor-fusion.ai/enabled": "true"},
        annotations={"tensor-fusion.ai/isolation": "shared"},
        containers=[a_gpu_container()],
    )


async def stored_copies(bus: NatsEventBus, event_ids: set[str]) -> Counter[str]:
    """How many messages the events stream holds for each of `event_ids`."""
    subscription = await bus.js.pull_subscribe(
        PodAdmitted.subject,
        stream=EVENTS.name,
        config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE),
    )
    copies: Counter[str] = Counter()
    try:
        remaining = (await subscription.consumer_info()).num_pending or 0
        while remaining > 0:
            batch = await subscription.fetch(batch=min(remaining, 256), timeout=10)
            remaining -= len(batch)
            copies.update(
                message_id
                for message in batch
                if (message_id := (message.headers or {}).get(MSG_ID)) in event_ids
            )
    finally:
        await subscription.unsubscribe()
    return copies


async def test_failed_publishes_are_retried_and_stored_once_each(bus: NatsEventBus) -> None:
    faulty = FaultyBus(bus, refused=5, ack_lost=5)
    service = AdmissionService(config=ConfigSource(None), bus=faulty, retry_backoff_s=0.01)
    uids = [f"delivery-{uuid.uuid4().hex}" for _ in range(20)]
    for uid in [*uids, uids[0]]:  # the API server retried the first admission
        status, _ = await service.review(a_review(gpu_pod(uid[:40]), uid=uid))
        assert status == 200
    await service.drain(timeout_s=20)
    assert service.pending_events == 0
    assert service.dropped_events == 0
    assert faulty.attempts >= len(uids) + 1 + 10
    expected = {str(uuid.uuid5(EVENT_NAMESPACE, uid)) for uid in uids}
    assert await stored_copies(bus, expected) == Counter(dict.fromkeys(expected, 1))


async def test_a_lone_event_whose_publish_fails_is_retried_until_stored(bus: NatsEventBus) -> None:
    faulty = FaultyBus(bus, refused=2, ack_lost=1)
    service = AdmissionService(config=ConfigSource(None), bus=faulty, retry_backoff_s=0.01)
    uid = f"lone-{uuid.uuid4().hex}"
    status, _ = await service.review(a_review(gpu_pod(uid[:40]), uid=uid))
    assert status == 200
    await service.drain(timeout_s=20)
    assert service.pending_events == 0
    assert faulty.attempts == 4
    event_id = str(uuid.uuid5(EVENT_NAMESPACE, uid))
    assert await stored_copies(bus, {event_id}) == Counter({event_id: 1})


async def test_shutdown_gives_up_at_its_deadline_and_says_how_many_were_lost(
    bus: NatsEventBus, caplog: pytest.LogCaptureFixture
) -> None:
    unreachable = FaultyBus(bus, refused=10**9)
    service = AdmissionService(
        config=ConfigSource(None), bus=unreachable, retry_backoff_s=0.01, retry_backoff_max_s=0.05
    )
    for number in range(3):
        await service.review(a_review(gpu_pod(f"lost-{number}"), uid=f"lost-{uuid.uuid4().hex}"))
    with caplog.at_level(logging.ERROR, logger="tfwebhook.http"):
        await service.drain(timeout_s=0.3)
    assert service.pending_events == 3
    assert unreachable.attempts > 3
    assert "3 PodAdmitted events not published before the drain deadline" in caplog.text


async def test_a_full_outbox_keeps_the_newest_events_and_counts_the_dropped(bus: NatsEventBus) -> None:
    unreachable = FaultyBus(bus, refused=10**9)
    service = AdmissionService(
        config=ConfigSource(None),
        bus=unreachable,
        outbox_limit=2,
        retry_backoff_s=0.01,
        retry_backoff_max_s=0.02,
    )
    uids = [f"full-{uuid.uuid4().hex}" for _ in range(5)]
    for uid in uids:
        await service.review(a_review(gpu_pod(uid[:30]), uid=uid))
    await service.drain(timeout_s=0.3)
    assert unreachable.attempts >= 2
    assert (service.pending_events, service.dropped_events) == (2, 3)
    unreachable.refused = 0
    await service.drain(timeout_s=20)
    assert service.pending_events == 0
    ids = {uid: str(uuid.uuid5(EVENT_NAMESPACE, uid)) for uid in uids}
    assert await stored_copies(bus, set(ids.values())) == Counter({ids[uid]: 1 for uid in uids[-2:]})
