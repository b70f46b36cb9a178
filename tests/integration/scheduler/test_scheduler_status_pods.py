"""The pod fields of GPU and GPUNode status that TensorFusion's dashboards read, written by the scheduler's
status writer to a real API server from a real Postgres ledger: GPU `runningApps`, GPUNode
`allocatedPods` and `totalGPUPods` follow placements and releases, and `hypervisorStatus.lastHeartbeatTime`
follows the node agent's heartbeats (a heartbeat alone is written at most every `HEARTBEAT_WRITE_S`)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from scheduler_builders import register_nodes
from tfagent.core.inventory import GpuDevice, NodeInventory
from tfagent.kubernetes_status import KubernetesStatus
from tfcommon.bus import NatsEventBus
from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.events import GpuRequest, WorkloadRef
from tfcommon.kube_local import LocalKubernetes
from tfcommon.ledger.sql import SqlLedger
from tfscheduler.engine import Scheduler
from tfscheduler.status_writer import HEARTBEAT_WRITE_S, StatusWriter
from tfscheduler.submission import Submission

pytestmark = pytest.mark.integration
GIB = 1024**3
LONG = timedelta(hours=1)


def kubectl_json(control_plane: LocalKubernetes, *args: str) -> dict[str, Any]:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "kubectl"), f"--kubeconfig={control_plane.kubeconfig}", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    found: dict[str, Any] = json.loads(result.stdout)
    return found


@pytest.fixture
async def cluster(local_kubernetes: LocalKubernetes) -> AsyncIterator[KubernetesCluster]:
    opened = KubernetesCluster.from_environment(kubeconfig=str(local_kubernetes.kubeconfig))
    try:
        yield opened
    finally:
        opened.close()


async def agent_node(ledger: SqlLedger, cluster: KubernetesCluster) -> tuple[str, list[str]]:
    """A node with two GPUs in the ledger and its GPUNode and GPU objects, created by the node agent's own
    writer; returns the node and its GPUs' UUIDs in index order."""
    [node] = await register_nodes(ledger, 1, 2)
    gpus = sorted((gpu for gpu in await ledger.list_gpus() if gpu.node == node), key=lambda gpu: gpu.index)
    devices = tuple(
        GpuDevice(
            uuid=gpu.uuid,
            index=gpu.index,
            model=gpu.model,
            product_name="NVIDIA H100 80GB HBM3",
            tflops_milli=gpu.capacity_tflops_milli,
            vram_bytes=gpu.capacity_vram_bytes,
            pci_bus_id=f"00000000:{gpu.index + 1:02x}:00.0",
            numa_node=0,
            nvlink_peers=(),
            mig_enabled=False,
            capacity_source="simulated",
            simulated=True,
        )
        for gpu in gpus
    )
    inventory = NodeInventory(node=node, driver_version="simulated", cuda_version="simulated", gpus=devices)
    await KubernetesStatus(cluster, node=node, pool="default").sync(inventory)
    return node, [gpu.uuid for gpu in gpus]


def submission(name: str, workload: str, tflops: int, gpus: int = 1) -> Submission:
    return Submission(
        workload=WorkloadRef(namespace="team-a", name=name, uid=str(uuid.uuid4()), workload=workload),
        request=GpuRequest(
            pool="default",
            gpu_count=gpus,
            tflops_request_milli=tflops * 1000,
            tflops_limit_milli=2 * tflops * 1000,
            vram_request_bytes=4 * GIB,
            vram_limit_bytes=8 * GIB,
            qos="high",
        ),
    )


async def test_pods_and_heartbeats_are_in_gpu_and_gpunode_status(
    local_kubernetes: LocalKubernetes, ledger: SqlLedger, bus: NatsEventBus, cluster: KubernetesCluster
) -> None:
    node, (first_gpu, second_gpu) = await agent_node(ledger, cluster)
    scheduler = Scheduler(ledger, bus, heartbeat_timeout=LONG)
    await scheduler.start()
    writer = StatusWriter(ledger, cluster)

    one = submission("trainer-0", "trainer", 60)
    two = submission("trainer-1", "trainer", 70)  # not beside trainer-0 on one card
    wide = submission("wide", "wide", 5, gpus=2)
    placed = [await scheduler.submit(workload) for workload in (one, two, wide)]
    assert [status.state for status in placed] == ["placed"] * 3
    await writer.sync()

    status = kubectl_json(local_kubernetes, "get", "gpunode", node, "-o", "json")["status"]
    assert status["totalGPUPods"] == 3
    pods_by_gpu = {gpu: [pod["name"] for pod in pods] for gpu, pods in status["allocatedPods"].items()}
    assert sorted(map(sorted, pods_by_gpu.values())) == [["trainer-0", "wide"], ["trainer-1", "wide"]]
    heartbeat = next(n for n in await ledger.list_nodes() if n.name == node).last_heartbeat_at
    assert heartbeat is not None
    assert status["hypervisorStatus"]["lastHeartbeatTime"] == heartbeat.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert status["hypervisorStatus"]["hypervisorVersion"], "the node agent's field stays"

    holder = next(gpu for gpu, names in pods_by_gpu.items() if "trainer-0" in names)
    gpu = kubectl_json(local_kubernetes, "get", "gpu", holder, "-o", "json")["status"]
    apps = {app["name"]: app for app in gpu["runningApps"]}
    assert set(apps) == {"trainer", "wide"}
    assert apps["trainer"]["count"] == 1
    assert apps["trainer"]["pods"] == [
        {
            "name": "trainer-0",
            "namespace": "team-a",
            "uid": one.workload.uid,
            "requests": {"tflops": "60", "vram": "4Gi"},
            "limits": {"tflops": "120", "vram": "8Gi"},
            "qos": "high",
            "isExternal": False,
        }
    ]

    assert await scheduler.release(placed[0].id, "workload-ended")
    await writer.sync()
    gpu = kubectl_json(local_kubernetes, "get", "gpu", holder, "-o", "json")["status"]
    assert [app["name"] for app in gpu["runningApps"]] == ["wide"]
    status = kubectl_json(local_kubernetes, "get", "gpunode", node, "-o", "json")["status"]
    assert status["totalGPUPods"] == 2
    assert set(status["allocatedPods"]) == {first_gpu.lower(), second_gpu.lower()}
    assert [pod["name"] for pod in status["allocatedPods"][holder]] == ["wide"]

    await ledger.record_heartbeat(node)
    assert await writer.sync() == 0, f"a heartbeat alone waits {HEARTBEAT_WRITE_S} s before it is written"
