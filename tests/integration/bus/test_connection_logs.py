"""What a service logs while its NATS server goes away and comes back: one line for each thing that
happened (disconnected, each refused reconnection, reconnected), naming the server by host and port
only, with no traceback; and nothing about a reconnection when the service closes its connection.

A real `nats-server` (`own_nats`) stopped and started again on the same port.
"""

from __future__ import annotations

import asyncio
import logging
from urllib.parse import urlparse

import pytest
from support.polling import eventually
from tfcommon.bus import NatsEventBus, log_nats_error, server_address
from tfcommon.infra import EmbeddedNats

NATS_LOGGER = "nats.aio.client"


def _messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == NATS_LOGGER]


async def test_a_server_lost_and_back_is_logged_in_single_lines(
    own_nats: EmbeddedNats, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=NATS_LOGGER)
    address = f"{own_nats.host}:{own_nats.port}"
    bus = await NatsEventBus.connect(own_nats.url, service="log-tests")
    try:
        own_nats.stop()
        await eventually(
            lambda: f"nats: disconnected from {address}, reconnecting" in _messages(caplog),
            "the disconnection",
        )
        await eventually(
            lambda: any("nats: connection lost or refused, reconnecting (" in m for m in _messages(caplog)),
            "a refused reconnection",
        )
        await asyncio.to_thread(own_nats.start)
        await eventually(lambda: f"nats: reconnected to {address}" in _messages(caplog), "the reconnection")
    finally:
        before_close = len(_messages(caplog))
        await bus.close()
    nats_records = [record for record in caplog.records if record.name == NATS_LOGGER]
    assert all(record.exc_info is None for record in nats_records), [r.getMessage() for r in nats_records]
    assert len(_messages(caplog)) == before_close, _messages(caplog)[before_close:]


def test_an_unexpected_client_error_keeps_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger=NATS_LOGGER)
    try:
        raise ValueError("a bug in a callback")
    except ValueError as error:
        log_nats_error(error)
    log_nats_error(ConnectionRefusedError(111, "Connect call failed ('127.0.0.1', 4222)"))

    unexpected, refused = caplog.records
    assert unexpected.levelno == logging.ERROR
    assert unexpected.exc_info is not None
    assert refused.levelno == logging.WARNING
    assert refused.exc_info is None
    assert "ConnectionRefusedError" in refused.getMessage()


def test_a_server_is_named_without_the_credentials_its_url_carries() -> None:
    assert server_address(urlparse("nats://webhook:s3cr3t@nats.tfpool.svc:4222")) == "nats.tfpool.svc:4222"
    assert server_address(urlparse("nats://nats.tfpool.svc")) == "nats.tfpool.svc"
    assert server_address(None) == "no server"
