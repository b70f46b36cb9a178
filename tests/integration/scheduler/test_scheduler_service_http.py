"""The scheduler as a service, through the real runtime (`tfcommon.runtime.serve`): a simulated node
agent registers over NATS and `inventory.py` fills the ledger; the HTTP API (bearer token, submit,
delete, reads, simulate); the outbox relay task publishes `tf.evt.allocation.created`; `tfctl submit`
and `tfctl get` against it."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import uuid4

import httpx
import pytest
import yaml
from nats.aio.msg import Msg
from pydantic import SecretStr
from scheduler_builders import GIB, a_submission
from scheduler_service import TOKEN, eventually, private_nats, run_tfctl, service_environment
from tfcommon.bus import NatsEventBus
from tfcommon.events import GpuDiscovered, NodeHeartbeatSent, NodeRegistered
from tfcommon.infra import free_port
from tfcommon.runtime import serve
from tfcommon.settings import DatabaseSettings, NatsSettings, SchedulerSettings
from tfscheduler.app import build

pytestmark = pytest.mark.integration
AUTH = {"Authorization": f"Bearer {TOKEN}"}
NODE = "sim-node-0"


@pytest.fixture(scope="module")
def own_nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with private_nats(tmp_path_factory.mktemp("scheduler-http-nats")) as url:
        yield url


@contextlib.asynccontextmanager
async def running_scheduler(
    database_url: str, nats_url: str, token: str | None, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[str]:
    monkeypatch.setenv("TF_SCHEDULER_HEARTBEAT_TIMEOUT_S", "3600")
    port = free_port()
    settings = SchedulerSettings(
        nats=NatsSettings(url=nats_url),
        database=DatabaseSettings(url=database_url),
        api_token=SecretStr(token) if token else None,
        port=port,
        bind_host="127.0.0.1",
    )
    stop = asyncio.Event()
    service = asyncio.create_task(serve(build(settings), stop=stop))
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=5) as client:

            async def ready() -> bool | None:
                assert not service.done(), service
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get(f"{url}/readyz")).status_code == 200:
                        return True
                return None

            await eventually(ready, timeout_s=30)
        yield url
    finally:
        stop.set()
        await asyncio.wait_for(service, timeout=30)


async def simulate_node_agent(bus: NatsEventBus, gpus: int) -> list[str]:
    now = datetime.now(UTC)
    uuids = [f"gpu-{uuid4()}" for _ in range(gpus)]
    await bus.publish(
        NodeRegistered(
            event_id=uuid4(), occurred_at=now, node=NODE, pool="default", gpu_count=gpus, simulated=True
        )
    )
    for index, gpu_uuid in enumerate(uuids):
        await bus.publish(
            GpuDiscovered(
                event_id=uuid4(),
                occurred_at=now,
                node=NODE,
                pool="default",
                gpu_uuid=gpu_uuid,
                index=index,
                model="H100",
                capacity_tflops_milli=100_000,
                capacity_vram_bytes=80 * GIB,
                simulated=True,
            )
        )
    await bus.publish(
        NodeHeartbeatSent(
            event_id=uuid4(), occurred_at=now, node=NODE, pool="default", gpu_count=gpus, interval_ms=1_000
        )
    )
    return uuids


def _pod_manifest(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "labels": {"tensor-fusion.ai/enabled": "true"},
            "annotations": {
                "tensor-fusion.ai/gpupool": "default",
                "tensor-fusion.ai/tflops-request": "20",
                "tensor-fusion.ai/tflops-limit": "20",
                "tensor-fusion.ai/vram-request": "16Gi",
                "tensor-fusion.ai/vram-limit": "16Gi",
            },
        },
        "spec": {"containers": [{"name": "main", "image": "python:3.11"}]},
    }


async def test_the_service_places_over_http_from_node_agent_inventory_and_announces_it(
    tmp_path: Path, database_url: str, own_nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bus = await NatsEventBus.connect(own_nats_url, service="node-agent-simulator")
    created: list[dict[str, Any]] = []

    async def keep(message: Msg) -> None:
        created.append(json.loads(message.data))

    subscription = await bus.nc.subscribe("tf.evt.allocation.created", cb=keep)
    try:
        async with (
            running_scheduler(database_url, own_nats_url, TOKEN, monkeypatch) as url,
            httpx.AsyncClient(base_url=url, timeout=30) as client,
        ):
            uuids = await simulate_node_agent(bus, gpus=2)

            async def inventory() -> list[dict[str, Any]] | None:
                gpus = (await client.get("/api/v1/gpus")).json()
                return gpus if len(gpus) == 2 else None

            gpus = await eventually(inventory)
            assert sorted(gpu["uuid"] for gpu in gpus) == sorted(uuids)
            assert all(gpu["node"] == NODE and gpu["available_tflops_milli"] == 100_000 for gpu in gpus)
            [node] = (await client.get("/api/v1/nodes")).json()
            assert (node["name"], node["schedulable"], node["gpus"]) == (NODE, True, 2)

            body = a_submission(tflops_milli=30_000, vram_bytes=16 * GIB).model_dump(mode="json")
            assert (await client.post("/api/v1/workloads", json=body)).status_code == 401
            wrong = {"Authorization": "Bearer not-the-token"}
            assert (await client.post("/api/v1/workloads", json=body, headers=wrong)).status_code == 401

            placed = await client.post("/api/v1/workloads", json=body, headers=AUTH)
            assert placed.status_code == 201, placed.text
            status = placed.json()
            assert (status["state"], status["node"]) == ("placed", NODE)
            await eventually(lambda: _found(any(event["allocation_id"] == status["id"] for event in created)))
            event = next(event for event in created if event["allocation_id"] == status["id"])
            assert event["shares"][0]["tflops_milli"] == 30_000
            assert event["workload"]["name"] == body["workload"]["name"]

            too_big = a_submission(vram_bytes=200 * GIB).model_dump(mode="json")
            refused = await client.post("/api/v1/workloads", json=too_big, headers=AUTH)
            assert refused.status_code == 422
            assert refused.json()["detail"] == (
                "workload refused: vram-request 200Gi exceeds every GPU of pool default (largest: 80Gi)"
            )
            not_now = a_submission(vram_bytes=70 * GIB, gpu_count=2).model_dump(mode="json")
            waiting = await client.post("/api/v1/workloads", json=not_now, headers=AUTH)
            assert waiting.status_code == 202
            assert waiting.json()["reason"].startswith("0/1 nodes fit: 1 insufficient VRAM")
            waiting_id = waiting.json()["id"]

            invalid = await client.post(
                "/api/v1/workloads", json={"workload": body["workload"]}, headers=AUTH
            )
            assert invalid.status_code == 422
            assert any(problem["loc"][-1] == "request" for problem in invalid.json()["detail"])

            allocations = (await client.get("/api/v1/allocations")).json()
            assert [a["id"] for a in allocations] == [status["id"]]
            gpu = next(
                g for g in (await client.get("/api/v1/gpus")).json() if g["uuid"] == status["gpu_uuids"][0]
            )
            assert gpu["available_tflops_milli"] == 70_000
            [pool] = (await client.get("/api/v1/pools")).json()
            assert (pool["name"], pool["gpus"], pool["available_tflops_milli"]) == ("default", 2, 170_000)

            where = (await client.post("/api/v1/simulate-schedule", json=body)).json()
            assert (where["placed"], where["node"]) == (True, NODE)
            assert where["nodes"][NODE]["fits"] is True

            assert (await client.delete(f"/api/v1/workloads/{waiting_id}", headers=AUTH)).status_code == 200
            deleted = f"/api/v1/workloads/{status['id']}"
            assert (await client.delete(deleted)).status_code == 401
            assert (await client.delete(deleted, headers=AUTH)).json() == {
                "id": status["id"],
                "released": True,
            }
            assert (await client.delete(deleted, headers=AUTH)).json() == {
                "id": status["id"],
                "released": False,
            }
            assert (await client.get("/api/v1/allocations")).json() == []

            environment = service_environment("", own_nats_url, TF_SCHEDULER_URL=url)
            pod = tmp_path / "pod.yaml"
            pod.write_text(yaml.safe_dump(_pod_manifest("notebook")), encoding="utf-8")
            code, out, err = await run_tfctl("submit", "-f", str(pod), environment=environment)
            assert code == 0, err
            assert out.startswith(f"placed team-a/notebook on {NODE}: ")
            code, again, err = await run_tfctl("submit", "-f", str(pod), environment=environment)
            assert code == 0, err
            assert again == out  # the same pod submitted twice is one workload, as with kubectl apply
            code, out, err = await run_tfctl("get", "allocations", "--json", environment=environment)
            assert code == 0, err
            [allocation] = json.loads(out)
            assert (allocation["namespace"], allocation["name"]) == ("team-a", "notebook")
            assert allocation["shares"][0]["tflops_milli"] == 20_000
            code, out, err = await run_tfctl("get", "gpus", environment=environment)
            assert code == 0, err
            assert out.splitlines()[0].split() == [
                "UUID",
                "NODE",
                "INDEX",
                "MODEL",
                "PHASE",
                "TFLOPS",
                "AVAIL/TOTAL",
                "VRAM",
                "GiB",
                "AVAIL/TOTAL",
            ]
            [held] = [
                line for line in out.splitlines() if line.startswith(allocation["shares"][0]["gpu_uuid"])
            ]
            assert held.split()[-2:] == ["80/100", "64/80"]  # 20 TFLOPS and 16 GiB taken, in one unit each
            unauthorized = {key: value for key, value in environment.items() if key != "TF_API_TOKEN"}
            code, _out, err = await run_tfctl("submit", "-f", str(pod), environment=unauthorized)
            assert code != 0
            assert "TF_API_TOKEN" in err
    finally:
        await subscription.unsubscribe()
        await bus.close()


async def test_mutations_are_refused_with_403_when_no_token_is_configured(
    database_url: str, own_nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with (
        running_scheduler(database_url, own_nats_url, None, monkeypatch) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        body = a_submission().model_dump(mode="json")
        refused = await client.post("/api/v1/workloads", json=body, headers=AUTH)
        assert refused.status_code == 403
        assert "TF_API_TOKEN" in refused.json()["detail"]
        assert (await client.delete(f"/api/v1/workloads/{uuid4()}", headers=AUTH)).status_code == 403
        assert (await client.get("/api/v1/pools")).status_code == 200


def _found(condition: bool) -> asyncio.Future[bool | None]:
    future: asyncio.Future[bool | None] = asyncio.get_running_loop().create_future()
    future.set_result(True if condition else None)
    return future
