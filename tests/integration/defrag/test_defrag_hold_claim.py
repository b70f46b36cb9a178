"""A defrag move's capacity hold goes to the replacement, in local mode: the real scheduler engine, a
real campaign, real Postgres and NATS JetStream. Another workload that arrives between the eviction
and the replacement cannot take the held GPU; the replacement lands on the planned target GPU."""

from __future__ import annotations

import asyncio
import contextlib
from collections import defaultdict
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from uuid import UUID, uuid4

import pytest
from defrag_scenario import (
    CONFIG,
    GIB,
    SCHEDULER,
    TFLOPS,
    VRAM,
    LocalSeed,
    Scenario,
    budget_manifest,
    node_manifest,
    pod_manifest,
    register_node,
    reserve,
)
from tfcommon import subjects
from tfcommon.bus import NatsEventBus
from tfcommon.cluster.local import LocalCluster
from tfcommon.events import GpuRequest, WorkloadRef
from tfcommon.ledger.records import (
    HoldFor,
    NodeSpec,
    ReservationRejected,
    ReservationRequest,
    Reserved,
    ShareRequest,
)
from tfcommon.ledger.sql import SqlLedger
from tfdefrag.campaign import HOLD_WORKLOAD_NAMESPACE
from tfdefrag.store import CampaignStore
from tfscheduler.engine import Scheduler
from tfscheduler.submission import Submission, WorkloadStatus

pytestmark = pytest.mark.integration

QUARTER = 250  # thousandths of a GPU


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[NatsEventBus]:
    nats_bus = await NatsEventBus.connect(nats_url, service="defrag-hold-test")
    await subjects.provision(nats_bus.js)
    try:
        yield nats_bus
    finally:
        await nats_bus.close()


def quarter_gpu(namespace: str, name: str, uid: str, pool: str) -> Submission:
    """A quarter of a GPU, only on the target node's zone (the source is no place for it either way)."""
    tflops, vram = QUARTER * TFLOPS // 1000, QUARTER * VRAM // 1000
    return Submission(
        workload=WorkloadRef(namespace=namespace, name=name, uid=uid),
        request=GpuRequest(
            pool=pool,
            tflops_request_milli=tflops,
            tflops_limit_milli=tflops,
            vram_request_bytes=vram,
            vram_limit_bytes=vram,
        ),
        node_selector={"zone": "target"},
    )


async def tight_scenario(ledger: SqlLedger) -> tuple[Scenario, LocalSeed]:
    """Source: `w1` on a quarter of GPU 0. Target: GPU 0 three quarters full, GPUs 1-3 full, so the
    planned move is w1 -> target GPU 0 and nothing else of the target has room."""
    tag = uuid4().hex[:8]
    pool, namespace, source, target = f"pool-{tag}", f"ml-{tag}", f"src-{tag}", f"dst-{tag}"
    cluster = LocalCluster()
    seed = LocalSeed(cluster)
    for node in (source, target):
        await register_node(ledger, pool, node)
        labels = {"zone": "target"} if node == target else {}
        await ledger.upsert_node(
            NodeSpec(
                name=node,
                pool=pool,
                labels=labels,
                cpu_allocatable_milli=64_000,
                memory_allocatable_bytes=256 * GIB,
            )
        )
        await ledger.record_heartbeat(node)
        seed.put_node(node_manifest(node))
    await reserve(ledger, pool, namespace, "w1", source, f"gpu-{source}-0", QUARTER)
    seed.put_pod(pod_manifest(namespace, "w1", source))
    for index, share in enumerate((750, 1000, 1000, 1000)):
        await reserve(ledger, pool, namespace, f"big-{index}", target, f"gpu-{target}-{index}", share)
        seed.put_pod(pod_manifest(namespace, f"big-{index}", target))
    seed.put_budget(budget_manifest(namespace, 5))
    scenario = Scenario(
        pool, namespace, source, target, ("w1",), ledger, cluster, CampaignStore(ledger.engine)
    )
    return scenario, seed


@contextlib.asynccontextmanager
async def local_controller(
    scenario: Scenario, scheduler: Scheduler, statuses: dict[str, WorkloadStatus]
) -> AsyncIterator[None]:
    """Plays what local mode does around the scheduler: a deleted pod's allocation is released; when the
    replacement appears, ANOTHER quarter-GPU workload is submitted first, then the replacement, which
    is bound where the scheduler placed it."""

    async def follow() -> None:
        watch = scenario.cluster.watch_pods(SCHEDULER)
        try:
            async for event in watch:
                pod = event.pod
                if pod.namespace != scenario.namespace:
                    continue
                if event.type.value == "DELETED":
                    for allocation in await scenario.ledger.active_allocations():
                        if (allocation.workload.namespace, allocation.workload.name) == (
                            pod.namespace,
                            pod.name,
                        ):
                            await scheduler.release(allocation.allocation_id, "pod deleted")
                    continue
                if pod.node_name or "replacement" in statuses:
                    continue
                statuses["intruder"] = await scheduler.submit(
                    quarter_gpu(pod.namespace, "intruder", str(uuid4()), scenario.pool)
                )
                replacement = await scheduler.submit(
                    quarter_gpu(pod.namespace, pod.name, pod.uid, scenario.pool)
                )
                statuses["replacement"] = replacement
                if replacement.state == "placed" and replacement.node is not None:
                    await scenario.cluster.bind_pod(pod.namespace, pod.name, replacement.node)
        finally:
            await watch.aclose()

    task = asyncio.create_task(follow())
    try:
        yield
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_the_replacement_takes_its_hold_and_a_workload_arriving_first_does_not(
    ledger: SqlLedger, bus: NatsEventBus
) -> None:
    scenario, _seed = await tight_scenario(ledger)
    scheduler = Scheduler(ledger, bus, heartbeat_timeout=timedelta(hours=1))
    await scheduler.start()
    statuses: dict[str, WorkloadStatus] = {}

    async with local_controller(scenario, scheduler, statuses):
        result = await scenario.executor(replacement_timeout_s=3).run(scenario.pool, CONFIG, trigger="manual")

    campaign = result.campaign
    assert (campaign.outcome, campaign.drained_nodes, campaign.stranded_pods) == (
        "completed",
        (scenario.source,),
        0,
    )
    planned_gpu = f"gpu-{scenario.target}-0"
    replacement = statuses["replacement"]
    assert (replacement.state, replacement.node, replacement.gpu_uuids) == (
        "placed",
        scenario.target,
        (planned_gpu,),
    )
    intruder = statuses["intruder"]
    assert intruder.state == "pending"
    assert "insufficient" in (intruder.reason or "")

    [move] = await scenario.store.moves(campaign.id)
    assert (move.state, move.placed_on, move.hold_released) == ("placed", scenario.target, True)
    assert move.hold_allocation_id is not None
    hold = await ledger.get_allocation(move.hold_allocation_id)
    assert hold is not None
    assert hold.workload.namespace == HOLD_WORKLOAD_NAMESPACE  # its time is billed to no user namespace
    assert [share.gpu_uuid for share in hold.shares] == [planned_gpu]
    assert hold.release_reason == f"defrag hold claimed by {scenario.namespace}/w1"
    # Both history entries, at the same moment: the hold ends where the replacement's allocation starts.
    hold_history = [(h.kind, h.reason) for h in await ledger.history(move.hold_allocation_id)]
    assert hold_history == [("opened", None), ("released", f"defrag hold claimed by {scenario.namespace}/w1")]
    [hold_end] = [h for h in await ledger.history(move.hold_allocation_id) if h.kind == "released"]
    replacement_history = await ledger.history(replacement.id)
    assert [(h.kind, h.gpu_uuid, h.occurred_at) for h in replacement_history] == [
        ("opened", planned_gpu, hold_end.occurred_at),
        ("committed", planned_gpu, hold_end.occurred_at),
    ]
    assert await ledger.active_holds() == []
    await assert_history_never_over_capacity(ledger)


async def assert_history_never_over_capacity(ledger: SqlLedger) -> None:
    """Replay the append-only history in order: no GPU ever holds more than its capacity."""
    capacity = {
        gpu.uuid: (gpu.capacity_tflops_milli, gpu.capacity_vram_bytes) for gpu in await ledger.list_gpus()
    }
    used: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for entry in await ledger.history():
        sign = {"opened": 1, "committed": 0, "released": -1, "evicted": -1}[entry.kind]
        used[entry.gpu_uuid][0] += sign * entry.tflops_milli
        used[entry.gpu_uuid][1] += sign * entry.vram_bytes
        tflops, vram = used[entry.gpu_uuid]
        assert 0 <= tflops <= capacity[entry.gpu_uuid][0], f"TFLOPS {tflops} after {entry}"
        assert 0 <= vram <= capacity[entry.gpu_uuid][1], f"VRAM {vram} after {entry}"


async def test_a_hold_is_not_claimed_by_a_workload_asking_for_more_or_after_it_expired(
    ledger: SqlLedger,
) -> None:
    """The ledger's side of a claim: more than the hold, or an expired hold, changes nothing."""
    scenario, _seed = await tight_scenario(ledger)
    hold_id = uuid4()
    gpu = f"gpu-{scenario.source}-1"

    def request(allocation_id: UUID, name: str, share: int) -> ReservationRequest:
        return ReservationRequest(
            allocation_id=allocation_id,
            workload=WorkloadRef(namespace=scenario.namespace, name=name, uid=str(uuid4())),
            pool=scenario.pool,
            node=scenario.source,
            shares=(
                ShareRequest(
                    gpu_uuid=gpu, tflops_milli=share * TFLOPS // 1000, vram_bytes=share * VRAM // 1000
                ),
            ),
        )

    await ledger.reserve_hold(
        request(hold_id, "hold-w9", QUARTER),
        HoldFor(
            pool=scenario.pool,
            namespace=scenario.namespace,
            name="w9",
            owner_uid=None,
            expires_at=datetime.now(UTC) + timedelta(minutes=5),
        ),
    )
    bigger = await ledger.claim_hold(hold_id, request(uuid4(), "w9", 2 * QUARTER))
    assert isinstance(bigger, ReservationRejected)
    assert bigger.field == "shares"
    [active] = await ledger.active_holds()
    assert (active.allocation.allocation_id, active.held_for.name) == (hold_id, "w9")

    expired_id = uuid4()
    await ledger.reserve_hold(
        request(expired_id, "hold-w8", QUARTER),
        HoldFor(
            pool=scenario.pool,
            namespace=scenario.namespace,
            name="w8",
            owner_uid=None,
            expires_at=datetime.now(UTC) - timedelta(seconds=1),
        ),
    )
    assert await ledger.claim_hold(expired_id, request(uuid4(), "w8", QUARTER)) is None
    assert [h.allocation.allocation_id for h in await ledger.active_holds()] == [hold_id]
    assert [h.kind for h in await ledger.history(expired_id)] == ["opened"]


async def test_an_expired_hold_no_move_recorded_is_released_by_the_sweep(ledger: SqlLedger) -> None:
    """A planner that crashed between reserving a hold and recording its move leaves a hold only the
    ledger knows; the expiry sweep releases it all the same (and leaves an unexpired one alone)."""
    scenario, _seed = await tight_scenario(ledger)
    gpu = f"gpu-{scenario.target}-0"

    async def hold(name: str, expires_in: timedelta) -> UUID:
        hold_id = uuid4()
        result = await ledger.reserve_hold(
            ReservationRequest(
                allocation_id=hold_id,
                workload=WorkloadRef(
                    namespace=HOLD_WORKLOAD_NAMESPACE, name=f"hold-{name}", uid=str(hold_id)
                ),
                pool=scenario.pool,
                node=scenario.target,
                shares=(ShareRequest(gpu_uuid=gpu, tflops_milli=QUARTER * TFLOPS // 2000, vram_bytes=GIB),),
            ),
            HoldFor(
                pool=scenario.pool,
                namespace=scenario.namespace,
                name=name,
                owner_uid=None,
                expires_at=datetime.now(UTC) + expires_in,
            ),
        )
        assert isinstance(result, Reserved)
        return hold_id

    await scenario.executor().release_expired_holds()  # those other tests in this database left
    orphan = await hold("w1", timedelta(seconds=-1))
    kept = await hold("w2", timedelta(minutes=5))
    assert await scenario.store.unreleased_holds() == [], "no move records either hold"

    released = await scenario.executor().release_expired_holds()

    assert released == 1
    orphaned = await ledger.get_allocation(orphan)
    assert orphaned is not None
    assert (orphaned.state, orphaned.release_reason) == ("released", "defrag hold expired")
    still_held = await ledger.get_allocation(kept)
    assert still_held is not None
    assert still_held.state != "released"
    ours = [
        h.allocation.allocation_id for h in await ledger.active_holds() if h.held_for.pool == scenario.pool
    ]
    assert ours == [kept]
    assert await ledger.expired_holds() == []
