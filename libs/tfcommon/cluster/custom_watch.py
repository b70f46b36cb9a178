"""A watch of one kind of our custom resources on the API server: every object, kept current within a second.

`watch_custom_objects` lists the kind, then watches from the list's resource version and calls
`on_change` with every object by name after each change (added, modified, deleted); a watch that ends
is reopened from the last version seen, and a `410 Gone` or any error relists after `retry_s`. The first
call comes right after the first list, so a caller starts with the cluster's state. Used for GPUPool
objects (`tfcommon.pool_source`) and, through `cluster_watch_task`, WorkloadProfile and ProviderConfig
objects.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from functools import partial
from typing import Any

from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.cluster.kubernetes_watch import GONE, _StreamEnded, _WatchStream
from tfcommon.cluster.manifests import custom_object_from_manifest
from tfcommon.cluster.model import (
    CUSTOM_RESOURCE_GROUP,
    CUSTOM_RESOURCE_VERSION,
    ClusterError,
    CustomObject,
    CustomResource,
)

log = logging.getLogger(__name__)
Objects = Mapping[str, CustomObject]


def _path(kind: CustomResource) -> str:
    return f"/apis/{CUSTOM_RESOURCE_GROUP}/{CUSTOM_RESOURCE_VERSION}/{kind.plural}"


def _key(obj: CustomObject) -> str:
    return f"{obj.namespace}/{obj.name}" if obj.namespace else obj.name


async def _list(cluster: KubernetesCluster, kind: CustomResource) -> tuple[dict[str, CustomObject], str]:
    def call() -> dict[str, Any]:
        response = cluster.open_request("GET", _path(kind))
        raw = response.read()
        body = json.loads(raw) if raw else {}
        if not 200 <= response.status < 300:
            raise ClusterError(response.status, str(body.get("reason", "")), str(body.get("message", "")))
        return dict(body)

    body = await asyncio.to_thread(call)
    objects = [custom_object_from_manifest(kind, item) for item in body.get("items") or ()]
    return {_key(o): o for o in objects}, str((body.get("metadata") or {}).get("resourceVersion", ""))


async def watch_custom_objects(
    cluster: KubernetesCluster,
    kind: CustomResource,
    on_change: Callable[[Objects], None],
    stop: asyncio.Event,
    *,
    retry_s: float = 1.0,
) -> None:
    """Keep calling `on_change(objects by name)` until `stop` is set."""
    while not stop.is_set():
        try:
            await _follow(cluster, kind, on_change, stop)
        except ClusterError as error:
            log.warning("watch of %s failed, listing again in %.0fs: %s", kind.plural, retry_s, error)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=retry_s)


async def _follow(
    cluster: KubernetesCluster,
    kind: CustomResource,
    on_change: Callable[[Objects], None],
    stop: asyncio.Event,
) -> None:
    objects, version = await _list(cluster, kind)
    on_change(dict(objects))
    while not stop.is_set():
        query = [
            ("watch", "true"),
            ("resourceVersion", version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(cluster.watch_timeout_s)),
        ]
        timeout = (cluster.request_timeout_s, cluster.watch_timeout_s + 5)
        stream = _WatchStream(partial(cluster.open_request, "GET", _path(kind), query, timeout=timeout))
        stopping = asyncio.create_task(stop.wait())
        try:
            while True:
                reading = asyncio.create_task(stream.next())
                await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not reading.done():
                    reading.cancel()
                    return
                item = reading.result()
                if isinstance(item, _StreamEnded):
                    if isinstance(item.error, ClusterError):
                        raise item.error
                    if item.error is not None:
                        raise ClusterError(0, type(item.error).__name__, str(item.error))
                    break  # the server ended the watch: reopen it from `version`
                event, manifest = str(item.get("type", "")), item.get("object") or {}
                if event == "ERROR":
                    if manifest.get("code") == GONE:
                        return  # too old: list again
                    raise ClusterError(int(manifest.get("code") or 0), str(manifest.get("reason", "")), "")
                version = str((manifest.get("metadata") or {}).get("resourceVersion") or version)
                if event == "BOOKMARK":
                    continue
                obj = custom_object_from_manifest(kind, manifest)
                if event == "DELETED":
                    objects.pop(_key(obj), None)
                else:
                    objects[_key(obj)] = obj
                on_change(dict(objects))
        finally:
            stream.close()
            stopping.cancel()


def cluster_watch_task(
    name: str,
    kind: CustomResource,
    on_change: Callable[[Objects], None],
    stop: asyncio.Event,
    on_close: Callable[[Callable[[], None]], object],
) -> dict[str, Callable[[], Awaitable[None]]]:
    """A service's background task `name` keeping `on_change` fed from a watch of `kind`, in Kubernetes
    mode (`tfcommon.pool_source.pools_from_cluster`) only: none outside it. The watch uses the service
    account's API server, or $KUBECONFIG; `on_close` registers closing its client."""
    from tfcommon.pool_source import pools_from_cluster

    if not pools_from_cluster():
        return {}
    cluster = KubernetesCluster.from_environment()
    on_close(cluster.close)
    return {name: lambda: watch_custom_objects(cluster, kind, on_change, stop)}
