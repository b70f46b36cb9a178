"""Namespace labels for automatic migration's `namespaceSelector`, read through the `Cluster` port.

`NamespaceLabelCache` answers from memory for `ttl_s` seconds after each read, so a burst of pods in
one namespace costs one API call; concurrent misses for the same namespace share that call. A
namespace that does not exist, or an API server that fails, gives None (labels unknown: a
namespace selector then does not match); a failure keeps serving the last labels read, if any.
The webhook asks only when the configuration has a `namespaceSelector`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping

from tfcommon.cluster.model import Namespace

log = logging.getLogger("tfwebhook.namespaces")

ReadNamespace = Callable[[str], Awaitable[Namespace | None]]


class NamespaceLabelCache:
    """`await cache(namespace)` -> the namespace's labels, None when unknown; a `NamespaceLabels`."""

    def __init__(
        self,
        read: ReadNamespace,
        *,
        ttl_s: float = 10.0,
        max_entries: int = 4096,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._read = read
        self.ttl_s = ttl_s
        self.max_entries = max_entries
        self._clock = clock
        self._entries: dict[str, tuple[float, Mapping[str, str] | None]] = {}
        self._reading: dict[str, asyncio.Task[Mapping[str, str] | None]] = {}

    async def __call__(self, namespace: str) -> Mapping[str, str] | None:
        entry = self._entries.get(namespace)
        if entry is not None and self._clock() < entry[0]:
            return entry[1]
        reading = self._reading.get(namespace)
        if reading is None:
            reading = asyncio.get_running_loop().create_task(self._refresh(namespace))
            self._reading[namespace] = reading
            reading.add_done_callback(lambda _: self._reading.pop(namespace, None))
        return await asyncio.shield(reading)

    async def _refresh(self, namespace: str) -> Mapping[str, str] | None:
        try:
            found = await self._read(namespace)
        except Exception as error:  # the API server being down must not block admission
            log.warning(
                "namespace %s not read: %s",
                namespace,
                error,
                extra={"event": "webhook.namespace_read_failed"},
            )
            stale = self._entries.get(namespace)
            return stale[1] if stale is not None else None
        labels = dict(found.labels) if found is not None else None
        if len(self._entries) >= self.max_entries and namespace not in self._entries:
            del self._entries[next(iter(self._entries))]
        self._entries[namespace] = (self._clock() + self.ttl_s, labels)
        return labels


async def local_namespace_labels(namespace: str) -> Mapping[str, str]:
    """Local mode has namespaces without labels."""
    return {}
