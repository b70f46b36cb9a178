"""Admission webhook benchmark for `make bench`: HTTPS throughput and latency against a bare endpoint.

`run_admission_benchmark()` starts two HTTPS servers as child processes on loopback, each a single
uvicorn worker with the same TLS certificate: the real admission route (config, core, patch, an
in-memory event bus and pod-index counter; no ledger, since the benchmark pod has no
`enabled-replicas`), served as the runtime serves it (the route ahead of FastAPI), and a bare ASGI
endpoint returning the same AdmissionReview bytes. Both processes get the same server settings and the
same frozen start-up heap. It then drives both with the same client, 10 and 100 concurrent keep-alive
clients, in rounds whose short chunks alternate between the two servers, and returns a dict of requests
per second, p50/p99 in milliseconds, each server's CPU time per request and the throughput ratio.
`python -m tfwebhook.bench` prints that dict as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import uvicorn
from starlette.types import ASGIApp
from tfcommon.config import ConfigSource
from tfcommon.events import Message, encode
from tfcommon.runtime import build_app, freeze_startup_heap, with_front_routes
from tfcommon.tls import generate_self_signed

from tfwebhook.http import AdmissionService, build_router, front_routes
from tfwebhook.testing import a_gpu_container, a_pod, a_review

GOAL_RATIO = 0.7
GOAL_P99_MS_AT_10 = 10.0
START_TIMEOUT_S = 30.0
WARM_UP_PER_CLIENT = 5
CHUNK_PER_CLIENT = 5
MIN_CHUNKS = 10

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def benchmark_review() -> bytes:
    """Step 2 of "Migrate Existing Workload": one opted-in pod with `nvidia.com/gpu: 1`, shared."""
    pod = a_pod(
        labels={"tensor-fusion.ai/enabled": "true", "pod-template-hash": "7c9d8f"},
        annotations={"tensor-fusion.ai/isolation": "shared"},
        containers=[a_gpu_container()],
        name=None,
        owner=("ReplicaSet", "llm-7c9d8f"),
    )
    return a_review(pod, uid="bench-0001")


def webhook_app() -> ASGIApp:
    """The webhook's HTTP app as the service runtime serves it (the admission route ahead of FastAPI),
    without the bus and ledger probes; pod indexes come from an in-process counter."""
    service = AdmissionService(config=ConfigSource(None), bus=_DiscardingBus())
    return with_front_routes(build_app("webhook", [build_router(service)], {}), front_routes(service))


class _DiscardingBus:
    """Encodes each event as a real bus would, then drops it (no NATS in the benchmark)."""

    async def publish(self, event: Message) -> None:
        encode(event)

    async def publish_raw(
        self,
        subject: str,
        payload: bytes,
        *,
        event_id: str,
        event_type: str,
        occurred_at: datetime,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        return None


def bare_app(body: bytes) -> Callable[[Scope, Receive, Send], Awaitable[None]]:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        more = True
        while more:
            more = (await receive()).get("more_body", False)
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def _serve(kind: str, port: int, cert: Path, key: Path, body_file: Path) -> None:
    app: Any = webhook_app() if kind == "webhook" else bare_app(body_file.read_bytes())
    freeze_startup_heap()  # as the service's composition does; the bare endpoint too, for fairness
    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        ssl_certfile=str(cert),
        ssl_keyfile=str(key),
        log_level="warning",
        access_log=False,
        lifespan="off",
    )


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _start(kind: str, port: int, cert: Path, key: Path, body_file: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "tfwebhook.bench", "--serve", kind, "--port", str(port)]
    command += ["--cert", str(cert), "--key", str(key), "--body", str(body_file)]
    process = subprocess.Popen(command, start_new_session=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{kind} benchmark server exited with code {process.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return process
        except OSError:
            time.sleep(0.05)
    process.kill()
    raise RuntimeError(f"{kind} benchmark server did not listen within {START_TIMEOUT_S:.0f}s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)


def _percentile(sorted_values: Sequence[float], fraction: float) -> float:
    index = min(len(sorted_values) - 1, max(0, round(fraction * len(sorted_values)) - 1))
    return sorted_values[index]


def _cpu_seconds(pid: int) -> float | None:
    """User and system CPU time of process `pid` so far (Linux `/proc`); None where unavailable."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _exchange(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    request: bytes,
    count: int,
    latencies: list[float],
) -> None:
    """`count` requests in turn on one keep-alive connection; a raw HTTP/1.1 loop keeps the load
    generator light."""
    for _ in range(count):
        started = time.perf_counter()
        writer.write(request)
        head = await reader.readuntil(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        length = next(
            int(line.split(":", 1)[1]) for line in header_lines if line.lower().startswith("content-length:")
        )
        await reader.readexactly(length)
        latencies.append(time.perf_counter() - started)
        if " 200 " not in status_line:
            raise RuntimeError(f"{status_line} from the benchmark server")


@dataclass
class _Server:
    """One benchmark server as a round drives it: its open connections and what was measured so far."""

    port: int
    pid: int
    connections: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)
    elapsed_s: float = 0.0
    cpu_s: float | None = 0.0

    def measured(self) -> dict[str, float]:
        ordered = sorted(self.latencies)
        figures = {
            "requests_per_s": round(len(ordered) / self.elapsed_s, 1),
            "p50_ms": round(_percentile(ordered, 0.50) * 1000, 2),
            "p99_ms": round(_percentile(ordered, 0.99) * 1000, 2),
        }
        if self.cpu_s is not None:
            figures["server_cpu_us_per_request"] = round(self.cpu_s / len(ordered) * 1e6, 1)
        return figures


async def _round(
    servers: Mapping[str, _Server], trust: ssl.SSLContext, body: bytes, clients: int, requests: int
) -> dict[str, dict[str, float]]:
    """One round: `requests` to each server among `clients` keep-alive connections, in chunks that
    alternate between the servers, so both see the same background load.

    Connections are opened and warmed up first: the TLS handshakes stay out of the timed chunks.
    """
    host = "127.0.0.1"
    try:
        for server in servers.values():
            server.connections = list(
                await asyncio.gather(
                    *(
                        asyncio.open_connection(host, server.port, ssl=trust, server_hostname=host)
                        for _ in range(clients)
                    )
                )
            )
        for server in servers.values():
            warm: list[float] = []
            await _chunk(server, _request(host, server.port, body), clients * WARM_UP_PER_CLIENT, warm)
        chunk = max(CHUNK_PER_CLIENT * clients, requests // MIN_CHUNKS)
        order = list(servers.values())
        done = 0
        while done < requests:
            size = min(chunk, requests - done)
            for server in order:
                cpu_before = _cpu_seconds(server.pid)
                started = time.perf_counter()
                await _chunk(server, _request(host, server.port, body), size, server.latencies)
                server.elapsed_s += time.perf_counter() - started
                cpu_after = _cpu_seconds(server.pid)
                if cpu_before is None or cpu_after is None or server.cpu_s is None:
                    server.cpu_s = None
                else:
                    server.cpu_s += cpu_after - cpu_before
            order.reverse()
            done += size
    finally:
        for server in servers.values():
            for _, writer in server.connections:
                writer.close()
    return {kind: server.measured() for kind, server in servers.items()}


def _request(host: str, port: int, body: bytes) -> bytes:
    return (
        f"POST /mutate-v1-pod HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


async def _chunk(server: _Server, request: bytes, requests: int, latencies: list[float]) -> None:
    """`requests` spread over the server's connections, each connection sending its share in turn."""
    per_connection, extra = divmod(requests, len(server.connections))
    await asyncio.gather(
        *(
            _exchange(reader, writer, request, per_connection + (index < extra), latencies)
            for index, (reader, writer) in enumerate(server.connections)
        )
    )


def _core_microseconds(body: bytes, *, cached: bool, rounds: int = 2000) -> float:
    """In-process cost of one review (parse, decide, patch, render, queue the event), no HTTP or TLS."""
    service = AdmissionService(
        config=ConfigSource(None), bus=_DiscardingBus(), verdict_cache_size=512 if cached else 0
    )

    async def loop() -> float:
        started = time.perf_counter()
        for _ in range(rounds):
            await service.review(body)
        await service.drain()
        return (time.perf_counter() - started) / rounds

    return round(asyncio.run(loop()) * 1e6, 1)


def run_admission_benchmark(
    requests: int = 2000, concurrency: Sequence[int] = (10, 100), rounds: int = 5
) -> dict[str, Any]:
    """Measure the webhook against a bare uvicorn endpoint returning the same AdmissionReview.

    Each round sends `requests` requests to each server in chunks that alternate between them (at
    least 5 requests per client a chunk), and its ratio is the webhook's throughput over the bare
    endpoint's: both ran under the same background load. Per concurrency level the round with the
    median ratio gives `requests_per_s` (the upper one for an even count), with every round's ratio in
    `ratio_per_round`; `p50_ms` and `p99_ms` are medians over the rounds, so one round that a burst of
    other work on the machine stalled does not decide the tail figure.
    `server_cpu_us_per_request` is each server's CPU time per request (median over the rounds; Linux
    only), the cost seen from the other side (other load on the machine moves it too).

    Returns `{"webhook": {"c10": {...}}, "bare": {...}, "ratio": {"c10": ...}, "goal": {...}, ...}` with
    `requests_per_s`, `p50_ms` and `p99_ms` per concurrency level.
    """
    body = benchmark_review()
    with tempfile.TemporaryDirectory(prefix="tf-bench-") as folder:
        directory = Path(folder)
        cert_pem, key_pem = generate_self_signed(["127.0.0.1"], datetime.now(UTC))
        cert, key = directory / "tls.crt", directory / "tls.key"
        cert.write_bytes(cert_pem)
        key.write_bytes(key_pem)
        expected = _expected_response(body)
        body_file = directory / "response.json"
        body_file.write_bytes(expected)
        trust = ssl.create_default_context(cafile=str(cert))
        ports = {"webhook": _free_port(), "bare": _free_port()}
        servers = {kind: _start(kind, port, cert, key, body_file) for kind, port in ports.items()}
        try:
            results: dict[str, dict[str, dict[str, float]]] = {"webhook": {}, "bare": {}}
            ratio_per_round: dict[str, list[float]] = {}
            server_cpu: dict[str, dict[str, float]] = {}
            for clients in concurrency:
                runs: list[dict[str, dict[str, float]]] = []
                for round_index in range(rounds):
                    order = list(ports) if round_index % 2 == 0 else list(reversed(ports))
                    driven = {kind: _Server(ports[kind], servers[kind].pid) for kind in order}
                    runs.append(asyncio.run(_round(driven, trust, body, clients, requests)))
                level = f"c{clients}"
                ratios = [run["webhook"]["requests_per_s"] / run["bare"]["requests_per_s"] for run in runs]
                median_round = runs[sorted(range(rounds), key=ratios.__getitem__)[rounds // 2]]
                for kind in ports:
                    results[kind][level] = {
                        "requests_per_s": median_round[kind]["requests_per_s"],
                        "p50_ms": round(statistics.median(run[kind]["p50_ms"] for run in runs), 2),
                        "p99_ms": round(statistics.median(run[kind]["p99_ms"] for run in runs), 2),
                    }
                ratio_per_round[level] = [round(ratio, 3) for ratio in ratios]
                cpu = {
                    kind: [run[kind]["server_cpu_us_per_request"] for run in runs]
                    for kind in ports
                    if all("server_cpu_us_per_request" in run[kind] for run in runs)
                }
                if cpu:
                    server_cpu[level] = {kind: sorted(values)[rounds // 2] for kind, values in cpu.items()}
        finally:
            for server in servers.values():
                _stop(server)
    ratio = {
        level: round(
            results["webhook"][level]["requests_per_s"] / results["bare"][level]["requests_per_s"], 3
        )
        for level in results["webhook"]
    }
    p99_at_10 = results["webhook"].get("c10", {}).get("p99_ms")
    return {
        "benchmark": "admission-webhook-https",
        "requests_per_run": requests,
        "rounds": rounds,
        "cpu_count": os.cpu_count(),
        "core_us_per_review": {
            "replica_pod_cached": _core_microseconds(body, cached=True),
            "uncached": _core_microseconds(body, cached=False),
        },
        "webhook": results["webhook"],
        "bare": results["bare"],
        "ratio": ratio,
        "ratio_per_round": ratio_per_round,
        "server_cpu_us_per_request": server_cpu,
        "goal": {
            "ratio_at_least": GOAL_RATIO,
            "p99_ms_at_10_below": GOAL_P99_MS_AT_10,
            "met": all(value >= GOAL_RATIO for value in ratio.values())
            and (p99_at_10 is None or p99_at_10 < GOAL_P99_MS_AT_10),
        },
    }


def _expected_response(review: bytes) -> bytes:
    service = AdmissionService(config=ConfigSource(None))
    status, response = asyncio.run(service.review(review))
    if status != 200:
        raise RuntimeError(f"the benchmark review is not admitted: HTTP {status}")
    return response


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfwebhook.bench", description=__doc__)
    parser.add_argument("--requests", type=int, default=2000, help="requests per run")
    parser.add_argument(
        "--rounds", type=int, default=5, help="rounds per concurrency level, each running both servers"
    )
    parser.add_argument("--serve", choices=["webhook", "bare"], help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--cert", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--key", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--body", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _serve(args.serve, args.port, args.cert, args.key, args.body)
        return 0
    sys.stdout.write(json.dumps(run_admission_benchmark(args.requests, rounds=args.rounds), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
