"""With leader election, only the Lease holder follows releases made by other processes: the
`scheduler-track-allocations` durable is shared by the replicas, so a follower fetching from it would keep
releases from the leader, whose view would then show freed GPUs as used until its next full refresh."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from uuid import UUID

import kmock
import pytest
from cluster_apiserver import ApiServerState
from k8s_scheduler_support import (
    GIB,
    LONG,
    api_server,
    eventually,
    eventually_async,
    install_once,
    register_gpus,
)
from tfcommon import subjects
from tfcommon.bus import NatsEventBus
from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.events import GpuRequest, WorkloadRef
from tfcommon.infra import EmbeddedNats
from tfcommon.ledger.outbox import OutboxRelay
from tfcommon.ledger.sql import SqlLedger
from tfcommon.settings import SchedulerKubernetesSettings
from tfscheduler.app import kubernetes_tasks, leader_elector, release_tasks
from tfscheduler.engine import Scheduler
from tfscheduler.submission import Submission

pytestmark = pytest.mark.integration
SETTINGS = SchedulerKubernetesSettings(
    mode="kubernetes",
    pending_retry_interval_s=0.5,
    lease_namespace="tfpool-system",
    lease_duration_s=3,
    renew_deadline_s=2,
    retry_period_s=0.1,
)
NODE = "gpu-node-1"
RELEASES = 6


@pytest.fixture
def own_nats_url(tmp_path: Path) -> Iterator[str]:
    server = EmbeddedNats(store_dir=tmp_path / "nats")
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture
async def own_bus(own_nats_url: str) -> AsyncIterator[NatsEventBus]:
    bus = await NatsEventBus.connect(own_nats_url, service="scheduler-k8s-test")
    await subjects.provision(bus.js)
    try:
        yield bus
    finally:
        await bus.close()


@pytest.fixture
async def api() -> AsyncIterator[tuple[ApiServerState, kmock.KubernetesScaffold, str]]:
    async with api_server() as server:
        install_once(server[1], server[0])
        yield server


def a_submission(name: str) -> Submission:
    return Submission(
        workload=WorkloadRef(namespace="team-a", name=name),  # no pod uid: reconciliation keeps it
        request=GpuRequest(
            pool="default",
            tflops_request_milli=10_000,
            tflops_limit_milli=10_000,
            vram_request_bytes=8 * GIB,
            vram_limit_bytes=8 * GIB,
        ),
    )


async def test_only_the_leader_follows_releases_made_elsewhere(
    api: tuple[ApiServerState, kmock.KubernetesScaffold, str], ledger: SqlLedger, own_bus: NatsEventBus
) -> None:
    state, _scaffold, url = api
    await register_gpus(ledger, NODE, 1)
    placer = Scheduler(ledger, own_bus, heartbeat_timeout=LONG)
    await placer.start()
    placed = [await placer.submit(a_submission(f"job-{n}")) for n in range(RELEASES)]
    assert all(status.state == "placed" for status in placed)

    replicas: dict[str, Scheduler] = {}
    stop = asyncio.Event()
    running: list[asyncio.Task[None]] = []
    clusters: list[KubernetesCluster] = []
    try:
        for identity in ("scheduler-a", "scheduler-b"):
            cluster = KubernetesCluster.for_url(url, token=identity, watch_timeout_s=5)
            clusters.append(cluster)
            scheduler = Scheduler(ledger, own_bus, heartbeat_timeout=LONG)
            await scheduler.start()
            replicas[identity] = scheduler
            elector = leader_elector(cluster, SETTINGS, identity=identity)
            tasks = kubernetes_tasks(
                scheduler,
                SETTINGS,
                stop,
                cluster=cluster,
                elector=elector,
                leader_only=release_tasks(scheduler, own_bus),
            )
            running += [asyncio.create_task(task()) for task in tasks.values()]
        lease = ("coordination.k8s.io/v1/leases", "tfpool-system", "tfpool-scheduler")
        await eventually(lambda: lease in state.objects, what="lease created")
        leader_name = state.objects[lease]["spec"]["holderIdentity"]
        leader = replicas[leader_name]
        follower = next(scheduler for name, scheduler in replicas.items() if name != leader_name)

        relay = OutboxRelay(ledger, own_bus)
        await relay.publish_pending()
        for count, status in enumerate(placed, start=1):
            # An operator releases each allocation in the ledger, one after the other.
            assert await ledger.release(UUID(str(status.id)), "released by an operator")
            await relay.publish_pending()

            async def handled(count: int = count) -> bool:
                info = await own_bus.js.consumer_info(
                    subjects.EVENTS_STREAM, subjects.SCHEDULER_TRACK_ALLOCATIONS.durable
                )
                floor = info.ack_floor.consumer_seq if info.ack_floor else 0
                return bool(floor and floor >= count and not info.num_ack_pending)

            await eventually_async(handled, what=f"release {count} handled")

        ids = {UUID(str(status.id)) for status in placed}
        assert not ids & set(leader.active)
        [gpu] = leader.view.nodes[NODE].gpus
        assert (gpu.used_tflops_milli, gpu.used_vram_bytes, gpu.workers) == (0, 0, 0)
        assert ids <= set(follower.active)  # the follower took none of them
    finally:
        stop.set()
        await asyncio.gather(*running)
        for cluster in clusters:
            cluster.close()
