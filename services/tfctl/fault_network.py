"""Network faults for the fault campaign: one service in its own network namespace behind a veth pair.

As root, `NetworkCell.create(index)` makes a namespace and a veth pair (host end `HOST_IP`, namespace end
`CELL_IP`, a /30 chosen from the process id and `index`, so that one process can make two cells), and
forwards the namespace's connections to NATS and Postgres on the host's loopback (`forward(port)`: the
cell reaches them at `HOST_IP:port`). A service started through `wrap(argv)` runs inside it, reachable
from the host at `CELL_IP`. Then (the kernel drops the packets in each case; no mock):

- `partition(seconds)`: the host end of the veth pair goes down, so the service reaches neither NATS nor
  Postgres, and nobody reaches it, until the link comes back;
- `partition_from(ports, seconds)` (or `cut_from(*ports)` as a context): only the cell's TCP traffic
  with `HOST_IP:port` for each of `ports` (the three NATS servers' ports, or Postgres's) is dropped,
  both ways, while the rest of the link works: on the egress of each end an `htb` root qdisc passes
  what no filter classifies and one `u32` filter per port (`match ip dport <port>` leaving the cell,
  `match ip sport <port>` entering it) sends the ports'
  packets to a class whose `pfifo limit 0` drops every one. Nothing is reset or closed: both sides'
  TCP sees silence and retransmits, as behind a real partition. This kernel has no `gact` action
  (`tc filter ... action drop` answers "Failed to load TC action module") nor `prio`, hence the class;
- `slow_link(seconds)` (or `slowed()` as a context): a slow, lossy link both ways. This kernel has no
  `netem`, so each end gets what does the same with the parts it has: an `htb` root qdisc whose default
  class leads to a token bucket (`tbf rate 256kbit burst 8kb latency 200ms`: what fits in its queue is
  delayed, what overflows it is dropped), and a `bpf` filter, a classic BPF program that draws the
  kernel's random number for each packet (`ld rand`) and sends `SLOW_LOSS_PERCENT` of them, at random,
  to the class whose `pfifo limit 0` drops them: random loss, as `netem loss 5%` would.

Each fault replaces the root qdisc of both ends, so two of them must not overlap on one cell.
`close()` removes the pair, the namespace and the forwarders. Where a step is refused (not root, no
`ip`), `create()` returns why, and where `tc` refuses a per-port cut `link_cut_refused()` says why; the
campaign then reports the faults as not run.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

SLOW_RATE = "256kbit"
SLOW_LATENCY = "200ms"
SLOW_BURST = "8kb"
SLOW_LOSS_PERCENT = 5.0
SLOW_CLASS = "1:2"
PIPE_CHUNK = 65536
CELLS_PER_PROCESS = 2
DROP_CLASS = "1:1"
PROBE_PORT = 9


class LinkCutError(RuntimeError):
    """`tc` refused a step of a per-port cut; the message is the command and its error."""


@dataclass
class LinkStats:
    """What the kernel did to the packets of a slowed link (`NetworkCell.slowed`), both ends summed."""

    passed: int = 0
    """Packets that went through the token bucket (delayed when its queue was not empty)."""
    dropped_at_random: int = 0
    """Packets the random-loss filter sent to the dropping class."""
    dropped_on_overflow: int = 0
    """Packets the token bucket dropped because its queue was full."""


def random_loss_program(percent: float) -> str:
    """A classic BPF program for a `tc ... bpf bytecode` filter that matches `percent` of packets at
    random: `A = rand` (the ancillary load `SKF_AD_OFF + SKF_AD_RANDOM`, a fresh 32-bit random number
    per packet), then `A > threshold`: return -1 (matched: the filter's `classid`), else 0 (not
    matched). The text is tc's: the instruction count, then `code jt jf k` per instruction."""
    if not 0.0 < percent < 100.0:
        raise ValueError(f"loss percent must be above 0 and below 100, got {percent}")
    threshold = round((1.0 - percent / 100.0) * 0xFFFFFFFF)
    load_random = f"{0x20} 0 0 {(1 << 32) - 0x1000 + 56}"
    above_threshold = f"{0x25} 0 1 {threshold}"
    matched, not_matched = f"{0x06} 0 0 {0xFFFFFFFF}", f"{0x06} 0 0 0"
    return f"4,{load_random},{above_threshold},{matched},{not_matched}"


@dataclass
class LinkCut:
    """A per-port cut (`NetworkCell.cut_from`): its ports and, once it ended, the packets dropped."""

    ports: tuple[int, ...]
    dropped: int = 0


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
    def create(cls, index: int = 0) -> NetworkCell | str:
        """The cell number `index` (0 or 1) of this process, or why it could not be made here."""
        if os.geteuid() != 0:
            return "not root: network namespaces and veth pairs need CAP_NET_ADMIN"
        if shutil.which("ip") is None:
            return "no ip command (iproute2)"
        if not 0 <= index < CELLS_PER_PROCESS:
            return f"cell {index}: a process has cells 0 to {CELLS_PER_PROCESS - 1}"
        pid = os.getpid()
        tag = f"{pid % 100_000}{'ab'[index]}"
        second, third = 200 + (pid // 32) % 50, (pid % 32) * 8 + index * 4
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

    @contextlib.asynccontextmanager
    async def cut_from(self, *ports: int) -> AsyncIterator[LinkCut]:
        """While open, the kernel drops the cell's TCP traffic with `host_ip:port` for each of `ports`,
        both ways, and nothing else (see the module); raises `LinkCutError` when `tc` refuses. The
        `LinkCut` it gives holds, once closed, how many packets were dropped."""
        cut = LinkCut(ports)
        await asyncio.to_thread(self._drop_ports, ports)
        try:
            yield cut
        finally:
            cut.dropped = await asyncio.to_thread(self._dropped_packets)
            await asyncio.to_thread(self._clear_qdiscs)

    async def partition_from(self, ports: Sequence[int], seconds: float) -> int:
        """Cut the cell off from `host_ip:port` for each of `ports` alone (the NATS servers, or
        Postgres) for `seconds`; the packets the kernel dropped meanwhile (0: the service sent nothing
        there and nothing came)."""
        async with self.cut_from(*ports) as cut:
            await asyncio.sleep(seconds)  # the fault itself is the outage, not a synchronisation
        return cut.dropped

    def link_cut_refused(self) -> str | None:
        """None when a per-port cut can be made here (one is made and removed), else `tc`'s refusal."""
        if shutil.which("tc") is None:
            return "no tc command (iproute2)"
        try:
            self._drop_ports((PROBE_PORT,))
        except LinkCutError as error:
            return str(error)
        finally:
            self._clear_qdiscs()
        return None

    def _ends(self) -> tuple[list[str], list[str]]:
        """The `tc` command prefix of the host end and of the cell end."""
        return (
            ["tc"],
            ["ip", "netns", "exec", self.namespace, "tc"],
        )

    def _drop_ports(self, ports: Sequence[int]) -> None:
        host_end, cell_end = self._ends()
        ends = (
            (host_end, self.host_interface, f"src {self.host_ip}/32 match ip sport"),
            (cell_end, self.cell_interface, f"dst {self.host_ip}/32 match ip dport"),
        )
        for tc, device, match in ends:
            steps = [
                f"qdisc add dev {device} root handle 1: htb default 0".split(),
                *_dropping_class(device),
                *(
                    (
                        f"filter add dev {device} parent 1: protocol ip prio 1 u32 match ip protocol 6 0xff"
                        f" match ip {match} {port} 0xffff flowid {DROP_CLASS}"
                    ).split()
                    for port in ports
                ),
            ]
            self._run_tc(tc, steps)

    def _run_tc(self, tc: list[str], steps: Sequence[list[str]]) -> None:
        """Each of `steps` with the `tc` prefix `tc`; at the first refusal both ends' qdiscs are
        removed and `LinkCutError` raised with the step and tc's message."""
        for step in steps:
            done = subprocess.run([*tc, *step], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                self._clear_qdiscs()
                raise LinkCutError(f"tc {' '.join(step)}: {done.stderr.strip()}")

    def _shown_qdiscs(self) -> list[str]:
        """`tc -s qdisc show` of the host end and of the cell end."""
        host_end, cell_end = self._ends()
        return [
            subprocess.run(
                [*tc, "-s", "qdisc", "show", "dev", device], capture_output=True, text=True, check=False
            ).stdout
            for tc, device in ((host_end, self.host_interface), (cell_end, self.cell_interface))
        ]

    def _dropped_packets(self) -> int:
        """Packets the dropping `pfifo` (handle 10:) of each end has dropped."""
        return sum(_dropped_by_pfifo(shown) for shown in self._shown_qdiscs())

    def _clear_qdiscs(self) -> None:
        host_end, cell_end = self._ends()
        for tc, device in ((host_end, self.host_interface), (cell_end, self.cell_interface)):
            subprocess.run([*tc, "qdisc", "del", "dev", device, "root"], capture_output=True, check=False)

    async def slow_link(self, seconds: float) -> LinkStats:
        """A slow link that drops `SLOW_LOSS_PERCENT` of packets at random and what overflows its
        queue, both ways, for `seconds`; what the kernel did to the packets meanwhile."""
        async with self.slowed() as stats:
            await asyncio.sleep(seconds)  # the fault itself is the slow link, not a synchronisation
        return stats

    @contextlib.asynccontextmanager
    async def slowed(self, loss_percent: float = SLOW_LOSS_PERCENT) -> AsyncIterator[LinkStats]:
        """While open, the link is slow and lossy both ways (see the module); raises `LinkCutError`
        when `tc` refuses. The `LinkStats` it gives holds, once closed, the kernel's counts."""
        stats = LinkStats()
        await asyncio.to_thread(self._slow_down, loss_percent)
        try:
            yield stats
        finally:
            counted = await asyncio.to_thread(self._slowed_counts)
            stats.passed, stats.dropped_at_random, stats.dropped_on_overflow = counted
            await asyncio.to_thread(self._clear_qdiscs)

    def _slow_down(self, loss_percent: float) -> None:
        host_end, cell_end = self._ends()
        program = random_loss_program(loss_percent)
        for tc, device in ((host_end, self.host_interface), (cell_end, self.cell_interface)):
            steps = [
                f"qdisc add dev {device} root handle 1: htb default {SLOW_CLASS[2:]}".split(),
                *_dropping_class(device),
                f"class add dev {device} parent 1: classid {SLOW_CLASS} htb rate 1gbit quantum 60000".split(),
                (
                    f"qdisc add dev {device} parent {SLOW_CLASS} handle 20: tbf rate {SLOW_RATE}"
                    f" burst {SLOW_BURST} latency {SLOW_LATENCY}"
                ).split(),
                [
                    *f"filter add dev {device} parent 1: protocol all prio 1 bpf bytecode".split(),
                    program,
                    *f"classid {DROP_CLASS}".split(),
                ],
            ]
            self._run_tc(tc, steps)

    def _slowed_counts(self) -> tuple[int, int, int]:
        """Packets passed by the token buckets (handle 20:), dropped by the random-loss class's `pfifo`
        (10:) and dropped by the token buckets, both ends summed."""
        passed = at_random = on_overflow = 0
        for shown in self._shown_qdiscs():
            at_random += _dropped_by_pfifo(shown)
            bucket = shown.partition("qdisc tbf 20:")[2]
            if found := re.search(r"Sent \d+ bytes (\d+) pkt \(dropped (\d+)", bucket):
                passed += int(found.group(1))
                on_overflow += int(found.group(2))
        return passed, at_random, on_overflow

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


def _dropping_class(device: str) -> list[list[str]]:
    """The `tc` steps of class `DROP_CLASS` under root `1:`, whose `pfifo limit 0` (handle 10:) drops
    every packet sent to it."""
    return [
        f"class add dev {device} parent 1: classid {DROP_CLASS} htb rate 8kbit quantum 1514".split(),
        f"qdisc add dev {device} parent {DROP_CLASS} handle 10: pfifo limit 0".split(),
    ]


def _dropped_by_pfifo(shown: str) -> int:
    """The packets the dropping `pfifo` (handle 10:) dropped, from one end's `tc -s qdisc show`."""
    found = re.search(r"dropped (\d+)", shown.partition("qdisc pfifo 10:")[2])
    return int(found.group(1)) if found else 0


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
