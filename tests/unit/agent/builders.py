"""Readable builders for the agent's tests: GPUs, allocations and samples."""

from __future__ import annotations

from uuid import UUID, uuid4

from tfagent.core.inventory import GpuDevice, NodeInventory
from tfagent.core.usage import WorkerAllocation, WorkerShare
from tfcommon.events import WorkloadRef
from tfcommon.gpu_models import GIB


def a_gpu(
    uuid: str = "gpu-aaaa", index: int = 0, tflops_milli: int = 1_000_000, vram_gib: int = 80
) -> GpuDevice:
    return GpuDevice(
        uuid=uuid,
        index=index,
        model="H100",
        product_name="NVIDIA H100 80GB HBM3",
        tflops_milli=tflops_milli,
        vram_bytes=vram_gib * GIB,
        pci_bus_id=f"00000000:{index + 16:02X}:00.0",
        numa_node=0,
        nvlink_peers=(),
        mig_enabled=False,
        capacity_source="test",
    )


def an_inventory(*gpus: GpuDevice, node: str = "node-a") -> NodeInventory:
    return NodeInventory(node=node, driver_version="570.86.15", cuda_version="12.8", gpus=gpus)


def an_allocation(
    *shares: WorkerShare, name: str = "train-0", namespace: str = "ml", allocation_id: UUID | None = None
) -> WorkerAllocation:
    return WorkerAllocation(
        allocation_id=allocation_id or uuid4(),
        workload=WorkloadRef(namespace=namespace, name=name, uid=str(uuid4()), workload="train"),
        pool="default",
        shares=shares,
    )


def a_share(
    gpu_uuid: str = "gpu-aaaa", tflops_milli: int = 250_000, vram_gib: int = 20, limit_gib: int | None = None
) -> WorkerShare:
    return WorkerShare(gpu_uuid, tflops_milli, vram_gib * GIB, None if limit_gib is None else limit_gib * GIB)
