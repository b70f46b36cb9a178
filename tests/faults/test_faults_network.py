"""The campaign's per-link partition is real: a cell cut from one port loses only that port's traffic.

A `NetworkCell` (network namespace and veth pair, root) forwards to the real NATS and Postgres of the
test session. A probe inside the cell opens fresh connections to both (NATS must greet with `INFO`,
Postgres must answer an `SSLRequest`) and keeps one NATS connection open (`PING`, `PONG`). While
`cut_from(port)` holds, the cut port's connections get no answer at all (a timeout, never a refusal or
a reset: the kernel drops the packets), the other port answers as before, and afterwards everything
answers again, the held connection included (TCP retransmitted what the cut dropped); the kernel
counted the packets it dropped (what the campaign reports as `chaos.partition_drops`).

The slow, lossy link is real too: while a cell is `slowed()`, datagrams sent from it are lost at
random (about `SLOW_LOSS_PERCENT`, counted by the kernel), a bulk TCP transfer takes as long as the
token bucket's rate says and still arrives whole (TCP retransmits the lost segments), and afterwards
everything answers again.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import pytest
from tfctl.fault_network import NetworkCell

pytestmark = pytest.mark.integration

PROBE = r"""
import json, socket, struct, sys

host, nats_port, postgres_port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
SSL_REQUEST = struct.pack("!ii", 8, 80877103)


def attempt(port, greet, timeout):
    try:
        with socket.create_connection((host, port), timeout=timeout) as connection:
            return greet(connection)
    except TimeoutError:
        return "silent"
    except OSError as error:
        return repr(error)


def nats_greets(connection):
    return "ok" if connection.recv(4096).startswith(b"INFO") else "no INFO"


def postgres_answers(connection):
    connection.sendall(SSL_REQUEST)
    return "ok" if connection.recv(1) in (b"N", b"S") else "no answer to SSLRequest"


held = socket.create_connection((host, nats_port), timeout=5)
held.recv(4096)
held.sendall(b'CONNECT {"verbose":false}\r\n')
pings = pongs = 0
for line in sys.stdin:
    timeout = float(line)
    answers = {
        "nats": attempt(nats_port, nats_greets, timeout),
        "postgres": attempt(postgres_port, postgres_answers, timeout),
    }
    held.sendall(b"PING\r\n")
    pings += 1
    held.settimeout(timeout)
    try:
        while pongs < pings:
            data = held.recv(4096)
            if not data:
                break
            pongs += data.count(b"PONG")
        answers["held nats connection"] = "ok" if pongs == pings else "closed"
    except TimeoutError:
        answers["held nats connection"] = "silent"
    except OSError as error:
        answers["held nats connection"] = repr(error)
    print(json.dumps(answers), flush=True)
"""

ALL_OK = {"nats": "ok", "postgres": "ok", "held nats connection": "ok"}
CUT_ROUND_S = 1.0
RECOVERY_ROUND_S = 10.0
"""Past TCP's retransmission backoff after the cut (the held connection's PING is sent again)."""


@pytest.fixture
async def cell(nats_url: str, postgres_server_url: str) -> AsyncIterator[tuple[NetworkCell, dict[str, int]]]:
    made = await asyncio.to_thread(NetworkCell.create)
    assert not isinstance(made, str), f"the partition test needs a network namespace: {made}"
    ports = {"nats": _port(nats_url), "postgres": _port(postgres_server_url)}
    try:
        for port in ports.values():
            await made.forward(port)
        yield made, ports
    finally:
        await made.close()


def _port(url: str) -> int:
    parts = urlsplit(url)
    assert parts.hostname == "127.0.0.1", f"the forwarders reach loopback only: {url}"
    assert parts.port is not None, url
    return parts.port


class Probe:
    """The probe inside the cell: one round of connections per `round(timeout)`."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process

    async def round(self, timeout_s: float) -> dict[str, str]:
        assert self.process.stdin is not None
        assert self.process.stdout is not None
        self.process.stdin.write(f"{timeout_s}\n".encode())
        await self.process.stdin.drain()
        line = await asyncio.wait_for(self.process.stdout.readline(), timeout=3 * timeout_s + 5)
        assert line, (await self.process.stderr.read()).decode() if self.process.stderr else "probe ended"
        answers: dict[str, str] = json.loads(line)
        return answers


@pytest.fixture
async def probe(cell: tuple[NetworkCell, dict[str, int]]) -> AsyncIterator[Probe]:
    network, ports = cell
    argv = [sys.executable, "-c", PROBE, network.host_ip, str(ports["nats"]), str(ports["postgres"])]
    process = await asyncio.create_subprocess_exec(
        *network.wrap(argv),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        yield Probe(process)
    finally:
        assert process.stdin is not None
        process.stdin.close()
        await asyncio.wait_for(process.wait(), timeout=10)


@pytest.mark.parametrize("cut", ["nats", "postgres"])
async def test_a_cell_cut_from_one_port_gets_silence_there_and_answers_everywhere_else(
    cell: tuple[NetworkCell, dict[str, int]], probe: Probe, cut: str
) -> None:
    network, ports = cell
    assert await probe.round(RECOVERY_ROUND_S) == ALL_OK
    async with network.cut_from(ports[cut]) as link_cut:
        during = await probe.round(CUT_ROUND_S)
    assert link_cut.dropped > 0
    other = "postgres" if cut == "nats" else "nats"
    assert during[cut] == "silent", during
    assert during[other] == "ok", during
    assert during["held nats connection"] == ("silent" if cut == "nats" else "ok"), during
    assert await probe.round(RECOVERY_ROUND_S) == ALL_OK


async def test_the_per_port_cut_is_accepted_by_this_kernel_and_leaves_no_qdisc_behind(
    cell: tuple[NetworkCell, dict[str, int]],
) -> None:
    network, _ = cell
    assert await asyncio.to_thread(network.link_cut_refused) is None
    shown = await asyncio.create_subprocess_exec(
        "tc", "qdisc", "show", "dev", network.host_interface, stdout=asyncio.subprocess.PIPE
    )
    output, _ = await shown.communicate()
    assert b"htb" not in output, output
    assert b"pfifo" not in output, output


DATAGRAMS = 400
DATAGRAM_SPACING_S = 0.005
"""400 small datagrams over 2 s: 18 KB/s, under the slow link's 256 kbit/s, so its queue never overflows."""
SENDER = r"""
import socket, sys, time
host, port, count, spacing = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sender:
    for serial in range(count):
        sender.sendto(serial.to_bytes(4, "big") * 16, (host, port))
        time.sleep(spacing)
"""
BULK_BYTES = 48 * 1024
"""A NATS publish this large takes 1.5 s at 256 kbit/s (less the token bucket's 8 KB burst)."""


async def test_a_slowed_cell_loses_packets_at_random_and_slows_tcp_which_still_delivers(
    cell: tuple[NetworkCell, dict[str, int]], probe: Probe
) -> None:
    network, ports = cell
    assert await probe.round(RECOVERY_ROUND_S) == ALL_OK
    received: set[bytes] = set()
    transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
        lambda: _Collector(received), local_addr=(network.host_ip, 0)
    )
    try:
        argv = [sys.executable, "-c", SENDER, network.host_ip, str(transport.get_extra_info("sockname")[1])]
        async with network.slowed() as link:
            sender = await asyncio.create_subprocess_exec(
                *network.wrap([*argv, str(DATAGRAMS), str(DATAGRAM_SPACING_S)])
            )
            assert await asyncio.wait_for(sender.wait(), timeout=30) == 0
            bulk_started = time.monotonic()
            bulk = await asyncio.to_thread(_publish_through_cell, network, ports["nats"])
            bulk_s = time.monotonic() - bulk_started
    finally:
        transport.close()
    assert bulk == "ok", bulk
    assert 0 < len(received) < DATAGRAMS
    assert link.dropped_at_random + link.dropped_on_overflow + len(received) >= DATAGRAMS, link
    assert 4 <= link.dropped_at_random <= 60, link
    assert bulk_s >= (BULK_BYTES - 8 * 1024) * 8 / 256_000, f"{BULK_BYTES} bytes took only {bulk_s:.2f}s"
    assert await probe.round(RECOVERY_ROUND_S) == ALL_OK


class _Collector(asyncio.DatagramProtocol):
    """Keeps the serial (first 4 bytes) of each datagram received."""

    def __init__(self, received: set[bytes]) -> None:
        self.received = received

    def datagram_received(self, data: bytes, addr: tuple[str | Any, int]) -> None:
        self.received.add(data[:4])


def _publish_through_cell(network: NetworkCell, nats_port: int) -> str:
    """From inside the cell: one `BULK_BYTES` NATS publish, then `PING`; "ok" once its `PONG` arrived."""
    script = (
        "import socket, sys\n"
        f"c = socket.create_connection(({network.host_ip!r}, {nats_port}), timeout=60)\n"
        "c.recv(4096)\n"
        f"c.sendall(b'CONNECT {{\"verbose\":false}}\\r\\nPUB tf.test.bulk {BULK_BYTES}\\r\\n'"
        f" + b'x' * {BULK_BYTES} + b'\\r\\nPING\\r\\n')\n"
        "seen = b''\n"
        "while b'PONG' not in seen:\n"
        "    data = c.recv(4096)\n"
        "    if not data: sys.exit('closed')\n"
        "    seen += data\n"
        "print('ok')\n"
    )
    done = subprocess.run(
        network.wrap([sys.executable, "-c", script]), capture_output=True, text=True, timeout=90, check=False
    )
    return done.stdout.strip() or done.stderr.strip()[-500:]
