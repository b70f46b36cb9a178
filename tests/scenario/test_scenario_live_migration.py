"""`seeds/gpu-live-migration.en.txt`, "What is available today": the node agent's hypervisor API exposes
snapshot and resume for a running worker, and both answer 501 Not Implemented with how to move the
workload instead (restart it elsewhere, a PodDisruptionBudget, `do-not-disrupt`)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from agent_builders import allocation_created, simulated_agent
from fastapi import FastAPI
from pydantic import SecretStr
from tfagent.api import build_router
from tfcommon.bus import InMemoryEventBus

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

TOKEN = "scenario-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@dataclass
class Hypervisor:
    client: httpx.AsyncClient
    worker: str


@pytest.fixture(scope="module")
async def hypervisor() -> AsyncIterator[Hypervisor]:
    """A node agent on simulated GPUs, without a checkpoint backend, running one worker."""
    agent, _probe = simulated_agent(InMemoryEventBus("node-agent"), "H100:1")
    inventory = await agent.register()
    created = allocation_created(inventory.gpus[0].uuid, vram_gib=16)
    await agent.track_allocation(created)
    app = FastAPI()
    app.include_router(build_router(agent, SecretStr(TOKEN)))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://node-a:8001") as client:
        yield Hypervisor(client, str(created.allocation_id))


async def test_the_worker_is_running_on_the_node(hypervisor: Hypervisor) -> None:
    response = await hypervisor.client.get(f"/api/v1/workers/{hypervisor.worker}")

    assert response.status_code == 200
    assert response.json()["data"]["worker_uid"] == hypervisor.worker


@pytest.mark.parametrize("action", ["snapshot", "resume"])
async def test_snapshot_and_resume_answer_501_with_how_to_move_the_workload(
    hypervisor: Hypervisor, action: str
) -> None:
    response = await hypervisor.client.post(f"/api/v1/workers/{hypervisor.worker}/{action}", headers=AUTH)

    assert response.status_code == 501
    body = response.json()
    assert body["error"] == "GPU context snapshot is not available on this node"
    assert (body["worker_uid"], body["action"]) == (hypervisor.worker, action)
    guidance = " ".join(body["how_to_move_the_workload"])
    assert "Restart the workload elsewhere" in guidance
    assert "cordon the node and delete the pod" in guidance
    assert "PodDisruptionBudget" in guidance
    assert "kubectl label gpunode <node> tensor-fusion.ai/do-not-disrupt=true" in guidance
