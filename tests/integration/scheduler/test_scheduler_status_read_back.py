"""The status writer on a real API server (the session's `local_kubernetes`) reads back what the server
holds before writing: a restarted scheduler whose ledger has not changed writes no status at all (it
used to patch every GPU and GPUNode again, 1,600 GPUs a minute on the Kubernetes benchmark's cluster),
and a status someone else changed is written again at the next read-back."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from scheduler_builders import register_nodes
from tfagent.core.inventory import GpuDevice, NodeInventory
from tfagent.kubernetes_status import KubernetesStatus
from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.kube_local import LocalKubernetes
from tfcommon.ledger.sql import SqlLedger
from tfscheduler.status_writer import StatusWriter

pytestmark = pytest.mark.integration
GPUS = 2


def kubectl(control_plane: LocalKubernetes, *args: str) -> str:
    result = subprocess.run(
        [str(Path(sys.executable).parent / "kubectl"), f"--kubeconfig={control_plane.kubeconfig}", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result.stdout


def available(control_plane: LocalKubernetes, gpu: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(kubectl(control_plane, "get", "gpu", gpu, "-o", "json"))
    return dict(found["status"]["available"])


@pytest.fixture
async def cluster(local_kubernetes: LocalKubernetes) -> AsyncIterator[KubernetesCluster]:
    opened = KubernetesCluster.from_environment(kubeconfig=str(local_kubernetes.kubeconfig))
    try:
        yield opened
    finally:
        opened.close()


async def agent_objects(ledger: SqlLedger, cluster: KubernetesCluster) -> tuple[str, list[str]]:
    """A node with two GPUs in the ledger, and its GPUNode and GPU objects written by the node agent's
    own writer; returns the node and the GPU objects' names."""
    [node] = await register_nodes(ledger, 1, GPUS)
    gpus = [gpu for gpu in await ledger.list_gpus() if gpu.node == node]
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
    return node, [gpu.uuid.lower() for gpu in gpus]


async def test_a_restarted_writer_writes_nothing_unchanged_and_restores_what_someone_else_changed(
    local_kubernetes: LocalKubernetes, ledger: SqlLedger, cluster: KubernetesCluster
) -> None:
    node, gpus = await agent_objects(ledger, cluster)
    first = StatusWriter(ledger, cluster)
    await first.read_back()
    await first.sync()
    expected = available(local_kubernetes, gpus[0])

    restarted = StatusWriter(ledger, cluster)
    assert await restarted.read_back() >= GPUS + 1, "every GPU and GPUNode of the cluster"
    assert await restarted.sync() == 0, "the server already holds what the ledger implies"

    changed = json.dumps({"status": {"available": {"tflops": "1", "vram": "1Gi"}}})
    kubectl(local_kubernetes, "patch", "gpu", gpus[0], "--subresource=status", "--type=merge", "-p", changed)
    assert await restarted.sync() == 0, "between read-backs it writes only what the ledger changes"
    await restarted.read_back()
    assert await restarted.sync() == 1, f"only {gpus[0]}, not {gpus[1]} nor GPUNode {node}"
    assert available(local_kubernetes, gpus[0]) == expected == available(local_kubernetes, gpus[1])
