"""Keeps the `UnsupportedFields` condition on every GPUPool, GPUNode and GPUResourceQuota object.

The shell around `tfcommon.unsupported_fields`: every `interval_s` it lists GPUPool and GPUResourceQuota
objects, every `node_interval_s` GPUNode objects (thousands of them, their spec rarely set), and, where
an object's condition differs from what its spec implies, writes `status.conditions` with only that
condition replaced (other conditions stay), guarded by the object's resource version so a concurrent
writer of another condition is never overwritten (a conflict is retried on the next round). The scheduler
runs it in Kubernetes mode (on the leader, with leader election), as it already writes GPUPool status.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from tfcommon.cluster import Applied, Cluster, ClusterError, CustomObject, CustomResource
from tfcommon.runtime import Timer, run_timer
from tfcommon.unsupported_fields import (
    CONDITION,
    find_condition,
    same_condition,
    unsupported_condition,
    with_condition,
)

log = logging.getLogger("tfscheduler.spec_conditions")
KINDS = (CustomResource.GPU_POOL, CustomResource.GPU_RESOURCE_QUOTA)


class UnsupportedFieldsReporter:
    """Writes the condition for objects whose spec changed (or that are new); `run` until stopped."""

    def __init__(
        self,
        cluster: Cluster,
        *,
        interval_s: float = 1.0,
        node_interval_s: float = 10.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self.cluster = cluster
        self.interval_s = interval_s
        self.node_interval_s = node_interval_s
        self._nodes_due = 0.0
        self.clock = clock

    async def run(self, stop: asyncio.Event) -> None:
        """`sync` now and every `interval_s` until `stop` is set (a runtime timer)."""
        await run_timer("spec-conditions", Timer(self.interval_s, self._round, at_start=True), stop)

    async def _round(self) -> None:
        try:
            await self.sync()
        except ClusterError as error:
            log.warning("writing the %s condition failed, will retry: %s", CONDITION, error)

    async def sync(self, *, nodes: bool | None = None) -> int:
        """One round over GPUPool and GPUResourceQuota objects, and GPUNode ones when `nodes` (default:
        when `node_interval_s` has passed); returns how many conditions it wrote."""
        now = asyncio.get_running_loop().time()
        if nodes is None:
            nodes = now >= self._nodes_due
        if nodes:
            self._nodes_due = now + self.node_interval_s
        written = 0
        for kind in (*KINDS, CustomResource.GPU_NODE) if nodes else KINDS:
            for obj in await self.cluster.list_custom_objects(kind):
                written += await self._reconcile(obj)
        return written

    async def _reconcile(self, obj: CustomObject) -> int:
        condition = unsupported_condition(obj.kind, obj.spec, self.clock())
        if same_condition(find_condition(obj.status, CONDITION), condition):
            return 0
        result = await self.cluster.patch_custom_status(
            obj.kind,
            obj.name,
            {"conditions": with_condition(obj.status, condition)},
            namespace=obj.namespace,
            resource_version=obj.resource_version or None,
        )
        return 1 if isinstance(result, Applied) else 0
