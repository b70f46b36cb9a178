"""How preemption removes a victim: the `Evictor` port the engine calls, and its two adapters.

The engine decides which workloads to preempt (`tfscheduler.core.preemption`) and records each
preemption in one ledger transaction; an evictor does what must happen outside the ledger first and
says how the victim comes back. `LocalEvictor` (local mode, the default) has nothing to remove: the
scheduler is the victim's controller and records its replacement. `ApiEvictor` (Kubernetes mode,
chosen in `compose`) evicts the pod through the Eviction API, so that a PodDisruptionBudget can refuse
it; the pod's own controller recreates it, and a victim refused is left out of preemption plans for a
while.
"""

from __future__ import annotations

import asyncio
import logging
from enum import Enum
from typing import Protocol
from uuid import UUID

from tfcommon.cluster import Cluster, EvictionBlocked

from tfscheduler.core.preemption import Candidate

log = logging.getLogger("tfscheduler.eviction")
EVICTION_RETRY_S = 10.0


class Removal(Enum):
    """How a victim was removed, which decides what the preemption records."""

    REPLACED_HERE = "replaced-here"
    """Nothing outside the ledger to do: the scheduler records the victim's replacement."""
    REPLACED_BY_CONTROLLER = "replaced-by-controller"
    """Evicted outside (the Eviction API): its controller recreates it; no replacement is recorded."""
    REFUSED = "refused"
    """Not evicted (a disruption budget said no): nothing is recorded."""


class Evictor(Protocol):
    """The port through which preemption removes a victim."""

    def may_evict(self, allocation_id: UUID) -> bool:
        """False while the victim holding `allocation_id` is not to be tried again."""
        ...

    async def remove(self, victim: Candidate) -> Removal:
        """Remove `victim` where it runs, and say how it comes back."""
        ...


class LocalEvictor:
    """Local mode: the victim's process is the node agent's to stop once its allocation is released."""

    def may_evict(self, allocation_id: UUID) -> bool:
        return True

    async def remove(self, victim: Candidate) -> Removal:
        return Removal.REPLACED_HERE


class ApiEvictor:
    """Kubernetes mode: evict through the Eviction API; a refused victim is skipped for the server's
    retry time, or `retry_s` when it gives none."""

    def __init__(self, cluster: Cluster, *, retry_s: float = EVICTION_RETRY_S) -> None:
        self.cluster = cluster
        self.retry_s = retry_s
        self._refused_until: dict[UUID, float] = {}

    def may_evict(self, allocation_id: UUID) -> bool:
        return self._refused_until.get(allocation_id, 0.0) <= asyncio.get_running_loop().time()

    async def remove(self, victim: Candidate) -> Removal:
        result = await self.cluster.evict_pod(victim.workload.namespace, victim.workload.name)
        if isinstance(result, EvictionBlocked):
            wait_s = float(result.retry_after_s or self.retry_s)
            allocation_id = UUID(str(victim.allocation_id))
            self._refused_until[allocation_id] = asyncio.get_running_loop().time() + wait_s
            log.info("eviction of %s refused: %s", victim.workload.name, result.reason)
            return Removal.REFUSED
        return Removal.REPLACED_BY_CONTROLLER
