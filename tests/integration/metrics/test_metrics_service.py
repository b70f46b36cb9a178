"""The metrics service against real NATS JetStream and a real Postgres ledger: bills from the history,
the `/metrics` exposition parsed with Prometheus' parser, usage from the agents, and the dashboard data."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from support.clocks import SteppedClock
from support.polling import eventually
from support.scratch_database import scratch_database
from support.serving import serving
from tfcommon.bus import NatsEventBus
from tfcommon.events import GpuUsage, GpuUsageReported, WorkloadRef
from tfcommon.infra import free_port
from tfcommon.ledger.records import GpuSpec, NodeSpec, ReservationRequest, Reserved, ShareRequest
from tfcommon.ledger.sql import SqlLedger
from tfcommon.settings import DatabaseSettings, MetricsSettings, NatsSettings
from tfctl.main import main as tfctl_main
from tfmetrics.app import build

pytestmark = pytest.mark.integration

GIB = 1024**3
T0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)
HOUR = timedelta(hours=1)

CONFIG = """
gpuPools:
  - name: training
    isDefault: true
    specTemplate:
      qosConfig:
        evictionProtectionPriceRatio: "1.2"
        pricing:
          - qos: medium
            requests: {perFP16TFlopsPerHour: "$0.01", perGBOfVRAMPerHour: "$0.02"}
            limitsOverRequests: "0.5"
        pricingHistory:
          - effectiveUntil: "2026-01-05T09:00:00Z"
            pricing:
              - qos: medium
                requests: {perFP16TFlopsPerHour: "$0.005", perGBOfVRAMPerHour: "$0.01"}
                limitsOverRequests: "0.5"
"""


@pytest.fixture(scope="module")
def database_url(postgres_server_url: str) -> Iterator[str]:
    with scratch_database(postgres_server_url, "metrics") as url:
        yield url


async def a_workload_held(
    ledger: SqlLedger, clock: SteppedClock, node: str, gpus: list[str], *, namespace: str, pod: str
) -> None:
    """Reserve 10 TFLOPS / 8 GiB (limits 20 / 16) on each GPU at T0, commit, release at T0 + 2h."""
    clock.now = T0
    result = await ledger.reserve(
        ReservationRequest(
            allocation_id=uuid.uuid4(),
            workload=WorkloadRef(namespace=namespace, name=pod, uid=str(uuid.uuid4()), workload="trainer"),
            pool="training",
            node=node,
            shares=tuple(
                ShareRequest(gpu, 10_000, 8 * GIB, limit_tflops_milli=20_000, limit_vram_bytes=16 * GIB)
                for gpu in gpus
            ),
        )
    )
    assert isinstance(result, Reserved)
    await ledger.commit(result.allocation.allocation_id)
    clock.now = T0 + 2 * HOUR
    assert await ledger.release(result.allocation.allocation_id, "pod-deleted")


@pytest.fixture(scope="module")
async def stack(
    database_url: str, nats_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[dict[str, Any]]:
    clock = SteppedClock(T0)
    ledger = SqlLedger.create(database_url, clock=clock)
    node = f"node-{uuid.uuid4().hex[:6]}"
    await ledger.upsert_node(NodeSpec(name=node, pool="training"))
    gpus = [f"gpu-{uuid.uuid4()}" for _ in range(3)]
    for index, gpu in enumerate(gpus):
        await ledger.upsert_gpu(GpuSpec(gpu, node, index, "H100", "nvidia", 100_000, 80 * GIB))
    await a_workload_held(ledger, clock, node, gpus[:2], namespace="team-a", pod="trainer-0")
    await a_workload_held(ledger, clock, node, gpus[2:], namespace="team-b", pod="server-0")
    clock.now = datetime.now(UTC)
    live = await ledger.reserve(
        ReservationRequest(
            allocation_id=uuid.uuid4(),
            workload=WorkloadRef(namespace="team-c", name="live-0", workload="live"),
            pool="training",
            node=node,
            shares=(ShareRequest(gpus[0], 30_000, 40 * GIB),),
        )
    )
    assert isinstance(live, Reserved)
    config_file: Path = tmp_path_factory.mktemp("metrics") / "config.yaml"
    await asyncio.to_thread(config_file.write_text, CONFIG, encoding="utf-8")
    settings = MetricsSettings(
        nats=NatsSettings(url=nats_url),
        database=DatabaseSettings(url=database_url),
        config_file=config_file,
        port=free_port(),
        bind_host="127.0.0.1",
        gpu_cost_per_hour={"H100": Decimal("3.00")},
        refresh_interval_s=0.2,
    )
    try:
        async with serving(build(settings)) as served:
            yield {"url": served.url, "node": node, "gpus": gpus, "nats_url": nats_url}
    finally:
        await ledger.close()


async def get(url: str, **params: str) -> httpx.Response:
    async with httpx.AsyncClient(timeout=10) as client:
        return await client.get(url, params=params)


async def test_the_bill_from_the_ledger_history_is_exact_with_a_price_change(stack: dict[str, Any]) -> None:
    response = await get(
        f"{stack['url']}/api/v1/billing",
        **{"from": "2026-01-05T00:00:00Z", "to": "2026-01-06T00:00:00Z", "groupBy": "namespace"},
    )
    assert response.status_code == 200, response.text
    bill = response.json()
    # Per GPU: 0.195/h in the first hour (old prices), 0.39/h in the second. team-a holds 2 GPUs.
    assert [(group["key"], group["cost"], group["shares"]) for group in bill["groups"]] == [
        ("team-a", "1.17", 2),
        ("team-b", "0.59", 1),
    ]
    assert bill["cost"] == "1.76"
    # Dedicated: 3 GPU-shares x 2 h x 3.00 = 18.00
    assert (bill["dedicatedCost"], bill["savings"]) == ("18.00", "16.24")


async def test_bad_billing_queries_get_a_400_naming_the_parameter(stack: dict[str, Any]) -> None:
    response = await get(f"{stack['url']}/api/v1/billing", **{"from": "yesterday"})
    assert response.status_code == 400
    assert response.json()["error"].startswith("from: 'yesterday' is not a time")
    response = await get(f"{stack['url']}/api/v1/billing", groupBy="team")
    assert response.status_code == 400
    assert "groupBy: 'team' is not one of namespace, workload, pod, qos, pool" in response.json()["error"]


async def metric_families(url: str) -> dict[str, Any]:
    text = (await get(f"{url}/metrics")).text
    return {family.name: family for family in text_string_to_metric_families(text)}


async def test_metrics_expose_gpu_pool_and_fragmentation_series(stack: dict[str, Any]) -> None:
    async def with_allocation() -> dict[str, Any] | None:
        families = await metric_families(stack["url"])
        family = families.get("tf_gpu_allocated_tflops")
        if family is None:
            return None
        values = {sample.labels["gpu"]: sample.value for sample in family.samples}
        return families if values.get(stack["gpus"][0]) == 30.0 else None

    families = await eventually(with_allocation)

    def pool_value(name: str) -> list[float]:
        return [sample.value for sample in families[name].samples if sample.labels["pool"] == "training"]

    assert pool_value("tf_pool_whole_idle_gpus") == [2.0]
    assert pool_value("tf_pool_allocated_tflops_percent") == [10.0]
    assert pool_value("tf_pool_largest_fit_tflops") == [100.0]
    # gpu-0 has 70 TFLOPS but 40 GiB free: at 100:80, 50 TFLOPS usable, 20 stranded.
    assert pool_value("tf_pool_stranded_tflops") == [20.0]
    assert pool_value("tf_pool_stranded_vram_bytes") == [0.0]
    # The running mix is one class (a half GPU): the other GPUs fit it, gpu-0's free half does too.
    assert pool_value("tf_pool_fragmentation_rate") == [0.0]
    workers = families["tf_worker_tflops_request"].samples
    assert [(s.labels["namespace"], s.value) for s in workers] == [("team-c", 30.0)]


async def test_agent_usage_reports_become_usage_series(stack: dict[str, Any]) -> None:
    bus = await NatsEventBus.connect(stack["nats_url"], service="test-agent")
    try:
        await bus.publish(
            GpuUsageReported(
                event_id=uuid.uuid4(),
                occurred_at=datetime.now(UTC),
                node=stack["node"],
                pool="training",
                sampled_at=datetime.now(UTC),
                interval_ms=60_000,
                gpus=(
                    GpuUsage(
                        uuid=stack["gpus"][1],
                        compute_percentage=42.5,
                        compute_tflops_milli=42_500,
                        memory_bytes=8 * GIB,
                        memory_percentage=10.0,
                        temperature=61,
                        power_usage=300,
                        rx=0,
                        tx=0,
                    ),
                ),
            )
        )
    finally:
        await bus.close()

    async def temperature() -> float | None:
        family = (await metric_families(stack["url"])).get("tf_gpu_usage_temperature")
        samples = [s.value for s in family.samples if s.labels["uuid"] == stack["gpus"][1]] if family else []
        return samples[0] if samples else None

    assert await eventually(temperature) == 61.0


async def test_the_dashboard_serves_its_page_and_the_gpu_grid(stack: dict[str, Any]) -> None:
    page = await get(f"{stack['url']}/")
    assert page.status_code == 200
    assert "<title>tfpool dashboard</title>" in page.text
    assert "http://" not in page.text  # no CDN: the page works offline
    assert "https://" not in page.text
    view = (await get(f"{stack['url']}/api/v1/dashboard")).json()
    [node] = [node for node in view["nodes"] if node["name"] == stack["node"]]
    first_gpu = node["gpus"][0]
    assert first_gpu["segments"] == [
        {
            "workload": "team-c/live",
            "pod": "live-0",
            "qos": "medium",
            "tflopsPercent": 30.0,
            "vramPercent": 50.0,
        }
    ]
    assert [pool["name"] for pool in view["pools"]] == ["training"]
    assert view["billing"]["groups"][0]["key"] == "team-c"


async def test_tfctl_billing_prints_the_bill_as_csv_and_a_table(
    stack: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    period = ["--from", "2026-01-05", "--to", "2026-01-06", "--url", stack["url"]]
    assert await asyncio.to_thread(tfctl_main, ["billing", *period, "--group-by", "pod", "--csv"]) == 0
    assert capsys.readouterr().out == (
        "pod,cost,dedicated_cost,savings,gpu_hours,shares\n"
        "team-a/trainer-0,1.17,12.00,10.83,4.0000,2\n"
        "team-b/server-0,0.59,6.00,5.41,2.0000,1\n"
        "TOTAL,1.76,18.00,16.24,,\n"
    )
    assert await asyncio.to_thread(tfctl_main, ["billing", *period]) == 0
    table = capsys.readouterr().out
    assert "NAMESPACE  COST  DEDICATED  SAVINGS  GPU-HOURS  SHARES" in table
    assert "TOTAL      1.76  18.00      16.24" in table
    assert await asyncio.to_thread(tfctl_main, ["billing", *period, "--json"]) == 0
    exact = json.loads(capsys.readouterr().out)
    # The table is in cents; --json keeps the exact amounts (team-b: 0.195 + 0.39 for its one GPU).
    assert exact["quantum"] == "0.000001"
    assert [(group["key"], group["cost"]) for group in exact["groups"]] == [
        ("team-a", "1.170000"),
        ("team-b", "0.585000"),
    ]
    assert (exact["dedicatedCost"], exact["savings"], exact["savingsUnknownReason"]) == (
        "18.000000",
        "16.245000",
        None,
    )


async def test_tfctl_billing_reports_a_bad_period_with_exit_code_2(
    stack: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["billing", "--from", "2026-01-06", "--to", "2026-01-05", "--url", stack["url"]]
    assert await asyncio.to_thread(tfctl_main, argv) == 2
    assert "to: 2026-01-05T00:00:00+00:00 must be after from" in capsys.readouterr().err
