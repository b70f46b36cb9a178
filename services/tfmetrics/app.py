"""Composition root of the metrics service (serves metrics, billing and fragmentation KPIs).

Only wiring lives here: `compose` plugs routers, consumers and tasks into the shared runtime
(`tfcommon.runtime`); decisions live in `tfmetrics.core`. Nothing is built at import time.
"""

from __future__ import annotations

from tfcommon.runtime import Components, ServiceContext, ServiceSpec, run_service
from tfcommon.settings import MetricsSettings

SERVICE = "metrics"


async def compose(context: ServiceContext[MetricsSettings]) -> Components:
    return Components()


def build(settings: MetricsSettings) -> ServiceSpec[MetricsSettings]:
    """The metrics service as the runtime runs it."""
    return ServiceSpec(name=SERVICE, settings=settings, port=settings.port, compose=compose)


def main() -> int:
    return run_service(build(MetricsSettings()))
