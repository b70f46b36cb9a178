"""The status the scheduler writes on the `GPU`, `GPUNode` and `GPUPool` custom resources. Pure.

Built from ledger facts only (capacity and requests per GPU, node readiness and pool), so every
scheduler replica computes the same values. Quantities are Kubernetes quantity strings: TFLOPS as
`format_milli` (`100`, `12500m`), VRAM as `format_bytes` (`80Gi`). Available = capacity - requests.

One writer per field: the scheduler owns exactly the fields these functions return; every other
status field (the GPUPool's `lastCompactionTime` and `lastDefragTime`, written by the defrag planner)
is left alone, because the shell writes with a merge patch of these fields only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from tfcommon.placement.from_ledger import GpuFacts, NodeFacts
from tfcommon.quantities import format_bytes, format_milli

HOSTNAME_LABEL = "kubernetes.io/hostname"
Status = dict[str, Any]


@dataclass(frozen=True)
class DesiredStatus:
    """Status per object name for each kind; GPU objects are named by their lower-case UUID."""

    gpus: Mapping[str, Status]
    nodes: Mapping[str, Status]
    pools: Mapping[str, Status]


def _available(capacity: int, used: int) -> int:
    return max(capacity - used, 0)


def gpu_status(gpu: GpuFacts) -> Status:
    """`GPU.status`: model, uuid, index, phase, node, capacity and available (capacity - requests)."""
    return {
        "phase": gpu.phase,
        "vendor": gpu.vendor,
        "model": gpu.model,
        "gpuModel": gpu.model,
        "uuid": gpu.uuid.lower(),
        "index": gpu.index,
        "numaNode": gpu.numa_node if gpu.numa_node is not None else -1,
        "capacity": {
            "tflops": format_milli(gpu.capacity_tflops_milli),
            "vram": format_bytes(gpu.capacity_vram_bytes),
        },
        "available": {
            "tflops": format_milli(_available(gpu.capacity_tflops_milli, gpu.used_tflops_milli)),
            "vram": format_bytes(_available(gpu.capacity_vram_bytes, gpu.used_vram_bytes)),
        },
        "nodeSelector": {HOSTNAME_LABEL: gpu.node},
        "usedBy": "tensor-fusion",
    }


def _totals(gpus: Iterable[GpuFacts]) -> Status:
    listed = list(gpus)
    return {
        "totalTFlops": format_milli(sum(g.capacity_tflops_milli for g in listed)),
        "totalVRAM": format_bytes(sum(g.capacity_vram_bytes for g in listed)),
        "availableTFlops": format_milli(
            sum(_available(g.capacity_tflops_milli, g.used_tflops_milli) for g in listed)
        ),
        "availableVRAM": format_bytes(
            sum(_available(g.capacity_vram_bytes, g.used_vram_bytes) for g in listed)
        ),
        "totalGPUs": len(listed),
    }


def node_phase(node: NodeFacts | None) -> str:
    """`Running` while the node agent reports ready, `Unknown` otherwise (or before it registered)."""
    return "Running" if node is not None and node.ready else "Unknown"


def node_status(node: NodeFacts | None, gpus: Iterable[GpuFacts]) -> Status:
    """`GPUNode.status`: phase (also `hypervisorStatus.hypervisorState`, TensorFusion's name for whether
    the node's agent is alive), totals and availability over its GPUs, and the GPUs it manages."""
    listed = sorted(gpus, key=lambda g: g.index)
    phase = node_phase(node)
    status = {"phase": phase, "hypervisorStatus": {"hypervisorState": phase}, **_totals(listed)}
    status["managedGPUs"] = len(listed)
    status["managedGPUDeviceIDs"] = [g.uuid.lower() for g in listed]
    return status


def pool_status(nodes: Iterable[NodeFacts], gpus: Iterable[GpuFacts]) -> Status:
    """`GPUPool.status`: node counts, phase, totals and availability over the pool's GPUs."""
    listed_nodes = list(nodes)
    ready = sum(1 for n in listed_nodes if n.ready)
    return {
        "phase": "Running" if ready else "Pending",
        "totalNodes": len(listed_nodes),
        "readyNodes": ready,
        "notReadyNodes": len(listed_nodes) - ready,
        **_totals(gpus),
    }


def desired_status(
    nodes: Iterable[NodeFacts],
    gpus: Iterable[GpuFacts],
    *,
    in_pool: Callable[[str, str], bool] | None = None,
) -> DesiredStatus:
    """Every GPU, GPUNode and GPUPool status the ledger implies. `in_pool(node, pool)` false leaves a
    node out of its pool's totals (its labels miss the pool's nodeSelector)."""
    node_by_name = {n.name: n for n in nodes}
    gpus_by_node: dict[str, list[GpuFacts]] = {name: [] for name in node_by_name}
    for gpu in gpus:
        gpus_by_node.setdefault(gpu.node, []).append(gpu)
    pools: dict[str, tuple[list[NodeFacts], list[GpuFacts]]] = {}
    for name, node_gpus in gpus_by_node.items():
        node = node_by_name.get(name)
        if node is None:
            continue
        members = pools.setdefault(node.pool, ([], []))
        if in_pool is not None and not in_pool(name, node.pool):
            continue
        members[0].append(node)
        members[1].extend(node_gpus)
    return DesiredStatus(
        gpus={g.uuid.lower(): gpu_status(g) for node_gpus in gpus_by_node.values() for g in node_gpus},
        nodes={name: node_status(node_by_name.get(name), g) for name, g in gpus_by_node.items()},
        pools={pool: pool_status(n, g) for pool, (n, g) in pools.items()},
    )
