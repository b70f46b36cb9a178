"""The dashboard's data: pools with their KPIs, nodes with their health and their GPUs split by the
workloads holding them (TFLOPS and VRAM), the allocation table, the pending workloads with the
scheduler's reasons, and each pool's running and last defrag campaign. Pure: a `ClusterSnapshot`
(campaign summaries, pending workloads) in, a JSON-ready mapping out."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tfmetrics.core.series import ClusterSnapshot, GpuState, NodeState, WorkerShare, pool_kpis

GIB = 1024**3
HEARTBEAT_LATE_S = 15.0
"""A node whose last heartbeat is this old is `late` (three of the agent's default 5 s intervals)."""
HEARTBEAT_LOST_S = 60.0
"""A node whose last heartbeat is this old is `lost` (the NodeHeartbeatLost alert's threshold)."""


def _percent(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 2) if whole else 0.0


def heartbeat_age_s(node: NodeState, now: datetime) -> float | None:
    """Seconds since the node's last heartbeat (never negative); None before its first."""
    if node.last_heartbeat_at is None:
        return None
    return round(max((now - node.last_heartbeat_at).total_seconds(), 0.0), 1)


def node_health(node: NodeState, now: datetime) -> str:
    """`ok`, `late`, `lost` (by heartbeat age), `no-heartbeat` (none yet) or `not-ready`."""
    if not node.ready:
        return "not-ready"
    age = heartbeat_age_s(node, now)
    if age is None:
        return "no-heartbeat"
    if age >= HEARTBEAT_LOST_S:
        return "lost"
    return "late" if age >= HEARTBEAT_LATE_S else "ok"


def _gpu_view(gpu: GpuState, shares: list[WorkerShare], usage_percent: float | None) -> dict[str, Any]:
    return {
        "uuid": gpu.uuid,
        "index": gpu.index,
        "model": gpu.model,
        "phase": gpu.phase,
        "capacityTflops": gpu.capacity_tflops_milli / 1000,
        "capacityVramGiB": round(gpu.capacity_vram_bytes / GIB, 2),
        "allocatedTflops": gpu.used_tflops_milli / 1000,
        "allocatedVramGiB": round(gpu.used_vram_bytes / GIB, 2),
        "allocatedTflopsPercent": _percent(gpu.used_tflops_milli, gpu.capacity_tflops_milli),
        "allocatedVramPercent": _percent(gpu.used_vram_bytes, gpu.capacity_vram_bytes),
        "usageComputePercent": usage_percent,
        "segments": [
            {
                "workload": f"{share.namespace}/{share.workload}",
                "pod": share.pod,
                "qos": share.qos,
                "tflopsPercent": _percent(share.request_tflops_milli, gpu.capacity_tflops_milli),
                "vramPercent": _percent(share.request_vram_bytes, gpu.capacity_vram_bytes),
            }
            for share in sorted(shares, key=lambda share: (share.namespace, share.pod))
        ],
    }


def dashboard_view(snapshot: ClusterSnapshot) -> dict[str, Any]:
    """Everything the page draws, in display order (pools, nodes and GPUs by name and index)."""
    shares_by_gpu: dict[str, list[WorkerShare]] = defaultdict(list)
    for share in snapshot.shares:
        shares_by_gpu[share.gpu_uuid].append(share)
    gpus_by_node: dict[str, list[GpuState]] = defaultdict(list)
    for gpu in snapshot.gpus:
        gpus_by_node[gpu.node].append(gpu)
    usage_by_gpu = {sample.uuid: sample.compute_percentage for sample in snapshot.gpu_usage}
    nodes = [
        {
            "name": node.name,
            "pool": node.pool,
            "ready": node.ready,
            "cordoned": node.cordoned,
            "doNotDisrupt": node.do_not_disrupt,
            "lastHeartbeatAt": node.last_heartbeat_at.isoformat() if node.last_heartbeat_at else None,
            "heartbeatAgeS": heartbeat_age_s(node, snapshot.now),
            "health": node_health(node, snapshot.now),
            "gpus": [
                _gpu_view(gpu, shares_by_gpu.get(gpu.uuid, []), usage_by_gpu.get(gpu.uuid))
                for gpu in sorted(gpus_by_node.get(node.name, []), key=lambda gpu: gpu.index)
            ],
        }
        for node in sorted(snapshot.nodes, key=lambda node: node.name)
    ]
    pools = [
        {
            "name": kpis.pool,
            "gpuCount": kpis.gpu_count,
            "wholeIdleGpus": kpis.whole_idle_gpus,
            "allocatedTflopsPercent": _percent(kpis.allocated_tflops_milli, kpis.capacity_tflops_milli),
            "allocatedVramPercent": _percent(kpis.allocated_vram_bytes, kpis.capacity_vram_bytes),
            "largestFitTflops": kpis.largest_fit_tflops_milli / 1000,
            "largestFitVramGiB": round(kpis.largest_fit_vram_bytes / GIB, 2),
            "largestFitGpuShare": kpis.largest_fit_share / 1000,
            "strandedTflops": kpis.stranded_tflops_milli / 1000,
            "strandedVramGiB": round(kpis.stranded_vram_bytes / GIB, 2),
            "fragmentationRate": round(kpis.fragmentation_rate, 4),
        }
        for kpis in pool_kpis(snapshot)
    ]
    node_of = {gpu.uuid: gpu.node for gpu in snapshot.gpus}
    allocations = [
        {
            "allocationId": share.allocation_id,
            "namespace": share.namespace,
            "pod": share.pod,
            "workload": share.workload,
            "qos": share.qos,
            "pool": share.pool,
            "node": node_of.get(share.gpu_uuid, ""),
            "gpu": share.gpu_uuid,
            "tflopsRequest": share.request_tflops_milli / 1000,
            "tflopsLimit": share.limit_tflops_milli / 1000,
            "vramRequestGiB": round(share.request_vram_bytes / GIB, 2),
            "vramLimitGiB": round(share.limit_vram_bytes / GIB, 2),
        }
        for share in sorted(snapshot.shares, key=lambda share: (share.namespace, share.pod, share.gpu_uuid))
    ]
    return {
        "generatedAt": snapshot.now.isoformat(),
        "pools": pools,
        "nodes": nodes,
        "allocations": allocations,
    }


@dataclass(frozen=True)
class PendingWorkload:
    """A workload the scheduler keeps pending, what it asks for per GPU, and why it waits."""

    namespace: str
    name: str
    workload: str
    pool: str
    qos: str
    gpu_count: int
    gpu_model: str | None
    tflops_request_milli: int
    vram_request_bytes: int
    reason: str | None
    submitted_at: datetime


def pending_view(pending: Sequence[PendingWorkload], total: int, now: datetime) -> dict[str, Any]:
    """`workloads` in the given order with how long each has waited, and `total`, every pending one
    (more than listed when the list was cut short)."""
    return {
        "total": max(total, len(pending)),
        "workloads": [
            {
                "namespace": workload.namespace,
                "name": workload.name,
                "workload": workload.workload,
                "pool": workload.pool,
                "qos": workload.qos,
                "gpuCount": workload.gpu_count,
                "gpuModel": workload.gpu_model,
                "tflopsRequest": workload.tflops_request_milli / 1000,
                "vramRequestGiB": round(workload.vram_request_bytes / GIB, 2),
                "reason": workload.reason,
                "submittedAt": workload.submitted_at.isoformat(),
                "waitingS": round(max((now - workload.submitted_at).total_seconds(), 0.0), 1),
            }
            for workload in pending
        ],
    }


@dataclass(frozen=True)
class CampaignSummary:
    """One defrag campaign as the dashboard shows it (node lists reduced to counts)."""

    pool: str
    trigger: str
    running: bool
    started_at: datetime
    finished_at: datetime | None
    deadline_at: datetime | None
    outcome: str | None
    current_node: str | None
    nodes_drained: int
    nodes_failed: int
    nodes_skipped: int
    pods_evicted: int
    stranded_pods: int


def _iso(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def defrag_view(campaigns: Sequence[CampaignSummary]) -> list[dict[str, Any]]:
    """Per pool (by name): `running`, the campaign in progress or None, and `last`, the last finished."""
    by_pool: dict[str, dict[str, Any]] = {}
    for campaign in sorted(campaigns, key=lambda campaign: (campaign.pool, campaign.started_at)):
        entry = by_pool.setdefault(campaign.pool, {"pool": campaign.pool, "running": None, "last": None})
        entry["running" if campaign.running else "last"] = {
            "trigger": campaign.trigger,
            "startedAt": _iso(campaign.started_at),
            "finishedAt": _iso(campaign.finished_at),
            "deadlineAt": _iso(campaign.deadline_at),
            "outcome": campaign.outcome,
            "currentNode": campaign.current_node,
            "nodesDrained": campaign.nodes_drained,
            "nodesFailed": campaign.nodes_failed,
            "nodesSkipped": campaign.nodes_skipped,
            "podsEvicted": campaign.pods_evicted,
            "strandedPods": campaign.stranded_pods,
        }
    return list(by_pool.values())
