"""The hypervisor API on :8001 (TensorFusion-compatible paths and `{"data": ...}` / `{"error": ...}` bodies).

Reads come from the `NodeAgent`'s live state. Mutating endpoints (discover, and snapshot and resume where
a checkpoint backend exists) require `Authorization: Bearer <TF_API_TOKEN>`, compared in constant time;
TensorFusion's own API has no auth. Without a checkpoint backend, snapshot and resume change nothing: like
TensorFusion's they answer 404 for an unknown worker, else 501, whatever the token, with how to move the
workload instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any
from uuid import UUID

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse
from pydantic import SecretStr

from tfagent.agent import NodeAgent
from tfagent.auth import RefusingRoute, bearer_token
from tfagent.core.inventory import GpuDevice
from tfagent.core.usage import WorkerAllocation
from tfagent.ports import CheckpointBackend

SNAPSHOT_UNAVAILABLE = "GPU context snapshot is not available on this node"
HOW_TO_MOVE_A_WORKLOAD = (
    "Restart the workload elsewhere: cordon the node and delete the pod (its controller recreates it on "
    "another node), or let node compaction and defragmentation move it; the process restarts and reloads.",
    "Add a PodDisruptionBudget and run at least two replicas behind a Service, so a restart does not "
    "interrupt it (defragmentation skips workloads without a PodDisruptionBudget).",
    "Keep a node out of automatic moves with "
    "`kubectl label gpunode <node> tensor-fusion.ai/do-not-disrupt=true`.",
)


def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


def device_json(gpu: GpuDevice) -> dict[str, Any]:
    return {
        "uuid": gpu.uuid,
        "index": gpu.index,
        "vendor": "nvidia",
        "model": gpu.model,
        "product_name": gpu.product_name,
        "capacity": {"tflops_milli": gpu.tflops_milli, "vram_bytes": gpu.vram_bytes},
        "capacity_source": gpu.capacity_source,
        "pci_bus_id": gpu.pci_bus_id,
        "numa_node": gpu.numa_node,
        "nvlink_peers": list(gpu.nvlink_peers),
        "mig_enabled": gpu.mig_enabled,
        "phase": gpu.phase.value,
        "missing_since": None if gpu.missing_since is None else gpu.missing_since.isoformat(),
        "simulated": gpu.simulated,
    }


def worker_json(allocation: WorkerAllocation) -> dict[str, Any]:
    return {
        "worker_uid": str(allocation.allocation_id),
        "worker": allocation.worker,
        "namespace": allocation.workload.namespace,
        "workload": allocation.workload.workload or allocation.workload.name,
        "pod_uid": allocation.workload.uid,
        "pool": allocation.pool,
        "qos": allocation.qos,
        "isolation": allocation.isolation,
        "devices": list(allocation.gpu_uuids),
        "shares": [
            {
                "gpu_uuid": share.gpu_uuid,
                "tflops_milli": share.tflops_milli,
                "vram_bytes": share.vram_bytes,
                "vram_limit_bytes": share.effective_vram_limit_bytes,
            }
            for share in allocation.shares
        ],
    }


WorkerProcesses = Callable[[UUID], Mapping[str, Any] | None]


def build_router(
    agent: NodeAgent,
    api_token: SecretStr | None,
    checkpoint: CheckpointBackend | None = None,
    processes: WorkerProcesses | None = None,
) -> APIRouter:
    """The hypervisor API routes over `agent`; `api_token` unset means mutating endpoints are refused.
    Without `checkpoint`, snapshot and resume take no token: they only answer 501 (or 404).
    `processes` gives the `tfctl run` process of an allocation (shown as `process` on workers)."""
    router = APIRouter(prefix="/api/v1", tags=["hypervisor"], route_class=RefusingRoute)
    token_needed = [
        Depends(
            bearer_token(
                api_token,
                disabled="mutating endpoints are disabled: set TF_API_TOKEN on the agent and send it as a "
                "bearer token",
            )
        )
    ]

    def with_process(allocation: WorkerAllocation) -> dict[str, Any]:
        worker = worker_json(allocation)
        process = None if processes is None else processes(allocation.allocation_id)
        return worker if process is None else {**worker, "process": dict(process)}

    def node_json() -> dict[str, Any]:
        inventory = agent.inventory
        return {
            "name": agent.node,
            "pool": agent.pool,
            "driver_version": None if inventory is None else inventory.driver_version,
            "cuda_version": None if inventory is None else inventory.cuda_version,
            "simulated": None if inventory is None else inventory.simulated,
            "warnings": [] if inventory is None else list(inventory.warnings),
            "checkpoint_backend": None if checkpoint is None else checkpoint.name,
        }

    def devices() -> list[dict[str, Any]]:
        return [] if agent.inventory is None else [device_json(gpu) for gpu in agent.inventory.gpus]

    @router.get("/devices")
    async def list_devices() -> dict[str, Any]:
        return {"data": devices(), "node": node_json()}

    @router.get("/devices/{uuid}", response_model=None)
    async def get_device(uuid: str) -> dict[str, Any] | JSONResponse:
        gpu = None if agent.inventory is None else agent.inventory.gpu(uuid)
        if gpu is None:
            return _error(
                404, f"no GPU {uuid.lower()!r} on node {agent.node}; GET /api/v1/devices lists them"
            )
        return {"data": device_json(gpu)}

    @router.post("/devices/discover", response_model=None, dependencies=token_needed)
    async def discover() -> dict[str, Any]:
        change = await agent.rediscover()
        return {
            "data": devices(),
            "appeared": [gpu.uuid for gpu in change.appeared],
            "went_missing": [gpu.uuid for gpu in change.went_missing],
            "removed": [gpu.uuid for gpu in change.removed],
        }

    @router.get("/workers")
    async def list_workers() -> dict[str, Any]:
        return {"data": [with_process(allocation) for allocation in agent.allocations()]}

    @router.get("/workers/{worker_id}", response_model=None)
    async def get_worker(worker_id: str) -> dict[str, Any] | JSONResponse:
        allocation = agent.allocation(worker_id)
        if allocation is None:
            return _unknown_worker(worker_id, agent.node)
        metrics: dict[str, dict[str, dict[str, Any]]] = {uuid: {} for uuid in allocation.gpu_uuids}
        sampled = agent.last_sampled
        if sampled is not None:
            for process in sampled.sample.processes:
                if sampled.owners.get(process.pid) == allocation.allocation_id:
                    metrics.setdefault(process.gpu_uuid, {})[str(process.pid)] = {
                        "memory_bytes": process.memory_used_bytes,
                        "compute_percentage": process.compute_percent,
                    }
        return {
            "data": {
                "worker_uid": str(allocation.allocation_id),
                "allocation": with_process(allocation),
                "metrics": metrics,
                "sampled_at": None if sampled is None else sampled.at.isoformat(),
            }
        }

    async def checkpoint_action(worker_id: str, action: str) -> dict[str, Any] | JSONResponse:
        allocation = agent.allocation(worker_id)
        if allocation is None:
            return _unknown_worker(worker_id, agent.node)
        if checkpoint is None:
            return _error(
                501,
                SNAPSHOT_UNAVAILABLE,
                worker_uid=str(allocation.allocation_id),
                action=action,
                how_to_move_the_workload=list(HOW_TO_MOVE_A_WORKLOAD),
            )
        run = checkpoint.snapshot if action == "snapshot" else checkpoint.resume
        return {"data": dict(await run(allocation))}

    checkpoint_token = [] if checkpoint is None else token_needed

    @router.post("/workers/{worker_id}/snapshot", response_model=None, dependencies=checkpoint_token)
    async def snapshot(worker_id: str) -> dict[str, Any] | JSONResponse:
        return await checkpoint_action(worker_id, "snapshot")

    @router.post("/workers/{worker_id}/resume", response_model=None, dependencies=checkpoint_token)
    async def resume(worker_id: str) -> dict[str, Any] | JSONResponse:
        return await checkpoint_action(worker_id, "resume")

    return router


def _unknown_worker(worker_id: str, node: str) -> JSONResponse:
    return _error(404, f"no worker {worker_id!r} on node {node}; GET /api/v1/workers lists them")
