"""`run_pull_consumer` on real JetStream: ack after publish, poison terminated, transient retried with
backoff, drain on stop without losing a message, trace context carried from publisher to handler.

Each test consumes the commands of its own node (a work-queue consumer), so tests never share messages.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from uuid import UUID, uuid4

import pytest
from opentelemetry import trace
from support.polling import eventually as poll_until
from tfcommon.bus import NatsEventBus
from tfcommon.consumer import Handler, TransientError, run_pull_consumer
from tfcommon.events import DiscoverGpus, Message, NodeDrained, derived_event_id
from tfcommon.subjects import EVENTS_STREAM, ConsumerSpec, node_agent_run_commands, provision_consumer
from tfcommon.telemetry import setup_telemetry

pytestmark = pytest.mark.integration

DEADLINE_S = 15.0
eventually = functools.partial(poll_until, timeout_s=DEADLINE_S, every_s=0.02)


def now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Recorder:
    """A handler that records what it saw and when, and can fail the first deliveries."""

    failures_before_success: int = 0
    returns: Callable[[Message], Sequence[Message]] = lambda _message: ()
    seen: list[UUID] = field(default_factory=list)
    seen_at: list[float] = field(default_factory=list)
    trace_ids: list[int] = field(default_factory=list)

    async def __call__(self, message: Message) -> Sequence[Message]:
        self.seen.append(message.event_id)
        self.seen_at.append(time.monotonic())
        self.trace_ids.append(trace.get_current_span().get_span_context().trace_id)
        if len(self.seen) <= self.failures_before_success:
            raise TransientError("ledger unavailable")
        return self.returns(message)


@pytest.fixture
async def consumer_spec(nats_bus: NatsEventBus, node: str) -> AsyncIterator[ConsumerSpec]:
    spec = replace(node_agent_run_commands(node), backoff_s=(0.4, 0.8), max_deliver=3)
    await provision_consumer(nats_bus.js, spec)
    yield spec
    await nats_bus.js.delete_consumer(spec.stream, spec.durable)


@dataclass
class Running:
    stop: asyncio.Event
    task: asyncio.Task[None]

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, timeout=DEADLINE_S)


def start(bus: NatsEventBus, spec: ConsumerSpec, handler: Handler, *, batch: int = 16) -> Running:
    stop = asyncio.Event()
    task = asyncio.create_task(
        run_pull_consumer(
            bus.js, spec, handler, bus=bus, service="bus-tests", stop=stop, batch=batch, fetch_timeout_s=0.2
        )
    )
    return Running(stop, task)


def a_command(node: str) -> DiscoverGpus:
    return DiscoverGpus(event_id=uuid4(), occurred_at=now(), node=node)


def outcomes(caplog: pytest.LogCaptureFixture, event_id: UUID | str) -> list[tuple[int, str]]:
    return [
        (record.__dict__["delivery"], record.__dict__["outcome"])
        for record in caplog.records
        if record.name == "tfcommon.consumer" and record.__dict__.get("event_id") == str(event_id)
    ]


async def settled(bus: NatsEventBus, spec: ConsumerSpec) -> bool:
    info = await bus.js.consumer_info(spec.stream, spec.durable)
    return bool(info.num_pending == 0 and info.num_ack_pending == 0)


async def test_returned_events_are_published_before_the_trigger_is_acked(
    nats_bus: NatsEventBus, consumer_spec: ConsumerSpec, node: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tfcommon.consumer")

    def drained(message: Message) -> Sequence[Message]:
        event_id = derived_event_id(message.event_id, NodeDrained)
        return [
            NodeDrained(
                event_id=event_id,
                occurred_at=now(),
                cause=message.event_id,
                node=node,
                pool="p",
                pods_moved=0,
            )
        ]

    handler = Recorder(returns=drained)
    running = start(nats_bus, consumer_spec, handler)
    command = a_command(node)
    await nats_bus.publish(command)

    await eventually(lambda: settled(nats_bus, consumer_spec), "the command to be acked")
    await eventually(lambda: _async_true(bool(handler.seen)), "the handler")
    await running.finish()

    published = await nats_bus.js.get_last_msg(EVENTS_STREAM, "tf.evt.node.drained")
    assert published.headers is not None
    assert published.headers["Nats-Msg-Id"] == str(derived_event_id(command.event_id, NodeDrained))
    assert outcomes(caplog, command.event_id) == [(1, "acked")]
    [line] = [r for r in caplog.records if r.__dict__.get("event_id") == str(command.event_id)]
    assert line.__dict__["service"] == "bus-tests"
    assert line.__dict__["subject"] == command.routing_subject()
    assert line.__dict__["published"] == 1
    assert isinstance(line.__dict__["ms"], float)


async def _async_true(value: bool) -> bool:
    return value


async def test_invalid_payload_is_terminated_and_logged_not_redelivered(
    nats_bus: NatsEventBus, consumer_spec: ConsumerSpec, node: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tfcommon.consumer")
    handler = Recorder()
    running = start(nats_bus, consumer_spec, handler)
    poison_id = str(uuid4())
    await nats_bus.publish_raw(
        f"tf.cmd.node-agent.discover-gpus.{node}",
        b'{"event_id": "not-a-uuid"}',
        event_id=poison_id,
        event_type="tf.cmd.node-agent.discover-gpus.v1",
        occurred_at=now(),
    )
    valid = a_command(node)
    await nats_bus.publish(valid)

    await eventually(lambda: _async_true(handler.seen == [valid.event_id]), "the valid command")
    await eventually(lambda: settled(nats_bus, consumer_spec), "both messages to be settled")
    await running.finish()

    assert outcomes(caplog, poison_id) == [(1, "terminated")]
    [poison_line] = [r for r in caplog.records if r.__dict__.get("event_id") == poison_id]
    assert poison_line.levelno == logging.ERROR
    assert "event_id: Input should be a valid UUID" in poison_line.__dict__["cause_detail"]
    info = await nats_bus.js.consumer_info(consumer_spec.stream, consumer_spec.durable)
    assert info.num_redelivered == 0
    assert handler.seen == [valid.event_id]


async def test_transient_error_is_redelivered_after_the_backoff(
    nats_bus: NatsEventBus, consumer_spec: ConsumerSpec, node: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tfcommon.consumer")
    handler = Recorder(failures_before_success=2)
    running = start(nats_bus, consumer_spec, handler)
    command = a_command(node)
    await nats_bus.publish(command)

    await eventually(lambda: _async_true(len(handler.seen) == 3), "the third delivery")
    await eventually(lambda: settled(nats_bus, consumer_spec), "the ack")
    await running.finish()

    assert outcomes(caplog, command.event_id) == [(1, "retry"), (2, "retry"), (3, "acked")]
    first, second, third = handler.seen_at
    assert second - first >= 0.4 * 0.9, "the first backoff step was not applied"
    assert third - second >= 0.8 * 0.9, "the second backoff step was not applied"


async def test_message_failing_every_delivery_is_given_up_after_max_deliver(
    nats_bus: NatsEventBus, consumer_spec: ConsumerSpec, node: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tfcommon.consumer")
    handler = Recorder(failures_before_success=99)
    running = start(nats_bus, consumer_spec, handler)
    command = a_command(node)
    await nats_bus.publish(command)

    await eventually(lambda: _async_true(len(handler.seen) == 3), "the last delivery")
    await eventually(lambda: settled(nats_bus, consumer_spec), "the message to be given up")
    follower = a_command(node)
    await nats_bus.publish(follower)
    await eventually(lambda: _async_true(handler.seen[-1] == follower.event_id), "the next message")
    await running.finish()

    assert outcomes(caplog, command.event_id) == [(1, "retry"), (2, "retry"), (3, "exhausted")]
    assert handler.seen.count(command.event_id) == 3


async def test_stop_drains_without_losing_or_repeating_a_message(
    nats_bus: NatsEventBus, consumer_spec: ConsumerSpec, node: str
) -> None:
    before_stop = [a_command(node) for _ in range(10)]
    during_shutdown = [a_command(node) for _ in range(20)]
    for command in before_stop:
        await nats_bus.publish(command)
    publishing: list[asyncio.Task[None]] = []

    first = Recorder()
    stop = asyncio.Event()

    async def handle_then_stop(message: Message) -> Sequence[Message]:
        await first(message)
        if len(first.seen) == 5:
            stop.set()  # what SIGTERM does in a service
            publishing.append(asyncio.create_task(_publish_all(nats_bus, during_shutdown)))
        return ()

    await run_pull_consumer(
        nats_bus.js,
        consumer_spec,
        handle_then_stop,
        bus=nats_bus,
        service="bus-tests",
        stop=stop,
        batch=4,
        fetch_timeout_s=0.2,
    )
    await asyncio.gather(*publishing)

    everything = {command.event_id for command in before_stop + during_shutdown}
    second = Recorder()
    running = start(nats_bus, consumer_spec, second)
    await eventually(lambda: _async_true(set(first.seen) | set(second.seen) == everything), "every message")
    await eventually(lambda: settled(nats_bus, consumer_spec), "every ack")
    await running.finish()

    assert 5 <= len(first.seen) < len(everything)
    assert set(first.seen).isdisjoint(second.seen), "a message acked before shutdown came back"
    assert len(first.seen) + len(second.seen) == len(everything)


async def _publish_all(bus: NatsEventBus, commands: Sequence[Message]) -> None:
    for command in commands:
        await bus.publish(command)


async def test_handler_runs_in_the_publishers_trace(
    nats_bus: NatsEventBus, consumer_spec: ConsumerSpec, node: str
) -> None:
    setup_telemetry("bus-tests")
    handler = Recorder()
    running = start(nats_bus, consumer_spec, handler)

    with trace.get_tracer("bus-tests").start_as_current_span("submit") as span:
        await nats_bus.publish(a_command(node))
        trace_id = span.get_span_context().trace_id

    await eventually(lambda: _async_true(bool(handler.seen)), "the handler")
    await running.finish()

    assert trace_id != 0
    assert handler.trace_ids == [trace_id]


async def test_long_work_is_not_redelivered_to_another_replica(
    nats_bus: NatsEventBus, consumer_spec: ConsumerSpec, node: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tfcommon.consumer")
    work_s = consumer_spec.effective_ack_wait_s * 3
    seen: list[UUID] = []

    async def slow(message: Message) -> Sequence[Message]:
        seen.append(message.event_id)
        await asyncio.sleep(work_s)  # the work itself, three ack waits long
        return ()

    replicas = [start(nats_bus, consumer_spec, slow), start(nats_bus, consumer_spec, slow)]
    command = a_command(node)
    await nats_bus.publish(command)
    await eventually(lambda: settled(nats_bus, consumer_spec), "the ack")
    for replica in replicas:
        await replica.finish()

    info = await nats_bus.js.consumer_info(consumer_spec.stream, consumer_spec.durable)
    assert info.num_redelivered == 0
    assert seen == [command.event_id]
    assert outcomes(caplog, command.event_id) == [(1, "acked")]


async def test_a_concurrent_consumer_handles_messages_together_and_loses_none(
    nats_bus: NatsEventBus, consumer_spec: ConsumerSpec, node: str
) -> None:
    commands = [a_command(node) for _ in range(120)]
    for command in commands[:60]:  # a backlog: the window of 16 fills at once
        await nats_bus.publish(command)
    seen: list[UUID] = []
    in_hand = most_in_hand = 0

    async def slow(message: Message) -> Sequence[Message]:
        nonlocal in_hand, most_in_hand
        in_hand += 1
        most_in_hand = max(most_in_hand, in_hand)
        await asyncio.sleep(0.02)  # a batch placing the submissions that came together
        in_hand -= 1
        seen.append(message.event_id)
        return ()

    stop = asyncio.Event()
    task = asyncio.create_task(
        run_pull_consumer(
            nats_bus.js,
            consumer_spec,
            slow,
            bus=nats_bus,
            service="bus-tests",
            stop=stop,
            batch=16,
            fetch_timeout_s=0.2,
            concurrent=True,
        )
    )
    started = time.monotonic()
    await _publish_all(nats_bus, commands[60:])
    await eventually(lambda: _async_true(len(seen) == len(commands)), "every message handled")
    elapsed = time.monotonic() - started
    await eventually(lambda: settled(nats_bus, consumer_spec), "every ack")
    stop.set()
    await asyncio.wait_for(task, timeout=DEADLINE_S)

    assert sorted(seen) == sorted(command.event_id for command in commands)
    assert 16 <= most_in_hand < 32
    assert elapsed < len(commands) * 0.02 / 2, "handled one after another"
