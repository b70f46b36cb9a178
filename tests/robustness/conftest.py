"""Fixtures for the robustness suite: every service running in-process on a NATS server of its own and a
fresh migrated ledger, so poison messages and fuzzed requests cannot disturb (or be disturbed by) other
suites' durable consumers."""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from robust_stack import RunningStack, service_specs
from support.nats_servers import embedded_nats
from support.scratch_database import scratch_database
from support.serving import service_url, wait_until_ready
from tfcommon.runtime import serve


@pytest.fixture(scope="module")
def robust_database_url(postgres_server_url: str) -> Iterator[str]:
    with scratch_database(postgres_server_url, "robust") as url:
        yield url


@pytest.fixture(scope="module")
def robust_nats_url() -> Iterator[str]:
    with embedded_nats(prefix="tfpool-robust-nats-") as server:
        yield server.url


@pytest.fixture(scope="module")
async def stack(robust_nats_url: str, robust_database_url: str) -> AsyncIterator[RunningStack]:
    state_dir = Path(tempfile.mkdtemp(prefix="tfpool-robust-state-"))
    specs = service_specs(robust_nats_url, robust_database_url, state_dir)
    stop = asyncio.Event()
    services = {name: asyncio.create_task(serve(spec, stop=stop)) for name, spec in specs.items()}
    try:
        for name, spec in specs.items():
            await wait_until_ready(service_url(spec), services[name])
        yield RunningStack(
            nats_url=robust_nats_url,
            database_url=robust_database_url,
            urls={name: service_url(spec) for name, spec in specs.items()},
            webhook_certificate=state_dir / "certs" / "tls.crt",
        )
        stopped = sorted(name for name, task in services.items() if task.done())
        assert not stopped, f"services stopped during the suite: {stopped}"
    finally:
        stop.set()
        _, stuck = await asyncio.wait(services.values(), timeout=30)
        shutil.rmtree(state_dir, ignore_errors=True)
        assert not stuck, "services did not stop within 30 s"
