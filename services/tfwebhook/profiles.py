"""The webhook's view of the cluster's WorkloadProfile objects, kept current through a watch.

In Kubernetes mode (`tfcommon.pool_source.pools_from_cluster`) `wire_profiles` watches the objects
(`tfcommon.cluster.custom_watch.cluster_watch_task`) and `WatchedProfiles` serves them to admission
(`AdmissionContext.profiles`, by `namespace/name`): a pod naming one in annotation
`tensor-fusion.ai/workload-profile` gets its keys wherever its own are unset (`tfwebhook.core.profile`).
An invalid object keeps its last good version and is logged (the webhook writes nothing to the API
server). Outside Kubernetes mode there are none, and a pod naming a profile is denied.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping

from tfcommon.cluster.model import CustomObject, CustomResource

from tfwebhook.core.profile import WorkloadProfile, profiles_in_force

log = logging.getLogger("tfwebhook.profiles")


class WatchedProfiles:
    """Callable: the profiles by `namespace/name` the watch last delivered (the same mapping until one
    changes, so the verdict cache can tell by identity)."""

    def __init__(self) -> None:
        self.synced = asyncio.Event()
        self._profiles: Mapping[str, WorkloadProfile] = {}
        self._reported: dict[str, str] = {}

    def __call__(self) -> Mapping[str, WorkloadProfile]:
        return self._profiles

    def observe(self, objects: Mapping[str, CustomObject]) -> None:
        """Take the watch's current objects (by `namespace/name`); touches no I/O."""
        specs = {key: (obj.namespace or "", obj.name, obj.spec) for key, obj in objects.items()}
        profiles, problems = profiles_in_force(specs, self._profiles)
        for key, message in problems.items():
            if self._reported.get(key) != message:
                log.warning(message, extra={"event": "webhook.profile_invalid"})
        self._reported = problems
        if profiles != self._profiles:
            self._profiles = profiles
        self.synced.set()


def wire_profiles(
    stop: asyncio.Event, on_close: Callable[[Callable[[], None]], object]
) -> tuple[WatchedProfiles, dict[str, Callable[[], Awaitable[None]]]]:
    """The profiles admission reads and, in Kubernetes mode, the `workload-profiles` watch keeping them
    (on the service account's API server, or $KUBECONFIG; `on_close` registers closing its client)."""
    from tfcommon.cluster.custom_watch import cluster_watch_task

    profiles = WatchedProfiles()
    kind = CustomResource.WORKLOAD_PROFILE
    return profiles, cluster_watch_task("workload-profiles", kind, profiles.observe, stop, on_close)
