"""Two scheduler replicas in Kubernetes mode with leader election (real Postgres and NATS, kmock over HTTP):
only the Lease holder lists, watches and binds pods; the other serves `GET /api/v1/leader` as a follower and
takes over, binding new pods, when the leader stops."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import kmock
import pytest
from cluster_apiserver import ApiServerState
from fastapi import FastAPI
from k8s_scheduler_support import (
    LONG,
    api_server,
    eventually,
    eventually_async,
    gpu_pod,
    install_once,
    register_gpus,
)
from tfcommon.bus import NatsEventBus
from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.ledger.sql import SqlLedger
from tfcommon.settings import SchedulerKubernetesSettings
from tfscheduler.app import kubernetes_tasks, leader_elector, leader_router
from tfscheduler.engine import Scheduler

pytestmark = pytest.mark.integration

SETTINGS = SchedulerKubernetesSettings(
    mode="kubernetes",
    status_debounce_s=0.1,
    status_poll_interval_s=0.3,
    pending_retry_interval_s=0.5,
    lease_namespace="tfpool-system",
    lease_duration_s=3,
    renew_deadline_s=2,
    retry_period_s=0.1,
)


@dataclass
class Replica:
    identity: str
    cluster: KubernetesCluster
    stop: asyncio.Event
    tasks: list[asyncio.Task[None]]
    leading: FastAPI

    async def leader_view(self) -> dict[str, object]:
        transport = httpx.ASGITransport(app=self.leading)
        async with httpx.AsyncClient(transport=transport, base_url="http://replica") as client:
            response = await client.get("/api/v1/leader")
        assert response.status_code == 200
        body: dict[str, object] = response.json()
        return body

    async def halt(self) -> None:
        if self.stop.is_set():
            return
        self.stop.set()
        try:
            await asyncio.gather(*self.tasks)
        finally:
            self.cluster.close()


async def start_replica(url: str, identity: str, ledger: SqlLedger, bus: NatsEventBus) -> Replica:
    """A replica as `compose` wires it with TF_SCHEDULER_MODE=kubernetes and leader election on."""
    cluster = KubernetesCluster.for_url(url, token=identity, watch_timeout_s=5)
    scheduler = Scheduler(ledger, bus, heartbeat_timeout=LONG)
    await scheduler.start()
    elector = leader_elector(cluster, SETTINGS, identity=identity)
    stop = asyncio.Event()
    tasks = kubernetes_tasks(scheduler, SETTINGS, stop, cluster=cluster, elector=elector)
    app = FastAPI()
    app.include_router(leader_router(elector))
    return Replica(identity, cluster, stop, [asyncio.create_task(t()) for t in tasks.values()], app)


@pytest.fixture
async def api() -> AsyncIterator[tuple[ApiServerState, kmock.KubernetesScaffold, str]]:
    async with api_server() as server:
        install_once(server[1], server[0])
        yield server


def pod_requests_by(scaffold: kmock.KubernetesScaffold, identity: str) -> list[str]:
    return [
        f"{request.method.value} {request.url.path}"
        for request in scaffold
        if request.headers.get("Authorization") == f"Bearer {identity}" and "/pods" in request.url.path
    ]


async def has_seen_holder(replica: Replica, holder: str) -> bool:
    return (await replica.leader_view())["holder"] == holder


@pytest.fixture
async def replicas() -> AsyncIterator[list[Replica]]:
    started: list[Replica] = []
    yield started
    for replica in started:
        await replica.halt()


async def test_only_the_leader_binds_and_the_follower_takes_over_when_it_stops(
    api: tuple[ApiServerState, kmock.KubernetesScaffold, str],
    ledger: SqlLedger,
    bus: NatsEventBus,
    replicas: list[Replica],
) -> None:
    state, scaffold, url = api
    await register_gpus(ledger, "gpu-node-1", 2)
    first = await start_replica(url, "scheduler-a", ledger, bus)
    second = await start_replica(url, "scheduler-b", ledger, bus)
    replicas += [first, second]
    lease = ("coordination.k8s.io/v1/leases", "tfpool-system", "tfpool-scheduler")
    await eventually(lambda: lease in state.objects, what="lease created")
    leader_name = state.objects[lease]["spec"]["holderIdentity"]
    leader, follower = (first, second) if leader_name == "scheduler-a" else (second, first)

    state.put("/v1/pods", gpu_pod("before"))
    await eventually(lambda: state.objects[("/v1/pods", "team-a", "before")]["spec"].get("nodeName"))

    assert (await leader.leader_view())["leader"] is True
    await eventually_async(lambda: has_seen_holder(follower, leader.identity), what="follower read the lease")
    assert await follower.leader_view() == {
        "leader": False,
        "election": True,
        "identity": follower.identity,
        "holder": leader.identity,
        "lease": "tfpool-system/tfpool-scheduler",
    }
    assert any(path.endswith("/binding") for path in pod_requests_by(scaffold, leader.identity))
    assert pod_requests_by(scaffold, follower.identity) == []

    await leader.halt()
    await eventually(lambda: state.objects[lease]["spec"]["holderIdentity"] == follower.identity, 2.0)
    state.put("/v1/pods", gpu_pod("after"))

    await eventually(lambda: state.objects[("/v1/pods", "team-a", "after")]["spec"].get("nodeName"))
    assert any(path.endswith("/binding") for path in pod_requests_by(scaffold, follower.identity))
    assert (await follower.leader_view())["leader"] is True
    await follower.halt()
    assert state.objects[lease]["spec"]["holderIdentity"] == ""
