"""The fault campaign's NATS: three `nats-server -js` processes routed to each other on loopback.

`NatsCluster(root)` runs servers `tfpool-nats-0..2`, each with its JetStream store under `root/n<i>`,
its client port, its route port and the routes to all three (`--cluster_name tfpool-faults`), and
`--no_advertise`: a client knows the servers it is given (`url`, the three URLs separated by commas,
as `TF_NATS_URL` takes them) and no other, so that a service in a network cell is never handed the
host's loopback addresses. `start()` returns once the three accept connections and JetStream can keep
a stream on three servers (the streams are provisioned then with `REPLICAS`, as the services do with
`TF_NATS_STREAM_REPLICAS`). Unlike deploy/nats/cluster.conf there are no users: the campaign's services
connect without credentials, as on the embedded single server.

`until_jetstream_answers(call)` asks a JetStream API again while it answers 503 (no server has taken
the request: a cluster still electing its meta or stream leader after a fault), for the campaign's own
requests (its faults' stream updates and dead-letter handling, and the reads of its checks).

The faults: `kill(server)` (SIGKILL) and `launch(server)` again on the same store, `restart_all()`
(every server SIGKILLed, then all three started again), and `leader_of(stream)`, the name of the
server leading a stream (its `cluster.leader` in the stream's info), or None while it has none.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import nats
import nats.errors
from nats.js.errors import APIError, NoStreamResponseError, ServiceUnavailableError
from tfcommon import subjects
from tfcommon.infra import die_with_parent, free_port, nats_server_binary, wait_for_port

HOST = "127.0.0.1"
SERVERS = 3
REPLICAS = 3
CLUSTER_NAME = "tfpool-faults"
READY_TIMEOUT_S = 60.0
"""How long a (re)started cluster may take to accept connections and hold three-replica streams."""
UNANSWERED_RETRY_S = 0.25
T = TypeVar("T")


async def until_jetstream_answers(call: Callable[[], Awaitable[T]], timeout_s: float = READY_TIMEOUT_S) -> T:
    """`await call()`, made again while JetStream has no responder for it (`ServiceUnavailableError`, or
    `NoStreamResponseError` for a publish): nothing was done then, so asking again is safe for any
    request. Any other error, and the last 503 after `timeout_s`, is raised."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await call()
        except (ServiceUnavailableError, NoStreamResponseError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(UNANSWERED_RETRY_S)


@dataclass
class ClusterServer:
    """One nats-server of the cluster: its name, store, ports and (while running) process."""

    name: str
    store_dir: Path
    port: int = field(default_factory=lambda: free_port(HOST))
    cluster_port: int = field(default_factory=lambda: free_port(HOST))
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"nats://{HOST}:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.store_dir.parent / f"{self.name}.log"


@dataclass
class NatsCluster:
    """Three routed JetStream servers whose stores live under `root` (`root/n0`, `root/n1`, `root/n2`)."""

    root: Path
    host: str = HOST
    servers: list[ClusterServer] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.servers:
            self.servers = [
                ClusterServer(f"tfpool-nats-{index}", self.root / f"n{index}") for index in range(SERVERS)
            ]

    @property
    def urls(self) -> list[str]:
        return [server.url for server in self.servers]

    @property
    def url(self) -> str:
        """Every server's URL, separated by commas (`TF_NATS_URL`, `tfcommon.bus.server_urls`)."""
        return ",".join(self.urls)

    @property
    def ports(self) -> list[int]:
        return [server.port for server in self.servers]

    def by_name(self, name: str) -> ClusterServer:
        (found,) = [server for server in self.servers if server.name == name]
        return found

    def launch(self, server: ClusterServer) -> None:
        """Start `server` without waiting for it, on its store of before (quick; from the main thread)."""
        server.store_dir.mkdir(parents=True, exist_ok=True)
        routes = ",".join(f"nats://{HOST}:{peer.cluster_port}" for peer in self.servers)
        server.process = subprocess.Popen(
            [
                str(nats_server_binary()),
                "-js",
                "-a", HOST,
                "-p", str(server.port),
                "-n", server.name,
                "-sd", str(server.store_dir),
                "-l", str(server.log_path),
                "--cluster_name", CLUSTER_NAME,
                "--cluster", f"nats://{HOST}:{server.cluster_port}",
                "--routes", routes,
                "--no_advertise",
            ],
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=die_with_parent(signal.SIGTERM),
        )  # fmt: skip

    def wait_for(self, server: ClusterServer) -> None:
        """Block until `server` accepts connections."""
        assert server.process is not None, "launch() first"
        wait_for_port(HOST, server.port, READY_TIMEOUT_S, server.process)

    async def start(self) -> None:
        """Start every server and wait until the cluster holds the streams on `REPLICAS` servers."""
        for server in self.servers:
            self.launch(server)
        await self.wait_ready()

    async def wait_ready(self) -> None:
        """Every server accepts connections and the streams exist with `REPLICAS` copies (created so
        when missing, as a service's start-up would, retried while the cluster elects its leaders)."""
        for server in self.servers:
            await asyncio.to_thread(self.wait_for, server)
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            try:
                connection = await nats.connect(self.urls, connect_timeout=2, allow_reconnect=False)
                try:
                    await subjects.provision(connection.jetstream(timeout=2), consumers=(), replicas=REPLICAS)
                    return
                finally:
                    await connection.close()
            except (nats.errors.Error, APIError, subjects.StreamReplicasError, OSError, TimeoutError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.25)

    async def kill(self, server: ClusterServer) -> None:
        """SIGKILL `server` and wait for it to be gone."""
        if server.process is not None and server.process.poll() is None:
            server.process.kill()
            await asyncio.to_thread(server.process.wait)

    async def restart(self, server: ClusterServer) -> None:
        """SIGKILL `server`, start it again on its store and wait until it accepts connections."""
        await self.kill(server)
        self.launch(server)
        await asyncio.to_thread(self.wait_for, server)

    async def restart_all(self) -> None:
        """SIGKILL every server, start all three again and wait until the streams are led again."""
        await asyncio.gather(*(self.kill(server) for server in self.servers))
        for server in self.servers:
            self.launch(server)
        await self.wait_ready()

    async def leader_of(self, stream: str) -> str | None:
        """The name of the server leading `stream` now, or None while it has no leader."""
        connection = await nats.connect(self.urls, connect_timeout=2, allow_reconnect=False)
        try:
            info = await connection.jetstream(timeout=2).stream_info(stream)
        finally:
            await connection.close()
        return info.cluster.leader if info.cluster is not None else None

    async def replicas_of(self, stream: str) -> int:
        """How many servers keep `stream` (its configured `num_replicas`)."""
        connection = await nats.connect(self.urls, connect_timeout=2, allow_reconnect=False)
        try:
            info = await until_jetstream_answers(lambda: connection.jetstream(timeout=2).stream_info(stream))
        finally:
            await connection.close()
        return info.config.num_replicas or 1

    def stop(self) -> None:
        for server in self.servers:
            if server.process is not None and server.process.poll() is None:
                server.process.terminate()
        for server in self.servers:
            if server.process is not None:
                try:
                    server.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    server.process.kill()
                    server.process.wait(timeout=10)
