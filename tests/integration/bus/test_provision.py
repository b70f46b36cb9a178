"""`provision()` on real JetStream: creates every stream and consumer, is idempotent, applies changes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from uuid import uuid4

import pytest
from nats.js.api import AckPolicy, RetentionPolicy, StorageType
from tfcommon import subjects
from tfcommon.bus import NatsEventBus
from tfcommon.subjects import ConsumerSpec, StreamSpec, provision

pytestmark = pytest.mark.integration


async def test_provision_twice_declares_every_stream_and_consumer(nats_bus: NatsEventBus) -> None:
    await provision(nats_bus.js)
    await provision(nats_bus.js)

    events = (await nats_bus.js.stream_info(subjects.EVENTS_STREAM)).config
    assert events.subjects == ["tf.evt.>"]
    assert events.retention == RetentionPolicy.LIMITS
    assert events.storage == StorageType.FILE
    assert events.duplicate_window >= 120
    commands = (await nats_bus.js.stream_info(subjects.COMMANDS_STREAM)).config
    assert commands.subjects == ["tf.cmd.>"]
    assert commands.retention == RetentionPolicy.WORK_QUEUE
    dead_letters = (await nats_bus.js.stream_info(subjects.DEADLETTER_STREAM)).config
    assert dead_letters.subjects == ["tf.dlq.>"]
    assert dead_letters.retention == RetentionPolicy.LIMITS
    assert (dead_letters.max_age, dead_letters.max_bytes) == (30 * 24 * 3600.0, 64 * 1024 * 1024)
    for spec in subjects.CONSUMERS:
        consumer = (await nats_bus.js.consumer_info(spec.stream, spec.durable)).config
        assert consumer.ack_policy == AckPolicy.EXPLICIT
        # The consumer loop gives a message up after spec.max_deliver (dead-lettered); the server never.
        assert consumer.max_deliver == -1
        assert consumer.backoff == list(spec.backoff_s)
        filters = consumer.filter_subjects or [consumer.filter_subject]
        assert tuple(filters) == spec.filter_subjects


async def test_per_node_consumers_accept_dotted_node_names(nats_bus: NatsEventBus) -> None:
    node = f"ip-10-0-0-{uuid4().hex[:6]}.ec2.internal"
    specs = [factory(node) for factory in subjects.PER_NODE_CONSUMERS]

    await provision(nats_bus.js, streams=(), consumers=specs)
    await provision(nats_bus.js, streams=(), consumers=specs)

    commands = await nats_bus.js.consumer_info(subjects.COMMANDS_STREAM, specs[0].durable)
    assert commands.config.filter_subject == f"tf.cmd.node-agent.*.{node}"
    for spec in specs:
        await nats_bus.js.delete_consumer(spec.stream, spec.durable)


@pytest.fixture
async def scratch_stream(nats_bus: NatsEventBus) -> AsyncIterator[StreamSpec]:
    token = uuid4().hex[:8]
    spec = StreamSpec(
        name=f"TFTEST_{token}", subjects=(f"tftest-{token}.>",), retention="limits", description="test"
    )
    yield spec
    await nats_bus.js.delete_stream(spec.name)


async def test_provision_applies_changed_configuration(
    nats_bus: NatsEventBus, scratch_stream: StreamSpec
) -> None:
    consumer = ConsumerSpec(
        stream=scratch_stream.name,
        durable="tests-record-things",
        filter_subjects=(f"{scratch_stream.subjects[0][:-2]}.thing",),
        description="test",
    )
    await provision(nats_bus.js, streams=[scratch_stream], consumers=[consumer])

    changed_stream = replace(scratch_stream, duplicate_window_s=300.0, max_age_s=3600.0)
    changed_consumer = replace(consumer, max_deliver=7, backoff_s=(2.0, 4.0))
    await provision(nats_bus.js, streams=[changed_stream], consumers=[changed_consumer])

    stream = (await nats_bus.js.stream_info(scratch_stream.name)).config
    assert (stream.duplicate_window, stream.max_age) == (300.0, 3600.0)
    applied = (await nats_bus.js.consumer_info(scratch_stream.name, consumer.durable)).config
    assert (applied.max_deliver, applied.backoff) == (-1, [2.0, 4.0])
    assert applied.ack_wait == changed_consumer.effective_ack_wait_s


async def test_more_replicas_than_a_single_server_holds_is_refused_naming_the_setting(
    nats_bus: NatsEventBus, scratch_stream: StreamSpec
) -> None:
    await provision(nats_bus.js, streams=[scratch_stream], consumers=[])
    with pytest.raises(subjects.StreamReplicasError, match="TF_NATS_STREAM_REPLICAS") as refused:
        await provision(nats_bus.js, streams=[scratch_stream], consumers=[], replicas=3)
    assert "1 for a single server" in str(refused.value)
    assert (await nats_bus.js.stream_info(scratch_stream.name)).config.num_replicas == 1
