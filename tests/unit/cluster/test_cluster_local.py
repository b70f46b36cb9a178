"""Local mode: an evicted workload comes back as a new pending one for the scheduler to place."""

from __future__ import annotations

import asyncio

from tfcommon.cluster import Evicted, EvictionBlocked, PodEventType
from tfcommon.cluster.local import LocalCluster

SCHEDULER = "tensor-fusion-scheduler"


def a_workload(name: str) -> dict[str, object]:
    return {
        "metadata": {
            "name": name,
            "namespace": "default",
            "labels": {"app": "train"},
            "annotations": {"tensor-fusion.ai/vram-request": "16Gi"},
        },
        "spec": {"schedulerName": SCHEDULER, "containers": [{"name": "main"}]},
    }


async def placed(cluster: LocalCluster, name: str) -> str:
    pod = cluster.submit(a_workload(name))
    await cluster.bind_pod("default", name, "local-node", uid=pod.uid)
    await cluster.patch_pod_metadata(
        "default",
        name,
        annotations={"tensor-fusion.ai/gpu-ids": "gpu-0", "tensor-fusion.ai/container-gpus": "{}"},
    )
    return pod.uid


async def test_an_evicted_workload_returns_pending_with_a_new_uid_and_no_placement() -> None:
    cluster = LocalCluster()
    old_uid = await placed(cluster, "train-1")

    result = await cluster.evict_pod("default", "train-1")

    pending = await cluster.list_pending_pods(SCHEDULER)
    assert result == Evicted()
    [replacement] = pending.items
    assert replacement.name == "train-1"
    assert replacement.uid != old_uid
    assert replacement.node_name is None
    assert dict(replacement.annotations) == {"tensor-fusion.ai/vram-request": "16Gi"}
    assert dict(replacement.labels) == {"app": "train"}


async def test_a_watch_sees_the_eviction_as_deleted_then_added() -> None:
    cluster = LocalCluster()
    await placed(cluster, "train-1")
    watch = cluster.watch_pods(SCHEDULER)
    assert (await asyncio.wait_for(anext(watch), 5)).type is PodEventType.ADDED

    await cluster.evict_pod("default", "train-1")

    gone = await asyncio.wait_for(anext(watch), 5)
    back = await asyncio.wait_for(anext(watch), 5)
    await watch.aclose()
    assert (gone.type, back.type) == (PodEventType.DELETED, PodEventType.ADDED)
    assert back.pod.uid != gone.pod.uid


async def test_a_disruption_budget_still_refuses_and_nothing_is_recreated() -> None:
    cluster = LocalCluster()
    uid = await placed(cluster, "train-1")
    cluster.put_disruption_budget(
        {
            "metadata": {"name": "train", "namespace": "default"},
            "spec": {"selector": {"matchLabels": {"app": "train"}}},
            "status": {"disruptionsAllowed": 0},
        }
    )

    result = await cluster.evict_pod("default", "train-1")

    pod = await cluster.get_pod("default", "train-1")
    assert isinstance(result, EvictionBlocked)
    assert pod is not None
    assert (pod.uid, pod.node_name) == (uid, "local-node")
