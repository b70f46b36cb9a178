"""Keeps the agents' per-worker usage over the window and stores autoscaling recommendations.

`UsageWindow` holds each workload's samples (from `GpuUsageReported` worker rows) for the configured
window, in memory: after a restart the window fills again while the stored recommendations stay.
`Recommender.run_once` computes the recommendation of every workload that holds GPUs now (`tfmetrics
.core.recommendations`, capped at the card it runs on) and makes them the ledger's whole set: a workload
that holds none any more (released, ended, deleted) loses its recommendation. `build_recommendations_router`
serves `GET /api/v1/recommendations` with each one's expected hourly saving on the pool's current prices.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from tfcommon.config import TfConfig
from tfcommon.events import GpuUsageReported
from tfcommon.ledger.recommendations import RecommendationStore
from tfcommon.recommendations import Recommendation, workload_key

from tfmetrics.billing_api import pool_pricing
from tfmetrics.core.pricing import PricingError
from tfmetrics.core.recommendations import (
    RecommendationPolicy,
    UsagePoint,
    current_resources,
    hourly_saving,
    recommend,
)
from tfmetrics.core.series import ClusterSnapshot

MAX_SAMPLES_PER_WORKLOAD = 100_000


@dataclass
class UsageWindow:
    """Per-workload usage samples no older than `window`; at most `max_samples` each (oldest out)."""

    window: timedelta
    max_samples: int = MAX_SAMPLES_PER_WORKLOAD
    _samples: dict[str, deque[tuple[datetime, UsagePoint]]] = field(default_factory=dict)
    _last_report: dict[str, datetime] = field(default_factory=dict)

    def add(self, event: GpuUsageReported) -> None:
        """Record the report's worker rows; one not newer than the node's last (a redelivery) is ignored."""
        last = self._last_report.get(event.node)
        if last is not None and event.sampled_at <= last:
            return
        self._last_report[event.node] = event.sampled_at
        for worker in event.workers:
            samples = self._samples.setdefault(
                workload_key(worker.namespace, worker.workload), deque(maxlen=self.max_samples)
            )
            samples.append((event.sampled_at, UsagePoint(worker.compute_tflops_milli, worker.memory_bytes)))

    def samples(self, key: str, now: datetime) -> list[UsagePoint]:
        """The workload's samples taken in (now - window, now]; older ones are dropped."""
        samples = self._samples.get(key)
        if samples is None:
            return []
        oldest = now - self.window
        while samples and samples[0][0] <= oldest:
            samples.popleft()
        return [point for taken_at, point in samples if taken_at <= now]


@dataclass
class Recommender:
    """Computes and stores recommendations for the workloads of the latest ledger snapshot."""

    store: RecommendationStore
    usage: UsageWindow
    policy: RecommendationPolicy
    snapshot: Callable[[], ClusterSnapshot | None]
    clock: Callable[[], datetime]

    def compute(self) -> list[Recommendation] | None:
        """One recommendation per workload holding GPUs in the latest snapshot; None before the first."""
        snapshot = self.snapshot()
        if snapshot is None:
            return None
        now = self.clock()
        return [
            recommend(key, self.usage.samples(key, now), current, self.policy, now, self.usage.window)
            for key, current in sorted(current_resources(snapshot.shares, snapshot.gpus).items())
        ]

    async def run_once(self) -> list[Recommendation]:
        """Store the computed set in place of the previous one (nothing is stored before a snapshot)."""
        recommendations = self.compute()
        if recommendations is None:
            return []
        await self.store.replace(recommendations)
        return recommendations


def recommendation_to_json(recommendation: Recommendation, saving: str | None) -> dict[str, Any]:
    """The wire form: quantities as integers (milli-TFLOPS, bytes), money as a decimal string."""
    return {
        "workload": recommendation.workload_key,
        "pool": recommendation.pool,
        "qos": recommendation.qos,
        "gpuCount": recommendation.gpu_count,
        "current": {
            "tflopsRequestMilli": recommendation.current_request_tflops_milli,
            "tflopsLimitMilli": recommendation.current_limit_tflops_milli,
            "vramRequestBytes": recommendation.current_request_vram_bytes,
            "vramLimitBytes": recommendation.current_limit_vram_bytes,
        },
        "recommended": {
            "tflopsRequestMilli": recommendation.request_tflops_milli,
            "tflopsLimitMilli": recommendation.limit_tflops_milli,
            "vramRequestBytes": recommendation.request_vram_bytes,
            "vramLimitBytes": recommendation.limit_vram_bytes,
        },
        "sampleCount": recommendation.sample_count,
        "sufficient": recommendation.sufficient,
        "reason": recommendation.reason,
        "computedAt": recommendation.computed_at.isoformat(),
        "expectedSavingPerHour": saving,
    }


def build_recommendations_router(store: RecommendationStore, config: Callable[[], TfConfig]) -> APIRouter:
    """`GET /api/v1/recommendations`: the stored recommendations with their expected hourly saving."""
    router = APIRouter(tags=["recommendations"])

    @router.get("/api/v1/recommendations")
    async def get_recommendations() -> JSONResponse:
        stored = await store.all()
        try:
            pricing = pool_pricing(config(), {item.pool for item in stored})
        except PricingError as error:
            return JSONResponse({"error": f"configuration file: {error}"}, status_code=503)
        items = []
        for item in stored:
            book = pricing[item.pool].books[-1][1]
            items.append(recommendation_to_json(item, str(hourly_saving(item, book))))
        return JSONResponse({"recommendations": items})

    return router
