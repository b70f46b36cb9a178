"""OpenTelemetry instruments for the series in `tfmetrics.core.series`, and the `GET /metrics` route.

The instruments are created once per process on the global meter provider (OpenTelemetry allows one
per process); their callbacks read whichever `LiveView` is current, so a service rebuilt in the same
process (tests) reports its own data and a stopped one reports nothing. `/metrics` renders the
Prometheus registry that the OpenTelemetry Prometheus reader feeds. Counters of system events are
OpenTelemetry counters (`_total` in Prometheus). Nothing here talks to a metrics backend, so a backend
that is down cannot take the service down.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from fastapi import APIRouter
from fastapi.responses import PlainTextResponse, Response
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Counter, Observation
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest

from tfmetrics.core.series import SERIES, Sample

SYSTEM_COUNTERS: dict[str, str] = {
    "tf_system_allocations_succeeded": "allocations created in the ledger",
    "tf_system_allocations_released": "allocations released or evicted",
    "tf_system_allocations_failed": "placements that found no GPU (workload unschedulable)",
    "tf_system_evictions": "pods evicted (defrag, preemption, drain)",
    "tf_system_drift_detected": "disagreements between what runs on a GPU and the ledger",
}

SampleSource = Callable[[], list[Sample]]
"""Returns the current samples; the same list object until the data changes."""


@dataclass
class SeriesBoard:
    """The process's instruments; `source` supplies the samples at each scrape (None: report nothing)."""

    source: SampleSource | None = None
    counters: dict[str, Counter] = field(default_factory=dict)
    _grouped_from: list[Sample] | None = None
    _grouped: dict[str, list[Sample]] = field(default_factory=dict)

    def observe(self, name: str) -> list[Observation]:
        """The current observations of series `name` (samples are grouped once per new sample list)."""
        samples = self.source() if self.source is not None else []
        if samples is not self._grouped_from:
            self._grouped = {}
            for sample in samples:
                self._grouped.setdefault(sample.name, []).append(sample)
            self._grouped_from = samples
        return [Observation(sample.value, dict(sample.labels)) for sample in self._grouped.get(name, [])]

    def count(self, name: str, amount: int = 1, **labels: str) -> None:
        self.counters[name].add(amount, labels)


_board: SeriesBoard | None = None


def series_board() -> SeriesBoard:
    """The process-wide board, creating its instruments on the first call."""
    global _board
    if _board is not None:
        return _board
    board = SeriesBoard()
    meter = metrics.get_meter("tfmetrics")

    def callback_for(name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        return lambda _options: board.observe(name)

    for name, description in SERIES.items():
        meter.create_observable_gauge(name, callbacks=[callback_for(name)], description=description)
    for name, description in SYSTEM_COUNTERS.items():
        board.counters[name] = meter.create_counter(name, description=description)
    _board = board
    return board


def build_metrics_router() -> APIRouter:
    """`GET /metrics`: the Prometheus text exposition of every series."""
    router = APIRouter(tags=["metrics"])

    @router.get("/metrics", response_class=PlainTextResponse)
    async def prometheus_metrics() -> Response:
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)

    return router
