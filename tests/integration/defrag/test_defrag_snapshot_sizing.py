"""The defrag planner's pool snapshot, read from a real ledger: nodes built by the scheduler's rules and a
compute-percent worker sized in percent of the card it would move to, as the scheduler sizes it."""

from __future__ import annotations

from datetime import UTC, datetime
from uuid import uuid4

import pytest
from defrag_scenario import LocalSeed, node_manifest, pod_manifest
from tfcommon.cluster.local import LocalCluster
from tfcommon.events import WorkloadRef
from tfcommon.ledger.records import GpuSpec, NodeSpec, ReservationRequest, ShareRequest
from tfcommon.ledger.sql import SqlLedger
from tfcommon.placement import Placement, place, policy
from tfdefrag.snapshot import load_pool
from tfscheduler.core.view import build_snapshot

pytestmark = pytest.mark.integration

GIB = 1 << 30


async def test_a_percent_worker_fits_a_smaller_card_and_both_services_see_the_same_gpus(
    ledger: SqlLedger,
) -> None:
    tag = uuid4().hex[:8]
    pool, namespace, source, target = f"pool-{tag}", f"ml-{tag}", f"src-{tag}", f"dst-{tag}"
    cluster = LocalCluster()
    seed = LocalSeed(cluster)
    cards = {
        source: ("A100", 312_000, 80 * GIB, ("Running",)),
        target: ("L4", 121_000, 24 * GIB, ("Updating", "Running")),
    }
    for node, (model, tflops, vram, phases) in cards.items():
        await ledger.upsert_node(
            NodeSpec(name=node, pool=pool, cpu_allocatable_milli=64_000, memory_allocatable_bytes=256 * GIB)
        )
        for index, phase in enumerate(phases):
            await ledger.upsert_gpu(
                GpuSpec(
                    uuid=f"gpu-{node}-{index}",
                    node=node,
                    index=index,
                    model=model,
                    vendor="NVIDIA",
                    capacity_tflops_milli=tflops,
                    capacity_vram_bytes=vram,
                    phase=phase,  # type: ignore[arg-type]
                )
            )
        seed.put_node(node_manifest(node))
    # 50 % of the A100 (156 TFLOPS) with 10Gi, as the scheduler reserved it for the pod's annotations.
    await ledger.reserve(
        ReservationRequest(
            allocation_id=uuid4(),
            workload=WorkloadRef(namespace=namespace, name="trainer", uid=str(uuid4())),
            pool=pool,
            node=source,
            shares=(ShareRequest(gpu_uuid=f"gpu-{source}-0", tflops_milli=156_000, vram_bytes=10 * GIB),),
        )
    )
    pod = pod_manifest(namespace, "trainer", source)
    pod["metadata"]["annotations"] = {  # type: ignore[index]
        "tensor-fusion.ai/gpupool": pool,
        "tensor-fusion.ai/compute-percent-request": "50",
        "tensor-fusion.ai/vram-request": "10Gi",
    }
    seed.put_pod(pod)

    loaded = await load_pool(ledger, cluster, pool)

    [worker] = loaded.snapshot.workers
    assert worker.request.compute_percent == 50
    by_name = {pool_node.name: pool_node.node for pool_node in loaded.snapshot.nodes}
    scheduler = build_snapshot(
        [n for n in await ledger.list_nodes() if n.pool == pool],
        await ledger.list_gpus(),
        [a for a in await ledger.active_allocations() if a.pool == pool],
        datetime.now(UTC),
    )
    assert by_name[target].gpus == scheduler.nodes[target].gpus
    assert by_name[source].gpus == scheduler.nodes[source].gpus
    moved = place(worker.request, [by_name[target]], policy("tfpool"))
    assert isinstance(moved, Placement), moved
    # GPU 0 is Updating, so full; GPU 1 takes 50 % of an L4 (60 whole TFLOPS), where 156 would not fit.
    assert (moved.gpu_indices, moved.tflops_milli, moved.vram_bytes) == ((1,), (60_000,), (10 * GIB,))
