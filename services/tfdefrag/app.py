"""Composition root of the defrag-planner service (plans node compaction and evicts one workload at a time).

Only wiring lives here: `compose` plugs the plan API, the start-campaign handler and the tick timer into
the shared runtime (`tfcommon.runtime`); decisions live in `tfdefrag.core`. Nothing is built at import time.
The cluster is the Kubernetes API server when running in a pod (or with `$KUBECONFIG`); otherwise (local
mode) the scheduler's HTTP API, which holds the workloads and evicts them (`SchedulerApiCluster`).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta

from tfcommon import subjects
from tfcommon.cluster import Cluster
from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.config_source import ConfigSource
from tfcommon.pool_capacity import capacity_of
from tfcommon.pool_source import wire_gpu_pools
from tfcommon.runtime import Components, ServiceContext, ServiceSpec, Timer, run_service
from tfcommon.settings import DefragSettings

from tfdefrag.adapters.scheduler_api import SchedulerApiCluster
from tfdefrag.api import build_router
from tfdefrag.campaign import CampaignDeps, ExecutorSettings
from tfdefrag.service import DefragService, pool_spec_problems
from tfdefrag.store import CampaignStore

SERVICE = "defrag-planner"


def default_cluster(settings: DefragSettings) -> Cluster:
    if os.environ.get("KUBERNETES_SERVICE_HOST") or os.environ.get("KUBECONFIG"):
        return KubernetesCluster.from_environment()
    return SchedulerApiCluster(
        settings.defrag_scheduler_url,
        api_token=settings.api_token.get_secret_value() if settings.api_token else None,
        pdb_file=settings.defrag_pdb_file,
    )


def utc_now() -> datetime:
    return datetime.now(UTC)


def make_compose(
    cluster_factory: Callable[[], Cluster] | None = None,
) -> Callable[[ServiceContext[DefragSettings]], Awaitable[Components]]:
    async def compose(context: ServiceContext[DefragSettings]) -> Components:
        settings = context.settings
        cluster = cluster_factory() if cluster_factory is not None else default_cluster(settings)
        if isinstance(cluster, SchedulerApiCluster):
            context.cleanup.push_async_callback(cluster.aclose)
        deps = CampaignDeps(
            cluster=cluster,
            ledger=context.ledger,
            store=CampaignStore(context.database),
            publish=context.bus.publish,
            clock=utc_now,
            settings=ExecutorSettings(replacement_timeout=timedelta(seconds=settings.replacement_timeout_s)),
        )
        pools, pool_tasks = wire_gpu_pools(
            ConfigSource(settings.config_file),
            service=SERVICE,
            stop=context.stopping,
            checks=[pool_spec_problems],
            cluster=cluster if isinstance(cluster, KubernetesCluster) else None,
            on_close=context.cleanup.callback,
        )
        deps.pool_capacity = lambda pool: capacity_of(pools.current(), pool)
        service = DefragService(deps=deps, config=pools)
        context.cleanup.push_async_callback(service.stop_campaigns)
        return Components(
            routers=[build_router(service)],
            handlers={subjects.DEFRAG_START_CAMPAIGN: service.start_from_command},
            timers={"tick": Timer(settings.tick_interval_s, service.tick, at_start=True)},
            tasks=pool_tasks,
        )

    return compose


async def compose(context: ServiceContext[DefragSettings]) -> Components:
    return await make_compose()(context)


def build(settings: DefragSettings) -> ServiceSpec[DefragSettings]:
    """The defrag-planner service as the runtime runs it."""
    return ServiceSpec(name=SERVICE, settings=settings, port=settings.port, compose=compose)


def main() -> int:
    return run_service(build(DefragSettings()))
