"""deploy/nats/nats.conf on a real nats-server: each service can do what its code does, and no more.

Who publishes what comes from `tfcommon.events` (`producers`), which durable consumers each service
runs from `tfcommon.subjects`; a new event or consumer that the NATS users do not allow fails here.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import nats
import pytest
from nats.aio.client import Client
from nats.js.errors import Error as JetStreamError
from secured_nats_server import SecuredNats
from tfcommon import events, subjects
from tfcommon.subjects import ConsumerSpec
from tfctl.commands.events import tail

pytestmark = pytest.mark.integration

SERVICES = ("webhook", "scheduler", "defrag-planner", "node-agent", "metrics", "tfctl")
NODE = "gpu-node-1"
DEADLINE_S = 5.0


class Violations:
    """Permission errors the server reported asynchronously on one connection."""

    def __init__(self) -> None:
        self.messages: list[str] = []

    async def record(self, error: Exception) -> None:
        self.messages.append(str(error).lower())

    async def wait_for(self, fragment: str) -> bool:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            if any(fragment.lower() in message for message in self.messages):
                return True
            await asyncio.sleep(0.05)
        return False


@asynccontextmanager
async def connected(server: SecuredNats, user: str) -> AsyncIterator[tuple[Client, Violations]]:
    violations = Violations()
    client = await nats.connect(
        server.url,
        user=user,
        password=server.passwords[user],
        error_cb=violations.record,
        allow_reconnect=False,
        connect_timeout=5,
    )
    try:
        yield client, violations
    finally:
        await client.close()


def producer_names(message_type: type[events.Message]) -> set[str]:
    return {producer.split()[0] for producer in message_type.producers}


def published_subject(message_type: type[events.Message]) -> str:
    if issubclass(message_type, events.NodeCommand):
        return f"{message_type.subject}.{NODE}"
    return message_type.subject


def produced_by(service: str) -> list[str]:
    return [
        published_subject(message_type)
        for message_type in events.MESSAGE_TYPES.values()
        if service in producer_names(message_type)
    ]


def consumers_of(service: str) -> list[ConsumerSpec]:
    own = [spec for spec in subjects.CONSUMERS if spec.service == service]
    if service == "node-agent":
        own += [factory(NODE) for factory in subjects.PER_NODE_CONSUMERS]
    return own


@pytest.fixture(scope="module")
async def provisioned(secured_nats: SecuredNats) -> SecuredNats:
    async with connected(secured_nats, "scheduler") as (client, _):
        await subjects.provision(client.jetstream(timeout=5), consumers=())
    return secured_nats


def test_every_producer_of_the_code_has_a_nats_user() -> None:
    named = set().union(*(producer_names(message_type) for message_type in events.MESSAGE_TYPES.values()))
    assert named <= set(SERVICES)
    assert {spec.service for spec in subjects.CONSUMERS} <= set(SERVICES)


@pytest.mark.parametrize("service", SERVICES)
async def test_service_provisions_publishes_and_consumes_what_its_code_does(
    provisioned: SecuredNats, service: str
) -> None:
    async with connected(provisioned, service) as (client, violations):
        js = client.jetstream(timeout=5)
        await subjects.provision(js, consumers=consumers_of(service))
        for subject in produced_by(service):
            acknowledgement = await js.publish(subject, b"{}")
            assert acknowledgement.stream in (subjects.EVENTS_STREAM, subjects.COMMANDS_STREAM)
        for spec in consumers_of(service):
            subscription = await js.pull_subscribe_bind(durable=spec.durable, stream=spec.stream)
            with contextlib.suppress(nats.errors.TimeoutError):
                for message in await subscription.fetch(10, timeout=0.3):
                    await message.ack()
        await client.flush()
        assert violations.messages == []


@pytest.mark.parametrize("service", SERVICES)
async def test_service_cannot_publish_what_another_service_produces(
    provisioned: SecuredNats, service: str
) -> None:
    foreign = sorted(
        published_subject(message_type)
        for message_type in events.MESSAGE_TYPES.values()
        if producer_names(message_type) and service not in producer_names(message_type)
    )
    async with connected(provisioned, service) as (client, violations):
        for subject in foreign:
            await client.publish(subject, b"{}")
        await client.flush()
        for subject in foreign:
            assert await violations.wait_for(f'publish to "{subject}"'), subject


async def test_no_service_can_delete_or_purge_a_stream(provisioned: SecuredNats) -> None:
    async with connected(provisioned, "scheduler") as (client, violations):
        js = client.jetstream(timeout=1)
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError, JetStreamError)):
            await js.delete_stream(subjects.EVENTS_STREAM)
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError, JetStreamError)):
            await js.purge_stream(subjects.COMMANDS_STREAM)
        assert await violations.wait_for("$js.api.stream.delete")


async def test_readonly_user_tails_events_with_tfctl(provisioned: SecuredNats) -> None:
    out = io.StringIO()
    subscribed = asyncio.Event()
    watcher = asyncio.create_task(
        tail(
            provisioned.url,
            pattern="tf.evt.>",
            as_json=False,
            count=1,
            out=out,
            user="readonly",
            password=provisioned.passwords["readonly"],
            subscribed=subscribed,
        )
    )
    await asyncio.wait_for(subscribed.wait(), DEADLINE_S)
    async with connected(provisioned, "webhook") as (client, _):
        await client.jetstream(timeout=5).publish(events.PodAdmitted.subject, b'{"event_id": "seen-by-tail"}')
    await asyncio.wait_for(watcher, DEADLINE_S)
    assert "seen-by-tail" in out.getvalue()


async def test_readonly_user_cannot_publish_steal_or_see_commands(provisioned: SecuredNats) -> None:
    async with connected(provisioned, "readonly") as (client, violations):
        await client.publish(events.PodAdmitted.subject, b"{}")
        assert await violations.wait_for(f'publish to "{events.PodAdmitted.subject}"')
        await client.publish(
            f"$JS.API.CONSUMER.MSG.NEXT.{subjects.EVENTS_STREAM}.scheduler-schedule-workload", b""
        )
        assert await violations.wait_for("consumer.msg.next")
        await client.publish(
            f"$JS.API.CONSUMER.DELETE.{subjects.EVENTS_STREAM}.scheduler-schedule-workload", b""
        )
        assert await violations.wait_for("consumer.delete")
        await client.subscribe("tf.cmd.>")
        assert await violations.wait_for('subscription to "tf.cmd.>"')
