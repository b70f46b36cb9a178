"""The preemption evictors (`tfscheduler.eviction`): local mode records the replacement itself;
Kubernetes mode evicts through the Eviction API (here the in-memory cluster, the fake side of the
cluster contract suite), leaves a victim its disruption budget protects alone and skips it for the
retry time."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from uuid import UUID, uuid4

from tfcommon.cluster.memory import InMemoryCluster
from tfcommon.events import WorkloadRef
from tfcommon.placement import Placement
from tfscheduler.core.preemption import Candidate, Priority
from tfscheduler.eviction import ApiEvictor, LocalEvictor, Removal


def a_victim(name: str, allocation_id: UUID) -> Candidate:
    return Candidate(
        allocation_id=allocation_id,
        workload=WorkloadRef(namespace="team-a", name=name, uid=str(uuid4())),
        priority=Priority.of(0, "low"),
        created_at=datetime.now(UTC),
        holding=Placement(
            request_name=name,
            node="node-a",
            gpu_indices=(0,),
            gpu_uuids=("gpu-0",),
            tflops_milli=(10_000,),
            vram_bytes=(1,),
            cpu_milli=0,
            memory_bytes=0,
            workload_class="share",
            score=0,
            policy="ledger",
        ),
    )


def a_pod(name: str) -> dict[str, object]:
    return {"metadata": {"name": name, "namespace": "team-a", "uid": str(uuid4()), "labels": {"app": name}}}


def a_budget(app: str, allowed: int) -> dict[str, object]:
    return {
        "metadata": {"name": f"{app}-pdb", "namespace": "team-a"},
        "spec": {"selector": {"matchLabels": {"app": app}}, "maxUnavailable": 1},
        "status": {
            "disruptionsAllowed": allowed,
            "currentHealthy": 1,
            "desiredHealthy": 1,
            "expectedPods": 1,
        },
    }


async def test_local_eviction_leaves_the_replacement_to_the_scheduler() -> None:
    evictor = LocalEvictor()
    allocation_id = uuid4()
    assert evictor.may_evict(allocation_id)
    assert await evictor.remove(a_victim("batch", allocation_id)) is Removal.REPLACED_HERE


async def test_the_eviction_api_removes_the_pod_and_its_controller_replaces_it() -> None:
    cluster = InMemoryCluster()
    cluster.put_pod(a_pod("batch"))
    evictor = ApiEvictor(cluster)

    assert await evictor.remove(a_victim("batch", uuid4())) is Removal.REPLACED_BY_CONTROLLER
    assert await cluster.get_pod("team-a", "batch") is None


async def test_a_victim_its_budget_protects_stays_and_is_skipped_for_the_retry_time() -> None:
    cluster = InMemoryCluster()
    cluster.put_pod(a_pod("serving"))
    cluster.put_disruption_budget(a_budget("serving", allowed=0))
    evictor = ApiEvictor(cluster, retry_s=0.2)
    allocation_id = uuid4()

    assert await evictor.remove(a_victim("serving", allocation_id)) is Removal.REFUSED
    assert await cluster.get_pod("team-a", "serving") is not None
    assert not evictor.may_evict(allocation_id)
    assert evictor.may_evict(uuid4())
    await asyncio.sleep(0.25)
    assert evictor.may_evict(allocation_id)
