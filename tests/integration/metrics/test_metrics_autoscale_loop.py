"""Autoscaling recommendations and the eviction-protection surcharge against real NATS JetStream and a real
Postgres ledger: agents' usage -> the metrics service's recommendation in the ledger -> `GET
/api/v1/recommendations` and `tfctl recommendations` -> the webhook admitting a new pod with it; and a
bill from the ledger charging `evictionProtectionPriceRatio` while the recorded protection lasts."""

from __future__ import annotations

import asyncio
import base64
import json
import re
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from support.clocks import SteppedClock
from support.polling import eventually
from support.scratch_database import libpq_conninfo, scratch_database
from support.serving import serving
from tfcommon import subjects
from tfcommon.bus import NatsEventBus
from tfcommon.config import parse_config
from tfcommon.config_source import ConfigSource
from tfcommon.events import GpuUsageReported, WorkerUsage, WorkloadRef
from tfcommon.infra import free_port
from tfcommon.ledger.recommendations import RecommendationCache, RecommendationStore
from tfcommon.ledger.records import GpuSpec, NodeSpec, QoS, ReservationRequest, Reserved, ShareRequest
from tfcommon.ledger.sql import SqlLedger
from tfcommon.ledger.urls import ledger_url
from tfcommon.recommendations import Recommendation
from tfcommon.settings import DatabaseSettings, MetricsSettings, NatsSettings
from tfctl.main import main as tfctl_main
from tfmetrics.app import build
from tfmetrics.billing_api import bill_from_ledger
from tfwebhook.http import AdmissionService
from tfwebhook.testing import a_pod, a_review, opted_in

pytestmark = pytest.mark.integration

MIB = 1024**2
GIB = 1024**3
T0 = datetime(2026, 1, 5, 8, 0, tzinfo=UTC)

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
          - qos: high
            requests: {perFP16TFlopsPerHour: "$0.01", perGBOfVRAMPerHour: "$0.02"}
            limitsOverRequests: "0.5"
"""


def a_database(postgres_server_url: str) -> Iterator[str]:
    with scratch_database(postgres_server_url, "metrics_rec") as url:
        yield url


@pytest.fixture(scope="module")
def database_url(postgres_server_url: str) -> Iterator[str]:
    """The ledger the metrics service of `stack` runs on."""
    yield from a_database(postgres_server_url)


@pytest.fixture
def quiet_database_url(postgres_server_url: str) -> Iterator[str]:
    """A ledger no service writes to."""
    yield from a_database(postgres_server_url)


def holding(
    namespace: str, workload: str, gpu: str, qos: QoS, node: str = "node-rec", **extra: Any
) -> ReservationRequest:
    """20 TFLOPS / 4 GiB, limits 40 TFLOPS / 8 GiB, on one GPU."""
    return ReservationRequest(
        allocation_id=uuid.uuid4(),
        workload=WorkloadRef(namespace=namespace, name=f"{workload}-0", workload=workload),
        pool="training",
        node=node,
        shares=(ShareRequest(gpu, 20_000, 4 * GIB, limit_tflops_milli=40_000, limit_vram_bytes=8 * GIB),),
        qos=qos,
        **extra,
    )


@pytest.fixture(scope="module")
async def stack(
    database_url: str, nats_url: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[dict[str, Any]]:
    clock = SteppedClock(datetime.now(UTC))
    ledger = SqlLedger.create(database_url, clock=clock)
    await ledger.upsert_node(NodeSpec(name="node-rec", pool="training"))
    gpus = [f"gpu-{uuid.uuid4()}" for _ in range(3)]
    for index, gpu in enumerate(gpus):
        await ledger.upsert_gpu(GpuSpec(gpu, "node-rec", index, "H100", "nvidia", 100_000, 80 * GIB))
    for request in (
        holding("ml-team-a", "trainer", gpus[0], "high"),
        holding("ml-team-b", "server", gpus[1], "medium"),
    ):
        assert isinstance(await ledger.reserve(request), Reserved)
    config_file: Path = tmp_path_factory.mktemp("metrics-rec") / "config.yaml"
    await asyncio.to_thread(config_file.write_text, CONFIG, encoding="utf-8")
    settings = MetricsSettings(
        nats=NatsSettings(url=nats_url),
        database=DatabaseSettings(url=database_url),
        config_file=config_file,
        port=free_port(),
        bind_host="127.0.0.1",
        refresh_interval_s=0.2,
        recommendation_interval_s=0.2,
        recommendation_min_samples=5,
    )
    try:
        async with serving(build(settings)) as served:
            yield {
                "url": served.url,
                "gpus": gpus,
                "nats_url": nats_url,
                "ledger": ledger,
                "clock": clock,
                "config_file": config_file,
                "database_url": database_url,
            }
    finally:
        await ledger.close()


async def report_usage(
    nats_url: str,
    gpu: str,
    count: int,
    *,
    node: str = "node-rec",
    workload: tuple[str, str] = ("ml-team-a", "trainer"),
    usage: Callable[[int], tuple[int, int]] = lambda i: (i * 1000, i * 256 * MIB),
) -> None:
    """`count` reports of `node`, a second apart, of `workload` (namespace, name) using `usage(i)`
    (milli-TFLOPS, bytes) for i = 1..count; by default ml-team-a/trainer using i TFLOPS and i x 256 MiB."""
    namespace, name = workload
    bus = await NatsEventBus.connect(nats_url, service="test-agent")
    start = datetime.now(UTC) - timedelta(seconds=count + 1)
    try:
        for i in range(1, count + 1):
            moment = start + timedelta(seconds=i)
            tflops_milli, memory_bytes = usage(i)
            await bus.publish(
                GpuUsageReported(
                    event_id=uuid.uuid4(),
                    occurred_at=moment,
                    node=node,
                    pool="training",
                    sampled_at=moment,
                    interval_ms=1000,
                    workers=(
                        WorkerUsage(
                            uuid=gpu,
                            namespace=namespace,
                            pod_name=f"{name}-0",
                            workload=name,
                            worker=f"{name}-0",
                            compute_percentage=float(i),
                            compute_tflops_milli=tflops_milli,
                            memory_bytes=memory_bytes,
                            memory_percentage=float(i),
                        ),
                    ),
                )
            )
    finally:
        await bus.close()


async def recommendations(url: str) -> dict[str, dict[str, Any]]:
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(f"{url}/api/v1/recommendations")
    assert response.status_code == 200, response.text
    return {item["workload"]: item for item in response.json()["recommendations"]}


async def test_usage_becomes_a_recommendation_that_tfctl_shows_and_the_webhook_applies(
    stack: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    await report_usage(stack["nats_url"], stack["gpus"][0], 10)

    async def trainer_recommended() -> dict[str, dict[str, Any]] | None:
        items = await recommendations(stack["url"])
        trainer = items.get("ml-team-a/trainer")
        return items if trainer is not None and trainer["sampleCount"] == 10 else None

    items = await eventually(trainer_recommended)
    trainer = items["ml-team-a/trainer"]
    # high QoS gets the target: p90 of 1..10 is 9 TFLOPS and 2304 MiB, plus 15%; limits keep the 2x ratio.
    vram_request = -(-2304 * MIB * 115 // 100)
    assert trainer["sufficient"] is True
    assert trainer["recommended"] == {
        "tflopsRequestMilli": 10_350,
        "tflopsLimitMilli": 20_700,
        "vramRequestBytes": vram_request,
        "vramLimitBytes": 2 * vram_request,
    }
    assert trainer["current"] == {
        "tflopsRequestMilli": 20_000,
        "tflopsLimitMilli": 40_000,
        "vramRequestBytes": 4 * GIB,
        "vramLimitBytes": 8 * GIB,
    }
    # Now 0.42/h (20 x 0.01 + 4 x 0.02, plus half of that above the requests); recommended 0.232875/h.
    assert trainer["expectedSavingPerHour"] == "0.187125"
    assert "high QoS gets the target: p90 of 10 samples in the last 1d plus 15%" in trainer["reason"]
    server = items["ml-team-b/server"]
    assert (server["sufficient"], server["sampleCount"]) == (False, 0)
    assert server["reason"] == "too few samples: 0 in the last 1d, 5 needed; keeping the current values"
    assert server["recommended"] == server["current"]

    assert await asyncio.to_thread(tfctl_main, ["recommendations", "--url", stack["url"]]) == 0
    table = capsys.readouterr().out.splitlines()
    assert re.split(r"\s{2,}", table[0]) == [
        *(
            "WORKLOAD",
            "QOS",
            "GPUS",
            "TFLOPS NOW",
            "TFLOPS REC",
            "VRAM GiB NOW",
            "VRAM GiB REC",
            "SAMPLES",
            "SAVING/H",
        )
    ]
    # One unit per column: TFLOPS in TFLOPS (10350m is 10.35), VRAM in GiB (2649.6 MiB is 2.59).
    assert table[1].split() == [
        "ml-team-a/trainer",
        "high",
        "1",
        "20/40",
        "10.35/20.7",
        "4/8",
        "2.59/5.18",
        "10",
        "0.187125",
    ]
    assert table[2].split() == ["ml-team-b/server", "medium", "1", "20/40", "-", "4/8", "-", "0", "-"]
    assert table[3] == "TFLOPS and VRAM are per GPU, request/limit"
    assert any(line.startswith("ml-team-b/server: too few samples: 0 in the last 1d") for line in table)
    assert await asyncio.to_thread(tfctl_main, ["recommendations", "--json", "--url", stack["url"]]) == 0
    assert json.loads(capsys.readouterr().out)["recommendations"][0]["workload"] == "ml-team-a/trainer"
    assert await asyncio.to_thread(tfctl_main, ["get", "recommendations", "--metrics-url", stack["url"]]) == 0
    assert capsys.readouterr().out.splitlines() == table

    engine = create_async_engine(ledger_url(stack["database_url"]))
    try:
        cache = RecommendationCache(RecommendationStore(engine))
        await cache.refresh()
        service = AdmissionService(
            config=ConfigSource(stack["config_file"]), recommendations=cache.current, verdict_cache_size=0
        )
        pod = a_pod(
            labels={"tensor-fusion.ai/enabled": "true"},
            annotations=opted_in(
                autoscale="true",
                qos="high",
                tflops_request="20",
                tflops_limit="40",
                vram_request="4Gi",
                vram_limit="8Gi",
            ),
        )
        status, body = await service.review(a_review(pod))
    finally:
        await engine.dispose()
    assert status == 200
    patch = json.loads(base64.b64decode(json.loads(body)["response"]["patch"]))
    annotations = jsonpatch.apply_patch(pod, patch)["metadata"]["annotations"]
    assert (annotations["tensor-fusion.ai/tflops-request"], annotations["tensor-fusion.ai/tflops-limit"]) == (
        "10350m",
        "20700m",
    )
    assert annotations["tensor-fusion.ai/vram-request"] != "4Gi"
    assert "on 10 samples applied" in annotations["tensor-fusion.ai/autoscale-source"]


async def test_a_recommendation_never_exceeds_the_card_and_is_forgotten_with_its_workload(
    stack: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    ledger: SqlLedger = stack["ledger"]
    node, gpu = "node-rec-h100", f"gpu-{uuid.uuid4()}"
    await ledger.upsert_node(NodeSpec(name=node, pool="training"))
    await ledger.upsert_gpu(GpuSpec(gpu, node, 0, "H100", "nvidia", 989_400, 80 * GIB))
    held = await ledger.reserve(holding("ml-team-c", "filler", gpu, "critical", node=node))
    assert isinstance(held, Reserved)
    # It uses the whole card: p95 plus 15% would be 1137.81 TFLOPS and 92 GiB, the limits twice that.
    await report_usage(
        stack["nats_url"],
        gpu,
        10,
        node=node,
        workload=("ml-team-c", "filler"),
        usage=lambda i: (989_400, 80 * GIB),
    )

    async def filler_recommended() -> dict[str, Any] | None:
        filler = (await recommendations(stack["url"])).get("ml-team-c/filler")
        return filler if filler is not None and filler["sampleCount"] == 10 else None

    filler = await eventually(filler_recommended)
    assert filler["recommended"] == {
        "tflopsRequestMilli": 989_400,
        "tflopsLimitMilli": 989_400,
        "vramRequestBytes": 80 * GIB,
        "vramLimitBytes": 80 * GIB,
    }
    assert filler["reason"].endswith("; capped at the H100 it runs on (989.4 TFLOPS, 80 GiB)")
    assert await asyncio.to_thread(tfctl_main, ["recommendations", "--url", stack["url"]]) == 0
    [row] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("ml-team-c/filler ")]
    assert row.split()[3:7] == ["20/40", "989.4/989.4", "4/8", "80/80"]

    assert await ledger.release(held.allocation.allocation_id, "pod-deleted")

    async def filler_forgotten() -> dict[str, dict[str, Any]] | None:
        items = await recommendations(stack["url"])
        return items if "ml-team-c/filler" not in items else None

    remaining = await eventually(filler_forgotten)
    assert {"ml-team-a/trainer", "ml-team-b/server"} <= set(remaining)
    assert await asyncio.to_thread(tfctl_main, ["get", "recommendations", "--metrics-url", stack["url"]]) == 0
    assert "ml-team-c/filler" not in capsys.readouterr().out


async def test_without_dedicated_prices_tfctl_billing_says_the_savings_are_unknown(
    stack: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    # The stack's metrics service has no TF_GPU_COST_PER_HOUR, as `make run` starts it.
    assert await asyncio.to_thread(tfctl_main, ["billing", "--url", stack["url"]]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split() for line in lines[2:] if not line.startswith("note: ")}
    assert set(rows) == {"ml-team-a", "ml-team-b", "TOTAL"}
    for row in rows.values():
        assert row[2:4] == ["unknown", "unknown"]  # was 0.00 and a negative saving
    reason = (
        "no dedicated price for GPU model 'H100': dedicated cost and savings are unknown; set "
        """TF_GPU_COST_PER_HOUR on the metrics service, e.g. '{"H100": "<price per hour>"}'"""
    )
    assert f"note: {reason}" in lines

    assert await asyncio.to_thread(tfctl_main, ["billing", "--json", "--url", stack["url"]]) == 0
    bill = json.loads(capsys.readouterr().out)
    assert (bill["dedicatedCost"], bill["savings"], bill["savingsUnknownReason"]) == (None, None, reason)
    for group in bill["groups"]:
        assert (group["dedicatedCost"], group["savings"], group["savingsUnknownReason"]) == (
            None,
            None,
            reason,
        )


def a_recommendation(key: str, tflops: int) -> Recommendation:
    return Recommendation(
        workload_key=key,
        pool="training",
        qos="low",
        gpu_count=1,
        request_tflops_milli=tflops,
        limit_tflops_milli=tflops,
        request_vram_bytes=GIB,
        limit_vram_bytes=GIB,
        current_request_tflops_milli=tflops,
        current_limit_tflops_milli=tflops,
        current_request_vram_bytes=GIB,
        current_limit_vram_bytes=GIB,
        sample_count=40,
        sufficient=True,
        reason="test",
        computed_at=datetime.now(UTC),
    )


async def test_the_store_keeps_one_recommendation_per_workload_and_the_cache_survives_an_outage(
    quiet_database_url: str,
) -> None:
    engine = create_async_engine(ledger_url(quiet_database_url))
    down = create_async_engine(
        ledger_url(make_url(quiet_database_url).set(port=free_port()).render_as_string(hide_password=False))
    )
    try:
        store = RecommendationStore(engine)
        first, second = a_recommendation("ns-x/a", 1000), a_recommendation("ns-x/b", 2000)
        assert await store.save([first, second]) == 2
        replaced = a_recommendation("ns-x/a", 3000)
        assert await store.save([replaced]) == 1
        stored = {item.workload_key: item for item in await store.all()}
        assert (stored["ns-x/a"], stored["ns-x/b"]) == (replaced, second)

        cache = RecommendationCache(store)
        before = cache.current()
        held = await cache.refresh()
        assert held is not before
        assert held["ns-x/a"].request_tflops_milli == 3000
        assert await cache.refresh() is held  # unchanged: same object, verdict caches stay valid
        cache.store = RecommendationStore(down)
        assert await cache.refresh() is held
        assert cache.last_error is not None
    finally:
        await engine.dispose()
        await down.dispose()


async def test_a_bill_from_the_ledger_charges_the_recorded_eviction_protection(database_url: str) -> None:
    clock = SteppedClock(T0)
    ledger = SqlLedger.create(database_url, clock=clock)
    try:
        await ledger.upsert_node(NodeSpec(name="node-rec", pool="training"))
        gpu = f"gpu-{uuid.uuid4()}"
        await ledger.upsert_gpu(GpuSpec(gpu, "node-rec", 9, "H100", "nvidia", 100_000, 80 * GIB))
        protected = await ledger.reserve(
            holding("ml-team-p", "protected", gpu, "medium", eviction_protection_s=1800)
        )
        plain = await ledger.reserve(holding("ml-team-q", "plain", gpu, "medium"))
        assert isinstance(protected, Reserved)
        assert isinstance(plain, Reserved)
        clock.now = T0 + timedelta(hours=2)
        for reserved in (protected, plain):
            assert await ledger.release(reserved.allocation.allocation_id, "pod-deleted")
        bill = await bill_from_ledger(
            ledger,
            parse_config(CONFIG),
            {},
            start=T0,
            end=T0 + timedelta(days=1),
            group_by="namespace",
            quantum=Decimal("0.0001"),
        )
    finally:
        await ledger.close()
    costs = {line.key: line.cost for line in bill.lines}
    # 0.42/h; the first 30 minutes of the protected one cost 1.2 times as much: 0.42 x (1.5 + 0.5 x 1.2).
    assert costs == {"ml-team-p": Decimal("0.8820"), "ml-team-q": Decimal("0.8400")}


async def test_the_service_exposes_request_latency_and_consumer_metrics(stack: dict[str, Any]) -> None:
    await report_usage(stack["nats_url"], stack["gpus"][0], 2)
    await recommendations(stack["url"])

    async def operational() -> dict[str, Any] | None:
        async with httpx.AsyncClient(timeout=10) as client:
            text = (await client.get(f"{stack['url']}/metrics")).text
        families = {family.name: family for family in text_string_to_metric_families(text)}
        consumed = families.get("tf_consumer_messages")
        if consumed is None or not any(s.labels.get("outcome") == "acked" for s in consumed.samples):
            return None
        return families

    families = await eventually(operational)
    latency = [
        sample
        for sample in families["tf_http_request_duration_seconds"].samples
        if sample.name.endswith("_count") and sample.labels["route"] == "/api/v1/recommendations"
    ]
    assert latency
    assert latency[0].labels["service"] == "metrics"
    assert latency[0].labels["status"] == "200"
    assert latency[0].value >= 1
    acked = [s for s in families["tf_consumer_messages"].samples if s.labels["outcome"] == "acked"]
    # The test process also hosted other services' consumers earlier; a service process has only its own.
    own = {s.labels["consumer"] for s in acked if s.labels["service"] == "metrics"}
    assert subjects.METRICS_RECORD_USAGE.durable in own  # the usage just reported
    assert own <= {subjects.METRICS_RECORD_USAGE.durable, subjects.METRICS_COUNT_EVENTS.durable}
    pending = families["tf_consumer_pending_messages"].samples
    assert all(sample.value >= 0 for sample in pending)
    assert pending


async def test_the_dashboard_shows_the_running_defrag_campaign_and_the_last_result(
    stack: dict[str, Any],
) -> None:
    started = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)

    def record_campaigns() -> None:
        with psycopg.connect(libpq_conninfo(stack["database_url"]), autocommit=True) as connection:
            connection.execute(
                "INSERT INTO defrag_campaign (id, pool_name, trigger, state, started_at, finished_at,"
                " outcome, drained_nodes, failed_nodes, skipped_nodes, pods_evicted, stranded_pods)"
                " VALUES (%s, 'training', 'cron', 'finished', %s, %s, 'completed',"
                ' \'["node-1", "node-2"]\', \'{"node-3": "pdb"}\', \'{}\', 5, 1)',
                (
                    uuid.uuid4(),
                    started - timedelta(days=1),
                    started - timedelta(days=1) + timedelta(minutes=20),
                ),
            )
            connection.execute(
                "INSERT INTO defrag_campaign (id, pool_name, trigger, state, started_at, current_node,"
                " drained_nodes, pods_evicted, stranded_pods)"
                " VALUES (%s, 'training', 'manual', 'running', %s, 'node-4', '[\"node-5\"]', 2, 0)",
                (uuid.uuid4(), started),
            )

    await asyncio.to_thread(record_campaigns)
    async with httpx.AsyncClient(timeout=10) as client:
        view = (await client.get(f"{stack['url']}/api/v1/dashboard")).json()
    assert view["defrag"] == [
        {
            "pool": "training",
            "running": {
                "trigger": "manual",
                "startedAt": started.isoformat(),
                "finishedAt": None,
                "deadlineAt": None,
                "outcome": None,
                "currentNode": "node-4",
                "nodesDrained": 1,
                "nodesFailed": 0,
                "nodesSkipped": 0,
                "podsEvicted": 2,
                "strandedPods": 0,
            },
            "last": {
                "trigger": "cron",
                "startedAt": (started - timedelta(days=1)).isoformat(),
                "finishedAt": (started - timedelta(days=1) + timedelta(minutes=20)).isoformat(),
                "deadlineAt": None,
                "outcome": "completed",
                "currentNode": None,
                "nodesDrained": 2,
                "nodesFailed": 1,
                "nodesSkipped": 0,
                "podsEvicted": 5,
                "strandedPods": 1,
            },
        }
    ]
