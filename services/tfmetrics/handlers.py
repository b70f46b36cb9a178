"""The metrics service's reactions to events: keep the agents' latest usage, count system events.

Handlers return no events. Label values are bounded: a release's free-text reason is counted under
its code (`tfmetrics.core.release_reasons`). Counting is at-least-once: a redelivered event (after a
crash before its ack) is counted again, which a Prometheus `rate()` tolerates.
"""

from __future__ import annotations

from collections.abc import Sequence

from tfcommon.consumer import Handler
from tfcommon.events import (
    AllocationCreated,
    AllocationReleased,
    DriftDetected,
    GpuUsageReported,
    Message,
    PodEvicted,
    WorkloadUnschedulable,
)

from tfmetrics.core.release_reasons import release_reason_code
from tfmetrics.exporter import SeriesBoard
from tfmetrics.live import LiveView
from tfmetrics.recommender import UsageWindow


def record_usage_handler(view: LiveView, window: UsageWindow | None = None) -> Handler:
    async def record_usage(message: Message) -> Sequence[Message]:
        if isinstance(message, GpuUsageReported):
            view.record_usage(message)
            if window is not None:
                window.add(message)
        return ()

    return record_usage


def count_events_handler(board: SeriesBoard) -> Handler:
    async def count_event(message: Message) -> Sequence[Message]:
        if isinstance(message, AllocationCreated):
            board.count("tf_system_allocations_succeeded", pool=message.pool, qos=message.qos)
        elif isinstance(message, AllocationReleased):
            board.count(
                "tf_system_allocations_released",
                reason=release_reason_code(message.reason, evicted=message.evicted),
            )
        elif isinstance(message, WorkloadUnschedulable):
            board.count("tf_system_allocations_failed", pool=message.pool)
        elif isinstance(message, PodEvicted):
            board.count("tf_system_evictions", pool=message.pool, by=message.by)
        elif isinstance(message, DriftDetected):
            board.count("tf_system_drift_detected", node=message.node, kind=message.kind)
        return ()

    return count_event
