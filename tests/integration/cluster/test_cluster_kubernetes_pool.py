"""`KubernetesCluster` keeps one connection alive per worker thread: rounds of concurrent calls reuse
them instead of opening (and handshaking) new ones, counted by a real HTTP server."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from tfcommon.cluster.kubernetes import KubernetesCluster

pytestmark = pytest.mark.integration

THREADS, ROUNDS = 16, 4


class _CountingServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _SlowPod)
        self.connections = 0
        self.lock = threading.Lock()

    def process_request(self, request: object, client_address: object) -> None:
        with self.lock:
            self.connections += 1
        super().process_request(request, client_address)  # type: ignore[arg-type]


class _SlowPod(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_GET(self) -> None:
        time.sleep(0.05)  # long enough for every thread's call to be in flight at once
        name = self.path.rsplit("/", 1)[-1]
        body = json.dumps(
            {"kind": "Pod", "metadata": {"name": name, "namespace": "default", "uid": name}, "spec": {}}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        return


@pytest.fixture
def server() -> Iterator[_CountingServer]:
    counting = _CountingServer()
    thread = threading.Thread(target=counting.serve_forever, daemon=True)
    thread.start()
    try:
        yield counting
    finally:
        counting.shutdown()
        counting.server_close()


async def test_concurrent_calls_reuse_one_connection_per_worker_thread(server: _CountingServer) -> None:
    cluster = KubernetesCluster.for_url(
        f"http://127.0.0.1:{server.server_address[1]}", max_concurrent_requests=THREADS
    )
    try:
        for round_number in range(ROUNDS):
            pods = await asyncio.gather(
                *(cluster.get_pod("default", f"p-{round_number}-{n}") for n in range(THREADS))
            )
            assert all(pod is not None for pod in pods)
    finally:
        cluster.close()

    assert server.connections <= THREADS
