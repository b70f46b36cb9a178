"""Admission webhook benchmark for `make bench`: HTTPS throughput and latency against a bare endpoint.

`run_admission_benchmark()` starts two HTTPS servers as child processes on loopback, each a single
uvicorn worker with the same TLS certificate: the real admission route (config, core, patch, an
in-memory event bus and pod-index counter; no ledger, since the benchmark pod has no
`enabled-replicas`), served as the runtime serves it (the route ahead of FastAPI), and a bare ASGI
endpoint returning the same AdmissionReview bytes. It then drives both, in the same run and in turn,
with 10 and 100 concurrent keep-alive clients, and returns a dict of requests per second, p50/p99 in
milliseconds and the throughput ratio. `python -m tfwebhook.bench` prints that dict as JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import uvicorn
from starlette.types import ASGIApp
from tfcommon.config import ConfigSource
from tfcommon.events import Message, encode
from tfcommon.runtime import build_app, with_front_routes
from tfcommon.tls import generate_self_signed

from tfwebhook.app import freeze_startup_heap
from tfwebhook.http import AdmissionService, build_router, front_routes
from tfwebhook.testing import a_gpu_container, a_pod, a_review

GOAL_RATIO = 0.7
GOAL_P99_MS_AT_10 = 10.0
START_TIMEOUT_S = 30.0

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
    if kind == "webhook":
        freeze_startup_heap()  # as the service's composition does
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


async def _keep_alive_client(
    host: str, port: int, trust: ssl.SSLContext, request: bytes, count: int, latencies: list[float]
) -> None:
    """One client on one keep-alive connection; a raw HTTP/1.1 loop keeps the load generator light."""
    reader, writer = await asyncio.open_connection(host, port, ssl=trust, server_hostname=host)
    try:
        for _ in range(count):
            started = time.perf_counter()
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            status_line, *header_lines = head.decode("latin-1").split("\r\n")
            length = next(
                int(line.split(":", 1)[1])
                for line in header_lines
                if line.lower().startswith("content-length:")
            )
            await reader.readexactly(length)
            latencies.append(time.perf_counter() - started)
            if " 200 " not in status_line:
                raise RuntimeError(f"{host}:{port}: {status_line}")
    finally:
        writer.close()


async def _drive(
    port: int, trust: ssl.SSLContext, body: bytes, clients: int, requests: int
) -> dict[str, float]:
    host = "127.0.0.1"
    request = (
        f"POST /mutate-v1-pod HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body
    warm: list[float] = []
    await asyncio.gather(*(_keep_alive_client(host, port, trust, request, 2, warm) for _ in range(clients)))
    latencies: list[float] = []
    per_client, extra = divmod(requests, clients)
    started = time.perf_counter()
    await asyncio.gather(
        *(
            _keep_alive_client(host, port, trust, request, per_client + (index < extra), latencies)
            for index in range(clients)
        )
    )
    elapsed = time.perf_counter() - started
    ordered = sorted(latencies)
    return {
        "requests_per_s": round(len(ordered) / elapsed, 1),
        "p50_ms": round(_percentile(ordered, 0.50) * 1000, 2),
        "p99_ms": round(_percentile(ordered, 0.99) * 1000, 2),
    }


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
    requests: int = 2000, concurrency: Sequence[int] = (10, 100), rounds: int = 3
) -> dict[str, Any]:
    """Measure the webhook against a bare uvicorn endpoint returning the same AdmissionReview.

    Each server is driven `rounds` times per concurrency level, alternating; the median run (by
    throughput) is reported, which damps other load on the machine.

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
            for clients in concurrency:
                runs: dict[str, list[dict[str, float]]] = {kind: [] for kind in ports}
                for _ in range(rounds):  # alternate, so both see the same background load
                    for kind, port in ports.items():
                        runs[kind].append(asyncio.run(_drive(port, trust, body, clients, requests)))
                for kind, measured in runs.items():
                    results[kind][f"c{clients}"] = sorted(measured, key=lambda run: run["requests_per_s"])[
                        len(measured) // 2
                    ]
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
    parser.add_argument("--rounds", type=int, default=3, help="runs per server and concurrency level")
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
