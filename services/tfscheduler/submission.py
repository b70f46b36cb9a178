"""What a client submits to the scheduler and what it gets back (the HTTP and `tfctl` contract)."""

from __future__ import annotations

from typing import Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field
from tfcommon.events import GpuRequest, WorkloadRef

WorkloadState = Literal["placed", "pending", "refused", "ended", "evicted"]


class Submission(BaseModel):
    """A GPU workload to place. `workload.uid` identifies this incarnation: submitting the same
    namespace, name and uid again is a no-op that returns the current status."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workload: WorkloadRef
    request: GpuRequest
    priority: int = Field(default=0, description="PriorityClass value; QoS orders equal values")
    eviction_protection_s: int = Field(
        default=0, ge=0, description="seconds after placement during which preemption never evicts it"
    )
    tolerations: tuple[dict[str, str], ...] = Field(default=(), description="Kubernetes tolerations")
    node_selector: dict[str, str] = Field(default_factory=dict, description="required node labels")


class WorkloadStatus(BaseModel):
    """Where a submitted workload stands. `id` is its allocation id (use it with DELETE)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: UUID
    workload: WorkloadRef
    state: WorkloadState
    node: str | None = None
    gpu_uuids: tuple[str, ...] = ()
    reason: str | None = None
