"""A metrics backend that is down never takes a service down (TensorFusion's issue #600): the metrics
service, started as its own process with `TF_OTLP_ENDPOINT` on a closed port, fails to export its
spans and stays ready and serving."""

from __future__ import annotations

import asyncio
import os
import sys
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
from support.scratch_database import scratch_database
from tfcommon.bus import NatsEventBus
from tfcommon.events import GpuUsageReported
from tfcommon.infra import free_port

pytestmark = pytest.mark.integration

DEADLINE_S = 60.0
EXPORT_FAILED = ("while exporting spans batch", "Failed to export spans batch")


@pytest.fixture(scope="module")
def database_url(postgres_server_url: str) -> Iterator[str]:
    with scratch_database(postgres_server_url, "metrics_otlp") as url:
        yield url


async def status_of(url: str) -> int | None:
    async with httpx.AsyncClient(timeout=5) as client:
        try:
            return (await client.get(url)).status_code
        except httpx.TransportError:
            return None


async def test_a_closed_otlp_endpoint_leaves_the_service_ready(
    database_url: str, nats_url: str, tmp_path: Path
) -> None:
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "metrics.log"
    environment = {
        **os.environ,
        "TF_NATS_URL": nats_url,
        "TF_DATABASE_URL": database_url,
        "TF_PORT": str(port),
        "TF_BIND_HOST": "127.0.0.1",
        "TF_OTLP_ENDPOINT": f"http://127.0.0.1:{free_port()}",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2",
    }
    with log_path.open("wb") as log:
        service = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "tfmetrics", env=environment, stdin=asyncio.subprocess.DEVNULL, stderr=log
        )
    try:
        deadline = time.monotonic() + DEADLINE_S
        while await status_of(f"{base_url}/readyz") != 200:
            assert service.returncode is None, log_path.read_text(encoding="utf-8")
            assert time.monotonic() < deadline, "the service never became ready"
            await asyncio.sleep(0.1)

        bus = await NatsEventBus.connect(nats_url, service="test-agent")
        try:
            now = datetime.now(UTC)
            await bus.publish(
                GpuUsageReported(
                    event_id=uuid.uuid4(),
                    occurred_at=now,
                    node="node-x",
                    pool="p",
                    sampled_at=now,
                    interval_ms=1000,
                )
            )
        finally:
            await bus.close()

        deadline = time.monotonic() + DEADLINE_S
        while not any(text in log_path.read_text(encoding="utf-8") for text in EXPORT_FAILED):
            assert await status_of(f"{base_url}/readyz") == 200
            assert time.monotonic() < deadline, "no span export was attempted"
            await asyncio.sleep(0.1)

        assert service.returncode is None
        assert await status_of(f"{base_url}/readyz") == 200
        assert await status_of(f"{base_url}/api/v1/dashboard") == 200
        assert await status_of(f"{base_url}/metrics") == 200
    finally:
        if service.returncode is None:
            service.terminate()
        assert await asyncio.wait_for(service.wait(), DEADLINE_S) == 0
