"""Composition root of the defrag-planner service (plans node compaction and evicts one workload at a time).

Only wiring lives here: `compose` plugs routers, consumers and tasks into the shared runtime
(`tfcommon.runtime`); decisions live in `tfdefrag.core`. Nothing is built at import time.
"""

from __future__ import annotations

from tfcommon.runtime import Components, ServiceContext, ServiceSpec, run_service
from tfcommon.settings import DefragSettings

SERVICE = "defrag-planner"


async def compose(context: ServiceContext[DefragSettings]) -> Components:
    return Components()


def build(settings: DefragSettings) -> ServiceSpec[DefragSettings]:
    """The defrag-planner service as the runtime runs it."""
    return ServiceSpec(name=SERVICE, settings=settings, port=settings.port, compose=compose)


def main() -> int:
    return run_service(build(DefragSettings()))
