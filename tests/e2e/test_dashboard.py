"""The dashboard in a real headless Chromium: it shows the simulated GPUs and updates on its own after
a workload is placed. The metrics service runs on real NATS JetStream and a real Postgres ledger; the
ledger is filled the way the node agent and the scheduler fill it. A screenshot is saved under
test-artifacts/.

Needs Debian's chromium at /usr/bin/chromium (`apt-get install -y chromium`; `make test` installs it)
and the playwright Python package (no browser download: the system Chromium is launched).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from pathlib import Path

import httpx
import psycopg
import pytest
from playwright.async_api import BrowserContext, Page, async_playwright
from sqlalchemy.engine import make_url
from tfcommon.events import WorkloadRef
from tfcommon.infra import free_port
from tfcommon.ledger.migrate import upgrade_head
from tfcommon.ledger.records import GpuSpec, NodeSpec, ReservationRequest, Reserved, ShareRequest
from tfcommon.ledger.sql import SqlLedger
from tfcommon.runtime import serve
from tfcommon.settings import DatabaseSettings, MetricsSettings, NatsSettings
from tfmetrics.app import build

pytestmark = pytest.mark.e2e

CHROMIUM = Path("/usr/bin/chromium")
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
GIB = 1024**3


def _conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture
def database_url(postgres_server_url: str) -> Iterator[str]:
    name = f"dashboard_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(_conninfo(postgres_server_url), autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    url = make_url(postgres_server_url).set(database=name).render_as_string(hide_password=False)
    upgrade_head(url)
    try:
        yield url
    finally:
        with psycopg.connect(_conninfo(postgres_server_url), autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def browser(tmp_path: Path) -> AsyncIterator[BrowserContext]:
    assert await asyncio.to_thread(CHROMIUM.exists), (
        "install Debian's chromium: apt-get install -y chromium (make test does)"
    )
    async with async_playwright() as playwright:
        context = await playwright.chromium.launch_persistent_context(
            user_data_dir=str(tmp_path / "chromium-profile"),
            executable_path=str(CHROMIUM),
            headless=True,
            args=CHROMIUM_FLAGS,
        )
        try:
            yield context
        finally:
            await context.close()


async def wait_until_ready(base_url: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    async with httpx.AsyncClient(timeout=5) as client:
        while time.monotonic() < deadline:
            try:
                if (await client.get(f"{base_url}/readyz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await asyncio.sleep(0.1)
    pytest.fail(f"metrics service at {base_url} not ready within {timeout_s}s")


async def simulated_node(ledger: SqlLedger) -> tuple[str, list[str]]:
    """What the node agent registers for `--fake-gpus H100:4` (simulated GPUs)."""
    node = f"sim-{uuid.uuid4().hex[:6]}"
    await ledger.upsert_node(NodeSpec(name=node, pool="default"))
    gpus = [f"gpu-{uuid.uuid4()}" for _ in range(4)]
    for index, gpu in enumerate(gpus):
        await ledger.upsert_gpu(GpuSpec(gpu, node, index, "H100", "nvidia", 989_400, 80 * GIB))
    return node, gpus


async def test_the_dashboard_shows_the_gpus_and_updates_after_a_workload_is_placed(
    database_url: str, nats_url: str, browser: BrowserContext
) -> None:
    ledger = SqlLedger.create(database_url)
    node, gpus = await simulated_node(ledger)
    settings = MetricsSettings(
        nats=NatsSettings(url=nats_url),
        database=DatabaseSettings(url=database_url),
        port=free_port(),
        bind_host="127.0.0.1",
        refresh_interval_s=0.5,
        gpu_cost_per_hour={"H100": Decimal("2.49")},
    )
    stop = asyncio.Event()
    service = asyncio.create_task(serve(build(settings), stop=stop))
    base_url = f"http://127.0.0.1:{settings.port}"
    try:
        await wait_until_ready(base_url)
        page: Page = await browser.new_page()
        await page.goto(f"{base_url}/")
        await page.wait_for_selector(f'[data-node="{node}"]', timeout=15_000)
        assert await page.locator(f'[data-node="{node}"] .gpu').count() == 4
        assert await page.locator(".segment").count() == 0

        placed = await ledger.reserve(
            ReservationRequest(
                allocation_id=uuid.uuid4(),
                workload=WorkloadRef(namespace="team-a", name="trainer-0", workload="trainer"),
                pool="default",
                node=node,
                shares=(ShareRequest(gpus[1], 494_700, 20 * GIB),),
            )
        )
        assert isinstance(placed, Reserved)
        segment = page.locator(f'[data-gpu="{gpus[1]}"] .segment[data-workload="team-a/trainer"]')
        await segment.wait_for(timeout=15_000)
        assert await segment.get_attribute("style") is not None
        assert "50%" in (await segment.get_attribute("style") or "")
        await page.locator("#allocations tbody tr").first.wait_for(timeout=15_000)
        assert await page.locator("#allocations tbody tr").count() == 1
        assert "3 whole idle" in await page.locator('[data-pool="default"]').inner_text()
        await page.locator("#billing-groups td", has_text="team-a").wait_for(timeout=15_000)
        assert "vs dedicated GPUs $" in await page.locator("#billing-total").inner_text()
        assert await page.locator("#status.error").count() == 0, await page.locator("#status").inner_text()
        ARTIFACTS.mkdir(exist_ok=True)
        await page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
    finally:
        stop.set()
        await asyncio.wait({service}, timeout=30)
        await ledger.close()
