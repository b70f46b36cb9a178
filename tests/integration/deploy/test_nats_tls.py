"""The bus over TLS to a real nats-server whose certificate a test CA signed (`TF_NATS_TLS_*`).

With the CA the bus connects, checks the server's name and publishes to JetStream; without it, with
another CA, by a name the certificate does not list, or to a server without TLS, it stops at once with
`NatsTlsError` naming the setting to fix, instead of retrying forever (a service's start-up fails
with that line; with the CA it becomes ready). A server that verifies clients
takes the bus with a client certificate its CA signed and refuses it without one. The Helm chart's
`nats.tls.enabled`: a nats-server run with the chart's own TLS arguments and generated certificate
takes a client that checks the name the services connect by against the CA they mount.
"""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import nats
import pytest
import yaml
from secured_nats_server import pod_admitted
from support.serving import service_url, wait_until_ready
from tfcommon.bus import NatsEventBus
from tfcommon.infra import free_port, nats_server_binary, stop_process, wait_for_port
from tfcommon.kube_local.helm import ensure_helm
from tfcommon.kube_local.pki import KeyPair
from tfcommon.nats_tls import NatsTlsError, client_context
from tfcommon.runtime import ServiceSpec, StartupError, no_components, serve
from tfcommon.settings import DatabaseSettings, NatsSettings, SchedulerSettings
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
        stop_process(process)


@pytest.fixture(scope="module")
def tls_port(authority: TestAuthority) -> Iterator[int]:
    server = authority.server("nats-server", ("127.0.0.1",))
    with tls_nats_server(authority.folder, server) as port:
        yield port


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
        event = pod_admitted("tls-0")
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


def chart_with_nats_tls(namespace: str) -> list[dict[str, Any]]:
    helm = ensure_helm(lambda line: print(line, file=sys.stderr, flush=True))
    chart = Path(__file__).resolve().parents[3] / "charts" / "tfpool"
    command = [str(helm), "template", "tfpool", str(chart), "--namespace", namespace]
    rendered = subprocess.run(
        [*command, "--set", "nats.tls.enabled=true"], capture_output=True, text=True, timeout=120, check=True
    ).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


@pytest.fixture
def chart_nats(tmp_path: Path) -> Iterator[tuple[int, Path, str]]:
    """A nats-server with the chart's TLS arguments and certificate (nats.tls.enabled) on 127.0.0.1:
    its port, the CA the services mount (the agent namespace's copy) and the host they connect to."""
    objects = chart_with_nats_tls("gpu-platform")
    secrets = {
        (obj["metadata"]["name"], obj["metadata"]["namespace"]): obj["data"]
        for obj in objects
        if obj["kind"] == "Secret"
    }
    mounted = tmp_path / "etc-nats-tls"
    mounted.mkdir()
    for key, value in secrets[("tfpool-nats-tls", "gpu-platform")].items():
        (mounted / key).write_bytes(base64.b64decode(value))
    ca_file = tmp_path / "ca.crt"
    ca_file.write_bytes(base64.b64decode(secrets[("tfpool-nats-ca", "gpu-platform-node-agent")]["ca.crt"]))
    (nats_set,) = [
        obj for obj in objects if (obj["kind"], obj["metadata"]["name"]) == ("StatefulSet", "tfpool-nats")
    ]
    (container,) = nats_set["spec"]["template"]["spec"]["containers"]
    args = container["args"][container["args"].index("--tls") :][:5]
    tls_args = [arg.replace("/etc/nats/tls", str(mounted)) for arg in args]
    url = base64.b64decode(secrets[("tfpool-nats", "gpu-platform")]["url"]).decode()
    port = free_port()
    process = subprocess.Popen(
        [str(nats_server_binary()), "-a", "127.0.0.1", "-p", str(port), *tls_args],
        env={"PATH": os.environ.get("PATH", "")},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for_port("127.0.0.1", port, 30.0, process)
        yield port, ca_file, url.split("://", 1)[1].rsplit(":", 1)[0]
    finally:
        stop_process(process)


async def test_the_charts_nats_tls_takes_a_client_checking_the_services_name(
    chart_nats: tuple[int, Path, str],
) -> None:
    port, ca_file, service_host = chart_nats
    url, tls = f"nats://127.0.0.1:{port}", client_context(NatsSettings(tls_ca_file=ca_file))
    client = await nats.connect(url, tls=tls, tls_hostname=service_host, allow_reconnect=False)
    assert client.is_connected
    await client.close()
    with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
        await nats.connect(url, tls=tls, tls_hostname="nats.elsewhere", allow_reconnect=False)


async def test_a_service_started_without_the_ca_stops_naming_the_setting(
    authority: TestAuthority, tls_port: int, migrated_database_url: str
) -> None:
    url = f"nats://127.0.0.1:{tls_port}"

    def spec(nats_settings: NatsSettings) -> ServiceSpec[SchedulerSettings]:
        settings = SchedulerSettings(nats=nats_settings, database=DatabaseSettings(url=migrated_database_url))
        return ServiceSpec(
            name="scheduler", settings=settings, port=free_port(), host="127.0.0.1", compose=no_components
        )

    async with asyncio.timeout(REFUSED_WITHIN_S):
        with pytest.raises(StartupError, match=r"certificate was refused.*set TF_NATS_TLS_CA_FILE"):
            await serve(spec(NatsSettings(url=url)), stop=asyncio.Event())
    with_ca = spec(NatsSettings(url=url, tls_ca_file=authority.ca.cert_file))
    stop = asyncio.Event()
    service = asyncio.create_task(serve(with_ca, stop=stop))
    try:
        await wait_until_ready(service_url(with_ca), service, timeout_s=30, every_s=0.1)
    finally:
        stop.set()
        await service
