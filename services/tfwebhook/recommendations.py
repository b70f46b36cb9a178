"""Keeps the webhook's copy of the stored autoscaling recommendations fresh, off the admission path.

`refresh_recommendations` re-reads the ledger's `workload_recommendation` table every `interval_s`
into a `RecommendationCache`; admissions only read the cache (`AdmissionService.recommendations`). A
failed read keeps the previous copy, so a ledger outage never blocks or slows admission.
"""

from __future__ import annotations

import asyncio
import contextlib

from tfcommon.ledger.recommendations import RecommendationCache

REFRESH_INTERVAL_S = 30.0


async def refresh_recommendations(
    cache: RecommendationCache, stopping: asyncio.Event, interval_s: float = REFRESH_INTERVAL_S
) -> None:
    """Refresh `cache` now and then every `interval_s` until `stopping` is set."""
    while not stopping.is_set():
        await cache.refresh()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), timeout=interval_s)
