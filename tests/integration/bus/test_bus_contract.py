"""The `EventBus` contract, run against both `InMemoryEventBus` and `NatsEventBus` on real JetStream.

A fake that passes the same tests as the real adapter can stand in for it in unit tests.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from uuid import uuid4

import pytest
from opentelemetry import trace
from tfcommon.bus import (
    EncodedEvent,
    EventBus,
    InMemoryEventBus,
    NatsEventBus,
    StoredMessage,
    UnroutableSubjectError,
)
from tfcommon.events import DiscoverGpus, Message, NodeDrained, StopWorker, decode, encode
from tfcommon.subjects import COMMANDS_STREAM, EVENTS_STREAM, STREAMS
from tfcommon.telemetry import setup_telemetry

NOW = datetime(2026, 12, 2, 9, 30, tzinfo=UTC)


@dataclass
class BusUnderTest:
    bus: EventBus
    read_back: Callable[[], Awaitable[list[StoredMessage]]]


async def _nats_reader(bus: NatsEventBus) -> Callable[[], Awaitable[list[StoredMessage]]]:
    baseline = {spec.name: (await bus.js.stream_info(spec.name)).state.last_seq for spec in STREAMS}

    async def read_back() -> list[StoredMessage]:
        stored: list[StoredMessage] = []
        for name, first in baseline.items():
            last = (await bus.js.stream_info(name)).state.last_seq
            for seq in range(first + 1, last + 1):
                raw = await bus.js.get_msg(name, seq)
                assert raw.subject is not None
                stored.append(StoredMessage(raw.subject, raw.data or b"", dict(raw.headers or {})))
        return stored

    return read_back


@pytest.fixture
async def nats_under_test(nats_bus: NatsEventBus) -> BusUnderTest:
    return BusUnderTest(nats_bus, await _nats_reader(nats_bus))


@pytest.fixture(params=["in-memory", pytest.param("nats", marks=pytest.mark.integration)])
def under_test(request: pytest.FixtureRequest) -> BusUnderTest:
    if request.param == "nats":
        nats_variant: BusUnderTest = request.getfixturevalue("nats_under_test")
        return nats_variant
    memory = InMemoryEventBus(service="bus-tests")

    async def read_memory() -> list[StoredMessage]:
        return list(memory.stored)

    return BusUnderTest(memory, read_memory)


def a_drained_node(node: str) -> NodeDrained:
    return NodeDrained(event_id=uuid4(), occurred_at=NOW, node=node, pool="default", pods_moved=3)


async def test_published_event_is_stored_with_cloudevents_headers(under_test: BusUnderTest) -> None:
    event = a_drained_node("node-a")

    await under_test.bus.publish(event)

    [stored] = await under_test.read_back()
    assert stored.subject == "tf.evt.node.drained"
    assert decode(stored.subject, stored.payload) == event
    assert stored.headers["Nats-Msg-Id"] == str(event.event_id)
    assert stored.headers["ce-id"] == str(event.event_id)
    assert stored.headers["ce-specversion"] == "1.0"
    assert stored.headers["ce-type"] == "tf.evt.node.drained.v1"
    assert stored.headers["ce-source"] == "/tfpool/bus-tests"
    assert datetime.fromisoformat(stored.headers["ce-time"]) == NOW


async def test_same_message_id_published_twice_is_stored_once(under_test: BusUnderTest) -> None:
    event = a_drained_node("node-b")

    await under_test.bus.publish(event)
    await under_test.bus.publish(event)
    await under_test.bus.publish_raw(
        event.subject,
        encode(event),
        event_id=str(event.event_id),
        event_type=event.event_type(),
        occurred_at=event.occurred_at,
    )

    stored = await under_test.read_back()
    assert [message.headers["Nats-Msg-Id"] for message in stored] == [str(event.event_id)]


async def test_a_batch_is_stored_in_order_once_per_id_with_every_outcome_reported(
    under_test: BusUnderTest,
) -> None:
    events = [a_drained_node(f"node-batch-{number}") for number in range(5)]
    bus = under_test.bus
    assert isinstance(bus, NatsEventBus | InMemoryEventBus)

    outcomes = await bus.publish_many([*events, events[1]])

    assert outcomes == [None] * 6
    stored = await under_test.read_back()
    assert [message.headers["Nats-Msg-Id"] for message in stored] == [str(event.event_id) for event in events]
    assert [decode(message.subject, message.payload) for message in stored] == events
    assert all(message.headers["ce-source"] == "/tfpool/bus-tests" for message in stored)


async def test_an_event_encoded_by_its_producer_is_stored_as_its_message_would_be(
    under_test: BusUnderTest,
) -> None:
    typed, raw = a_drained_node("node-typed"), a_drained_node("node-encoded")
    encoded = EncodedEvent(
        raw.routing_subject(), encode(raw), str(raw.event_id), raw.event_type(), raw.occurred_at
    )
    bus = under_test.bus
    assert isinstance(bus, NatsEventBus | InMemoryEventBus)

    outcomes = await bus.publish_many([typed, encoded, encoded])

    assert outcomes == [None] * 3
    first, second = await under_test.read_back()
    assert decode(second.subject, second.payload) == raw
    assert second.subject == first.subject
    assert set(second.headers) == set(first.headers)
    assert second.headers["Nats-Msg-Id"] == second.headers["ce-id"] == str(raw.event_id)
    assert second.headers["ce-type"] == first.headers["ce-type"]


async def test_node_command_goes_to_its_node_subject(under_test: BusUnderTest, node: str) -> None:
    command = StopWorker(
        event_id=uuid4(), occurred_at=NOW, node=node, allocation_id=uuid4(), reason="tfctl run exited"
    )

    await under_test.bus.publish(command)

    [stored] = await under_test.read_back()
    assert stored.subject == f"tf.cmd.node-agent.stop-worker.{node}"
    assert decode(stored.subject, stored.payload) == command


async def test_publish_raw_keeps_caller_headers_and_type(under_test: BusUnderTest) -> None:
    event = a_drained_node("node-c")

    await under_test.bus.publish_raw(
        event.subject,
        encode(event),
        event_id=str(event.event_id),
        event_type="tf.evt.node.drained.v1",
        occurred_at=event.occurred_at,
        headers={"tf-outbox-id": "42"},
    )

    [stored] = await under_test.read_back()
    assert stored.headers["tf-outbox-id"] == "42"
    assert stored.headers["ce-type"] == "tf.evt.node.drained.v1"
    assert decode(stored.subject, stored.payload) == event


async def test_publish_carries_the_current_trace_context(under_test: BusUnderTest) -> None:
    setup_telemetry("bus-tests")
    tracer = trace.get_tracer("bus-tests")

    with tracer.start_as_current_span("admit pod") as span:
        await under_test.bus.publish(a_drained_node("node-d"))
        trace_id = format(span.get_span_context().trace_id, "032x")

    [stored] = await under_test.read_back()
    assert stored.headers["traceparent"].split("-")[1] == trace_id


async def test_subject_without_a_stream_is_refused(under_test: BusUnderTest) -> None:
    with pytest.raises(UnroutableSubjectError, match=r"no JetStream stream stores subject 'tf\.nowhere'"):
        await under_test.bus.publish_raw(
            "tf.nowhere", b"{}", event_id=str(uuid4()), event_type="x", occurred_at=NOW
        )


@pytest.mark.integration
async def test_jetstream_keeps_one_message_for_a_repeated_id(nats_bus: NatsEventBus, node: str) -> None:
    command: Message = DiscoverGpus(event_id=uuid4(), occurred_at=NOW, node=node)

    for _ in range(3):
        await nats_bus.publish(command)

    info = await nats_bus.js.stream_info(COMMANDS_STREAM, subjects_filter=command.routing_subject())
    assert info.state.subjects == {command.routing_subject(): 1}
    assert (await nats_bus.js.stream_info(EVENTS_STREAM)).config.duplicate_window >= 120
