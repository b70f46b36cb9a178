"""The agent's ports: what discovery, sampling and process attribution must provide.

Adapters (`tfagent.adapters.nvml`, `tfagent.adapters.simulated`) implement these; the agent shell and the
API depend only on them. One contract suite (`tests/unit/agent/test_probe_contract.py`) holds both
adapters to the same behaviour.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol
from uuid import UUID

from tfcommon.cluster import CustomObject, CustomResource, PatchResult

from tfagent.core.inventory import NodeInventory
from tfagent.core.usage import ProcessSample, UsageSample, WorkerAllocation


class GpuProbe(Protocol):
    """Reads a node's GPUs.

    `discover()` returns every GPU present now (lower-case UUIDs, capacity from the model table) and may be
    called again at any time (rediscovery). `sample()` returns one round of counters for the GPUs of the
    last discovery. `close()` releases the driver; it is idempotent.
    """

    def discover(self) -> NodeInventory: ...

    def sample(self) -> UsageSample: ...

    def close(self) -> None: ...


class ProcessOwners(Protocol):
    """Says which allocation started each GPU process (cgroup in Kubernetes, the run registry locally).

    Returns pid -> allocation id for the pids it can attribute; unknown pids are left out.
    """

    def owners(
        self, processes: Sequence[ProcessSample], allocations: Sequence[WorkerAllocation]
    ) -> Mapping[int, UUID]: ...


class CheckpointBackend(Protocol):
    """Suspends a worker's GPU context to host memory (`snapshot`) and restores it (`resume`).

    Present only where the node can do it (e.g. the CUDA driver's process checkpoint API); without one the
    hypervisor API answers 501 with how to move the workload instead. Both return a JSON-able summary.
    """

    name: str

    async def snapshot(self, allocation: WorkerAllocation) -> Mapping[str, object]: ...

    async def resume(self, allocation: WorkerAllocation) -> Mapping[str, object]: ...


class CustomResourceWriter(Protocol):
    """The part of the `Cluster` port (`tfcommon.cluster`) the agent writes its GPUNode and GPU objects with.

    `KubernetesCluster` and `InMemoryCluster` provide it; the agent calls nothing else on the API server,
    which is what the node agent's RBAC rules grant (`tfcommon.cluster.rbac`). `list_custom_objects` is
    for the ProviderConfig objects, read once at start (`tfagent.providers`).
    """

    async def list_custom_objects(
        self, kind: CustomResource, *, namespace: str | None = None
    ) -> list[CustomObject]: ...

    async def get_custom_object(
        self, kind: CustomResource, name: str, *, namespace: str | None = None
    ) -> CustomObject | None: ...

    async def create_custom_object(
        self,
        kind: CustomResource,
        name: str,
        *,
        namespace: str | None = None,
        labels: Mapping[str, str] | None = None,
        spec: Mapping[str, Any] | None = None,
        owner: CustomObject | None = None,
    ) -> PatchResult: ...

    async def patch_custom_metadata(
        self,
        kind: CustomResource,
        name: str,
        *,
        namespace: str | None = None,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        owner: CustomObject | None = None,
        resource_version: str | None = None,
    ) -> PatchResult: ...

    async def patch_custom_status(
        self,
        kind: CustomResource,
        name: str,
        status: Mapping[str, Any],
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
    ) -> PatchResult: ...
