"""Composition root of the scheduler service (places pending GPU workloads and reserves them in the ledger).

Only wiring lives here: `compose` plugs the API, the consumers (submitted workloads, node-agent
inventory), the outbox relay and the timers into the shared runtime (`tfcommon.runtime`); decisions
live in `tfscheduler.core` and `tfscheduler.engine`. Nothing is built at import time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from pathlib import Path

import yaml
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict
from tfcommon import subjects
from tfcommon.config import load_config
from tfcommon.consumer import run_pull_consumer
from tfcommon.events import Message, WorkloadSubmitted
from tfcommon.ledger.outbox import OutboxRelay
from tfcommon.runtime import Components, ServiceContext, ServiceSpec, run_service
from tfcommon.settings import SchedulerSettings

from tfscheduler.api import build_router
from tfscheduler.core.quota import NamespaceQuota, QuotaError, parse_quota
from tfscheduler.engine import Scheduler
from tfscheduler.inventory import inventory_handler
from tfscheduler.kubernetes_mode import KubernetesScheduler, wire_kubernetes
from tfscheduler.submission import Submission

SERVICE = "scheduler"
log = logging.getLogger("tfscheduler")


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


async def _every(interval_s: float, stop: asyncio.Event, work: Callable[[], Awaitable[None]]) -> None:
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
        if not stop.is_set():
            await _survive_outage(work)


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
    scheduler = (KubernetesScheduler if kubernetes.mode == "kubernetes" else Scheduler)(
        context.ledger,
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

    async def refresh() -> None:
        await scheduler.start()
        await scheduler.retry_pending()

    tasks = {
        "schedule-workload": lambda: run_pull_consumer(
            context.bus.js,
            subjects.SCHEDULER_SCHEDULE_WORKLOAD,
            schedule_workload,
            bus=context.bus,
            service=SERVICE,
            stop=stop,
        ),
        "track-nodes": lambda: run_pull_consumer(
            context.bus.js,
            subjects.SCHEDULER_TRACK_NODES,
            inventory_handler(context.ledger, scheduler),
            bus=context.bus,
            service=SERVICE,
            stop=stop,
        ),
        "retry-pending": lambda: _retry_on_freed_capacity(scheduler, stop),
        "check-nodes": lambda: _every(options.node_check_interval_s, stop, scheduler.recheck_nodes),
        "refresh-view": lambda: _every(options.refresh_interval_s, stop, refresh),
    }
    if isinstance(scheduler, KubernetesScheduler):
        tasks.update(wire_kubernetes(scheduler, kubernetes).tasks(stop))
    if options.run_outbox_relay:
        relay = OutboxRelay(context.ledger, context.bus)
        tasks["outbox-relay"] = lambda: relay.run(stop)
    return Components(routers=[build_router(scheduler, context.settings.api_token)], tasks=tasks)


def build(settings: SchedulerSettings) -> ServiceSpec[SchedulerSettings]:
    """The scheduler service as the runtime runs it."""
    return ServiceSpec(name=SERVICE, settings=settings, port=settings.port, compose=compose)


def main() -> int:
    return run_service(build(SchedulerSettings()))
