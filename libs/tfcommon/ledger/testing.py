"""Builders for tests that use the ledger: register a node with GPUs, describe a reservation.

Every call uses fresh, unique names, so tests sharing one database do not collide. Test support only:
no service imports this module.
"""

from __future__ import annotations

from uuid import uuid4

from tfcommon.events import WorkloadRef
from tfcommon.ledger.records import GpuSpec, NodeSpec, ReservationRequest, ShareRequest
from tfcommon.ledger.sql import SqlLedger

GIB = 1024**3


async def a_node_with_gpus(
    ledger: SqlLedger,
    *,
    gpus: int = 1,
    tflops_milli: int = 100_000,
    vram_bytes: int = 80 * GIB,
    pool: str = "default",
) -> tuple[str, list[str]]:
    """Register a node (unique name) with `gpus` GPUs of the given capacity; returns its name and UUIDs."""
    node = f"node-{uuid4().hex[:8]}"
    await ledger.upsert_node(NodeSpec(name=node, pool=pool))
    uuids = [f"gpu-{uuid4()}" for _ in range(gpus)]
    for index, gpu_uuid in enumerate(uuids):
        await ledger.upsert_gpu(
            GpuSpec(
                uuid=gpu_uuid,
                node=node,
                index=index,
                model="H100",
                vendor="NVIDIA",
                capacity_tflops_milli=tflops_milli,
                capacity_vram_bytes=vram_bytes,
            )
        )
    return node, uuids


def a_reservation(
    node: str,
    shares: dict[str, tuple[int, int]],
    *,
    pool: str = "default",
    name: str | None = None,
) -> ReservationRequest:
    """A reservation of `shares` (GPU UUID -> (milli-TFLOPS, bytes)) for a fresh workload."""
    workload_name = name or f"pod-{uuid4().hex[:8]}"
    return ReservationRequest(
        allocation_id=uuid4(),
        workload=WorkloadRef(namespace="team-a", name=workload_name, uid=str(uuid4()), workload="trainer"),
        pool=pool,
        node=node,
        shares=tuple(
            ShareRequest(gpu_uuid=gpu_uuid, tflops_milli=tflops, vram_bytes=vram)
            for gpu_uuid, (tflops, vram) in shares.items()
        ),
        qos="medium",
        isolation="soft",
        cause=uuid4(),
    )
