"""The standalone outbox relay on a secured NATS (deploy/nats/nats.conf): it connects with the same
`TF_NATS_USER` / `TF_NATS_PASSWORD` settings as the services, as the `scheduler` user whose events it
publishes, and without credentials it stops with an error that says what to set."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Iterator
from uuid import UUID

import nats
import pytest
from nats.js.api import DeliverPolicy
from sqlalchemy import select
from support.nats_servers import SecuredNats, secured_nats_server
from tfcommon.bus import inbox_prefix_for
from tfcommon.events import AllocationCreated, decode, derived_event_id
from tfcommon.ledger import tables
from tfcommon.ledger.outbox import RELAY_NATS_USER
from tfcommon.ledger.records import Reserved
from tfcommon.ledger.sql import SqlLedger
from tfcommon.ledger.testing import GIB, a_node_with_gpus, a_reservation
from tfcommon.subjects import provision

pytestmark = pytest.mark.integration

DEADLINE_S = 20.0


@pytest.fixture(scope="module")
def secured_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredNats]:
    with secured_nats_server(tmp_path_factory.mktemp("relay-secured-nats"), "relay-test-") as server:
        yield server


@pytest.fixture(scope="module")
async def provisioned(secured_nats: SecuredNats) -> SecuredNats:
    client = await nats.connect(
        secured_nats.url,
        user=RELAY_NATS_USER,
        password=secured_nats.passwords[RELAY_NATS_USER],
        inbox_prefix=inbox_prefix_for(RELAY_NATS_USER),
    )
    try:
        await provision(client.jetstream(timeout=5), consumers=())
    finally:
        await client.close()
    return secured_nats


async def a_committed_reservation(ledger: SqlLedger) -> UUID:
    node, (gpu,) = await a_node_with_gpus(ledger)
    result = await ledger.reserve(a_reservation(node, {gpu: (10_000, 8 * GIB)}))
    assert isinstance(result, Reserved)
    return derived_event_id(result.allocation.allocation_id, AllocationCreated)


async def published_at_is_set(ledger: SqlLedger, event_id: UUID) -> bool:
    async with ledger.engine.connect() as connection:
        published_at = await connection.scalar(
            select(tables.outbox.c.published_at).where(tables.outbox.c.event_id == event_id)
        )
    return published_at is not None


async def start_relay(
    database_url: str, nats_url: str, environment: dict[str, str]
) -> asyncio.subprocess.Process:
    inherited = {key: value for key, value in os.environ.items() if not key.startswith("TF_NATS_")}
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tfcommon.ledger.outbox",
        "--database-url",
        database_url,
        "--nats-url",
        nats_url,
        env={**inherited, **environment},
        stdin=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )


@pytest.fixture
async def relay_as_scheduler(
    provisioned: SecuredNats, ledger_database_url: str
) -> AsyncIterator[asyncio.subprocess.Process]:
    relay = await start_relay(
        ledger_database_url,
        provisioned.url,
        {"TF_NATS_USER": RELAY_NATS_USER, "TF_NATS_PASSWORD": provisioned.passwords[RELAY_NATS_USER]},
    )
    try:
        yield relay
    finally:
        if relay.returncode is None:
            relay.terminate()
        await asyncio.wait_for(relay.communicate(), DEADLINE_S)


async def test_relay_with_the_scheduler_credentials_publishes_on_the_secured_server(
    provisioned: SecuredNats, ledger: SqlLedger, relay_as_scheduler: asyncio.subprocess.Process
) -> None:
    event_id = await a_committed_reservation(ledger)

    loop = asyncio.get_running_loop()
    deadline = loop.time() + DEADLINE_S
    while not await published_at_is_set(ledger, event_id):
        assert relay_as_scheduler.returncode is None, "the relay exited"
        assert loop.time() < deadline, "the relay did not publish within the deadline"
        await asyncio.sleep(0.05)

    watcher = await nats.connect(
        provisioned.url,
        user="readonly",
        password=provisioned.passwords["readonly"],
        inbox_prefix=inbox_prefix_for("readonly"),
    )
    try:
        subscription = await watcher.jetstream(timeout=5).subscribe(
            AllocationCreated.subject, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL
        )
        seen: list[UUID] = []
        while event_id not in seen:
            message = await subscription.next_msg(timeout=DEADLINE_S)
            seen.append(decode(message.subject, message.data).event_id)
            assert (message.headers or {}).get("ce-id") == str(seen[-1])
    finally:
        await watcher.close()


async def test_relay_without_credentials_exits_with_an_error_naming_the_settings(
    provisioned: SecuredNats, ledger_database_url: str
) -> None:
    relay = await start_relay(ledger_database_url, provisioned.url, {})

    _, stderr = await asyncio.wait_for(relay.communicate(), DEADLINE_S)

    assert relay.returncode == 1
    assert "TF_NATS_USER=scheduler" in stderr.decode()
    assert "TF_NATS_PASSWORD" in stderr.decode()


async def test_relay_with_a_user_but_no_password_is_refused_before_connecting(
    provisioned: SecuredNats, ledger_database_url: str
) -> None:
    relay = await start_relay(ledger_database_url, provisioned.url, {"TF_NATS_USER": RELAY_NATS_USER})

    _, stderr = await asyncio.wait_for(relay.communicate(), DEADLINE_S)

    assert relay.returncode == 2
    assert "TF_NATS_PASSWORD: unset" in stderr.decode()
