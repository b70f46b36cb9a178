"""Keeps this node's `GPUNode` and `GPU` objects in Kubernetes equal to the agent's inventory.

The shell around `tfagent.core.custom_resources`: after discovery and every rediscovery (`notify`) it
creates what is missing (each GPU owned by the GPUNode, so it goes with it), merges its labels into the
objects (users' labels stay) and merge-patches the status fields the agent owns through the status
subresource. A GPU that disappears is marked `Unknown`, never deleted. Failed writes are retried. It
touches only the GPUNode named after its node and the GPUs it discovered there; everything else (the
scheduler's availability fields, GPUPool) belongs to others.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from importlib import metadata

from tfcommon.cluster import Applied, ClusterError, Conflict, CustomObject, CustomResource, NotFound

from tfagent.core.custom_resources import DesiredObject, Status, desired_objects, object_labels
from tfagent.core.inventory import NodeInventory
from tfagent.ports import CustomResourceWriter

log = logging.getLogger("tfagent.kubernetes")


def _agent_version() -> str:
    try:
        return metadata.version("tfpool")
    except metadata.PackageNotFoundError:
        return "unknown"


AGENT_VERSION = _agent_version()
"""Written as the GPUNode's `hypervisorStatus.hypervisorVersion` (TensorFusion's name)."""
RETRY_INTERVAL_S = 5.0
FULL_REWRITE_S = 600.0


class KubernetesStatus:
    """Writes one node's GPUNode and GPU objects. `notify(inventory)` after each discovery; `run` until
    stopped (it writes, and retries a failed write every `retry_interval_s`), or call `sync` directly."""

    def __init__(
        self,
        cluster: CustomResourceWriter,
        *,
        node: str,
        pool: str,
        retry_interval_s: float = RETRY_INTERVAL_S,
        full_rewrite_s: float = FULL_REWRITE_S,
    ) -> None:
        self.cluster = cluster
        self.node = node
        self.pool = pool
        self.retry_interval_s = retry_interval_s
        self.full_rewrite_s = full_rewrite_s
        self._inventory: NodeInventory | None = None
        self._changed = asyncio.Event()
        self._labels_written: dict[str, tuple[tuple[tuple[str, str], ...], str]] = {}
        self._status_written: dict[tuple[CustomResource, str], Status] = {}
        self._cache_started: float | None = None

    def notify(self, inventory: NodeInventory) -> None:
        """A discovery round finished: write what it found soon."""
        self._inventory = inventory
        self._changed.set()

    async def run(self, stopping: asyncio.Event) -> None:
        """Write after every notification until `stopping` is set; a failed write is tried again."""
        failed = False
        while not stopping.is_set():
            await self._wait(stopping, self.retry_interval_s if failed else None)
            if stopping.is_set():
                return
            if not self._changed.is_set() and not failed:
                continue
            self._changed.clear()
            if self._inventory is None:
                continue
            try:
                await self.sync(self._inventory)
                failed = False
            except ClusterError as error:
                failed = True
                log.warning(
                    "writing this node's GPUNode and GPU objects failed; retrying in %.0f s: %s",
                    self.retry_interval_s,
                    error,
                    extra={"event": "agent.kubernetes_status", "outcome": "error"},
                )

    async def _wait(self, stopping: asyncio.Event, limit_s: float | None) -> None:
        waiters = {asyncio.ensure_future(self._changed.wait()), asyncio.ensure_future(stopping.wait())}
        try:
            await asyncio.wait(waiters, timeout=limit_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*waiters, return_exceptions=True)

    async def sync(self, inventory: NodeInventory) -> int:
        """Create, label and write the status of the GPUNode and every GPU; returns how many writes."""
        self._expire_cache()
        gpu_node = await self._ensure_gpu_node()
        previously = gpu_node.status.get("managedGPUDeviceIDs")
        managed = previously if isinstance(previously, list) else ()
        desired = desired_objects(inventory, self.pool, managed, agent_version=AGENT_VERSION)
        writes = 0
        for name, gpu in desired.gpus.items():
            writes += await self._ensure_gpu(name, gpu, gpu_node)
            writes += await self._write_status(CustomResource.GPU, name, gpu.status)
        for name, status in desired.vanished.items():
            log.warning(
                "GPU %s is gone from node %s; marked Unknown",
                name,
                self.node,
                extra={"event": "agent.gpu_unknown"},
            )
            writes += await self._write_status(CustomResource.GPU, name, status)
        writes += await self._write_status(CustomResource.GPU_NODE, self.node, desired.node.status)
        return writes

    def _expire_cache(self) -> None:
        now = asyncio.get_running_loop().time()
        if self._cache_started is None or now - self._cache_started >= self.full_rewrite_s:
            self._labels_written.clear()
            self._status_written.clear()
            self._cache_started = now

    async def _ensure_gpu_node(self) -> CustomObject:
        labels = object_labels(self.node, self.pool)
        found = await self.cluster.get_custom_object(CustomResource.GPU_NODE, self.node)
        if found is None:
            created = await self.cluster.create_custom_object(
                CustomResource.GPU_NODE, self.node, labels=labels
            )
            _require_resource(created, "gpunodes")
            log.info("created GPUNode %s", self.node, extra={"event": "agent.gpunode_created"})
            found = await self.cluster.get_custom_object(CustomResource.GPU_NODE, self.node)
            if found is None:
                raise ClusterError(
                    404, "NotFound", f"GPUNode {self.node} vanished right after it was created"
                )
        elif any(found.labels.get(key) != value for key, value in labels.items()):
            _require_resource(
                await self.cluster.patch_custom_metadata(CustomResource.GPU_NODE, self.node, labels=labels),
                "gpunodes",
            )
        return found

    async def _ensure_gpu(self, name: str, gpu: DesiredObject, owner: CustomObject) -> int:
        written = (tuple(sorted(gpu.labels.items())), owner.uid)
        if self._labels_written.get(name) == written:
            return 0
        result = await self.cluster.patch_custom_metadata(
            CustomResource.GPU, name, labels=gpu.labels, owner=owner
        )
        if isinstance(result, NotFound):
            result = await self.cluster.create_custom_object(
                CustomResource.GPU, name, labels=gpu.labels, owner=owner
            )
            if isinstance(result, Conflict):  # created meanwhile by an older writer: label and own it
                result = await self.cluster.patch_custom_metadata(
                    CustomResource.GPU, name, labels=gpu.labels, owner=owner
                )
            else:
                log.info("created GPU %s on %s", name, self.node, extra={"event": "agent.gpu_created"})
        _require_resource(result, "gpus")
        self._labels_written[name] = written
        return 1

    async def _write_status(self, kind: CustomResource, name: str, status: Mapping[str, object]) -> int:
        key = (kind, name)
        if self._status_written.get(key) == status:
            return 0
        result = await self.cluster.patch_custom_status(kind, name, status)
        if isinstance(result, NotFound):  # deleted by someone (a vanished GPU): nothing to mark
            self._status_written[key] = dict(status)
            return 0
        _require_resource(result, kind.plural)
        self._status_written[key] = dict(status)
        return 1


def _require_resource(result: object, plural: str) -> None:
    if isinstance(result, NotFound):
        raise ClusterError(
            404,
            "NotFound",
            f"{plural}.tensor-fusion.ai: {result.message}; install the CRDs (kubectl apply -k k8s/base)",
        )
    if isinstance(result, Conflict):
        raise ClusterError(409, "Conflict", f"{plural}.tensor-fusion.ai: {result.message}")
    if not isinstance(result, Applied):
        raise ClusterError(0, "Unexpected", f"{plural}.tensor-fusion.ai: {result!r}")
