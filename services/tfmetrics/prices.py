"""Billing's price per hour of a dedicated GPU, by model: `TF_GPU_COST_PER_HOUR`, over the cluster's
ProviderConfig `hardwareMetadata[].costPerHour`, kept current through a watch.

`LivePrices` is the mapping billing reads (`tfmetrics.core.billing.dedicated_cost`): the setting's
prices win, a model it does not price takes the ProviderConfig's (`tfcommon.provider_config`). In
Kubernetes mode (`tfcommon.pool_source.pools_from_cluster`) `wire_prices` watches the ProviderConfig
objects, so an edit is in force for the next bill within a second; outside it the setting is all.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from decimal import Decimal

from tfcommon.cluster.model import CustomObject, CustomResource
from tfcommon.provider_config import hardware_models, provider_prices

log = logging.getLogger("tfmetrics.prices")


class LivePrices(Mapping[str, Decimal]):
    """The prices in force: `configured` (the setting) over those the ProviderConfig watch last gave."""

    def __init__(self, configured: Mapping[str, Decimal]) -> None:
        self.configured = dict(configured)
        self.synced = asyncio.Event()
        self._prices = dict(configured)
        self._reported: list[str] = []

    def __getitem__(self, model: str) -> Decimal:
        return self._prices[model]

    def __iter__(self) -> Iterator[str]:
        return iter(self._prices)

    def __len__(self) -> int:
        return len(self._prices)

    def observe(self, objects: Mapping[str, CustomObject]) -> None:
        """Take the watch's current ProviderConfig objects; touches no I/O."""
        models, problems = hardware_models((obj.name, obj.spec) for obj in objects.values())
        for problem in problems:
            if problem not in self._reported:
                log.warning(problem + "; entry skipped", extra={"event": "metrics.provider_invalid"})
        self._reported = problems
        self._prices = {**provider_prices(models), **self.configured}
        self.synced.set()


def wire_prices(
    configured: Mapping[str, Decimal], stop: asyncio.Event, on_close: Callable[[Callable[[], None]], object]
) -> tuple[LivePrices, dict[str, Callable[[], Awaitable[None]]]]:
    """The prices billing reads and, in Kubernetes mode, the `provider-configs` watch keeping them (on
    the service account's API server, or $KUBECONFIG; `on_close` registers closing its client)."""
    from tfcommon.cluster.custom_watch import cluster_watch_task

    prices = LivePrices(configured)
    kind = CustomResource.PROVIDER_CONFIG
    return prices, cluster_watch_task("provider-configs", kind, prices.observe, stop, on_close)
