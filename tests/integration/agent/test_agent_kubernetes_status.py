"""The node agent in Kubernetes mode keeps its GPUNode and GPU objects: the real `kubernetes` client over
HTTP against kmock with the stateful reactions of `tests/integration/cluster/cluster_apiserver.py`."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import uuid4

import kmock
import pytest
import yaml
from support.polling import eventually
from tfagent.adapters.simulated import SimulatedGpuProbe, parse_fake_gpus
from tfagent.agent import AgentTimers, NodeAgent
from tfagent.app import build
from tfagent.kubernetes_status import KubernetesStatus
from tfcommon.bus import NatsEventBus
from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.infra import free_port
from tfcommon.runtime import serve
from tfcommon.settings import AgentSettings, DatabaseSettings, NatsSettings

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))
from cluster_apiserver import ApiServerState, install

pytestmark = pytest.mark.integration

GPUS = "tensor-fusion.ai/v1/gpus"
GPU_NODES = "tensor-fusion.ai/v1/gpunodes"
DO_NOT_DISRUPT = "tensor-fusion.ai/do-not-disrupt"
HOSTNAME = "kubernetes.io/hostname"
POOL = "tensor-fusion.ai/gpupool"


@pytest.fixture
async def api() -> AsyncIterator[tuple[ApiServerState, str]]:
    state = ApiServerState()
    async with kmock.KubernetesScaffold() as scaffold, kmock.Server(scaffold) as server:
        install(scaffold, state)
        yield state, str(server.url).rstrip("/")
        state.stopping = True


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[NatsEventBus]:
    nats_bus = await NatsEventBus.connect(nats_url, service="agent-k8s-test")
    try:
        yield nats_bus
    finally:
        await nats_bus.close()


def kubeconfig(path: Path, url: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "kmock", "cluster": {"server": url}}],
                "users": [{"name": "agent", "user": {"token": "test"}}],
                "contexts": [{"name": "kmock", "context": {"cluster": "kmock", "user": "agent"}}],
                "current-context": "kmock",
            }
        )
    )
    return path


def gpus_of(state: ApiServerState, node: str) -> dict[str, dict[str, Any]]:
    return {
        name: obj
        for (resource, _, name), obj in state.objects.items()
        if resource == GPUS and obj["metadata"].get("labels", {}).get(HOSTNAME) == node
    }


def gpu_node(state: ApiServerState, node: str) -> dict[str, Any] | None:
    return state.objects.get((GPU_NODES, None, node))


def label_gpu_node(state: ApiServerState, node: str, key: str, value: str) -> None:
    """`kubectl label gpunode NODE KEY=VALUE`."""
    obj = gpu_node(state, node)
    assert obj is not None
    obj["metadata"].setdefault("labels", {})[key] = value
    state.put(GPU_NODES, obj)


async def test_agent_service_in_kubernetes_mode_creates_its_gpunode_and_gpus_with_status(
    api: tuple[ApiServerState, str], nats_url: str, tmp_path: Path
) -> None:
    state, url = api
    node = f"node-{uuid4().hex[:8]}"
    settings = AgentSettings(
        nats=NatsSettings(url=nats_url),
        database=DatabaseSettings(url=None),  # the agent holds no database credential
        bind_host="127.0.0.1",
        port=free_port(),
        node_name=node,
        fake_gpus="H100:2",
        pool="training",
        agent_kubernetes=True,
        agent_kubeconfig=kubeconfig(tmp_path / "kubeconfig", url),
    )
    stop = asyncio.Event()
    service = asyncio.create_task(serve(build(settings), stop=stop))
    try:
        written = await eventually(
            lambda: (
                (node_obj := gpu_node(state, node)) is not None
                and len(node_obj.get("status", {}).get("managedGPUDeviceIDs", [])) == 2
                and node_obj
            ),
            "the GPUNode with both GPUs",
        )
    finally:
        stop.set()
        await asyncio.wait_for(service, timeout=30)

    assert written["metadata"]["labels"] == {POOL: "training", HOSTNAME: node}
    assert written["status"]["totalGPUs"] == 2
    assert (written["status"]["totalTFlops"], written["status"]["totalVRAM"]) == ("1978800m", "160Gi")
    gpus = gpus_of(state, node)
    assert sorted(gpus) == sorted(written["status"]["managedGPUDeviceIDs"])
    by_index = sorted(gpus.values(), key=lambda gpu: gpu["status"]["index"])
    for index, gpu in enumerate(by_index):
        status = gpu["status"]
        assert status["index"] == index
        assert status["uuid"] == gpu["metadata"]["name"]
        assert (status["phase"], status["gpuModel"], status["vendor"]) == ("Running", "H100", "NVIDIA")
        assert status["capacity"] == {"tflops": "989400m", "vram": "80Gi"}
        assert status["nodeSelector"] == {HOSTNAME: node}
        assert "available" not in status, "availability is the scheduler's"
        assert gpu["metadata"]["ownerReferences"] == [
            {
                "apiVersion": "tensor-fusion.ai/v1",
                "kind": "GPUNode",
                "name": node,
                "uid": written["metadata"]["uid"],
                "controller": True,
            }
        ]


def simulated_agent(
    bus: NatsEventBus, node: str, status: KubernetesStatus
) -> tuple[NodeAgent, SimulatedGpuProbe]:
    holder: list[NodeAgent] = []
    probe = SimulatedGpuProbe(
        node, parse_fake_gpus("A100-80G:2"), allocations=lambda: holder[0].allocations()
    )
    agent = NodeAgent(
        node=node,
        pool="default",
        probe=probe,
        owners=probe,
        bus=bus,
        timers=AgentTimers(discovery_interval_s=3600),
        on_inventory=status.notify,
    )
    holder.append(agent)
    return agent, probe


async def test_users_labels_and_spec_on_the_gpunode_survive_start_and_rediscovery(
    api: tuple[ApiServerState, str], bus: NatsEventBus
) -> None:
    state, url = api
    node = f"node-{uuid4().hex[:8]}"
    state.put(
        GPU_NODES,
        {
            "apiVersion": "tensor-fusion.ai/v1",
            "kind": "GPUNode",
            "metadata": {"name": node, "labels": {"team": "research"}},
            "spec": {"manageMode": "Manual"},
        },
    )
    cluster = KubernetesCluster.for_url(url)
    status = KubernetesStatus(cluster, node=node, pool="default")
    agent, probe = simulated_agent(bus, node, status)
    stop = asyncio.Event()
    writer = asyncio.create_task(status.run(stop))
    try:
        await agent.register()
        await eventually(lambda: len(gpus_of(state, node)) == 2, "both GPU objects")
        label_gpu_node(state, node, DO_NOT_DISRUPT, "true")
        removed = sorted(gpus_of(state, node))[1]
        probe.remove_gpu(removed)

        await agent.rediscover()
        rewritten = await eventually(
            lambda: (
                (obj := gpu_node(state, node)) is not None
                and obj.get("status", {}).get("managedGPUDeviceIDs") == [sorted(gpus_of(state, node))[0]]
                and obj
            ),
            "the GPUNode status after the rediscovery",
        )
    finally:
        stop.set()
        await writer
        cluster.close()

    assert rewritten["metadata"]["labels"] == {
        "team": "research",
        DO_NOT_DISRUPT: "true",
        POOL: "default",
        HOSTNAME: node,
    }
    assert rewritten["spec"] == {"manageMode": "Manual"}


async def test_a_gpu_that_disappears_is_marked_unknown_and_kept_also_across_a_restart(
    api: tuple[ApiServerState, str], bus: NatsEventBus
) -> None:
    state, url = api
    node = f"node-{uuid4().hex[:8]}"
    cluster = KubernetesCluster.for_url(url)
    status = KubernetesStatus(cluster, node=node, pool="default")
    agent, probe = simulated_agent(bus, node, status)
    try:
        await status.sync(await agent.register())
        first, second = sorted(gpus_of(state, node).values(), key=lambda gpu: gpu["status"]["index"])

        probe.remove_gpu(second["metadata"]["name"])
        await status.sync((await agent.rediscover()).inventory)

        gone = gpus_of(state, node)[second["metadata"]["name"]]
        assert gone["status"]["phase"] == "Unknown"
        assert "no longer reported by the driver" in gone["status"]["message"]
        assert gone["status"]["capacity"] == second["status"]["capacity"]
        assert gpus_of(state, node)[first["metadata"]["name"]]["status"]["phase"] == "Running"
        node_status = state.objects[(GPU_NODES, None, node)]["status"]
        assert (node_status["totalGPUs"], node_status["totalVRAM"]) == (1, "80Gi")

        restarted = KubernetesStatus(cluster, node=node, pool="default")  # the GPU fell off while down
        _, fresh_probe = simulated_agent(bus, node, restarted)
        fresh_probe.remove_gpu(first["metadata"]["name"])
        fresh_probe.remove_gpu(second["metadata"]["name"])
        await restarted.sync(fresh_probe.discover())

        assert gpus_of(state, node)[first["metadata"]["name"]]["status"]["phase"] == "Unknown"
        assert len(gpus_of(state, node)) == 2, "GPU objects are never deleted by the agent"
    finally:
        cluster.close()
