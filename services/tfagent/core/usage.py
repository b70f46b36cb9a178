"""Usage: turn one sampling round into TensorFusion's `tf_gpu_usage` / `tf_worker_usage` rows, and find drift.

Pure: samples, allocations and the pid-to-allocation map come in as values; rows and drift findings come
out. Row field names follow TensorFusion's hypervisor metrics (reference §4.3, the `GpuUsage` and
`WorkerUsage` wire models), so its dashboards and alert SQL keep working.
"""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from uuid import UUID

from tfcommon.events import AllocationCreated, GpuUsage, WorkerUsage, WorkloadRef

from tfagent.core.inventory import GpuDevice


@dataclass(frozen=True)
class GpuSample:
    """One GPU's counters from one sampling round, in the units NVML reports."""

    uuid: str
    utilization_percent: int
    memory_used_bytes: int
    temperature_c: int
    power_mw: int
    pcie_rx_kib_s: int
    pcie_tx_kib_s: int


@dataclass(frozen=True)
class ProcessSample:
    """One process on one GPU; `compute_percent` is None where the driver cannot say."""

    gpu_uuid: str
    pid: int
    memory_used_bytes: int
    compute_percent: int | None = None


@dataclass(frozen=True)
class UsageSample:
    """Everything one sampling round read from the GPUs of a node."""

    gpus: tuple[GpuSample, ...]
    processes: tuple[ProcessSample, ...]


@dataclass(frozen=True)
class WorkerShare:
    """What one allocation holds on one GPU; `vram_limit_bytes` is the most it may use (request if unset)."""

    gpu_uuid: str
    tflops_milli: int
    vram_bytes: int
    vram_limit_bytes: int | None = None

    @property
    def effective_vram_limit_bytes(self) -> int:
        return self.vram_bytes if self.vram_limit_bytes is None else self.vram_limit_bytes


@dataclass(frozen=True)
class WorkerAllocation:
    """An allocation placed on this node, as the agent knows it (from the allocation events)."""

    allocation_id: UUID
    workload: WorkloadRef
    pool: str
    shares: tuple[WorkerShare, ...]
    qos: str = "medium"
    isolation: str = "soft"

    @classmethod
    def from_event(cls, event: AllocationCreated) -> WorkerAllocation:
        return cls(
            allocation_id=event.allocation_id,
            workload=event.workload,
            pool=event.pool,
            shares=tuple(
                WorkerShare(share.gpu_uuid.lower(), share.tflops_milli, share.vram_bytes)
                for share in event.shares
            ),
            qos=event.qos,
            isolation=event.isolation,
        )

    @property
    def worker(self) -> str:
        return self.workload.name

    @property
    def gpu_uuids(self) -> tuple[str, ...]:
        return tuple(share.gpu_uuid for share in self.shares)

    def share_on(self, gpu_uuid: str) -> WorkerShare | None:
        return next((share for share in self.shares if share.gpu_uuid == gpu_uuid), None)


@dataclass(frozen=True)
class NodeUsage:
    """One batched usage round for one node: `tf_gpu_usage` rows and `tf_worker_usage` rows."""

    gpus: tuple[GpuUsage, ...]
    workers: tuple[WorkerUsage, ...]


class DriftKind(StrEnum):
    """Accounting drift the agent surfaces: what runs on a GPU disagrees with the ledger."""

    PROCESS_WITHOUT_ALLOCATION = "process-without-allocation"
    VRAM_OVER_LIMIT = "vram-over-limit"


@dataclass(frozen=True)
class Drift:
    """One drift finding; `key` identifies it across rounds so it is reported once, when it starts."""

    kind: DriftKind
    gpu_uuid: str
    used_bytes: int
    pid: int | None = None
    allocation: WorkerAllocation | None = None
    limit_bytes: int | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        if self.kind is DriftKind.PROCESS_WITHOUT_ALLOCATION:
            return (self.kind.value, self.gpu_uuid, str(self.pid))
        allocation_id = None if self.allocation is None else self.allocation.allocation_id
        return (self.kind.value, self.gpu_uuid, str(allocation_id))

    @property
    def detail(self) -> str:
        if self.kind is DriftKind.PROCESS_WITHOUT_ALLOCATION:
            return (
                f"process {self.pid} uses {self.used_bytes} bytes of VRAM on GPU {self.gpu_uuid} but holds "
                "no allocation on it; find it with nvidia-smi and stop it, or run it through the pool"
            )
        if self.allocation is None:
            return f"unattributed VRAM use of {self.used_bytes} bytes on GPU {self.gpu_uuid}"
        workload = self.allocation.workload
        return (
            f"workload {workload.namespace}/{workload.name} uses {self.used_bytes} bytes of VRAM on GPU "
            f"{self.gpu_uuid}, over its limit of {self.limit_bytes} bytes; raise its "
            "tensor-fusion.ai/vram-limit or reduce its memory use"
        )


def _percent(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 2) if whole > 0 else 0.0


def build_node_usage(
    devices: Sequence[GpuDevice],
    sample: UsageSample,
    allocations: Sequence[WorkerAllocation],
    owners: Mapping[int, UUID],
) -> NodeUsage:
    """The batched `tf_gpu_usage` and `tf_worker_usage` rows for one round.

    `owners` maps a pid to the allocation that started it; processes without an owner count towards the
    GPU's figures but towards no worker (they are drift, see `detect_drift`). Every allocation gets a row
    per GPU it holds, zero while none of its processes run.
    """
    by_uuid = {device.uuid: device for device in devices}
    gpu_rows = tuple(
        GpuUsage(
            uuid=gpu.uuid,
            compute_percentage=float(gpu.utilization_percent),
            compute_tflops_milli=gpu.utilization_percent * by_uuid[gpu.uuid].tflops_milli // 100,
            memory_bytes=gpu.memory_used_bytes,
            memory_percentage=_percent(gpu.memory_used_bytes, by_uuid[gpu.uuid].vram_bytes),
            temperature=gpu.temperature_c,
            power_usage=gpu.power_mw // 1000,
            rx=gpu.pcie_rx_kib_s,
            tx=gpu.pcie_tx_kib_s,
        )
        for gpu in sample.gpus
        if gpu.uuid in by_uuid
    )
    known = {allocation.allocation_id for allocation in allocations}
    memory: dict[tuple[UUID, str], int] = defaultdict(int)
    compute: dict[tuple[UUID, str], int] = defaultdict(int)
    for process in sample.processes:
        owner = owners.get(process.pid)
        if owner is None or owner not in known:
            continue
        memory[(owner, process.gpu_uuid)] += process.memory_used_bytes
        compute[(owner, process.gpu_uuid)] += process.compute_percent or 0
    worker_rows: list[WorkerUsage] = []
    for allocation in allocations:
        for share in allocation.shares:
            device = by_uuid.get(share.gpu_uuid)
            if device is None:
                continue
            key = (allocation.allocation_id, share.gpu_uuid)
            compute_percent = min(compute[key], 100)
            worker_rows.append(
                WorkerUsage(
                    uuid=share.gpu_uuid,
                    namespace=allocation.workload.namespace,
                    pod_name=allocation.workload.name,
                    workload=allocation.workload.workload or allocation.workload.name,
                    worker=allocation.worker,
                    allocation_id=allocation.allocation_id,
                    compute_percentage=float(compute_percent),
                    compute_tflops_milli=compute_percent * device.tflops_milli // 100,
                    memory_bytes=memory[key],
                    memory_percentage=_percent(memory[key], share.effective_vram_limit_bytes),
                )
            )
    return NodeUsage(gpus=gpu_rows, workers=tuple(worker_rows))


def detect_drift(
    processes: Iterable[ProcessSample],
    allocations: Sequence[WorkerAllocation],
    owners: Mapping[int, UUID],
) -> tuple[Drift, ...]:
    """Drift in one round: a process on a GPU its owner holds nothing on, and allocations over their limit."""
    allocation_by_id = {allocation.allocation_id: allocation for allocation in allocations}
    findings: list[Drift] = []
    used: dict[tuple[UUID, str], int] = defaultdict(int)
    for process in processes:
        owner_id = owners.get(process.pid)
        owner = None if owner_id is None else allocation_by_id.get(owner_id)
        if owner is None or owner.share_on(process.gpu_uuid) is None:
            findings.append(
                Drift(
                    kind=DriftKind.PROCESS_WITHOUT_ALLOCATION,
                    gpu_uuid=process.gpu_uuid,
                    used_bytes=process.memory_used_bytes,
                    pid=process.pid,
                    allocation=owner,
                )
            )
            continue
        used[(owner.allocation_id, process.gpu_uuid)] += process.memory_used_bytes
    for (allocation_id, gpu_uuid), used_bytes in used.items():
        allocation = allocation_by_id[allocation_id]
        share = allocation.share_on(gpu_uuid)
        if share is not None and used_bytes > share.effective_vram_limit_bytes:
            findings.append(
                Drift(
                    kind=DriftKind.VRAM_OVER_LIMIT,
                    gpu_uuid=gpu_uuid,
                    used_bytes=used_bytes,
                    allocation=allocation,
                    limit_bytes=share.effective_vram_limit_bytes,
                )
            )
    return tuple(findings)


def drift_started(
    already_reported: Collection[tuple[str, str, str]], current: Iterable[Drift]
) -> tuple[Drift, ...]:
    """The findings of this round that were not found in the previous one: each drift is published once."""
    return tuple(drift for drift in current if drift.key not in already_reported)


_POD_UID = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})")


def pod_uid_from_cgroup(cgroup_text: str) -> str | None:
    """The Kubernetes pod UID in a `/proc/<pid>/cgroup` file (cgroupfs or systemd driver), else None."""
    match = _POD_UID.search(cgroup_text)
    return None if match is None else match.group(1).replace("_", "-")


def owners_by_pod_uid(
    pod_uid_by_pid: Mapping[int, str], allocations: Iterable[WorkerAllocation]
) -> dict[int, UUID]:
    """Map pids to allocations through their pod UID (Kubernetes mode)."""
    by_pod = {a.workload.uid: a.allocation_id for a in allocations if a.workload.uid is not None}
    return {pid: by_pod[pod_uid] for pid, pod_uid in pod_uid_by_pid.items() if pod_uid in by_pod}
