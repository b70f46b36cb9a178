"""Composition root of the scheduler service (places pending GPU workloads and reserves them in the ledger).

Only wiring lives here: `compose` plugs the API, the consumers (submitted workloads, node-agent
inventory, allocations released by other processes, releases node agents ask for), the answers to node
agents' allocation requests, the outbox relay and the timers into the shared runtime
(`tfcommon.runtime`); decisions live in `tfscheduler.core` and `tfscheduler.engine`. In
Kubernetes mode with leader election only the holder of the Lease runs the pod watch, binding, status
writer, cordon sync and pending retries (`kubernetes_tasks`); every replica serves the API,
`GET /api/v1/leader` and the node agents' requests and releases. Nothing is built at import time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from datetime import timedelta
from functools import partial
from pathlib import Path
from typing import Any

import yaml
from fastapi import APIRouter
from pydantic import BaseModel, Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from tfcommon import subjects
from tfcommon.bus import NatsEventBus
from tfcommon.cluster import Cluster
from tfcommon.cluster.port import LeaseStore
from tfcommon.config_source import ConfigSource, load_config
from tfcommon.consumer import Handler, run_pull_consumer
from tfcommon.events import AllocationReleased, Message, WorkloadSubmitted
from tfcommon.ledger.outbox import OutboxRelay
from tfcommon.pool_source import ClusterPoolSource, follow_gpu_pools
from tfcommon.runtime import (
    Components,
    Consume,
    ServiceContext,
    ServiceSpec,
    Timer,
    freeze_full_collection_survivors,
    freeze_startup_heap,
    run_service,
)
from tfcommon.settings import SchedulerKubernetesSettings, SchedulerSettings
from tfcommon.subjects import ConsumerSpec

from tfscheduler.api import build_router, front_routes
from tfscheduler.core.leader import ElectionTimings
from tfscheduler.core.quota import NamespaceQuota, QuotaError, parse_quota
from tfscheduler.engine import Scheduler, placement_problems
from tfscheduler.inventory import inventory_handler
from tfscheduler.kubernetes_mode import wire_kubernetes
from tfscheduler.leader_election import LeaderElector, default_identity, default_namespace
from tfscheduler.node_requests import release_handler, serve_node_allocations
from tfscheduler.quota_source import ClusterQuotas, QuotaStatusWriter, follow_quotas
from tfscheduler.submission import Submission

SERVICE = "scheduler"
SUBMISSIONS_FETCHED = 64
"""Most `WorkloadSubmitted` messages fetched at once and handed to the engine together."""
log = logging.getLogger("tfscheduler")
Tasks = dict[str, Callable[[], Coroutine[Any, Any, None]]]


class SchedulerOptions(BaseSettings):
    """Scheduler-only settings (`TF_SCHEDULER_*`)."""

    model_config = SettingsConfigDict(env_prefix="TF_SCHEDULER_", extra="ignore")

    heartbeat_timeout_s: float | None = Field(
        default=None, gt=0, description="silence after which a node takes no new work; 3 heartbeats if unset"
    )
    quota_file: Path | None = Field(default=None, description="YAML file of GPUResourceQuota manifests")
    refresh_interval_s: float = Field(default=30.0, gt=0, description="full view rebuild from the ledger")
    node_check_interval_s: float = Field(default=1.0, gt=0, description="node readiness re-check period")
    run_outbox_relay: bool = Field(default=True, description="publish the ledger outbox from this process")


def load_quotas(path: Path | None) -> dict[str, NamespaceQuota]:
    """Quotas by namespace from a YAML file of GPUResourceQuota manifests (last one per namespace wins)."""
    if path is None:
        return {}
    quotas: dict[str, NamespaceQuota] = {}
    for position, document in enumerate(yaml.safe_load_all(path.read_text(encoding="utf-8"))):
        if document is None:
            continue
        try:
            quota = parse_quota(document)
        except QuotaError as error:
            raise QuotaError(f"{path} (document {position + 1}): {error}") from error
        quotas[quota.namespace] = quota
    return quotas


async def _survive_outage(work: Callable[[], Awaitable[object]]) -> None:
    """Run one round of periodic work; a failure (the ledger or the bus restarting) is logged and the
    next round retries, instead of stopping the whole scheduler."""
    try:
        await work()
    except Exception as error:
        log.warning(
            "periodic work failed; retrying on the next round",
            extra={
                "event": "scheduler.round_failed",
                "outcome": "retry",
                "error": f"{type(error).__name__}: {error}",
            },
        )


async def _retry_on_freed_capacity(scheduler: Scheduler, stop: asyncio.Event) -> None:
    while not stop.is_set():
        waiter = asyncio.create_task(scheduler.capacity_freed.wait())
        stopper = asyncio.create_task(stop.wait())
        await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        stopper.cancel()
        if stop.is_set():
            return
        scheduler.capacity_freed.clear()
        await _survive_outage(scheduler.retry_pending)


async def compose(context: ServiceContext[SchedulerSettings]) -> Components:
    options = SchedulerOptions()
    kubernetes = context.settings.kubernetes
    scheduler = Scheduler(
        context.sql_ledger,
        context.bus,
        config=load_config(context.settings.config_file),
        quotas=load_quotas(options.quota_file),
        heartbeat_timeout=timedelta(seconds=options.heartbeat_timeout_s)
        if options.heartbeat_timeout_s
        else None,
        name=SERVICE,
    )
    await scheduler.start()
    stop = context.stopping

    async def schedule_workload(message: Message) -> Sequence[Message]:
        if isinstance(message, WorkloadSubmitted):
            submission = Submission(
                workload=message.workload, request=message.request, priority=message.priority
            )
            await scheduler.submit(submission, cause=message.event_id)
        return ()

    elector: LeaderElector | None = None

    async def refresh() -> None:
        await scheduler.start()
        if elector is None or elector.is_leader:
            await scheduler.retry_pending()

    handlers: dict[ConsumerSpec, Handler | Consume] = {
        # submissions fetched together are placed in one batch
        subjects.SCHEDULER_SCHEDULE_WORKLOAD: Consume(
            schedule_workload, batch=SUBMISSIONS_FETCHED, concurrent=True
        ),
        subjects.SCHEDULER_TRACK_NODES: inventory_handler(context.ledger, scheduler),
        subjects.SCHEDULER_RELEASE_ALLOCATIONS: release_handler(scheduler),
    }
    timers = {
        "check-nodes": Timer(options.node_check_interval_s, scheduler.recheck_nodes),
        "refresh-view": Timer(options.refresh_interval_s, refresh),
    }
    tasks: Tasks = {
        "node-allocations": lambda: serve_node_allocations(context.nats, context.ledger, stop),
        "retry-pending": lambda: _retry_on_freed_capacity(scheduler, stop),
    }
    follow_releases = release_tasks(scheduler, context.nats)
    routers = [build_router(scheduler, context.settings.api_token)]
    front = front_routes(scheduler, context.settings.api_token, SERVICE)
    if kubernetes.mode == "kubernetes":
        from tfcommon.cluster.kubernetes import KubernetesCluster

        cluster = KubernetesCluster.from_environment(
            kubeconfig=str(kubernetes.kubeconfig) if kubernetes.kubeconfig else None,
            context=kubernetes.kube_context,
        )
        context.cleanup.callback(cluster.close)
        pools = ClusterPoolSource(
            ConfigSource(context.settings.config_file), service=SERVICE, checks=[placement_problems]
        )
        pools.listeners.append(partial(setattr, scheduler, "config"))  # read at each placement
        tasks["gpu-pools"] = lambda: follow_gpu_pools(pools, cluster, stop)
        quotas = ClusterQuotas(scheduler, file_quotas=scheduler.quotas)
        tasks["gpu-resource-quotas"] = lambda: follow_quotas(quotas, cluster, stop)
        follow_releases = with_quota_status(
            follow_releases, QuotaStatusWriter(quotas, context.ledger, cluster)
        )
        if kubernetes.leader_election:
            elector = leader_elector(cluster, kubernetes)
        del tasks["retry-pending"]  # the engine's retry would reserve pods that nobody binds
        tasks.update(
            kubernetes_tasks(
                scheduler, kubernetes, stop, cluster=cluster, elector=elector, leader_only=follow_releases
            )
        )
    if elector is None:
        tasks.update(follow_releases(stop))
    routers.append(leader_router(elector))
    if options.run_outbox_relay:
        relay = OutboxRelay(context.database, context.bus)
        tasks["outbox-relay"] = lambda: relay.run(stop)
    freeze_startup_heap()
    freeze_full_collection_survivors()
    return Components(routers=routers, handlers=handlers, timers=timers, tasks=tasks, front_routes=front)


def with_quota_status(
    leader_only: Callable[[asyncio.Event], Tasks], writer: QuotaStatusWriter
) -> Callable[[asyncio.Event], Tasks]:
    """`leader_only`'s tasks and the GPUResourceQuota status writer (one writer: the leader)."""

    def tasks(until: asyncio.Event) -> Tasks:
        return {**leader_only(until), "quota-status": lambda: writer.run(until)}

    return tasks


def release_tasks(scheduler: Scheduler, bus: NatsEventBus) -> Callable[[asyncio.Event], Tasks]:
    """The `scheduler-track-allocations` consumer, running until the given event is set: `scheduler`
    follows the releases other processes make in the ledger (`Scheduler.released_elsewhere`)."""

    async def track_allocations(message: Message) -> Sequence[Message]:
        if isinstance(message, AllocationReleased):
            await scheduler.released_elsewhere(message.allocation_id, message.reason)
        return ()

    def tasks(until: asyncio.Event) -> Tasks:
        return {
            "track-allocations": lambda: run_pull_consumer(
                bus.js,
                subjects.SCHEDULER_TRACK_ALLOCATIONS,
                track_allocations,
                bus=bus,
                service=SERVICE,
                stop=until,
            )
        }

    return tasks


def leader_elector(
    leases: LeaseStore, settings: SchedulerKubernetesSettings, *, identity: str | None = None
) -> LeaderElector:
    """A candidate for the scheduler's Lease, named by `identity` (default: POD_NAME, else hostname_pid)."""
    return LeaderElector(
        leases,
        namespace=default_namespace(settings.lease_namespace),
        name=settings.lease_name,
        identity=identity or default_identity(),
        timings=ElectionTimings(
            settings.lease_duration_s, settings.renew_deadline_s, settings.retry_period_s
        ),
    )


def kubernetes_tasks(
    scheduler: Scheduler,
    settings: SchedulerKubernetesSettings,
    stop: asyncio.Event,
    *,
    cluster: Cluster,
    elector: LeaderElector | None,
    leader_only: Callable[[asyncio.Event], Tasks] | None = None,
) -> Tasks:
    """Kubernetes mode's tasks. Without `elector`: the pod watch, binding, retries, status and cordons run
    at once. With it: one `leader-election` task runs them only while this replica holds the Lease, each
    term on a view rebuilt from the ledger (the previous leader changed it) and a fresh pod loop, together
    with the `leader_only` tasks given the term's end (the release consumer: its durable is shared, and
    a follower taking a release would keep it from the leader)."""
    if elector is None:
        return dict(wire_kubernetes(scheduler, settings, cluster=cluster).tasks(stop))

    async def lead(term_over: asyncio.Event) -> None:
        await scheduler.start()
        term = dict(wire_kubernetes(scheduler, settings, cluster=cluster).tasks(term_over))
        if leader_only is not None:
            term.update(leader_only(term_over))
        await _run_together(term)

    return {"leader-election": lambda: elector.run(stop, lead)}


async def _run_together(tasks: Mapping[str, Callable[[], Awaitable[None]]]) -> None:
    async with asyncio.TaskGroup() as group:
        for name, task in tasks.items():
            group.create_task(_call(task), name=f"{SERVICE}-{name}")


async def _call(task: Callable[[], Awaitable[None]]) -> None:
    await task()


class LeaderStatus(BaseModel):
    """`GET /api/v1/leader`: whether this replica places pods; `election` false means every replica does."""

    leader: bool
    election: bool
    identity: str | None
    holder: str | None
    lease: str | None


def leader_router(elector: LeaderElector | None) -> APIRouter:
    """`GET /api/v1/leader`: whether this replica is the one placing pods (always true without election)."""
    router = APIRouter(prefix="/api/v1", tags=["scheduler"])

    @router.get("/leader")
    async def leader() -> LeaderStatus:
        if elector is None:
            return LeaderStatus(leader=True, election=False, identity=None, holder=None, lease=None)
        return LeaderStatus(
            leader=elector.is_leader,
            election=True,
            identity=elector.identity,
            holder=elector.holder or None,
            lease=elector.lease,
        )

    return router


def build(settings: SchedulerSettings) -> ServiceSpec[SchedulerSettings]:
    """The scheduler service as the runtime runs it."""
    return ServiceSpec(name=SERVICE, settings=settings, port=settings.port, compose=compose)


def main() -> int:
    return run_service(build(SchedulerSettings()))
