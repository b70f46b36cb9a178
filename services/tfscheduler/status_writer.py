"""Writes the allocation-derived status of `GPU`, `GPUNode` and `GPUPool` from the ledger, within a second.

The shell around `tfscheduler.core.custom_status`: it reads the ledger (so changes by any scheduler
replica or node agent show) and writes only objects whose fields changed. The node agent creates the GPU
and GPUNode objects and owns their identity and capacity (`tfagent.core.custom_resources`); this writer
only merge-patches the fields it owns (`SCHEDULER_FIELDS`: availability, the pods on each GPU, and the
GPUNode phase and last heartbeat, the latter alone at most every `HEARTBEAT_WRITE_S`) and the whole
GPUPool status it computes. It creates nothing: an object not there yet is
tried again shortly; `GPUPool` objects are the operator's. A `notify()` (a placement, a release) writes
after a short debounce; a poll of the ledger catches changes made elsewhere. What it last wrote is read
back from the API server on start and every `READ_BACK_S` (one list per kind), so a status someone else
changed is written again, and one already right (after a restart, say) is not: it patches only where
the server differs. It decides nothing about placement and never touches spec, labels, or status fields
it does not own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

from tfcommon.cluster import Applied, Cluster, ClusterError, CustomResource, NotFound
from tfcommon.ledger.port import Ledger

from tfscheduler.core.custom_status import Status, desired_status, heartbeat_only_change

log = logging.getLogger("tfscheduler.status")
READ_BACK_S = 60.0
"""How often what the API server holds replaces what this writer remembers writing."""
ABSENT_RETRY_S = 2.0
HEARTBEAT_WRITE_S = 30.0
"""A GPUNode's `hypervisorStatus.lastHeartbeatTime` alone is written when it moved this much."""
SCHEDULER_FIELDS: dict[CustomResource, tuple[str, ...]] = {
    CustomResource.GPU: ("available", "runningApps"),
    CustomResource.GPU_NODE: (
        "phase",
        "hypervisorStatus",
        "availableTFlops",
        "availableVRAM",
        "allocatedPods",
        "totalGPUPods",
    ),
}
"""Status fields of agent-created objects this writer owns; all of GPUPool's it computes are its own."""


class StatusWriter:
    """Keeps custom-resource status equal to the ledger; `run` until stopped, or call `sync` directly."""

    def __init__(
        self,
        ledger: Ledger,
        cluster: Cluster,
        *,
        debounce_s: float = 0.2,
        poll_interval_s: float = 0.5,
        concurrency: int = 8,
        in_pool: Callable[[str, str], bool] | None = None,
    ) -> None:
        self.ledger = ledger
        self.in_pool = in_pool
        """Whether a node is in the pool it registered in (a GPUPool's nodeSelector); None: always."""
        self.cluster = cluster
        self.debounce_s = debounce_s
        self.poll_interval_s = poll_interval_s
        self._gate = asyncio.Semaphore(concurrency)
        self._changed = asyncio.Event()
        self._written: dict[tuple[CustomResource, str], Status] = {}
        self._absent_until: dict[tuple[CustomResource, str], float] = {}

    def notify(self) -> None:
        """Something changed in the ledger: write the status soon (after the debounce)."""
        self._changed.set()

    async def run(self, stop: asyncio.Event) -> None:
        """Write on every notification (debounced) and every poll interval until `stop` is set."""
        loop = asyncio.get_running_loop()
        last_read = -math.inf
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=self.poll_interval_s)
            if self._changed.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.debounce_s)
            if stop.is_set():
                return
            self._changed.clear()
            if loop.time() - last_read >= READ_BACK_S:
                last_read = loop.time()
                try:
                    await self.read_back()
                except ClusterError as error:  # then every status is written again, as if never written
                    log.warning("reading back custom-resource status failed, writing it all: %s", error)
                    self._written.clear()
            try:
                await self.sync()
            except ClusterError as error:
                log.warning("writing custom-resource status failed, will retry: %s", error)

    async def sync(self) -> int:
        """Write every status that differs from what this writer last wrote; returns how many it wrote."""
        nodes = await self.ledger.list_nodes()
        gpus = await self.ledger.list_gpus()
        allocations = await self.ledger.active_allocations()
        desired = desired_status(nodes, gpus, allocations, in_pool=self.in_pool)
        writes = [self._write(CustomResource.GPU, name, status) for name, status in desired.gpus.items()]
        writes += [
            self._write(CustomResource.GPU_NODE, name, status) for name, status in desired.nodes.items()
        ]
        writes += [
            self._write(CustomResource.GPU_POOL, name, status) for name, status in desired.pools.items()
        ]
        return sum(await asyncio.gather(*writes))

    async def read_back(self) -> int:
        """Remember what the API server holds now as what was last written (the owned fields of every
        GPU, GPUNode and GPUPool; an object it does not list is forgotten, so it is written when it
        appears): the next `sync` patches only what differs from the ledger. Returns how many objects
        it read."""
        held: dict[tuple[CustomResource, str], Status] = {}
        for kind in (CustomResource.GPU, CustomResource.GPU_NODE, CustomResource.GPU_POOL):
            for found in await self.cluster.list_custom_objects(kind):
                held[kind, found.name] = _owned(kind, found.status)
                self._absent_until.pop((kind, found.name), None)
        self._written = held
        return len(held)

    async def _write(self, kind: CustomResource, name: str, computed: Status) -> bool:
        key = (kind, name)
        status = _owned(kind, computed)
        now = asyncio.get_running_loop().time()
        written = self._written.get(key)
        unchanged = _holds(written, status) or (
            kind is CustomResource.GPU_NODE and heartbeat_only_change(written, status, HEARTBEAT_WRITE_S)
        )
        if unchanged or self._absent_until.get(key, now) > now:
            return False
        async with self._gate:
            result = await self.cluster.patch_custom_status(kind, name, _without_gone_gpus(written, status))
        if isinstance(result, Applied):
            self._written[key] = status
            self._absent_until.pop(key, None)
            return True
        if isinstance(result, NotFound):  # not created yet by the node agent, or a GPUPool nobody created
            wait = READ_BACK_S if kind is CustomResource.GPU_POOL else ABSENT_RETRY_S
            self._absent_until[key] = now + wait
        return False


def _holds(held: Any, wanted: Any) -> bool:
    """Whether merge-patching `wanted` onto `held` would change nothing: every field of `wanted` is in
    `held` with the same value (fields only others write, such as the agent's `hypervisorVersion`,
    may be there too)."""
    if isinstance(wanted, Mapping):
        return isinstance(held, Mapping) and all(
            (value is None and key not in held) or (key in held and _holds(held[key], value))
            for key, value in wanted.items()
        )
    return bool(held == wanted)


def _owned(kind: CustomResource, status: Mapping[str, Any]) -> Status:
    fields = SCHEDULER_FIELDS.get(kind)
    return dict(status) if fields is None else {field: status[field] for field in fields if field in status}


def _without_gone_gpus(written: Status | None, status: Status) -> Status:
    """`status` as a merge patch: a GPU no longer in `allocatedPods` is removed there (null)."""
    before = (written or {}).get("allocatedPods")
    after = status.get("allocatedPods")
    if not isinstance(before, Mapping) or not isinstance(after, Mapping) or before.keys() <= after.keys():
        return status
    return {**status, "allocatedPods": {**dict.fromkeys(before.keys() - after.keys()), **after}}
