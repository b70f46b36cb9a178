"""The `GPUNode` and `GPU` objects a node agent keeps in Kubernetes: names, labels, status fields. Pure.

One writer per field. The agent owns what it observes on its node: identity and capacity (GPU `phase`,
`vendor`, `model`, `gpuModel`, `uuid`, `index`, `numaNode`, `capacity`, `nodeSelector`, `usedBy`,
`message`; GPUNode `totalTFlops`, `totalVRAM`, `totalGPUs`, `managedGPUs`, `managedGPUDeviceIDs`,
`hypervisorStatus.hypervisorVersion`: the agent's version) and it
creates both kinds of object. The scheduler owns what the ledger says: GPU `available`, GPUNode
`availableTFlops`, `availableVRAM`, `phase` and `hypervisorStatus.hypervisorState` (from heartbeats: an
agent cannot report its own death),
and GPUPool. Labels are merged key by key, so labels users set (`tensor-fusion.ai/do-not-disrupt`) stay.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tfcommon.pod_spec import GPUPOOL
from tfcommon.quantities import format_bytes, format_milli

from tfagent.core.inventory import GpuDevice, GpuPhase, NodeInventory

POOL_LABEL = GPUPOOL
HOSTNAME_LABEL = "kubernetes.io/hostname"
VENDOR = "NVIDIA"
USED_BY = "tensor-fusion"
MISSING_MESSAGE = "no longer reported by the driver on node {node}; kept until someone deletes it"
Status = dict[str, Any]


@dataclass(frozen=True)
class DesiredObject:
    """The labels the agent merges into an object and the status fields it writes."""

    labels: Mapping[str, str]
    status: Status


@dataclass(frozen=True)
class DesiredObjects:
    """Everything one sync writes: the GPUNode, each GPU in the inventory (by object name) and the phase
    of GPUs this node managed before that are gone from the inventory altogether."""

    node: DesiredObject
    gpus: Mapping[str, DesiredObject]
    vanished: Mapping[str, Status]


def gpu_object_name(uuid: str) -> str:
    """GPU objects are named by the lower-case UUID (`kubectl get gpu gpu-1f2e...`)."""
    return uuid.lower()


def object_labels(node: str, pool: str) -> dict[str, str]:
    return {POOL_LABEL: pool, HOSTNAME_LABEL: node}


def missing_status(node: str) -> Status:
    return {"phase": GpuPhase.UNKNOWN.value, "message": MISSING_MESSAGE.format(node=node)}


def gpu_status(gpu: GpuDevice, node: str) -> Status:
    """`GPU.status` fields the agent owns; a GPU gone missing keeps its figures and says why it is Unknown."""
    status: Status = {
        "phase": gpu.phase.value,
        "vendor": VENDOR,
        "model": gpu.product_name,
        "gpuModel": gpu.model,
        "uuid": gpu.uuid.lower(),
        "index": gpu.index,
        "numaNode": gpu.numa_node if gpu.numa_node is not None else -1,
        "capacity": {"tflops": format_milli(gpu.tflops_milli), "vram": format_bytes(gpu.vram_bytes)},
        "nodeSelector": {HOSTNAME_LABEL: node},
        "usedBy": USED_BY,
        "message": None,
    }
    if gpu.phase is GpuPhase.UNKNOWN:
        status.update(missing_status(node))
    return status


def node_status(inventory: NodeInventory, agent_version: str) -> Status:
    """`GPUNode.status` fields the agent owns: totals over the GPUs present, their UUIDs by index and the
    agent's version."""
    present = sorted((g for g in inventory.gpus if g.phase is GpuPhase.RUNNING), key=lambda g: g.index)
    return {
        "totalTFlops": format_milli(inventory.total_tflops_milli),
        "totalVRAM": format_bytes(inventory.total_vram_bytes),
        "totalGPUs": len(present),
        "managedGPUs": len(present),
        "managedGPUDeviceIDs": [gpu_object_name(g.uuid) for g in present],
        "hypervisorStatus": {"hypervisorVersion": agent_version},
    }


def desired_objects(
    inventory: NodeInventory, pool: str, previously_managed: Iterable[str], *, agent_version: str = "unknown"
) -> DesiredObjects:
    """What the agent writes for `inventory`. `previously_managed` are the GPU names the GPUNode listed
    before (its `managedGPUDeviceIDs`): those no longer in the inventory become `Unknown`, never deleted."""
    labels = object_labels(inventory.node, pool)
    gpus = {
        gpu_object_name(gpu.uuid): DesiredObject(labels, gpu_status(gpu, inventory.node))
        for gpu in inventory.gpus
    }
    vanished = {
        name: missing_status(inventory.node)
        for name in sorted({gpu_object_name(str(n)) for n in previously_managed} - gpus.keys())
    }
    return DesiredObjects(DesiredObject(labels, node_status(inventory, agent_version)), gpus, vanished)
