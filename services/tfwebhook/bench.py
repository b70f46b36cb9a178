"""Admission webhook benchmark for `make bench`: HTTPS throughput and latency against a bare endpoint,
on the shortcut path and on the path users hit.

`run_admission_benchmark()` starts HTTPS servers as child processes on loopback, each a single uvicorn
worker with the same certificate and the same server settings (`tfcommon.runtime`'s TLS context):

- `cached`, the shortcut path: the admission route alone (config, core, patch; an event bus that
  encodes each event and drops it, pod indexes from an in-process counter, no ledger), sent the same
  review every time, so the verdict cache answers all but the first;
- `varied`, the path users hit (only with a `VariedLoad`): the webhook service itself, as
  `python -m tfwebhook` runs it, on a real ledger (pod indexes from the Postgres sequence) and real
  NATS (`PodAdmitted` published to JetStream), sent a distinct pod every time: a GPU shape drawn from
  the openb trace, its own UID, owner and pod-template hash;
- `bare`: an ASGI endpoint returning a fixed AdmissionReview.

It then drives them with the same client at each client count, in rounds whose short chunks alternate
between the servers, and returns requests per second, p50/p99 in milliseconds, each server's CPU time
per request, and `cached_ratio` / `varied_ratio` (throughput over the bare endpoint's). A `varied`
chunk ends only once JetStream has stored every `PodAdmitted` it caused, and the run fails unless the
stream holds one event per varied admission. `python -m tfwebhook.bench` prints the shortcut path's
figures as JSON (the varied load needs a ledger and NATS: `tfctl bench webhook`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

import nats
import uvicorn
from nats.aio.client import Client as NatsClient
from starlette.types import ASGIApp
from tfcommon import subjects
from tfcommon.config_source import ConfigSource
from tfcommon.events import Message, encode
from tfcommon.placement import PlacementRequest
from tfcommon.runtime import build_app, freeze_startup_heap, server_ssl_context, with_front_routes
from tfcommon.tls import TlsFiles, generate_self_signed

from tfwebhook.http import AdmissionService, build_router, front_routes
from tfwebhook.testing import a_gpu_container, a_pod, a_review

GOAL_CACHED_RATIO = 0.7
GOAL_VARIED_RATIO = 0.6
GOAL_P99_MS_AT_10 = 10.0
START_TIMEOUT_S = 60.0
EVENTS_TIMEOUT_S = 60.0
EVENTS_POLL_S = 0.002
WARM_UP_PER_CLIENT = 5
CHUNK_PER_CLIENT = 5
MIN_CHUNKS = 10
NAMESPACES = 8
MIB = 1024**2
VRAM_MIB_PER_GPU = 80 * 1024
"""VRAM a whole GPU of a trace shape asks for (an 80 GiB card); a share asks for its part of it."""

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class AdmissionBenchmarkError(RuntimeError):
    """The varied load lost work (an admission without its stored `PodAdmitted`), or a server failed."""


@dataclass(frozen=True)
class VariedLoad:
    """The realistic load: the webhook service on the ledger at `database_url` (migrated) and the NATS
    at `nats_url`, sent pods of `shapes` (GPU requests, e.g. the openb trace's) drawn with `seed`."""

    database_url: str
    nats_url: str
    shapes: Sequence[PlacementRequest]
    seed: int = 42


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


def varied_review(shape: PlacementRequest, serial: int, run: str) -> bytes:
    """The review of one pod of `shape`, as a rollout of its own sends it: opted in, its GPU count,
    share (compute percent) and VRAM in annotations, its CPU and memory requests, its own ReplicaSet
    (name and uid), pod-template hash, namespace (one of `NAMESPACES`) and request UID."""
    share = shape.gpu_share or 1000
    template = f"{serial:010x}"
    owner = f"openb-{run}-{serial}"
    namespace = f"team-{serial % NAMESPACES}"
    pod = a_pod(
        labels={"tensor-fusion.ai/enabled": "true", "pod-template-hash": template, "app": owner},
        annotations={
            "tensor-fusion.ai/gpu-count": str(shape.gpu_count),
            "tensor-fusion.ai/compute-percent-request": str(max(1, round(share / 10))),
            "tensor-fusion.ai/vram-request": f"{max(1, share * VRAM_MIB_PER_GPU // 1000)}Mi",
        },
        containers=[
            {
                "name": "main",
                "image": "registry.local/openb/job:1",
                "resources": {
                    "requests": {"cpu": f"{shape.cpu_milli}m", "memory": f"{shape.memory_bytes // MIB}Mi"}
                },
            }
        ],
        namespace=namespace,
        name=None,
        owner=("ReplicaSet", f"{owner}-{template}"),
    )
    pod["metadata"]["ownerReferences"][0]["uid"] = str(uuid4())
    return a_review(pod, uid=f"{run}-{serial}", namespace=namespace)


def webhook_app() -> ASGIApp:
    """The webhook's HTTP app as the service runtime serves it (the admission route ahead of FastAPI),
    without the bus and ledger probes; pod indexes come from an in-process counter."""
    service = AdmissionService(config=ConfigSource(None), bus=_DiscardingBus())
    return with_front_routes(build_app("webhook", [build_router(service)], {}), front_routes(service))


class _DiscardingBus:
    """Encodes each event as a real bus would, then drops it (no NATS on the shortcut path)."""

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
    app: Any = webhook_app() if kind == "cached" else bare_app(body_file.read_bytes())
    freeze_startup_heap()  # as the service's composition does; the bare endpoint too, for fairness
    context = server_ssl_context(TlsFiles(cert_file=cert, key_file=key))
    config = uvicorn.Config(
        app,
        host="127.0.0.1",
        port=port,
        log_config=None,
        access_log=False,
        lifespan="off",
        ssl_context_factory=lambda _config, _default: context,
    )
    uvicorn.Server(config).run()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _bench_server(kind: str, port: int, cert: Path, key: Path, body_file: Path) -> subprocess.Popen[bytes]:
    command = [sys.executable, "-m", "tfwebhook.bench", "--serve", kind, "--port", str(port)]
    command += ["--cert", str(cert), "--key", str(key), "--body", str(body_file)]
    return _listening(kind, port, subprocess.Popen(command, start_new_session=True))


def _webhook_service(
    port: int, cert: Path, key: Path, load: VariedLoad, log: Path
) -> subprocess.Popen[bytes]:
    """`python -m tfwebhook` on `port` with the load's ledger and NATS; its output goes to `log`."""
    environment = {name: value for name, value in os.environ.items() if not name.startswith("TF_")}
    environment.update(
        TF_PORT=str(port),
        TF_BIND_HOST="127.0.0.1",
        TF_DATABASE_URL=load.database_url,
        TF_NATS_URL=load.nats_url,
        TF_TLS_CERT_FILE=str(cert),
        TF_TLS_KEY_FILE=str(key),
        TF_LOG_LEVEL="WARNING",
    )
    with log.open("ab") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "tfwebhook"],
            env=environment,
            cwd=log.parent,
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return _listening("varied", port, process, log)


def _listening(
    kind: str, port: int, process: subprocess.Popen[bytes], log: Path | None = None
) -> subprocess.Popen[bytes]:
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            said = f":\n{log.read_text(errors='replace')[-2000:]}" if log is not None else ""
            raise AdmissionBenchmarkError(
                f"{kind} benchmark server exited with code {process.returncode}{said}"
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return process
        except OSError:
            time.sleep(0.05)
    _stop(process)
    raise AdmissionBenchmarkError(f"{kind} benchmark server did not listen within {START_TIMEOUT_S:.0f}s")


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
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
    requests: Iterator[bytes],
    count: int,
    latencies: list[float],
) -> None:
    """`count` requests in turn on one keep-alive connection, each the next of `requests`; a raw
    HTTP/1.1 loop keeps the load generator light."""
    for _ in range(count):
        request = next(requests)
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
            raise AdmissionBenchmarkError(f"{status_line} from the benchmark server")


class _StoredEvents:
    """`PodAdmitted` events JetStream stored since `start`, counted from the stream's state (one
    request per check, so that counting costs the machine next to nothing while a chunk runs)."""

    def __init__(self, connection: NatsClient) -> None:
        self.jetstream = connection.jetstream()
        self.stored_at_start = 0
        self.confirmed = 0

    async def start(self) -> None:
        self.stored_at_start = await self._in_stream()

    async def wait_for(self, wanted: int, timeout_s: float) -> None:
        """Return once the stream holds `wanted` events more than at `start`."""
        deadline = time.monotonic() + timeout_s
        while self.confirmed < wanted:
            self.confirmed = await self._in_stream() - self.stored_at_start
            if self.confirmed >= wanted:
                return
            if time.monotonic() > deadline:
                raise AdmissionBenchmarkError(
                    f"{wanted - self.confirmed} of {wanted} varied admissions have no PodAdmitted in "
                    f"{subjects.EVENTS_STREAM} {timeout_s:.0f}s after their answers; the figures would "
                    "count lost work"
                )
            await asyncio.sleep(EVENTS_POLL_S)

    async def _in_stream(self) -> int:
        info = await self.jetstream.stream_info(subjects.EVENTS_STREAM, subjects_filter=subjects.POD_ADMITTED)
        return int((info.state.subjects or {}).get(subjects.POD_ADMITTED, 0))


@dataclass
class _Server:
    """One benchmark server as a round drives it: what it is sent, its open connections and what was
    measured so far. `events` is set for the server whose admissions publish `PodAdmitted`."""

    port: int
    pid: int
    requests: Iterator[bytes]
    events: _StoredEvents | None = None
    sent: int = 0
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
    servers: Mapping[str, _Server], trust: ssl.SSLContext, clients: int, requests: int
) -> dict[str, dict[str, float]]:
    """One round: `requests` to each server among `clients` keep-alive connections, in chunks that
    alternate between the servers, so all see the same background load.

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
            await _chunk(server, clients * WARM_UP_PER_CLIENT, [])
        chunk = max(CHUNK_PER_CLIENT * clients, requests // MIN_CHUNKS)
        order = list(servers.values())
        done = 0
        while done < requests:
            size = min(chunk, requests - done)
            for server in order:
                cpu_before = _cpu_seconds(server.pid)
                started = time.perf_counter()
                await _chunk(server, size, server.latencies)
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


async def _chunk(server: _Server, requests: int, latencies: list[float]) -> None:
    """`requests` spread over the server's connections, each connection sending its share in turn;
    for a server that publishes events, until JetStream stored every event of its admissions so far."""
    per_connection, extra = divmod(requests, len(server.connections))
    await asyncio.gather(
        *(
            _exchange(reader, writer, server.requests, per_connection + (index < extra), latencies)
            for index, (reader, writer) in enumerate(server.connections)
        )
    )
    server.sent += requests
    if server.events is not None:
        await server.events.wait_for(server.sent, EVENTS_TIMEOUT_S)


def _framed(host: str, port: int, body: bytes) -> bytes:
    return (
        f"POST /mutate-v1-pod HTTP/1.1\r\nhost: {host}:{port}\r\ncontent-type: application/json\r\n"
        f"content-length: {len(body)}\r\n\r\n"
    ).encode() + body


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


class _VariedBodies:
    """Distinct reviews for the varied load, each pod's shape drawn from the load's shapes."""

    def __init__(self, load: VariedLoad) -> None:
        self.shapes = [shape for shape in load.shapes if shape.gpu_count > 0]
        if not self.shapes:
            raise AdmissionBenchmarkError("the varied load needs at least one GPU shape (gpu_count >= 1)")
        self.random = random.Random(load.seed)
        self.run = uuid4().hex[:8]
        self.serial = 0

    def take(self, count: int) -> list[bytes]:
        bodies = []
        for _ in range(count):
            bodies.append(varied_review(self.random.choice(self.shapes), self.serial, self.run))
            self.serial += 1
        return bodies


def run_admission_benchmark(
    requests: int = 2000,
    concurrency: Sequence[int] = (10, 100),
    rounds: int = 5,
    varied: VariedLoad | None = None,
) -> dict[str, Any]:
    """Measure the webhook, on the shortcut path and (with `varied`) on the path users hit, against a
    bare uvicorn endpoint returning a fixed AdmissionReview.

    Each round sends `requests` requests to each server in chunks that alternate between them (at
    least 5 requests per client a chunk). A round's ratio is a server's throughput over the bare
    endpoint's in that round: both ran under the same background load. Per client count, each
    server's `requests_per_s` comes from its median-ratio round (the upper one for an even count),
    with the bare endpoint's of that same round as `bare_requests_per_s`, so that the ratio is
    theirs; `ratio_per_round` lists every round. `p50_ms` and `p99_ms` are medians over the rounds,
    so one round that a burst of other work on the machine stalled does not decide the tail figure.
    `server_cpu_us_per_request` is each server's CPU time per request (median over the rounds; Linux
    only). The bare endpoint is sent the varied bodies when there are some, else the cached one.

    Returns `{"cached": {"c10": {...}}, "varied": {...}, "bare": {...}, "cached_ratio": {"c10": ...},
    "varied_ratio": {...}, "events": {...}, "goal": {...}, ...}` (`varied`, `varied_ratio` and
    `events` only with `varied`). Raises `AdmissionBenchmarkError` when a varied admission's
    `PodAdmitted` is missing from the stream at the end.
    """
    cached_body = benchmark_review()
    with tempfile.TemporaryDirectory(prefix="tf-bench-") as folder:
        directory = Path(folder)
        cert_pem, key_pem = generate_self_signed(["127.0.0.1"], datetime.now(UTC))
        cert, key = directory / "tls.crt", directory / "tls.key"
        cert.write_bytes(cert_pem)
        key.write_bytes(key_pem)
        body_file = directory / "response.json"
        body_file.write_bytes(_expected_response(cached_body))
        trust = ssl.create_default_context(cafile=str(cert))
        kinds = ["cached", "bare"] + (["varied"] if varied is not None else [])
        ports = {kind: _free_port() for kind in kinds}
        servers: dict[str, subprocess.Popen[bytes]] = {}
        try:
            for kind in kinds:
                servers[kind] = (
                    _webhook_service(ports[kind], cert, key, varied, directory / "webhook.log")
                    if kind == "varied" and varied is not None
                    else _bench_server(kind, ports[kind], cert, key, body_file)
                )
            measured = asyncio.run(
                _measure(servers, ports, trust, cached_body, requests, concurrency, rounds, varied)
            )
        finally:
            for server in servers.values():
                _stop(server)
    return {
        "benchmark": "admission-webhook-https",
        "requests_per_run": requests,
        "rounds": rounds,
        "cpu_count": os.cpu_count(),
        "core_us_per_review": {
            "replica_pod_cached": _core_microseconds(cached_body, cached=True),
            "uncached": _core_microseconds(cached_body, cached=False),
        },
        **measured,
    }


async def _measure(
    servers: Mapping[str, subprocess.Popen[bytes]],
    ports: Mapping[str, int],
    trust: ssl.SSLContext,
    cached_body: bytes,
    requests: int,
    concurrency: Sequence[int],
    rounds: int,
    varied: VariedLoad | None,
) -> dict[str, Any]:
    host = "127.0.0.1"
    bodies = _VariedBodies(varied) if varied is not None else None
    connection = await nats.connect(varied.nats_url) if varied is not None else None
    events = _StoredEvents(connection) if connection is not None else None
    try:
        sent = 0
        if events is not None:
            await events.start()
        runs_by_level: dict[str, list[dict[str, dict[str, float]]]] = {}
        for clients in concurrency:
            runs: list[dict[str, dict[str, float]]] = []
            for round_index in range(rounds):
                order = list(ports) if round_index % 2 == 0 else list(reversed(list(ports)))
                fresh = bodies.take(clients * WARM_UP_PER_CLIENT + requests) if bodies is not None else []
                driven = {}
                for kind in order:
                    port = ports[kind]
                    feed: Iterator[bytes]
                    if kind == "cached" or not fresh:
                        feed = _forever(_framed(host, port, cached_body))
                    else:
                        feed = iter([_framed(host, port, body) for body in fresh])
                    driven[kind] = _Server(
                        port, servers[kind].pid, feed, events=events if kind == "varied" else None, sent=sent
                    )
                runs.append(await _round(driven, trust, clients, requests))
                sent = driven["varied"].sent if "varied" in driven else 0
            runs_by_level[f"c{clients}"] = runs
        result = _summarize(runs_by_level, list(ports), rounds)
        if events is not None:
            await events.wait_for(sent, EVENTS_TIMEOUT_S)
            result["events"] = {"varied_admissions": sent, "pod_admitted_stored": events.confirmed}
        return result
    finally:
        if connection is not None:
            await connection.close()


def _forever(request: bytes) -> Iterator[bytes]:
    while True:
        yield request


def _summarize(
    runs_by_level: Mapping[str, list[dict[str, dict[str, float]]]], kinds: Sequence[str], rounds: int
) -> dict[str, Any]:
    result: dict[str, Any] = {kind: {} for kind in kinds}
    served = [kind for kind in kinds if kind != "bare"]
    ratio_per_round: dict[str, dict[str, list[float]]] = {kind: {} for kind in served}
    server_cpu: dict[str, dict[str, float]] = {}
    for level, runs in runs_by_level.items():
        for kind in kinds:
            result[kind][level] = {
                "requests_per_s": round(statistics.median(run[kind]["requests_per_s"] for run in runs), 1),
                "p50_ms": round(statistics.median(run[kind]["p50_ms"] for run in runs), 2),
                "p99_ms": round(statistics.median(run[kind]["p99_ms"] for run in runs), 2),
            }
        for kind in served:
            round_ratios = [run[kind]["requests_per_s"] / run["bare"]["requests_per_s"] for run in runs]
            median_round = runs[sorted(range(rounds), key=round_ratios.__getitem__)[rounds // 2]]
            result[kind][level]["requests_per_s"] = median_round[kind]["requests_per_s"]
            result[kind][level]["bare_requests_per_s"] = median_round["bare"]["requests_per_s"]
            ratio_per_round[kind][level] = [round(ratio, 3) for ratio in round_ratios]
        cpu = {
            kind: [run[kind]["server_cpu_us_per_request"] for run in runs]
            for kind in kinds
            if all("server_cpu_us_per_request" in run[kind] for run in runs)
        }
        if cpu:
            server_cpu[level] = {kind: sorted(values)[rounds // 2] for kind, values in cpu.items()}
    ratios = {
        f"{kind}_ratio": {
            level: round(measured["requests_per_s"] / measured["bare_requests_per_s"], 3)
            for level, measured in result[kind].items()
        }
        for kind in served
    }
    p99_at_10 = result["cached"].get("c10", {}).get("p99_ms")
    goals = {"cached_ratio": GOAL_CACHED_RATIO, "varied_ratio": GOAL_VARIED_RATIO}
    return {
        **result,
        **ratios,
        "ratio_per_round": ratio_per_round,
        "server_cpu_us_per_request": server_cpu,
        "goal": {
            "cached_ratio_at_least": GOAL_CACHED_RATIO,
            "varied_ratio_at_least": GOAL_VARIED_RATIO,
            "p99_ms_at_10_below": GOAL_P99_MS_AT_10,
            "met": all(
                value >= goals[name] for name, by_level in ratios.items() for value in by_level.values()
            )
            and (p99_at_10 is None or p99_at_10 < GOAL_P99_MS_AT_10),
        },
    }


def _expected_response(review: bytes) -> bytes:
    service = AdmissionService(config=ConfigSource(None))
    status, response = asyncio.run(service.review(review))
    if status != 200:
        raise AdmissionBenchmarkError(f"the benchmark review is not admitted: HTTP {status}")
    return response


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tfwebhook.bench", description=__doc__)
    parser.add_argument("--requests", type=int, default=2000, help="requests per run")
    parser.add_argument(
        "--rounds", type=int, default=5, help="rounds per concurrency level, each running every server"
    )
    parser.add_argument("--serve", choices=["cached", "bare"], help=argparse.SUPPRESS)
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
