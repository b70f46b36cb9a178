"""The defrag planner never splits a gang (issue 16, item 5): a pod with `tensor-fusion.ai/gang-enabled`
is read into the pool snapshot as a member of its gang (its `gang-group-key`, else its namespace and
controller), and its node is skipped as `gang-member`. Real ledger, local cluster."""

from __future__ import annotations

from uuid import uuid4

import pytest
from defrag_scenario import LocalSeed, node_manifest, pod_manifest, register_node, reserve
from tfcommon.cluster.local import LocalCluster
from tfcommon.ledger.sql import SqlLedger
from tfdefrag.snapshot import load_pool

pytestmark = pytest.mark.integration


async def test_a_gang_pod_is_read_as_a_member_of_its_replica_sets_gang(ledger: SqlLedger) -> None:
    tag = uuid4().hex[:8]
    pool, namespace, node = f"pool-{tag}", f"ml-{tag}", f"node-{tag}"
    cluster = LocalCluster()
    seed = LocalSeed(cluster)
    await register_node(ledger, pool, node)
    seed.put_node(node_manifest(node))
    for name, gang in (("train-0", True), ("serve-0", False)):
        await reserve(ledger, pool, namespace, name, node, f"gpu-{node}-{int(gang)}", 100)
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
