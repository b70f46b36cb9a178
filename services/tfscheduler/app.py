"""Composition root of the scheduler service (places pending GPU workloads and reserves them in the ledger).

Only wiring lives here: `compose` plugs routers, consumers and tasks into the shared runtime
(`tfcommon.runtime`); decisions live in `tfscheduler.core`. Nothing is built at import time.
"""

from __future__ import annotations

from tfcommon.runtime import Components, ServiceContext, ServiceSpec, run_service
from tfcommon.settings import SchedulerSettings

SERVICE = "scheduler"


async def compose(context: ServiceContext[SchedulerSettings]) -> Components:
    return Components()


def build(settings: SchedulerSettings) -> ServiceSpec[SchedulerSettings]:
    """The scheduler service as the runtime runs it."""
    return ServiceSpec(name=SERVICE, settings=settings, port=settings.port, compose=compose)


def main() -> int:
    return run_service(build(SchedulerSettings()))
