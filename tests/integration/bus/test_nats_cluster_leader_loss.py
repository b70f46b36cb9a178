"""A three-server NATS JetStream cluster (deploy/nats/cluster.conf: the chart's bundled NATS, with
`sync_interval: always`) losing its stream leader to SIGKILL: every event the bus had acknowledged is
still there, once, on the new leader; and no service start-up lowers the streams' replicas.

Three real nats-server processes, routed to each other on loopback, users and permissions of
deploy/nats/nats.conf; the services' own provisioning (`tfcommon.subjects.provision`) creates the
streams with 3 replicas.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from uuid import uuid4

import nats
import pytest
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import DeliverPolicy, StreamInfo
from nats.js.errors import APIError
from tfcommon import subjects
from tfcommon.bus import PUBLISH_TIMEOUT_S, NatsEventBus, inbox_prefix_for
from tfcommon.events import WorkloadRef, WorkloadUnschedulable
from tfcommon.infra import free_port, nats_server_binary, wait_for_port
from tfcommon.nats_auth.node_access import CalloutKeys
from tfcommon.subjects import StreamSpec

pytestmark = pytest.mark.integration

DEPLOY_NATS = Path(__file__).resolve().parents[3] / "deploy" / "nats"
CLUSTER_CONFIG = DEPLOY_NATS / "cluster.conf"
EVENTS_BEFORE_KILL = 150
EVENTS_AFTER_KILL = 150
RECOVERY_BUDGET_S = 30.0
"""How long the two surviving servers may take to elect a new leader and acknowledge again."""


@dataclass
class Server:
    """One nats-server of the cluster: its name, ports and (while running) process."""

    name: str
    store: Path
    port: int = field(default_factory=free_port)
    cluster_port: int = field(default_factory=free_port)
    monitor_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"


@dataclass
class Cluster:
    """Three routed servers and each user's password (deploy/nats/nats.conf's users)."""

    servers: list[Server]
    passwords: dict[str, str]
    environment: dict[str, str]

    def start(self, server: Server) -> None:
        routes = ",".join(f"nats://127.0.0.1:{peer.cluster_port}" for peer in self.servers)
        server.process = subprocess.Popen(
            [
                str(nats_server_binary()),
                "-c", str(CLUSTER_CONFIG),
                "-a", "127.0.0.1",
                "-p", str(server.port),
                "-m", str(server.monitor_port),
                "-sd", str(server.store),
                "-l", str(server.store / "nats-server.log"),
                "--cluster_name", "tfpool-test",
                "--cluster", f"nats://127.0.0.1:{server.cluster_port}",
                "--routes", routes,
            ],
            env={**self.environment, "NATS_SERVER_NAME": server.name},
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )  # fmt: skip

    def by_name(self, name: str) -> Server:
        (found,) = [server for server in self.servers if server.name == name]
        return found

    async def connect(self, user: str, timeout_s: float = PUBLISH_TIMEOUT_S) -> NatsEventBus:
        """A bus as `user`, knowing every server, so that it reconnects to a survivor; `timeout_s`
        bounds each JetStream request."""
        nc = await nats.connect(
            servers=[server.url for server in self.servers],
            name=f"tfpool-{user}",
            user=user,
            password=self.passwords[user],
            inbox_prefix=inbox_prefix_for(user),
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.2,
            connect_timeout=2,
        )
        return NatsEventBus(nc, nc.jetstream(timeout=timeout_s), user)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    users = re.findall(r"user:\s*(\S+)\s+password:\s*\$(\w+)", (DEPLOY_NATS / "nats.conf").read_text())
    passwords = {user: f"pw-{user}" for user, _ in users}
    issuer = CalloutKeys.from_secret(os.urandom(48).hex().encode()).issuer.public_key
    environment = {
        "PATH": os.environ.get("PATH", ""),
        "NATS_CALLOUT_ISSUER": issuer,
        **{var: passwords[user] for user, var in users},
    }
    servers = [Server(name=f"tfpool-nats-{index}", store=tmp_path / f"n{index}") for index in range(3)]
    running = Cluster(servers, passwords, environment)
    for server in servers:
        server.store.mkdir()
        running.start(server)
    try:
        for server in servers:
            assert server.process is not None
            wait_for_port("127.0.0.1", server.port, 30.0, server.process)
        yield running
    finally:
        for server in servers:
            if server.process is not None and server.process.poll() is None:
                server.process.terminate()
                try:
                    server.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    server.process.kill()
                    server.process.wait(timeout=10)


async def _provision_when_ready(
    bus: NatsEventBus, replicas: int, streams: Iterable[StreamSpec] = subjects.STREAMS
) -> None:
    """`provision()`, retried while the fresh cluster has not yet elected its JetStream leader or its
    servers have not all joined (JetStream cannot place 3 replicas yet)."""
    deadline = time.monotonic() + 30
    while True:
        try:
            await subjects.provision(bus.js, streams=streams, consumers=(), replicas=replicas)
            return
        except (nats.errors.TimeoutError, APIError, subjects.StreamReplicasError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.25)


def _event(index: int) -> WorkloadUnschedulable:
    return WorkloadUnschedulable(
        event_id=uuid4(),
        occurred_at=datetime.now(UTC),
        workload=WorkloadRef(namespace="default", name=f"pod-{index}"),
        pool="pool-a",
        summary="0/3 GPUs fit: 3 insufficient VRAM",
        gpus_considered=3,
    )


async def _publish_until_acknowledged(bus: NatsEventBus, event: WorkloadUnschedulable) -> float:
    """Publish `event` as a service does, again with the same id after a failure (deduplicated by
    JetStream within the window); returns when it was acknowledged (monotonic seconds)."""
    deadline = time.monotonic() + RECOVERY_BUDGET_S
    while True:
        try:
            await bus.publish(event)
            return time.monotonic()
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def _stream(bus: NatsEventBus, name: str) -> StreamInfo:
    return await bus.js.stream_info(name)


async def _new_leader(bus: NatsEventBus, name: str, old: str) -> tuple[str, float]:
    """The stream's next leader after `old`, and when it was first seen (monotonic seconds)."""
    deadline = time.monotonic() + RECOVERY_BUDGET_S
    while True:
        try:
            info = await bus.js.stream_info(name)
            if info.cluster is not None and info.cluster.leader not in (None, old):
                return info.cluster.leader, time.monotonic()
        except Exception:
            if time.monotonic() > deadline:
                raise
        assert time.monotonic() < deadline, f"no new leader of {name} within {RECOVERY_BUDGET_S:.0f}s"
        await asyncio.sleep(0.05)


async def _stored_event_ids(bus: NatsEventBus, expected: int) -> list[str]:
    """The ce-id of every message of TF_EVENTS, in stream order, read with an ordered consumer."""
    ids: list[str] = []
    done = asyncio.Event()

    async def collect(msg: Msg) -> None:
        ids.append((msg.headers or {})["ce-id"])
        if len(ids) >= expected:
            done.set()

    sub = await _ordered_subscription(bus, collect)
    try:
        await asyncio.wait_for(done.wait(), timeout=20)
        await asyncio.sleep(0.5)  # anything beyond `expected` (a doubled message) arrives too
    finally:
        await sub.unsubscribe()
    return ids


async def _ordered_subscription(bus: NatsEventBus, collect: Callable[[Msg], Awaitable[None]]) -> Subscription:
    """An ordered consumer on TF_EVENTS; its creation is asked again while the new stream leader, still
    catching up after the kill, lets the JetStream API request time out (the read is late, not the
    publish)."""
    deadline = asyncio.get_running_loop().time() + 20
    while True:
        try:
            return await bus.js.subscribe(
                subjects.ALL_EVENTS,
                stream=subjects.EVENTS_STREAM,
                ordered_consumer=True,
                deliver_policy=DeliverPolicy.ALL,
                cb=collect,
            )
        except NatsTimeoutError:
            if asyncio.get_running_loop().time() > deadline:
                raise
            await asyncio.sleep(0.5)


@pytest.fixture
async def scheduler_and_tfctl(cluster: Cluster) -> AsyncIterator[tuple[NatsEventBus, NatsEventBus]]:
    scheduler = await cluster.connect("scheduler")
    tfctl = await cluster.connect("tfctl", timeout_s=0.5)
    try:
        yield scheduler, tfctl
    finally:
        for bus in (scheduler, tfctl):
            await bus.nc.close()


async def test_acknowledged_events_survive_the_stream_leader_killed(
    cluster: Cluster, scheduler_and_tfctl: tuple[NatsEventBus, NatsEventBus]
) -> None:
    scheduler, tfctl = scheduler_and_tfctl
    await _provision_when_ready(scheduler, replicas=3)
    info = await _stream(scheduler, subjects.EVENTS_STREAM)
    assert info.config.num_replicas == 3
    assert info.cluster is not None
    assert info.cluster.leader is not None
    assert len(info.cluster.replicas or []) == 2

    acknowledged = []
    for index in range(EVENTS_BEFORE_KILL):
        event = _event(index)
        await _publish_until_acknowledged(scheduler, event)
        acknowledged.append(str(event.event_id))

    old_leader = info.cluster.leader
    leader = cluster.by_name(old_leader)
    assert leader.process is not None
    killed_at = time.monotonic()
    leader.process.send_signal(signal.SIGKILL)
    leader.process.wait(timeout=10)
    election = asyncio.create_task(_new_leader(tfctl, subjects.EVENTS_STREAM, old_leader))

    first_ack_at = None
    for index in range(EVENTS_BEFORE_KILL, EVENTS_BEFORE_KILL + EVENTS_AFTER_KILL):
        event = _event(index)
        acked_at = await _publish_until_acknowledged(scheduler, event)
        first_ack_at = first_ack_at or acked_at
        acknowledged.append(str(event.event_id))
    new_leader, elected_at = await election
    assert first_ack_at is not None
    print(
        f"\nfigure: leader {old_leader} killed; {new_leader} led {elected_at - killed_at:.2f}s later; the "
        f"first acknowledged publish came {first_ack_at - killed_at:.2f}s after the SIGKILL"
    )

    stored = await _stored_event_ids(tfctl, expected=len(acknowledged))
    assert stored == acknowledged, "every acknowledged event, once each, in publish order"
    after = await _stream(scheduler, subjects.EVENTS_STREAM)
    assert after.state.messages == len(acknowledged)
    assert after.cluster is not None
    assert after.cluster.leader == new_leader

    # A service restarting with the local default (1) does not take the copies away. The commands
    # stream may have been led by the killed server too: the restart comes once it has a new leader.
    await _new_leader(tfctl, subjects.COMMANDS_STREAM, old_leader)
    await subjects.provision(scheduler.js, consumers=(), replicas=1)
    for name in (subjects.EVENTS_STREAM, subjects.COMMANDS_STREAM):
        assert (await _stream(scheduler, name)).config.num_replicas == 3, name


async def test_provision_raises_replicas_and_never_lowers_them(
    scheduler_and_tfctl: tuple[NatsEventBus, NatsEventBus], caplog: pytest.LogCaptureFixture
) -> None:
    scheduler, tfctl = scheduler_and_tfctl
    caplog.set_level(logging.INFO, logger="tfcommon.subjects")
    await _provision_when_ready(scheduler, replicas=1, streams=[subjects.COMMANDS])
    assert (await _stream(scheduler, subjects.COMMANDS_STREAM)).config.num_replicas == 1

    # An operator raises the stream to 3 copies; a service started with the default 1 keeps them.
    await tfctl.js.update_stream(subjects.COMMANDS.config(replicas=3))
    caplog.clear()
    await subjects.provision(scheduler.js, streams=[subjects.COMMANDS], consumers=(), replicas=1)
    assert (await _stream(scheduler, subjects.COMMANDS_STREAM)).config.num_replicas == 3
    (record,) = [r for r in caplog.records if getattr(r, "event", None) == "stream.provisioned"]
    assert (record.outcome, record.replicas, record.replicas_wanted) == ("kept", 3, 1)  # type: ignore[attr-defined]

    # A service configured with more copies than a stream has raises it.
    await _provision_when_ready(scheduler, replicas=1, streams=[subjects.EVENTS])
    caplog.clear()
    await subjects.provision(scheduler.js, streams=[subjects.EVENTS], consumers=(), replicas=3)
    assert (await _stream(scheduler, subjects.EVENTS_STREAM)).config.num_replicas == 3
    (record,) = [r for r in caplog.records if getattr(r, "event", None) == "stream.provisioned"]
    assert (record.outcome, record.replicas_before) == ("raised", 1)  # type: ignore[attr-defined]
