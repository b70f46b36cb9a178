"""The webhook's view of the cluster's GPUResourceQuota objects, kept current through a watch.

In Kubernetes mode (`tfcommon.pool_source.pools_from_cluster`) `wire_quotas` watches the objects
(`tfcommon.cluster.custom_watch`) and `WatchedQuotas` serves each namespace's quota to admission
(`AdmissionContext.quota`): its
`single.defaultRequests/defaultLimits` fill a pod's zero requests and a pod over a `single` maximum is
denied with the limit named. An invalid object keeps its namespace's last good quota and is logged (the
webhook writes nothing to the API server). Outside Kubernetes mode there are none.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

from tfcommon.cluster.model import CustomObject, CustomResource
from tfcommon.pool_source import pools_from_cluster
from tfcommon.quota import NamespaceQuota, quotas_in_force

log = logging.getLogger("tfwebhook.quotas")


class WatchedQuotas:
    """Callable: the quotas by namespace the watch last delivered (a new mapping after each change)."""

    def __init__(self) -> None:
        self.synced = asyncio.Event()
        self._quotas: Mapping[str, NamespaceQuota] = {}
        self._reported: dict[str, str] = {}

    def __call__(self) -> Mapping[str, NamespaceQuota]:
        return self._quotas

    def observe(self, objects: Mapping[str, CustomObject]) -> None:
        """Take the watch's current objects (by `namespace/name`); touches no I/O."""
        quotas, problems = quotas_in_force(objects, self._quotas)
        for namespace, message in problems.items():
            if self._reported.get(namespace) != message:
                log.warning(message, extra={"event": "webhook.quota_invalid"})
        self._reported = problems
        if quotas != self._quotas:
            self._quotas = quotas
        self.synced.set()


def wire_quotas(
    stop: asyncio.Event, on_close: Callable[[Callable[[], None]], object]
) -> tuple[WatchedQuotas, dict[str, Callable[[], Awaitable[None]]]]:
    """The quotas admission reads and, in Kubernetes mode, the `gpu-resource-quotas` watch keeping them
    (on the service account's API server, or $KUBECONFIG; `on_close` registers closing its client)."""
    quotas = WatchedQuotas()
    if not pools_from_cluster():
        return quotas, {}
    from tfcommon.cluster.custom_watch import watch_custom_objects
    from tfcommon.cluster.kubernetes import KubernetesCluster

    cluster = KubernetesCluster.from_environment()
    on_close(cluster.close)
    kind = CustomResource.GPU_RESOURCE_QUOTA
    return quotas, {"gpu-resource-quotas": lambda: watch_custom_objects(cluster, kind, quotas.observe, stop)}
