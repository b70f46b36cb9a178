"""The status the scheduler writes on the `GPU`, `GPUNode` and `GPUPool` custom resources. Pure.

Built from ledger facts only (capacity and requests per GPU, node readiness, heartbeats and pool, the
active allocations), so every scheduler replica computes the same values. Quantities are Kubernetes
quantity strings: TFLOPS as `format_milli` (`100`, `12500m`), VRAM as `format_bytes` (`80Gi`).
Available = capacity - requests. The pods on each GPU are TensorFusion's `PodGPUInfo` (name, namespace,
uid, requests and limits on that GPU, QoS, `isExternal` false): under GPU `runningApps`, grouped by
workload (the pod's controller, else the pod), and under GPUNode `allocatedPods`, keyed by GPU object
name (every GPU of the node, `[]` when idle), with `totalGPUPods` the node's distinct pods.

One writer per field: the scheduler owns exactly the fields these functions return; every other
status field (the GPUPool's `lastCompactionTime` and `lastDefragTime`, written by the defrag planner)
is left alone, because the shell writes with a merge patch of these fields only.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from tfcommon.placement.from_ledger import AllocationFacts, GpuFacts, NodeFacts
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


def gpu_object_name(gpu: GpuFacts) -> str:
    """The GPU object's name: its lower-case UUID (the node agent creates it so)."""
    return gpu.uuid.lower()


def pod_gpu_info(allocation: AllocationFacts, gpu_uuid: str) -> Status:
    """TensorFusion's `PodGPUInfo` of an allocation on one of its GPUs: what it holds there."""
    share = next((s for s in allocation.shares if s.gpu_uuid == gpu_uuid), None)
    workload = allocation.workload
    info: Status = {"name": workload.name, "namespace": workload.namespace}
    if workload.uid:
        info["uid"] = workload.uid
    if share is not None:
        info["requests"] = {
            "tflops": format_milli(share.tflops_milli),
            "vram": format_bytes(share.vram_bytes),
        }
        info["limits"] = {
            "tflops": format_milli(share.limit_tflops_milli),
            "vram": format_bytes(share.limit_vram_bytes),
        }
    info["qos"] = allocation.qos
    info["isExternal"] = False
    return info


def _pod_order(allocation: AllocationFacts) -> tuple[str, str, str]:
    return (allocation.workload.namespace, allocation.workload.name, allocation.workload.uid or "")


def running_apps(gpu_uuid: str, allocations: Iterable[AllocationFacts]) -> list[Status]:
    """GPU `runningApps`: the pods on the GPU grouped by workload (its controller's name, else the pod's),
    in name order, each with its pods and their count."""
    apps: dict[tuple[str, str], list[Status]] = {}
    for allocation in sorted(allocations, key=_pod_order):
        workload = allocation.workload
        key = (workload.namespace, workload.workload or workload.name)
        apps.setdefault(key, []).append(pod_gpu_info(allocation, gpu_uuid))
    return [
        {"name": name, "namespace": namespace, "count": len(pods), "pods": pods}
        for (namespace, name), pods in sorted(apps.items(), key=lambda item: (item[0][1], item[0][0]))
    ]


def gpu_status(gpu: GpuFacts, allocations: Iterable[AllocationFacts] = ()) -> Status:
    """`GPU.status`: model, uuid, index, phase, node, capacity, available (capacity - requests) and
    `runningApps` (the `allocations` holding a share of it)."""
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
        "runningApps": running_apps(gpu.uuid, allocations),
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


def node_status(
    node: NodeFacts | None, gpus: Iterable[GpuFacts], allocations: Iterable[AllocationFacts] = ()
) -> Status:
    """`GPUNode.status`: phase (also `hypervisorStatus.hypervisorState`, TensorFusion's name for whether
    the node's agent is alive, with `lastHeartbeatTime`, its last heartbeat), totals and availability
    over its GPUs, the GPUs it manages, the pods on each GPU (`allocatedPods`) and how many pods use its
    GPUs (`totalGPUPods`)."""
    listed = sorted(gpus, key=lambda g: g.index)
    placed = sorted(allocations, key=_pod_order)
    phase = node_phase(node)
    hypervisor: Status = {"hypervisorState": phase}
    if node is not None and node.last_heartbeat_at is not None:
        hypervisor["lastHeartbeatTime"] = node.last_heartbeat_at.strftime("%Y-%m-%dT%H:%M:%SZ")
    status = {"phase": phase, "hypervisorStatus": hypervisor, **_totals(listed)}
    status["managedGPUs"] = len(listed)
    status["managedGPUDeviceIDs"] = [g.uuid.lower() for g in listed]
    status["allocatedPods"] = {
        gpu_object_name(g): [
            pod_gpu_info(a, g.uuid) for a in placed if any(s.gpu_uuid == g.uuid for s in a.shares)
        ]
        for g in listed
    }
    status["totalGPUPods"] = len({a.allocation_id for a in placed})
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
    allocations: Iterable[AllocationFacts] = (),
    *,
    in_pool: Callable[[str, str], bool] | None = None,
) -> DesiredStatus:
    """Every GPU, GPUNode and GPUPool status the ledger implies, with the pods of the active
    `allocations` on each GPU and node. `in_pool(node, pool)` false leaves a node out of its pool's
    totals (its labels miss the pool's nodeSelector)."""
    by_gpu: dict[str, list[AllocationFacts]] = {}
    by_node: dict[str, list[AllocationFacts]] = {}
    for allocation in allocations:
        by_node.setdefault(allocation.node, []).append(allocation)
        for share in allocation.shares:
            by_gpu.setdefault(share.gpu_uuid, []).append(allocation)
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
        gpus={
            gpu_object_name(g): gpu_status(g, by_gpu.get(g.uuid, ()))
            for node_gpus in gpus_by_node.values()
            for g in node_gpus
        },
        nodes={
            name: node_status(node_by_name.get(name), g, by_node.get(name, ()))
            for name, g in gpus_by_node.items()
        },
        pools={pool: pool_status(n, g) for pool, (n, g) in pools.items()},
    )


def heartbeat_only_change(written: Status | None, status: Status, every_s: float) -> bool:
    """Whether a GPUNode `status` differs from what was `written` only in
    `hypervisorStatus.lastHeartbeatTime`, and by less than `every_s`: such a change need not be written
    (a heartbeat every few seconds on every node is not a write each)."""
    if written is None:
        return False
    old_beat, old = _split_heartbeat(written)
    new_beat, new = _split_heartbeat(status)
    if old != new or old_beat is None or new_beat is None:
        return False
    try:
        moved = abs((_timestamp(new_beat) - _timestamp(old_beat)).total_seconds())
    except ValueError:
        return False
    return moved < every_s


def _split_heartbeat(status: Status) -> tuple[str | None, Status]:
    hypervisor = dict(status.get("hypervisorStatus") or {})
    beat = hypervisor.pop("lastHeartbeatTime", None)
    return (beat if isinstance(beat, str) else None), {**status, "hypervisorStatus": hypervisor}


def _timestamp(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
