"""Each service, started by the shared runtime against a real nats-server running deploy/nats/nats.conf
as its own NATS user, provisions the streams and only its own durable consumers (a fresh server, so
every durable seen here was created by the service under test)."""

from __future__ import annotations

import asyncio

import nats
import pytest
from nats.js.errors import NotFoundError
from pydantic import SecretStr
from secured_nats_server import SecuredNats
from support.serving import wait_until_ready
from tfcommon import subjects
from tfcommon.bus import inbox_prefix_for
from tfcommon.infra import free_port
from tfcommon.runtime import ServiceSpec, serve
from tfcommon.settings import DatabaseSettings, NatsSettings, ServiceSettings

pytestmark = pytest.mark.integration

DEADLINE_S = 30.0
SERVICES_WITH_FIXED_DURABLES = sorted({spec.service for spec in subjects.CONSUMERS})


async def existing_durables(server: SecuredNats) -> set[str]:
    client = await nats.connect(
        server.url,
        user="scheduler",
        password=server.passwords["scheduler"],
        inbox_prefix=inbox_prefix_for("scheduler"),
    )
    try:
        js = client.jetstream(timeout=5)
        found: set[str] = set()
        for spec in subjects.CONSUMERS:
            try:
                await js.consumer_info(spec.stream, spec.durable)
            except NotFoundError:
                continue
            found.add(spec.durable)
        return found
    finally:
        await client.close()


async def test_each_service_provisions_only_its_own_durables_as_its_own_user(
    secured_nats: SecuredNats, postgres_server_url: str
) -> None:
    provisioned: set[str] = set()
    for name in ["webhook", *SERVICES_WITH_FIXED_DURABLES]:
        settings = ServiceSettings(
            nats=NatsSettings(
                url=secured_nats.url, user=name, password=SecretStr(secured_nats.passwords[name])
            ),
            database=DatabaseSettings(url=postgres_server_url, pool_size=1),
            bind_host="127.0.0.1",
        )
        port = free_port()
        stop = asyncio.Event()
        service = asyncio.create_task(serve(ServiceSpec(name=name, settings=settings, port=port), stop=stop))
        try:
            await wait_until_ready(f"http://127.0.0.1:{port}", service, timeout_s=DEADLINE_S, every_s=0.1)
        finally:
            stop.set()
            await asyncio.wait_for(service, DEADLINE_S)

        provisioned |= {spec.durable for spec in subjects.consumers_of(name)}
        assert await existing_durables(secured_nats) == provisioned, name
    assert provisioned == {spec.durable for spec in subjects.CONSUMERS}
