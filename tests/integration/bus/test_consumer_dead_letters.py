"""What a consumer gives up is dead-lettered, with why, and `tfctl deadletters` reconciles it.

Real NATS JetStream and the real pull loop (`run_pull_consumer`): a handler that keeps failing past
`max_deliver`, and a poison payload, each end in `TF_DEADLETTER` with their reason and their original
subject, sequence and event id, counted in `tf_consumer_dead_letters_total`; nothing is lost when the
copy cannot be made at first (no dead-letter stream yet); `tfctl deadletters replay` delivers the
message to the consumer again exactly once, and `discard` removes a poison one.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from uuid import UUID, uuid4

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from support.polling import eventually as poll_until
from tfcommon import subjects
from tfcommon.bus import NatsEventBus
from tfcommon.consumer import TransientError, metric_consumer, run_pull_consumer
from tfcommon.deadletter import DeadLetter, list_dead_letters
from tfcommon.events import DiscoverGpus, Message, decode
from tfcommon.infra import EmbeddedNats
from tfcommon.subjects import ConsumerSpec, node_agent_run_commands, provision_consumer, provision_stream
from tfcommon.telemetry import setup_telemetry
from tfctl.main import main

pytestmark = pytest.mark.integration

eventually = functools.partial(poll_until, timeout_s=15.0, every_s=0.05)


@dataclass
class Stalled:
    """A handler whose dependency is down while `failing`: every delivery fails transiently."""

    failing: bool = True
    seen: list[UUID] = field(default_factory=list)
    handled: list[UUID] = field(default_factory=list)

    async def __call__(self, message: Message) -> Sequence[Message]:
        self.seen.append(message.event_id)
        if self.failing:
            raise TransientError("ledger unavailable")
        self.handled.append(message.event_id)
        return ()


@dataclass
class Running:
    stop: asyncio.Event
    task: asyncio.Task[None]

    async def finish(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, timeout=15.0)


def start(bus: NatsEventBus, spec: ConsumerSpec, handler: Stalled) -> Running:
    stop = asyncio.Event()
    task = asyncio.create_task(
        run_pull_consumer(bus.js, spec, handler, bus=bus, service="bus-tests", stop=stop, fetch_timeout_s=0.2)
    )
    return Running(stop, task)


def spec_for(node: str) -> ConsumerSpec:
    return replace(node_agent_run_commands(node), backoff_s=(0.3, 0.6), max_deliver=3)


@pytest.fixture
async def consumer_spec(nats_bus: NatsEventBus, node: str) -> AsyncIterator[ConsumerSpec]:
    spec = spec_for(node)
    await provision_consumer(nats_bus.js, spec)
    yield spec
    await nats_bus.js.delete_consumer(spec.stream, spec.durable)


def a_command(node: str) -> DiscoverGpus:
    return DiscoverGpus(event_id=uuid4(), occurred_at=datetime.now(UTC), node=node)


def outcomes(caplog: pytest.LogCaptureFixture, event_id: UUID | str) -> list[tuple[int, str]]:
    return [
        (record.__dict__["delivery"], record.__dict__["outcome"])
        for record in caplog.records
        if record.name == "tfcommon.consumer" and record.__dict__.get("event_id") == str(event_id)
    ]


async def dead_letters(bus: NatsEventBus, spec: ConsumerSpec, count: int) -> list[DeadLetter]:
    async def found() -> list[DeadLetter] | None:
        letters = await list_dead_letters(bus.js, spec.durable)
        return letters if len(letters) == count else None

    letters: list[DeadLetter] = await eventually(found, f"{count} dead letters of {spec.durable}")
    return letters


def dead_letters_counted(consumer: str, reason: str) -> float:
    families = text_string_to_metric_families(generate_latest(REGISTRY).decode())
    return sum(
        sample.value
        for family in families
        if family.name == "tf_consumer_dead_letters"
        for sample in family.samples
        if sample.name == "tf_consumer_dead_letters_total"
        and {key: sample.labels.get(key) for key in ("service", "consumer", "reason")}
        == {"service": "bus-tests", "consumer": consumer, "reason": reason}
    )


async def tfctl(*argv: str) -> int:
    code: int = await asyncio.to_thread(main, list(argv))
    return code


async def test_a_handler_failing_past_max_deliver_is_dead_lettered_with_its_reason_and_replayed_once(
    nats_bus: NatsEventBus,
    nats_url: str,
    consumer_spec: ConsumerSpec,
    node: str,
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    setup_telemetry("bus-tests")
    caplog.set_level(logging.INFO, logger="tfcommon.consumer")
    counted_before = dead_letters_counted("node-agent-run-commands", "exhausted")
    handler = Stalled()
    running = start(nats_bus, consumer_spec, handler)
    command = a_command(node)
    await nats_bus.publish(command)

    [letter] = await dead_letters(nats_bus, consumer_spec, 1)
    assert outcomes(caplog, command.event_id) == [(1, "retry"), (2, "retry"), (3, "exhausted")]
    assert (letter.reason, letter.consumer, letter.deliveries) == ("exhausted", consumer_spec.durable, 3)
    assert letter.detail == "TransientError: ledger unavailable"
    assert (letter.stream, letter.subject) == (subjects.COMMANDS_STREAM, f"{subjects.DISCOVER_GPUS}.{node}")
    assert letter.event_id == str(command.event_id)
    assert letter.original_sequence > 0
    assert decode(letter.subject, letter.payload) == command, "the dead letter is the message, whole"
    assert dead_letters_counted("node-agent-run-commands", "exhausted") == counted_before + 1

    handler.failing = False  # the dependency is back: reconcile
    capsys.readouterr()
    assert (
        await tfctl(
            "deadletters", "list", "--consumer", consumer_spec.durable, "--json", "--nats-url", nats_url
        )
        == 0
    )
    [listed] = json.loads(capsys.readouterr().out)
    assert (listed["id"], listed["reason"], listed["event_id"]) == (
        letter.sequence,
        "exhausted",
        str(command.event_id),
    )
    assert await tfctl("deadletters", "replay", str(letter.sequence), "--nats-url", nats_url) == 0

    await eventually(lambda: _true(handler.handled == [command.event_id]), "the replayed message")
    assert await list_dead_letters(nats_bus.js, consumer_spec.durable) == [], "replayed, then removed"
    assert await tfctl("deadletters", "replay", str(letter.sequence), "--nats-url", nats_url) == 1
    assert "no dead letter" in capsys.readouterr().err
    await asyncio.sleep(1.0)  # longer than the backoff: a second delivery would have come by now
    await running.finish()
    assert handler.seen.count(command.event_id) == 4, "three failed deliveries and the replay, once"
    assert handler.handled == [command.event_id]


async def test_a_poison_message_is_dead_lettered_once_and_can_be_discarded(
    nats_bus: NatsEventBus, nats_url: str, consumer_spec: ConsumerSpec, node: str
) -> None:
    handler = Stalled(failing=False)
    running = start(nats_bus, consumer_spec, handler)
    poison_id = str(uuid4())
    await nats_bus.publish_raw(
        f"{subjects.DISCOVER_GPUS}.{node}",
        b'{"event_id": "not-a-uuid"}',
        event_id=poison_id,
        event_type=f"{subjects.DISCOVER_GPUS}.v1",
        occurred_at=datetime.now(UTC),
    )
    follower = a_command(node)
    await nats_bus.publish(follower)

    [letter] = await dead_letters(nats_bus, consumer_spec, 1)
    await eventually(lambda: _true(handler.handled == [follower.event_id]), "the next message")
    await running.finish()
    assert (letter.reason, letter.deliveries, letter.event_id) == ("poison", 1, poison_id)
    assert "event_id: Input should be a valid UUID" in letter.detail
    assert letter.payload == b'{"event_id": "not-a-uuid"}'
    assert await tfctl("deadletters", "discard", str(letter.sequence), "--nats-url", nats_url) == 0
    assert await list_dead_letters(nats_bus.js, consumer_spec.durable) == []


async def test_a_message_whose_dead_letter_cannot_be_stored_yet_is_kept_and_dead_lettered_later(
    own_nats: EmbeddedNats, node: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tfcommon.consumer")
    bus = await NatsEventBus.connect(own_nats.url, service="bus-tests")
    try:
        await provision_stream(bus.js, subjects.COMMANDS)  # no TF_DEADLETTER yet
        spec = spec_for(node)
        await provision_consumer(bus.js, spec)
        handler = Stalled()
        running = start(bus, spec, handler)
        command = a_command(node)
        await bus.publish(command)

        await eventually(
            lambda: _true((4, "dead-letter-failed") in outcomes(caplog, command.event_id)),
            "a failed copy, and a delivery after it",
        )
        await provision_stream(bus.js, subjects.DEADLETTER)
        [letter] = await dead_letters(bus, spec, 1)
        await running.finish()
    finally:
        await bus.close()
    assert letter.event_id == str(command.event_id)
    assert letter.deliveries >= 5
    assert outcomes(caplog, command.event_id)[-1][1] == "exhausted"


def test_a_node_agents_consumers_are_counted_without_their_node() -> None:
    assert metric_consumer(node_agent_run_commands("gpu-7.example")) == "node-agent-run-commands"
    assert metric_consumer(subjects.node_agent_track_allocations("n")) == "node-agent-track-allocations"
    assert metric_consumer(subjects.METRICS_COUNT_EVENTS) == "metrics-count-events"


async def _true(value: bool) -> bool:
    return value
