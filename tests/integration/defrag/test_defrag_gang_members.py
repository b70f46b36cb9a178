"""The defrag planner never splits a gang (issue 16, item 5): a pod with `tensor-fusion.ai/gang-enabled`
is read into the pool snapshot as a member of its gang (its `gang-group-key`, else its namespace and
controller), and its node is skipped as `gang-member`. Real ledger, local cluster."""

from __future__ import annotations

from uuid import uuid4

import pytest
from defrag_scenario import LocalSeed, node_manifest, pod_manifest
from tfcommon.cluster.local import LocalCluster
from tfcommon.events import WorkloadRef
from tfcommon.ledger.records import GpuSpec, NodeSpec, ReservationRequest, ShareRequest
from tfcommon.ledger.sql import SqlLedger
from tfdefrag.snapshot import load_pool

pytestmark = pytest.mark.integration

GIB = 1 << 30


async def test_a_gang_pod_is_read_as_a_member_of_its_replica_sets_gang(ledger: SqlLedger) -> None:
    tag = uuid4().hex[:8]
    pool, namespace, node = f"pool-{tag}", f"ml-{tag}", f"node-{tag}"
    cluster = LocalCluster()
    seed = LocalSeed(cluster)
    await ledger.upsert_node(NodeSpec(name=node, pool=pool))
    for index in range(2):
        await ledger.upsert_gpu(
            GpuSpec(
                uuid=f"gpu-{node}-{index}",
                node=node,
                index=index,
                model="A100",
                vendor="NVIDIA",
                capacity_tflops_milli=312_000,
                capacity_vram_bytes=80 * GIB,
            )
        )
    seed.put_node(node_manifest(node))
    for name, gang in (("train-0", True), ("serve-0", False)):
        await ledger.reserve(
            ReservationRequest(
                allocation_id=uuid4(),
                workload=WorkloadRef(namespace=namespace, name=name, uid=str(uuid4())),
                pool=pool,
                node=node,
                shares=(
                    ShareRequest(gpu_uuid=f"gpu-{node}-{int(gang)}", tflops_milli=10_000, vram_bytes=GIB),
                ),
            )
        )
        pod = pod_manifest(namespace, name, node)
        pod["metadata"]["annotations"] = {  # type: ignore[index]
            "tensor-fusion.ai/gpupool": pool,
            "tensor-fusion.ai/tflops-request": "10",
            "tensor-fusion.ai/vram-request": "1Gi",
            **(
                {"tensor-fusion.ai/gang-enabled": "true", "tensor-fusion.ai/gang-min-members": "2"}
                if gang
                else {}
            ),
        }
        pod["metadata"]["ownerReferences"] = [  # type: ignore[index]
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": f"{name[:5]}-5d8f",
                "uid": "u",
                "controller": True,
            }
        ]
        seed.put_pod(pod)

    loaded = await load_pool(ledger, cluster, pool)

    gangs = {worker.name: worker.gang for worker in loaded.snapshot.workers}
    assert gangs == {"train-0": f"{namespace}/train-5d8f", "serve-0": None}
