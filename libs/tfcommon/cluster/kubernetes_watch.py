"""The pod watch of `KubernetesCluster`: list, watch from the list's version, relist on `410 Gone`.

A watch request is read line by line in a daemon thread (the `kubernetes` client is synchronous) and its
events cross to the asyncio loop through a queue; `PodReflector` drops repeats and turns a relist into
the missed changes.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import urllib3
from kubernetes.watch.watch import iter_resp_lines

from tfcommon.cluster.manifests import pod_from_manifest
from tfcommon.cluster.model import ClusterError, PodEvent, PodEventType, WatchCursor
from tfcommon.cluster.reflector import PodReflector

if TYPE_CHECKING:
    from tfcommon.cluster.kubernetes import KubernetesCluster

GONE = 410


def _deleted_at_once(manifest: dict[str, Any]) -> bool:
    """The first of the two writes by which the API server deletes a pod with no grace period and no
    finalizer (`deletionTimestamp` set, then the deletion in the same request): no news, the `DELETED`
    event follows. A pod left terminating (a grace period, or a finalizer) is delivered as `MODIFIED`."""
    meta = manifest.get("metadata") or {}
    return bool(
        meta.get("deletionTimestamp")
        and meta.get("deletionGracePeriodSeconds") == 0
        and not meta.get("finalizers")
    )


@dataclass(frozen=True)
class _StreamEnded:
    error: BaseException | None = None


class _WatchStream:
    """One watch request read line by line in a daemon thread; items arrive on an asyncio queue."""

    def __init__(self, open_response: Callable[[], Any]) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[dict[str, Any] | _StreamEnded] = asyncio.Queue()
        self._open_response = open_response
        self._closed = threading.Event()
        threading.Thread(target=self._run, name="tf-pod-watch", daemon=True).start()

    async def next(self) -> dict[str, Any] | _StreamEnded:
        return await self._queue.get()

    def close(self) -> None:
        """Stop delivering at once. The thread may sit in a blocking read until the next line or the
        server-side timeout; it then closes the connection and ends (closing it from here would block)."""
        self._closed.set()

    def _push(self, item: dict[str, Any] | _StreamEnded) -> None:
        if self._closed.is_set():
            return
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:
            self._closed.set()

    def _run(self) -> None:
        try:
            rest = self._open_response()
            if not 200 <= rest.status < 300:
                raw = rest.read()
                body = json.loads(raw) if raw else {}
                self._push(_StreamEnded(ClusterError(rest.status, str(body.get("reason", "")), str(body))))
                return
            try:
                for line in iter_resp_lines(rest.response):  # type: ignore[no-untyped-call]
                    if self._closed.is_set():
                        return
                    if line and not line.isspace():
                        self._push(json.loads(line))
            finally:
                rest.response.close()
            self._push(_StreamEnded())
        except (urllib3.exceptions.ReadTimeoutError, urllib3.exceptions.ProtocolError):
            self._push(_StreamEnded())
        except Exception as error:
            self._push(_StreamEnded(error))


class KubernetesPodWatch:
    """List, then watch from the list's version; relist on `410 Gone`; never deliver a change twice."""

    def __init__(self, cluster: KubernetesCluster, scheduler_name: str, cursor: WatchCursor | None) -> None:
        self._cluster = cluster
        self._scheduler_name = scheduler_name
        self._reflector = PodReflector(cursor)
        self._ready: deque[PodEvent] = deque()
        self._stream: _WatchStream | None = None
        self._closed = False

    @property
    def cursor(self) -> WatchCursor:
        return self._reflector.cursor

    def __aiter__(self) -> KubernetesPodWatch:
        return self

    async def __anext__(self) -> PodEvent:
        while not self._ready:
            if self._closed:
                raise StopAsyncIteration
            if not self._reflector.resource_version:
                await self._relist()
                continue
            if self._stream is None:
                self._stream = self._open_stream(self._reflector.resource_version)
            self._take(await self._stream.next())
        return self._ready.popleft()

    async def aclose(self) -> None:
        self._closed = True
        self._drop_stream()

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    async def _relist(self) -> None:
        self._drop_stream()
        listed = await self._cluster.list_scheduler_pods(self._scheduler_name)
        self._ready.extend(self._reflector.resync(listed.items, listed.resource_version))

    def _open_stream(self, resource_version: str) -> _WatchStream:
        cluster = self._cluster
        query = [
            ("watch", "true"),
            ("resourceVersion", resource_version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(cluster.watch_timeout_s)),
            ("fieldSelector", f"spec.schedulerName={self._scheduler_name}"),
        ]
        timeout = (cluster.request_timeout_s, cluster.watch_timeout_s + 5)
        return _WatchStream(lambda: cluster.open_request("GET", "/api/v1/pods", query, timeout=timeout))

    def _take(self, item: dict[str, Any] | _StreamEnded) -> None:
        if isinstance(item, _StreamEnded):
            self._stream = None
            if isinstance(item.error, ClusterError) and item.error.status == GONE:
                self._reflector.resource_version = None
            elif isinstance(item.error, ClusterError):
                raise item.error
            elif item.error is not None:
                raise ClusterError(0, type(item.error).__name__, str(item.error)) from item.error
            return
        kind = str(item.get("type", ""))
        obj = item.get("object") or {}
        if kind == "ERROR":
            self._drop_stream()
            if obj.get("code") == GONE:
                self._reflector.resource_version = None
                return
            raise ClusterError(
                int(obj.get("code") or 0), str(obj.get("reason", "")), str(obj.get("message", ""))
            )
        if kind == "BOOKMARK":
            self._reflector.bookmark(str(obj.get("metadata", {}).get("resourceVersion", "")))
            return
        if kind not in PodEventType.__members__:
            return
        if kind == "MODIFIED" and _deleted_at_once(obj):
            self._reflector.bookmark(str(obj.get("metadata", {}).get("resourceVersion", "")))
            return
        pod = pod_from_manifest(obj)
        if pod.scheduler_name != self._scheduler_name:
            return
        event = self._reflector.observe(PodEventType(kind), pod)
        if event is not None:
            self._ready.append(event)
