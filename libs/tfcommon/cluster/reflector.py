"""Exactly-once pod delivery over list + watch: drops repeats, turns a relist into the missing events.

Pure bookkeeping shared by every `Cluster` adapter. A watch can replay an event (reconnect from an older
version), and after `410 Gone` the adapter must relist: `resync` compares the fresh list with what was
delivered and yields only the difference, so a consumer sees each change once and misses none.
"""

from __future__ import annotations

from collections.abc import Iterable

from tfcommon.cluster.model import Pod, PodEvent, PodEventType, WatchCursor


class PodReflector:
    """Tracks the last delivered version of each pod (by uid) and the resource version to resume from."""

    def __init__(self, cursor: WatchCursor | None = None) -> None:
        self.resource_version: str | None = cursor.resource_version if cursor else None
        self._seen: dict[str, Pod] = {
            uid: Pod(namespace=namespace, name=name, uid=uid, resource_version=version)
            for uid, (namespace, name, version) in (cursor.seen.items() if cursor else ())
        }

    @property
    def cursor(self) -> WatchCursor:
        return WatchCursor(
            resource_version=self.resource_version or "",
            seen={uid: (p.namespace, p.name, p.resource_version) for uid, p in self._seen.items()},
        )

    def observe(self, event_type: PodEventType, pod: Pod) -> PodEvent | None:
        """One watch event; None when it repeats what was already delivered."""
        if pod.resource_version:
            self.resource_version = pod.resource_version
        known = self._seen.get(pod.uid)
        if event_type is PodEventType.DELETED:
            if known is None:
                return None
            del self._seen[pod.uid]
            return PodEvent(PodEventType.DELETED, pod)
        if known is not None and known.resource_version == pod.resource_version:
            return None
        self._seen[pod.uid] = pod
        return PodEvent(PodEventType.ADDED if known is None else PodEventType.MODIFIED, pod)

    def bookmark(self, resource_version: str) -> None:
        self.resource_version = resource_version

    def resync(self, pods: Iterable[Pod], resource_version: str) -> list[PodEvent]:
        """A full list at `resource_version`: the deletions, additions and changes not yet delivered."""
        listed = {pod.uid: pod for pod in pods}
        events = [
            PodEvent(PodEventType.DELETED, gone)
            for uid, gone in sorted(self._seen.items(), key=lambda item: (item[1].namespace, item[1].name))
            if uid not in listed
        ]
        for uid in [uid for uid in self._seen if uid not in listed]:
            del self._seen[uid]
        for pod in sorted(listed.values(), key=lambda p: (p.namespace, p.name)):
            event = self.observe(PodEventType.MODIFIED, pod)
            if event is not None:
                events.append(event)
        self.resource_version = resource_version
        return events
