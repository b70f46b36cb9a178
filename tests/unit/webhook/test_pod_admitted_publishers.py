"""`PodAdmitted` leaves through a long-lived publisher task: in batches whose acknowledgements are awaited
together (one batch an interval under load), flushed and stopped by `drain`, started again by the next
admission."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from itertools import pairwise
from typing import Any

from tfcommon.bus import InMemoryEventBus
from tfcommon.config_source import ConfigSource
from tfcommon.events import GpuRequest, Message, PodAdmitted, WorkloadRef
from tfwebhook.core.admission import Admitted
from tfwebhook.http import (
    BATCH_INTERVAL_S,
    EVENT_NAMESPACE,
    PUBLISH_CONCURRENCY,
    AdmissionService,
    PodAdmittedOutbox,
    event_id,
)
from tfwebhook.testing import a_gpu_container, a_pod, a_review


def gpu_review(uid: str, *, dry_run: bool = False) -> bytes:
    pod = a_pod(
        name=uid,
        labels={"tensor-fusion.ai/enabled": "true"},
        annotations={"tensor-fusion.ai/isolation": "shared"},
        containers=[a_gpu_container()],
    )
    return a_review(pod, uid=uid, dry_run=dry_run)


class AckWaitingBus:
    """Holds every publish until `acknowledge` is set, as JetStream holds it until its ack."""

    def __init__(self) -> None:
        self.acknowledge = asyncio.Event()
        self.in_flight = 0
        self.most_in_flight = 0
        self.stored: list[Message] = []

    async def publish(self, event: Message) -> None:
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            await self.acknowledge.wait()
        finally:
            self.in_flight -= 1
        self.stored.append(event)

    async def publish_raw(self, subject: str, payload: bytes, **attributes: Any) -> None:
        raise AssertionError("the webhook publishes typed events only")


def an_admitted_pod(name: str) -> Admitted:
    request = GpuRequest(
        pool="default",
        tflops_request_milli=1_000,
        tflops_limit_milli=1_000,
        vram_request_bytes=1 << 30,
        vram_limit_bytes=1 << 30,
    )
    return Admitted(workload=WorkloadRef(namespace="team-a", name=name), request=request)


def test_the_event_id_is_the_uuid5_of_the_request_uid() -> None:
    for uid in ["req-1", "", "705ab4f5-6393-11e8-b7cc-42010a800002", "pod-ü"]:
        assert event_id(uid) == uuid.uuid5(EVENT_NAMESPACE, uid)


async def test_a_burst_waits_for_its_acknowledgements_together() -> None:
    bus = AckWaitingBus()
    service = AdmissionService(config=ConfigSource(None), bus=bus)
    burst = PUBLISH_CONCURRENCY + 6
    for number in range(burst):
        assert (await service.review(gpu_review(f"burst-{number}")))[0] == 200
    for _ in range(10):
        await asyncio.sleep(0)
    assert bus.most_in_flight == PUBLISH_CONCURRENCY
    bus.acknowledge.set()
    await service.drain(timeout_s=5)
    assert service.pending_events == 0
    assert sorted(str(event.event_id) for event in bus.stored) == sorted(
        str(event_id(f"burst-{number}")) for number in range(burst)
    )


async def test_drain_publishes_everything_stops_the_publishers_and_the_next_admission_restarts_them() -> None:
    bus = InMemoryEventBus()
    service = AdmissionService(config=ConfigSource(None), bus=bus)
    before = asyncio.all_tasks()
    for number in range(5):
        await service.review(gpu_review(f"first-{number}"))
    await service.review(gpu_review("dry", dry_run=True))
    await service.drain(timeout_s=5)
    assert asyncio.all_tasks() == before
    await service.review(gpu_review("after-drain"))
    await service.drain(timeout_s=5)
    assert asyncio.all_tasks() == before
    published = [event for event in bus.messages() if isinstance(event, PodAdmitted)]
    assert [event.event_id for event in published] == [
        event_id(uid) for uid in [*(f"first-{number}" for number in range(5)), "after-drain"]
    ]
    assert all(isinstance(event.occurred_at, datetime) for event in published)


async def test_events_admitted_while_the_publisher_is_idle_are_published_without_a_drain() -> None:
    bus = InMemoryEventBus()
    service = AdmissionService(config=ConfigSource(None), bus=bus)
    for round_number in range(3):
        await service.review(gpu_review(f"idle-{round_number}"))
        for _ in range(5):
            await asyncio.sleep(0)
        assert len(bus.stored) == round_number + 1
        assert service.pending_events == 0
    await service.drain(timeout_s=5)


async def test_an_event_that_cannot_be_built_is_dropped_and_counted_not_retried_forever() -> None:
    bus = InMemoryEventBus()
    outbox = PodAdmittedOutbox(bus, limit=10, retry_backoff_s=0.01, retry_backoff_max_s=0.02)
    now = datetime.now(UTC)
    healthy = an_admitted_pod("web")
    outbox.put(("poison", now, Admitted(request=healthy.request)))  # no workload: cannot build
    outbox.put(("healthy", now, healthy))

    await outbox.drain(timeout_s=5)

    assert outbox.dropped == 1
    assert outbox.pending == 0
    assert [stored.decoded().event_id for stored in bus.stored] == [event_id("healthy")]


class BatchRecordingBus(InMemoryEventBus):
    """Stores as the in-memory bus does and records when each batch was handed over, and its size."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[tuple[float, int]] = []

    async def publish_many(self, events: Sequence[Message]) -> list[BaseException | None]:
        self.batches.append((asyncio.get_running_loop().time(), len(events)))
        return await super().publish_many(events)


async def test_a_steady_stream_of_admissions_leaves_in_batches_one_interval_apart() -> None:
    bus = BatchRecordingBus()
    outbox = PodAdmittedOutbox(bus, limit=10_000, retry_backoff_s=0.01, retry_backoff_max_s=0.02)
    verdict = an_admitted_pod("web")
    loop = asyncio.get_running_loop()
    started = loop.time()
    for number in range(600):  # about 2,000 admissions a second, ten times the batching rate
        outbox.put((f"steady-{number}", datetime.now(UTC), verdict))
        await asyncio.sleep(0.0005)
    elapsed = loop.time() - started
    await outbox.drain(timeout_s=5)

    assert [stored.decoded().event_id for stored in bus.stored] == [
        event_id(f"steady-{number}") for number in range(600)
    ]
    assert sum(size for _at, size in bus.batches) == 600
    # The first 19 events come below the batching rate and leave one by one; then one batch an interval.
    assert len(bus.batches) <= 19 + elapsed / BATCH_INTERVAL_S + 5
    busy = [at for at, _size in bus.batches[19:]]
    apart = [later - earlier >= BATCH_INTERVAL_S * 0.9 for earlier, later in pairwise(busy)]
    assert sum(apart) >= 0.95 * len(apart)  # a stalled loop may let one batch follow early
    assert max(size for _at, size in bus.batches) <= PUBLISH_CONCURRENCY


async def test_admissions_below_the_batching_rate_leave_one_by_one_at_once() -> None:
    bus = BatchRecordingBus()
    outbox = PodAdmittedOutbox(bus, limit=100, retry_backoff_s=0.01, retry_backoff_max_s=0.02)
    verdict = an_admitted_pod("web")
    for number in range(8):
        outbox.put((f"slow-{number}", datetime.now(UTC), verdict))
        for _ in range(5):
            await asyncio.sleep(0)
        assert len(bus.stored) == number + 1
        await asyncio.sleep(0.02)  # 50 a second
    await outbox.drain(timeout_s=5)
    assert [size for _at, size in bus.batches] == [1] * 8
