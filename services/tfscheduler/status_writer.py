"""Writes the `GPU`, `GPUNode` and `GPUPool` status from the ledger, within a second of a change.

The shell around `tfscheduler.core.custom_status`: it reads the ledger (so changes by any scheduler
replica or node agent show), writes only objects whose status changed, and creates missing `GPU`
(named by lower-case UUID) and `GPUNode` objects; `GPUPool` objects are the operator's and are only
patched. A `notify()` (a placement, a release) writes after a short debounce; a poll of the ledger
catches changes made elsewhere. It decides nothing about placement and never touches spec or labels
of existing objects, nor status fields it does not own (see `custom_status`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping

from tfcommon.cluster import Applied, Cluster, ClusterError, CustomResource, NotFound
from tfcommon.ledger.sql import SqlLedger

from tfscheduler.core.custom_status import HOSTNAME_LABEL, Status, desired_status

log = logging.getLogger("tfscheduler.status")
POOL_LABEL = "tensor-fusion.ai/gpupool"
FULL_REWRITE_S = 60.0


class StatusWriter:
    """Keeps custom-resource status equal to the ledger; `run` until stopped, or call `sync` directly."""

    def __init__(
        self,
        ledger: SqlLedger,
        cluster: Cluster,
        *,
        debounce_s: float = 0.2,
        poll_interval_s: float = 0.5,
        concurrency: int = 8,
    ) -> None:
        self.ledger = ledger
        self.cluster = cluster
        self.debounce_s = debounce_s
        self.poll_interval_s = poll_interval_s
        self._gate = asyncio.Semaphore(concurrency)
        self._changed = asyncio.Event()
        self._written: dict[tuple[CustomResource, str], Status] = {}

    def notify(self) -> None:
        """Something changed in the ledger: write the status soon (after the debounce)."""
        self._changed.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Write on every notification (debounced) and every poll interval until `stop` is set."""
        loop = asyncio.get_running_loop()
        last_full = loop.time()
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=self.poll_interval_s)
            if self._changed.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.debounce_s)
            if stop.is_set():
                return
            self._changed.clear()
            if loop.time() - last_full >= FULL_REWRITE_S:
                self._written.clear()
                last_full = loop.time()
            try:
                await self.sync()
            except ClusterError as error:
                log.warning("writing custom-resource status failed, will retry: %s", error)

    async def sync(self) -> int:
        """Write every status that differs from what this writer last wrote; returns how many it wrote."""
        nodes = await self.ledger.list_nodes()
        gpus = await self.ledger.list_gpus()
        desired = desired_status(nodes, gpus)
        pool_of_node = {node.name: node.pool for node in nodes}
        pool_of_gpu = {gpu.uuid.lower(): pool_of_node.get(gpu.node, "") for gpu in gpus}
        writes = [
            self._write(CustomResource.GPU, name, status, _labels(pool_of_gpu.get(name), status))
            for name, status in desired.gpus.items()
        ]
        writes += [
            self._write(CustomResource.GPU_NODE, name, status, _labels(pool_of_node.get(name), None, name))
            for name, status in desired.nodes.items()
        ]
        writes += [
            self._write(CustomResource.GPU_POOL, name, status, None) for name, status in desired.pools.items()
        ]
        return sum(await asyncio.gather(*writes))

    async def _write(
        self, kind: CustomResource, name: str, status: Status, create_labels: Mapping[str, str] | None
    ) -> bool:
        key = (kind, name)
        if self._written.get(key) == status:
            return False
        async with self._gate:
            result = await self.cluster.patch_custom_status(kind, name, status)
            if isinstance(result, NotFound) and create_labels is not None:
                await self.cluster.create_custom_object(kind, name, labels=create_labels)
                result = await self.cluster.patch_custom_status(kind, name, status)
        if isinstance(result, Applied):
            self._written[key] = status
            return True
        if isinstance(result, NotFound):
            self._written[key] = status  # a GPUPool nobody created: try again on the next full rewrite
        return False


def _labels(pool: str | None, gpu_status: Status | None, node: str | None = None) -> dict[str, str]:
    labels: dict[str, str] = {}
    if pool:
        labels[POOL_LABEL] = pool
    if gpu_status is not None:
        node = gpu_status["nodeSelector"][HOSTNAME_LABEL]
    if node:
        labels[HOSTNAME_LABEL] = node
    return labels
