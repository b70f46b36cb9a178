"""The hypervisor API over real HTTP (uvicorn on loopback, httpx): devices, workers, auth, 404s and 501s."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field

import httpx
import pytest
import uvicorn
from agent_builders import allocation_created, simulated_agent
from fastapi import FastAPI
from pydantic import SecretStr
from tfagent.adapters.simulated import SimulatedGpuProbe
from tfagent.agent import NodeAgent
from tfagent.api import build_router
from tfagent.core.usage import WorkerAllocation
from tfcommon.bus import InMemoryEventBus
from tfcommon.events import AllocationCreated
from tfcommon.infra import free_port

pytestmark = pytest.mark.integration

TOKEN = "s3cret-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class _QuietServer(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@dataclass
class RecordingCheckpoint:
    name: str = "cuda-checkpoint"
    calls: list[str] = field(default_factory=list)

    async def snapshot(self, allocation: WorkerAllocation) -> Mapping[str, object]:
        self.calls.append(f"snapshot {allocation.allocation_id}")
        return {"state": "suspended"}

    async def resume(self, allocation: WorkerAllocation) -> Mapping[str, object]:
        self.calls.append(f"resume {allocation.allocation_id}")
        return {"state": "running"}


@dataclass
class Api:
    client: httpx.AsyncClient
    agent: NodeAgent
    probe: SimulatedGpuProbe
    allocation: AllocationCreated


@contextlib.asynccontextmanager
async def serving(
    token: str | None = TOKEN, checkpoint: RecordingCheckpoint | None = None
) -> AsyncIterator[Api]:
    agent, probe = simulated_agent(InMemoryEventBus("node-agent"), "H100:2")
    inventory = await agent.register()
    created = allocation_created(inventory.gpus[0].uuid, vram_gib=12)
    await agent.track_allocation(created)
    await agent.sample()
    app = FastAPI()
    app.include_router(build_router(agent, None if token is None else SecretStr(token), checkpoint))
    port = free_port()
    server = _QuietServer(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, lifespan="off"))
    task = asyncio.create_task(server.serve())
    deadline = asyncio.get_running_loop().time() + 10
    while not server.started:
        assert asyncio.get_running_loop().time() < deadline, "the API server did not start within 10s"
        assert not task.done(), "the API server stopped while starting"
        await asyncio.sleep(0.01)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
            yield Api(client, agent, probe, created)
    finally:
        server.should_exit = True
        await task


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with serving() as running:
        yield running


async def test_lists_devices_with_capacity_and_the_node_they_are_on(api: Api) -> None:
    response = await api.client.get("/api/v1/devices")

    assert response.status_code == 200
    body = response.json()
    assert [d["index"] for d in body["data"]] == [0, 1]
    first = body["data"][0]
    assert (first["model"], first["phase"], first["simulated"]) == ("H100", "Running", True)
    assert first["capacity"] == {"tflops_milli": 989_400, "vram_bytes": 80 * 1024**3}
    assert body["node"]["name"] == "node-a"
    assert body["node"]["simulated"] is True
    assert body["node"]["checkpoint_backend"] is None


async def test_gets_one_device_by_uuid_in_any_case(api: Api) -> None:
    uuid = api.allocation.shares[0].gpu_uuid

    response = await api.client.get(f"/api/v1/devices/{uuid.upper()}")

    assert response.status_code == 200
    assert response.json()["data"]["uuid"] == uuid


async def test_an_unknown_device_is_404_with_an_error_body(api: Api) -> None:
    response = await api.client.get("/api/v1/devices/gpu-nope")

    assert response.status_code == 404
    assert "gpu-nope" in response.json()["error"]


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/api/v1/devices/discover", {}),
        ("/api/v1/devices/discover", {"Authorization": "Bearer wrong"}),
        ("/api/v1/devices/discover", {"Authorization": TOKEN}),
    ],
)
async def test_mutating_endpoints_refuse_a_missing_or_wrong_token(
    api: Api, path: str, headers: dict[str, str]
) -> None:
    response = await api.client.post(path, headers=headers)

    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == "Bearer"
    assert "TF_API_TOKEN" in response.json()["error"]


@pytest.mark.parametrize(
    ("path", "headers"),
    [
        ("/api/v1/workers/{worker}/snapshot", {}),
        ("/api/v1/workers/{worker}/resume", {"Authorization": "Bearer wrong"}),
        ("/api/v1/workers/unknown/snapshot", {}),
    ],
)
async def test_a_checkpoint_backend_takes_snapshot_and_resume_only_with_the_token(
    path: str, headers: dict[str, str]
) -> None:
    backend = RecordingCheckpoint()
    async with serving(checkpoint=backend) as api:
        response = await api.client.post(path.format(worker=api.allocation.allocation_id), headers=headers)

    assert response.status_code == 401
    assert "TF_API_TOKEN" in response.json()["error"]
    assert backend.calls == []


async def test_without_a_configured_token_mutating_endpoints_are_disabled() -> None:
    async with serving(token=None) as api:
        response = await api.client.post("/api/v1/devices/discover", headers=AUTH)

    assert response.status_code == 401
    assert "set TF_API_TOKEN" in response.json()["error"]


async def test_discover_reports_an_allocated_gpu_that_vanished_as_unknown_and_an_idle_one_as_removed(
    api: Api,
) -> None:
    allocated, idle = (gpu["uuid"] for gpu in (await api.client.get("/api/v1/devices")).json()["data"])
    api.probe.remove_gpu(allocated)
    api.probe.remove_gpu(idle)

    response = await api.client.post("/api/v1/devices/discover", headers=AUTH)

    assert response.status_code == 200
    body = response.json()
    assert (body["went_missing"], body["removed"]) == ([allocated], [idle])
    assert [(d["uuid"], d["phase"]) for d in body["data"]] == [(allocated, "Unknown")]
    assert body["data"][0]["missing_since"] is not None


async def test_lists_workers_with_their_allocation(api: Api) -> None:
    response = await api.client.get("/api/v1/workers")

    (worker,) = response.json()["data"]
    assert worker["worker_uid"] == str(api.allocation.allocation_id)
    assert (worker["namespace"], worker["worker"], worker["workload"]) == ("ml", "train-0", "train")
    assert worker["devices"] == [api.allocation.shares[0].gpu_uuid]


async def test_a_worker_shows_its_allocation_and_live_metrics_per_device_and_process(api: Api) -> None:
    response = await api.client.get(f"/api/v1/workers/{api.allocation.allocation_id}")

    assert response.status_code == 200
    data = response.json()["data"]
    assert data["worker_uid"] == str(api.allocation.allocation_id)
    (per_process,) = data["metrics"][api.allocation.shares[0].gpu_uuid].values()
    assert per_process["memory_bytes"] == 12 * 1024**3


async def test_an_unknown_worker_is_404(api: Api) -> None:
    for response in (
        await api.client.get("/api/v1/workers/nobody"),
        await api.client.post("/api/v1/workers/nobody/snapshot", headers=AUTH),
        await api.client.post("/api/v1/workers/nobody/resume"),
    ):
        assert response.status_code == 404
        assert "nobody" in response.json()["error"]


@pytest.mark.parametrize("action", ["snapshot", "resume"])
@pytest.mark.parametrize(
    ("configured", "headers"),
    [(TOKEN, AUTH), (TOKEN, {}), (TOKEN, {"Authorization": "Bearer wrong"}), (None, {})],
    ids=["right token", "no token", "wrong token", "agent without a token"],
)
async def test_snapshot_and_resume_are_501_with_how_to_move_the_workload_whatever_the_token(
    action: str, configured: str | None, headers: dict[str, str]
) -> None:
    async with serving(token=configured) as api:
        response = await api.client.post(
            f"/api/v1/workers/{api.allocation.allocation_id}/{action}", headers=headers
        )

    assert response.status_code == 501
    body = response.json()
    assert body["error"] == "GPU context snapshot is not available on this node"
    guidance = " ".join(body["how_to_move_the_workload"])
    assert "Restart the workload elsewhere" in guidance
    assert "PodDisruptionBudget" in guidance
    assert "tensor-fusion.ai/do-not-disrupt" in guidance


async def test_a_checkpoint_backend_takes_snapshot_and_resume_and_is_reported() -> None:
    backend = RecordingCheckpoint()
    async with serving(checkpoint=backend) as api:
        worker = api.allocation.allocation_id
        snapshot = await api.client.post(f"/api/v1/workers/{worker}/snapshot", headers=AUTH)
        resume = await api.client.post(f"/api/v1/workers/{worker}/resume", headers=AUTH)
        devices = await api.client.get("/api/v1/devices")

    assert (snapshot.status_code, snapshot.json()) == (200, {"data": {"state": "suspended"}})
    assert (resume.status_code, resume.json()) == (200, {"data": {"state": "running"}})
    assert backend.calls == [f"snapshot {worker}", f"resume {worker}"]
    assert devices.json()["node"]["checkpoint_backend"] == "cuda-checkpoint"
