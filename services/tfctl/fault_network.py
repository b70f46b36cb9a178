"""Network faults for the fault campaign: one service in its own network namespace behind a veth pair.

As root, `NetworkCell.create()` makes a namespace and a veth pair (host end `HOST_IP`, namespace end
`CELL_IP`, a /30 chosen from the process id), and forwards the namespace's connections to NATS and
Postgres on the host's loopback (`forward(port)`: the cell reaches them at `HOST_IP:port`). A service
started through `wrap(argv)` runs inside it, reachable from the host at `CELL_IP`. Then:

- `partition(seconds)`: the host end of the veth pair goes down, so the service reaches neither NATS nor
  Postgres, and nobody reaches it, until the link comes back (the kernel drops the packets; no mock);
- `slow_link(seconds)`: a token bucket (`tc qdisc ... tbf rate 256kbit latency 200ms`) on both ends,
  which delays what fits in its queue and drops what does not (this kernel has no `netem`).

`close()` removes the pair, the namespace and the forwarders. Where a step is refused (not root, no
`ip`), `create()` returns why, and the campaign reports the fault as not run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
from dataclasses import dataclass, field

SLOW_RATE = "256kbit"
SLOW_LATENCY = "200ms"
SLOW_BURST = "8kb"
PIPE_CHUNK = 65536


def _ip(*arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["ip", *arguments], capture_output=True, text=True, check=False)


@dataclass
class NetworkCell:
    """A network namespace joined to the host by a veth pair, with its forwarders (see the module)."""

    namespace: str
    host_interface: str
    cell_interface: str
    host_ip: str
    cell_ip: str
    servers: list[asyncio.Server] = field(default_factory=list)
    pipes: set[asyncio.Task[None]] = field(default_factory=set)

    @classmethod
    def create(cls) -> NetworkCell | str:
        """The cell, or why it could not be made here."""
        if os.geteuid() != 0:
            return "not root: network namespaces and veth pairs need CAP_NET_ADMIN"
        if shutil.which("ip") is None:
            return "no ip command (iproute2)"
        tag = os.getpid() % 100_000
        second, third = 200 + (os.getpid() // 64) % 50, (os.getpid() % 64) * 4
        cell = cls(
            namespace=f"tfcell{tag}",
            host_interface=f"tfh{tag}",
            cell_interface=f"tfc{tag}",
            host_ip=f"10.{second}.{third}.1",
            cell_ip=f"10.{second}.{third}.2",
        )
        steps = [
            ("netns", "add", cell.namespace),
            ("link", "add", cell.host_interface, "type", "veth", "peer", "name", cell.cell_interface),
            ("link", "set", cell.cell_interface, "netns", cell.namespace),
            ("addr", "add", f"{cell.host_ip}/30", "dev", cell.host_interface),
            ("link", "set", cell.host_interface, "up"),
            ("-n", cell.namespace, "addr", "add", f"{cell.cell_ip}/30", "dev", cell.cell_interface),
            ("-n", cell.namespace, "link", "set", cell.cell_interface, "up"),
            ("-n", cell.namespace, "link", "set", "lo", "up"),
        ]
        for step in steps:
            done = _ip(*step)
            if done.returncode != 0:
                cell._remove_links()
                return f"ip {' '.join(step)}: {done.stderr.strip()}"
        return cell

    def wrap(self, argv: list[str]) -> list[str]:
        """`argv` run inside the cell, its `--host` (if any) set to the cell's address."""
        inside = list(argv)
        if "--host" in inside:
            inside[inside.index("--host") + 1] = self.cell_ip
        return ["ip", "netns", "exec", self.namespace, *inside]

    async def forward(self, port: int) -> None:
        """Connections from the cell to `host_ip:port` reach `127.0.0.1:port` on the host."""

        async def connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", port)
            except OSError:
                writer.close()
                return
            for source, sink in ((reader, upstream_writer), (upstream_reader, writer)):
                task = asyncio.create_task(_pipe(source, sink))
                self.pipes.add(task)
                task.add_done_callback(self.pipes.discard)

        self.servers.append(await asyncio.start_server(connect, self.host_ip, port))

    async def partition(self, seconds: float) -> None:
        """Cut the cell off for `seconds`."""
        await asyncio.to_thread(_ip, "link", "set", self.host_interface, "down")
        try:
            await asyncio.sleep(seconds)  # the fault itself is the outage, not a synchronisation
        finally:
            await asyncio.to_thread(_ip, "link", "set", self.host_interface, "up")

    async def slow_link(self, seconds: float) -> None:
        """A slow link that drops what overflows its queue, both ways, for `seconds`."""
        bucket = ["root", "tbf", "rate", SLOW_RATE, "burst", SLOW_BURST, "latency", SLOW_LATENCY]
        ends = (
            ["tc", "qdisc", "{}", "dev", self.host_interface],
            ["ip", "netns", "exec", self.namespace, "tc", "qdisc", "{}", "dev", self.cell_interface],
        )
        for end in ends:
            command = [word.replace("{}", "add") for word in end] + bucket
            await asyncio.to_thread(subprocess.run, command, capture_output=True, check=True)
        try:
            await asyncio.sleep(seconds)  # the fault itself is the slow link, not a synchronisation
        finally:
            for end in ends:
                command = [word.replace("{}", "del") for word in end] + ["root"]
                await asyncio.to_thread(subprocess.run, command, capture_output=True, check=False)

    async def close(self) -> None:
        for server in self.servers:
            server.close()
        for task in list(self.pipes):
            task.cancel()
        await asyncio.gather(*self.pipes, return_exceptions=True)
        await asyncio.to_thread(self._remove_links)

    def _remove_links(self) -> None:
        _ip("link", "del", self.host_interface)
        _ip("netns", "del", self.namespace)


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while data := await source.read(PIPE_CHUNK):
            sink.write(data)
            await sink.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            sink.close()
