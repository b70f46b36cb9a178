"""deploy/nats/nats.conf on a real nats-server: each service can do what its code does, and no more.

Who publishes what comes from `tfcommon.events` (`producers`), which durable consumers each service
runs from `tfcommon.subjects`; a new event or consumer that the NATS users do not allow fails here.
The node agent connects as `node:<node>` with its node token and is granted by the real auth callout
(`python -m tfcommon.nats_auth`); `OTHER_NODE` is a second node whose subjects the first may not touch.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import nats
import pytest
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js.errors import Error as JetStreamError
from secured_nats_server import SecuredNats, pod_admitted
from tfcommon import events, subjects
from tfcommon.bus import NatsEventBus, inbox_prefix_for
from tfcommon.catalogue import filter_matches
from tfcommon.deadletter import (
    dead_letter_headers,
    dead_letter_subject,
    discard_dead_letter,
    list_dead_letters,
    replay_dead_letter,
)
from tfcommon.events import encode, node_token
from tfcommon.node_allocations import NODE_ALLOCATIONS, SCHEDULER_QUEUE, node_allocations_subject
from tfcommon.subjects import ConsumerSpec
from tfctl.commands.events import tail

pytestmark = pytest.mark.integration

SERVICES = ("webhook", "scheduler", "defrag-planner", "node-agent", "metrics", "tfctl")
NODE = "gpu-node-1"
OTHER_NODE = "gpu-node-2.example"
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


def credentials(server: SecuredNats, service: str) -> tuple[str, str]:
    """The NATS user and password `service` connects with: a node agent's are its node's own."""
    if service == "node-agent":
        return f"node:{NODE}", server.node_password(NODE)
    if service == "other-node-agent":
        return f"node:{OTHER_NODE}", server.node_password(OTHER_NODE)
    return service, server.passwords[service]


@asynccontextmanager
async def connected(server: SecuredNats, service: str) -> AsyncIterator[tuple[Client, Violations]]:
    violations = Violations()
    user, password = credentials(server, service)
    client = await nats.connect(
        server.url,
        user=user,
        password=password,
        error_cb=violations.record,
        inbox_prefix=inbox_prefix_for(user),
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
    if issubclass(message_type, events.FromNodeCommand):
        return f"{message_type.subject}.{node_token(NODE)}"
    return message_type.subject


def produced_by(service: str) -> list[str]:
    return [
        published_subject(message_type)
        for message_type in events.MESSAGE_TYPES.values()
        if service in producer_names(message_type)
    ]


def consumers_of(service: str) -> tuple[ConsumerSpec, ...]:
    return subjects.consumers_of(service, NODE)


def create_subject(spec: ConsumerSpec) -> str:
    """The JetStream API subject that creates or updates `spec` (what `provision_consumer` requests)."""
    base = f"$JS.API.CONSUMER.CREATE.{spec.stream}.{spec.durable}"
    return f"{base}.{spec.filter_subjects[0]}" if len(spec.filter_subjects) == 1 else base


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
            with contextlib.suppress(TimeoutError):  # nats raises asyncio's when a fetch gets nothing
                for message in await subscription.fetch(10, timeout=0.3):
                    await message.ack()
        await client.flush()
        assert violations.messages == []


def replayed_by_tfctl(subject: str) -> bool:
    """Whether a durable consumer reads `subject`: `tfctl deadletters replay` publishes it again."""
    per_node = [factory(NODE) for factory in subjects.PER_NODE_CONSUMERS]
    return any(
        filter_matches(pattern, subject)
        for spec in (*subjects.CONSUMERS, *per_node)
        for pattern in spec.filter_subjects
    )


@pytest.mark.parametrize("service", SERVICES)
async def test_service_cannot_publish_what_another_service_produces(
    provisioned: SecuredNats, service: str
) -> None:
    foreign = sorted(
        published_subject(message_type)
        for message_type in events.MESSAGE_TYPES.values()
        if producer_names(message_type)
        and service not in producer_names(message_type)
        and not (service == "tfctl" and replayed_by_tfctl(published_subject(message_type)))
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


def durable_subjects(spec: ConsumerSpec) -> tuple[str, str]:
    """The fetch request subject of a durable consumer and one of its acknowledgement subjects."""
    return (
        f"$JS.API.CONSUMER.MSG.NEXT.{spec.stream}.{spec.durable}",
        f"$JS.ACK.{spec.stream}.{spec.durable}.1.1.1.1700000000000000000.0",
    )


def a_message_for(spec: ConsumerSpec) -> tuple[str, str]:
    """A subject the consumer receives, and a service allowed to publish it."""
    for message_type in events.MESSAGE_TYPES.values():
        subject = published_subject(message_type)
        if producer_names(message_type) and any(
            filter_matches(pattern, subject) for pattern in spec.filter_subjects
        ):
            return subject, sorted(producer_names(message_type))[0]
    raise LookupError(f"nothing is published for {spec.durable}")


@pytest.mark.parametrize("service", [s for s in SERVICES if consumers_of(s)])
async def test_service_fetches_and_acknowledges_on_each_of_its_own_durables(
    provisioned: SecuredNats, service: str
) -> None:
    async with connected(provisioned, service) as (client, violations):
        js = client.jetstream(timeout=5)
        await subjects.provision(js, consumers=consumers_of(service))
        for spec in consumers_of(service):
            subject, producer = a_message_for(spec)
            marker = f"for-{spec.durable}".encode()
            async with connected(provisioned, producer) as (publisher, _):
                await publisher.jetstream(timeout=5).publish(subject, marker)
            subscription = await js.pull_subscribe_bind(durable=spec.durable, stream=spec.stream)
            seen: list[bytes] = []
            deadline = time.monotonic() + DEADLINE_S
            while marker not in seen and time.monotonic() < deadline:
                with contextlib.suppress(TimeoutError):  # nats raises asyncio's when a fetch gets nothing
                    for message in await subscription.fetch(50, timeout=0.5):
                        seen.append(message.data)
                        await message.ack_sync(timeout=5)
            assert marker in seen, spec.durable
        await client.flush()
        assert violations.messages == []


@pytest.mark.parametrize("service", [*SERVICES, "readonly"])
async def test_service_cannot_fetch_from_or_acknowledge_another_services_durable(
    provisioned: SecuredNats, service: str
) -> None:
    foreign = [spec for other in SERVICES if other != service for spec in consumers_of(other)]
    async with connected(provisioned, service) as (client, violations):
        for spec in foreign:
            for subject in durable_subjects(spec):
                await client.publish(subject, b"", reply=client.new_inbox())
        await client.flush()
        for spec in foreign:
            for subject in durable_subjects(spec):
                assert await violations.wait_for(f'publish to "{subject}"'), (service, subject)


@pytest.mark.parametrize("service", [*SERVICES, "readonly"])
async def test_user_cannot_read_another_users_inbox_or_the_shared_one(
    provisioned: SecuredNats, service: str
) -> None:
    other = "scheduler" if service != "scheduler" else "webhook"
    async with connected(provisioned, service) as (client, violations):
        for inbox in (f"{inbox_prefix_for(other)}.>", "_INBOX.>"):
            await client.subscribe(inbox)
            assert await violations.wait_for(f'subscription to "{inbox}"'), inbox


async def test_event_bus_receives_its_acknowledgements_on_its_own_inbox(provisioned: SecuredNats) -> None:
    admitted = pod_admitted()
    bus = await NatsEventBus.connect(
        provisioned.url, service="webhook", user="webhook", password=provisioned.passwords["webhook"]
    )
    try:
        await bus.publish(admitted)
        assert bus.nc.new_inbox().startswith("_INBOX_webhook.")
    finally:
        await bus.close()
    violations = Violations()
    shared_inbox = await nats.connect(
        provisioned.url,
        user="webhook",
        password=provisioned.passwords["webhook"],
        error_cb=violations.record,
        allow_reconnect=False,
    )
    try:
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await shared_inbox.jetstream(timeout=1).publish(admitted.subject, encode(admitted), timeout=1)
        assert await violations.wait_for("subscription to")
    finally:
        await shared_inbox.close()


@pytest.mark.parametrize("service", [*SERVICES, "readonly"])
async def test_user_cannot_create_or_update_another_services_durable(
    provisioned: SecuredNats, service: str
) -> None:
    foreign = [spec for other in SERVICES if other != service for spec in consumers_of(other)]
    async with connected(provisioned, service) as (client, violations):
        for spec in foreign:
            await client.publish(create_subject(spec), b"{}")
        await client.flush()
        for spec in foreign:
            assert await violations.wait_for(f'publish to "{create_subject(spec)}"'), (service, spec.durable)


async def test_provisioning_every_services_durables_is_refused_to_one_service(
    provisioned: SecuredNats,
) -> None:
    async with connected(provisioned, "metrics") as (client, violations):
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError, JetStreamError)):
            await subjects.provision(client.jetstream(timeout=1), streams=(), consumers=subjects.CONSUMERS)
        assert await violations.wait_for("$js.api.consumer.create")


def test_each_durable_is_provisioned_by_exactly_one_service() -> None:
    owners = {
        spec.durable: [service for service in SERVICES if spec in consumers_of(service)]
        for spec in (*subjects.CONSUMERS, *(factory(NODE) for factory in subjects.PER_NODE_CONSUMERS))
    }
    assert {durable: len(services) for durable, services in owners.items()} == dict.fromkeys(owners, 1)
    assert consumers_of("webhook") == ()
    assert consumers_of("tfctl") == ()
    assert {spec.durable for spec in consumers_of("node-agent")} == {
        f"node-agent-run-commands-{NODE}",
        f"node-agent-track-allocations-{NODE}",
    }


def dead_letter_of(spec: ConsumerSpec) -> str:
    return f"{subjects.DEADLETTER_PREFIX}.{spec.service}.{spec.durable}"


async def test_a_node_agent_dead_letters_what_its_own_consumers_give_up(provisioned: SecuredNats) -> None:
    async with connected(provisioned, "scheduler") as (client, _):
        await subjects.provision(client.jetstream(timeout=5), streams=(), consumers=consumers_of("scheduler"))
    async with connected(provisioned, "node-agent") as (client, violations):
        js = client.jetstream(timeout=5)
        for factory in subjects.PER_NODE_CONSUMERS:
            acknowledgement = await js.publish(dead_letter_of(factory(NODE)), b"{}")
            assert acknowledgement.stream == subjects.DEADLETTER_STREAM
        assert violations.messages == []


async def test_a_node_agent_cannot_touch_another_nodes_consumers_or_inbox(provisioned: SecuredNats) -> None:
    other_nodes = [factory(OTHER_NODE) for factory in subjects.PER_NODE_CONSUMERS]
    async with connected(provisioned, "other-node-agent") as (client, violations):
        await subjects.provision(client.jetstream(timeout=5), consumers=other_nodes)
        assert violations.messages == []
    async with connected(provisioned, "node-agent") as (client, violations):
        for spec in other_nodes:
            for subject in (create_subject(spec), *durable_subjects(spec), dead_letter_of(spec)):
                await client.publish(subject, b"", reply=client.new_inbox())
        other_inbox = f"{inbox_prefix_for(f'node:{OTHER_NODE}')}.>"
        await client.subscribe(other_inbox)
        await client.flush()
        for spec in other_nodes:
            for subject in (create_subject(spec), *durable_subjects(spec), dead_letter_of(spec)):
                assert await violations.wait_for(f'publish to "{subject}"'), subject
        assert await violations.wait_for(f'subscription to "{other_inbox}"')


async def test_a_node_agent_cannot_read_another_nodes_commands(provisioned: SecuredNats) -> None:
    """A command may carry a worker's environment: only its node's agent may receive it."""
    commands = subjects.node_agent_run_commands(OTHER_NODE)
    command_subject = f"{events.StartWorker.subject}.{OTHER_NODE}"
    async with connected(provisioned, "other-node-agent") as (client, _):
        await subjects.provision(client.jetstream(timeout=5), consumers=(commands,))
    async with connected(provisioned, "tfctl") as (client, _):
        await client.jetstream(timeout=5).publish(command_subject, b'{"secret": "for node 2"}')
    async with connected(provisioned, "node-agent") as (client, violations):
        subscription = await client.jetstream(timeout=1).pull_subscribe_bind(
            durable=commands.durable, stream=commands.stream
        )
        with pytest.raises((nats.errors.TimeoutError, JetStreamError)):
            await subscription.fetch(1, timeout=1)
        await client.subscribe(command_subject)
        assert await violations.wait_for(f'subscription to "{command_subject}"')
    async with connected(provisioned, "other-node-agent") as (client, violations):
        subscription = await client.jetstream(timeout=5).pull_subscribe_bind(
            durable=commands.durable, stream=commands.stream
        )
        (message,) = await subscription.fetch(1, timeout=DEADLINE_S)
        assert message.data == b'{"secret": "for node 2"}'
        await message.ack_sync(timeout=5)
        assert violations.messages == []


@pytest.mark.parametrize(
    ("user", "password_of"),
    [
        (f"node:{NODE}", OTHER_NODE),
        (f"node:{NODE}", None),
        (f"node:{NODE.upper()}", NODE),
        ("node-agent", NODE),
        ("scheduler", NODE),
    ],
    ids=[
        "another-nodes-token",
        "a-made-up-token",
        "not-a-node-name",
        "the-old-shared-user",
        "a-service-user",
    ],
)
async def test_the_callout_refuses_a_connection_that_is_not_its_nodes(
    provisioned: SecuredNats, user: str, password_of: str | None
) -> None:
    password = "tfn1.made-up" if password_of is None else provisioned.node_password(password_of)
    with pytest.raises(nats.errors.Error, match="Authorization Violation"):
        await nats.connect(
            provisioned.url, user=user, password=password, allow_reconnect=False, connect_timeout=5
        )
    log = provisioned.callout_log.read_text(encoding="utf-8")
    assert password not in log, "the callout logged a password"


async def test_a_node_agent_asks_for_its_allocations_and_the_scheduler_answers(
    provisioned: SecuredNats,
) -> None:
    async def answer(msg: Msg) -> None:
        await msg.respond(f'{{"node": "{msg.subject.rsplit(".", 1)[1]}"}}'.encode())

    async with connected(provisioned, "scheduler") as (scheduler, answered_violations):
        await scheduler.subscribe(f"{NODE_ALLOCATIONS}.*", queue=SCHEDULER_QUEUE, cb=answer)
        await scheduler.flush()
        async with connected(provisioned, "node-agent") as (agent, asked_violations):
            reply = await agent.request(node_allocations_subject(NODE), b"{}", timeout=DEADLINE_S)
            await agent.flush()
        await scheduler.flush()
    assert reply.data == f'{{"node": "{node_token(NODE)}"}}'.encode()
    assert asked_violations.messages == []
    assert answered_violations.messages == []


@pytest.mark.parametrize("service", [s for s in (*SERVICES, "readonly") if s != "node-agent"])
async def test_only_a_node_agent_may_ask_for_a_nodes_allocations(
    provisioned: SecuredNats, service: str
) -> None:
    subject = node_allocations_subject(NODE)
    async with connected(provisioned, service) as (client, violations):
        await client.publish(subject, b"{}", reply=client.new_inbox())
        await client.flush()
        assert await violations.wait_for(f'publish to "{subject}"')


@pytest.mark.parametrize("service", [s for s in (*SERVICES, "readonly") if s != "scheduler"])
async def test_only_the_scheduler_may_receive_allocation_requests(
    provisioned: SecuredNats, service: str
) -> None:
    async with connected(provisioned, service) as (client, violations):
        await client.subscribe(f"{NODE_ALLOCATIONS}.*", queue=SCHEDULER_QUEUE)
        await client.flush()
        assert await violations.wait_for(f'subscription to "{NODE_ALLOCATIONS}.*"')


DEAD_LETTERING = [s for s in SERVICES if s != "node-agent" and consumers_of(s)]


@pytest.mark.parametrize("service", DEAD_LETTERING)
async def test_a_service_dead_letters_for_its_own_durables_only(
    provisioned: SecuredNats, service: str
) -> None:
    others = [spec for other in DEAD_LETTERING if other != service for spec in consumers_of(other)]
    async with connected(provisioned, service) as (client, violations):
        js = client.jetstream(timeout=5)
        await subjects.provision(js, consumers=consumers_of(service))
        for spec in consumers_of(service):
            acknowledgement = await js.publish(dead_letter_subject(service, spec.durable), b"{}")
            assert acknowledgement.stream == subjects.DEADLETTER_STREAM
        assert violations.messages == []
        for spec in others:
            await client.publish(dead_letter_subject(spec.service, spec.durable), b"{}")
        await client.flush()
        for spec in others:
            subject = dead_letter_subject(spec.service, spec.durable)
            assert await violations.wait_for(f'publish to "{subject}"'), subject


async def test_tfctl_lists_replays_and_discards_dead_letters_and_no_service_reads_them(
    provisioned: SecuredNats,
) -> None:
    original = events.AllocationReleased.subject
    headers = dead_letter_headers(
        {"Nats-Msg-Id": "released-once"},
        stream=subjects.EVENTS_STREAM,
        subject=original,
        sequence=7,
        consumer=subjects.METRICS_COUNT_EVENTS.durable,
        reason="exhausted",
        detail="TransientError: board busy",
        deliveries=5,
        at=datetime.now(UTC),
    )
    async with connected(provisioned, "metrics") as (client, _):
        js = client.jetstream(timeout=5)
        await subjects.provision(js, consumers=consumers_of("metrics"))
        subject = dead_letter_subject("metrics", subjects.METRICS_COUNT_EVENTS.durable)
        kept = (await js.publish(subject, b'{"replay": "me"}', headers=headers)).seq
        dropped = (await js.publish(subject, b"{not json", headers={**headers, "Nats-Msg-Id": "x"})).seq
    async with connected(provisioned, "tfctl") as (client, violations):
        js = client.jetstream(timeout=5)
        listed = await list_dead_letters(js, subjects.METRICS_COUNT_EVENTS.durable)
        assert {kept, dropped} <= {letter.sequence for letter in listed}
        replayed = await replay_dead_letter(js, kept)
        assert replayed is not None
        assert (replayed.stream, replayed.duplicate) == (subjects.EVENTS_STREAM, False)
        assert await discard_dead_letter(js, dropped)
        assert {kept, dropped}.isdisjoint(letter.sequence for letter in await list_dead_letters(js))
        assert violations.messages == []
    for service in ("webhook", "readonly", "scheduler"):
        async with connected(provisioned, service) as (client, violations):
            await client.publish(f"$JS.API.STREAM.MSG.GET.{subjects.DEADLETTER_STREAM}", b"{}")
            await client.flush()
            assert await violations.wait_for("stream.msg.get"), service


async def test_a_node_agent_asks_for_and_releases_its_own_nodes_allocations_only(
    provisioned: SecuredNats,
) -> None:
    foreign = (node_allocations_subject(OTHER_NODE), subjects.release_allocation(OTHER_NODE))
    assert foreign[0].endswith(".gpu-node-2_example"), "the node name is one subject token"
    async with connected(provisioned, "node-agent") as (client, violations):
        for subject in foreign:
            await client.publish(subject, b"{}", reply=client.new_inbox())
        await client.flush()
        for subject in foreign:
            assert await violations.wait_for(f'publish to "{subject}"'), subject
