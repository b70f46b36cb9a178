"""`PodAdmitted` leaves through a long-lived publisher task: in batches whose acknowledgements are awaited
together (one batch an interval under load), flushed and stopped by `drain`, started again by the next
admission."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone
from itertools import pairwise, product
from typing import Any
from zoneinfo import ZoneInfo

from tfcommon.bus import EncodedEvent, InMemoryEventBus, _headers_for
from tfcommon.config import TfConfig
from tfcommon.config_source import ConfigSource
from tfcommon.events import GpuRequest, Message, PodAdmitted, WorkloadRef, decode, encode
from tfcommon.placement import PlacementRequest
from tfwebhook.bench import varied_review
from tfwebhook.core.admission import AdmissionContext, Admitted
from tfwebhook.core.review import parse_review
from tfwebhook.http import (
    BATCH_INTERVAL_S,
    EVENT_NAMESPACE,
    PUBLISH_CONCURRENCY,
    AdmissionService,
    PodAdmittedOutbox,
    _pod_admitted,
    encoded_pod_admitted,
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

    async def publish_many(self, events: Sequence[Message | EncodedEvent]) -> list[BaseException | None]:
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


def an_admitted_pod_of_every_field() -> Admitted:
    request = GpuRequest(
        pool="inference",
        gpu_count=2,
        tflops_request_milli=0,
        tflops_limit_milli=0,
        vram_request_bytes=3 << 30,
        vram_limit_bytes=4 << 30,
        compute_percent_request=20,
        compute_percent_limit=40,
        gpu_model="H100",
        qos="high",
        isolation="shared",
    )
    workload = WorkloadRef(namespace="team-ü", name='web-"0"', uid="uid-1", workload="web")
    return Admitted(
        patch=[{"op": "add", "path": "/a", "value": 1}] * 3,
        workload=workload,
        request=request,
        migrated_resource="nvidia.com/gpu",
    )


def test_the_encoded_pod_admitted_is_byte_for_byte_what_encoding_its_model_gives() -> None:
    shapes = [
        PlacementRequest(
            name=f"s{count}", gpu_count=count, gpu_share=share, cpu_milli=4000, memory_bytes=8 << 30
        )
        for count, share in [(1, 1000), (1, 250), (2, 1000), (8, 1000), (1, 500)]
    ]
    service = AdmissionService(config=ConfigSource(None))
    verdicts = [an_admitted_pod("web"), an_admitted_pod_of_every_field()]
    for serial, shape in enumerate(shapes):
        request = parse_review(varied_review(shape, serial, "enc"))
        assert request.pod is not None
        verdict = service._verdicts.decide(request.pod, AdmissionContext(TfConfig(), request.namespace))
        assert isinstance(verdict, Admitted)
        assert verdict.is_gpu_pod
        verdicts.append(verdict)
    moments = [
        datetime.now(UTC),
        datetime(2026, 1, 1, tzinfo=UTC),
        datetime(2026, 6, 1, 12, 30, 5, 7, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        datetime(2026, 6, 1, 12, tzinfo=ZoneInfo("Europe/Paris")),
    ]
    for number, (verdict, occurred_at) in enumerate(product(verdicts, moments)):
        uid = f"req-{number}"
        model = _pod_admitted(uid, occurred_at, verdict)
        encoded = encoded_pod_admitted(uid, occurred_at, verdict)
        assert encoded.payload == encode(model)
        assert (encoded.subject, encoded.event_id, encoded.event_type, encoded.occurred_at) == (
            model.routing_subject(),
            str(model.event_id),
            model.event_type(),
            model.occurred_at,
        )
        assert decode(encoded.subject, encoded.payload) == model


async def test_a_batching_bus_stores_the_events_encoded_by_the_webhook_as_their_models() -> None:
    bus = BatchRecordingBus()
    outbox = PodAdmittedOutbox(bus, limit=100, retry_backoff_s=0.01, retry_backoff_max_s=0.02)
    now = datetime.now(UTC)
    verdicts = [an_admitted_pod("web"), an_admitted_pod_of_every_field()]
    for number, verdict in enumerate(verdicts):
        outbox.put((f"enc-{number}", now, verdict))
    await outbox.drain(timeout_s=5)
    assert bus.messages() == [
        _pod_admitted(f"enc-{number}", now, verdict) for number, verdict in enumerate(verdicts)
    ]
    assert [stored.headers for stored in bus.stored] == [
        _headers_for(
            "test",
            event_id=str(event_id(f"enc-{number}")),
            event_type=PodAdmitted.event_type(),
            occurred_at=now,
            extra=None,
        )
        for number in range(len(verdicts))
    ]
