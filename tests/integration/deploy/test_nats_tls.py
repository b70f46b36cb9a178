"""The bus over TLS to a real nats-server whose certificate a test CA signed (`TF_NATS_TLS_*`).

With the CA the bus connects, checks the server's name and publishes to JetStream; without it, with
another CA, by a name the certificate does not list, or to a server without TLS, it stops at once with
`NatsTlsError` naming the setting to fix, instead of retrying forever. A server that verifies clients
takes the bus with a client certificate its CA signed and refuses it without one.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from uuid import uuid4

import pytest
from tfcommon import events
from tfcommon.bus import NatsEventBus
from tfcommon.infra import free_port, nats_server_binary, wait_for_port
from tfcommon.kube_local.pki import KeyPair
from tfcommon.nats_tls import NatsTlsError, client_context
from tfcommon.settings import NatsSettings
from tfcommon.subjects import EVENTS, EVENTS_STREAM, provision
from tfctl.bus_client import NatsUnreachableError
from tfctl.bus_client import connect as tfctl_connect
from tls_authority import TestAuthority

pytestmark = pytest.mark.integration

REFUSED_WITHIN_S = 10.0
"""A refused certificate ends the connection attempt well before any start-up deadline."""


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> TestAuthority:
    return TestAuthority(tmp_path_factory.mktemp("nats-tls-ca"))


@contextmanager
def tls_nats_server(folder: Path, server: KeyPair, verify_clients_with: Path | None = None) -> Iterator[int]:
    """A nats-server with JetStream serving TLS only, on 127.0.0.1; yields its port."""
    port = free_port()
    verify = f'ca_file: "{verify_clients_with}"\n    verify: true' if verify_clients_with else ""
    config = folder / f"nats-{port}.conf"
    config.write_text(
        f"""
listen: "127.0.0.1:{port}"
jetstream {{ store_dir: "{folder / f"store-{port}"}" }}
tls {{
    cert_file: "{server.cert_file}"
    key_file: "{server.key_file}"
    {verify}
    timeout: 2
}}
"""
    )
    process = subprocess.Popen(
        [str(nats_server_binary()), "-c", str(config), "-l", str(folder / f"nats-{port}.log")],
        env={"PATH": os.environ.get("PATH", "")},
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for_port("127.0.0.1", port, 30.0, process)
        yield port
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@pytest.fixture(scope="module")
def tls_port(authority: TestAuthority) -> Iterator[int]:
    server = authority.server("nats-server", ("127.0.0.1",))
    with tls_nats_server(authority.folder, server) as port:
        yield port


def admitted() -> events.PodAdmitted:
    return events.PodAdmitted(
        event_id=uuid4(),
        occurred_at=datetime.now(UTC),
        workload=events.WorkloadRef(namespace="ml-team", name="tls-0"),
        request=events.GpuRequest(
            pool="default",
            tflops_request_milli=100_000,
            tflops_limit_milli=100_000,
            vram_request_bytes=8 << 30,
            vram_limit_bytes=8 << 30,
        ),
        patch_operations=3,
    )


async def refusal(url: str, settings: NatsSettings) -> str:
    """The message of the `NatsTlsError` the bus raises on connecting to `url` with `settings`."""
    async with asyncio.timeout(REFUSED_WITHIN_S):
        with pytest.raises(NatsTlsError) as refused:
            await NatsEventBus.connect(url, service="tls-test", tls=client_context(settings))
    return str(refused.value)


async def test_bus_with_the_ca_publishes_to_jetstream_over_tls(
    authority: TestAuthority, tls_port: int
) -> None:
    settings = NatsSettings(tls_ca_file=authority.ca.cert_file)
    bus = await NatsEventBus.connect(
        f"nats://127.0.0.1:{tls_port}", service="tls-test", tls=client_context(settings)
    )
    try:
        await provision(bus.js, streams=[EVENTS], consumers=[])
        event = admitted()
        await bus.publish(event)
        stored = await bus.js.get_last_msg(EVENTS_STREAM, event.subject)
        assert stored.headers is not None
        assert stored.headers["Nats-Msg-Id"] == str(event.event_id)
    finally:
        await bus.close()


async def test_without_the_ca_the_bus_refuses_the_certificate_naming_the_setting(tls_port: int) -> None:
    message = await refusal(f"nats://127.0.0.1:{tls_port}", NatsSettings())
    assert "certificate was refused" in message
    assert "TF_NATS_TLS_CA_FILE" in message


async def test_a_certificate_from_another_ca_is_refused(tmp_path: Path, tls_port: int) -> None:
    other = TestAuthority(tmp_path, "another-ca")
    message = await refusal(f"nats://127.0.0.1:{tls_port}", NatsSettings(tls_ca_file=other.ca.cert_file))
    assert "certificate was refused" in message
    assert "TF_NATS_TLS_CA_FILE" in message


async def test_a_name_the_certificate_does_not_list_is_refused(
    authority: TestAuthority, tls_port: int
) -> None:
    """The certificate lists 127.0.0.1 only: `localhost` is the same server by another name."""
    message = await refusal(f"nats://localhost:{tls_port}", NatsSettings(tls_ca_file=authority.ca.cert_file))
    assert "mismatch" in message.lower()
    assert "a name the server's certificate lists" in message


async def test_asking_for_tls_from_a_server_without_it_is_refused(
    authority: TestAuthority, nats_url: str
) -> None:
    message = await refusal(nats_url, NatsSettings(tls_ca_file=authority.ca.cert_file))
    assert "does not offer TLS" in message


async def test_a_server_verifying_clients_takes_our_client_certificate_only(
    authority: TestAuthority, tmp_path: Path
) -> None:
    server = authority.server("nats-server-mtls", ("127.0.0.1",))
    client = authority.client("nats-client", "scheduler")
    with tls_nats_server(tmp_path, server, verify_clients_with=authority.ca.cert_file) as port:
        url = f"nats://127.0.0.1:{port}"
        with_certificate = NatsSettings(
            tls_ca_file=authority.ca.cert_file, tls_cert_file=client.cert_file, tls_key_file=client.key_file
        )
        bus = await NatsEventBus.connect(url, service="tls-test", tls=client_context(with_certificate))
        await bus.close()
        without_certificate = NatsSettings(tls_ca_file=authority.ca.cert_file)
        async with asyncio.timeout(REFUSED_WITHIN_S):
            with pytest.raises(NatsTlsError, match="TF_NATS_TLS_CERT_FILE"):
                await NatsEventBus.connect(url, service="tls-test", tls=client_context(without_certificate))


async def test_tfctl_reads_the_tls_settings_and_says_why_it_is_refused(
    authority: TestAuthority, tls_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TF_NATS_TLS_CA_FILE", str(authority.ca.cert_file))
    client = await tfctl_connect(f"nats://127.0.0.1:{tls_port}", "--nats-url", name="tfctl-tls-test")
    await client.close()
    with pytest.raises(NatsUnreachableError, match="a name the server's certificate lists"):
        await tfctl_connect(f"nats://localhost:{tls_port}", "--nats-url", name="tfctl-tls-test")
