"""What a client submits to the scheduler and what it gets back (the HTTP and `tfctl` contract)."""

from __future__ import annotations

from typing import Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, model_validator
from tfcommon.events import GpuRequest, WorkloadRef

BIGINT_MAX = 2**63 - 1
"""The largest integer a ledger column (Postgres bigint) holds."""

WorkloadState = Literal["placed", "pending", "refused", "ended", "evicted"]


class Takeover(BaseModel):
    """`tensor-fusion.ai/enabled-replicas` of a pod with a controller (what the webhook's
    `TakeoverClaim` carries): the pod is taken over only while fewer than `limit` pods of the workload
    `workload_key` (namespace, controller and pod template) are live in the scheduler."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workload_key: str = Field(
        min_length=1, max_length=1024, description="namespace/kind/controller/pod-template-hash"
    )
    limit: int = Field(ge=0, lt=2**31, description="the enabled-replicas value")


class Gang(BaseModel):
    """Gang placement (`tensor-fusion.ai/gang-enabled`): the pending members with the same `group_key`
    are reserved together, in one ledger transaction, once at least `min_members` of them fit; none is
    placed before. `timeout_s` 0 waits indefinitely; after it the waiting members are reported
    unschedulable with the gang's numbers (and are still retried)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    group_key: str = Field(min_length=1, max_length=1024, description="namespace/workload of the gang")
    min_members: int = Field(ge=1, lt=2**31, description="members reserved together at least")
    timeout_s: int = Field(default=0, ge=0, lt=2**31, description="seconds to wait; 0 waits indefinitely")


class Submission(BaseModel):
    """A GPU workload to place. `workload.uid` identifies this incarnation: submitting the same
    namespace, name and uid again is a no-op that returns the current status."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    workload: WorkloadRef
    request: GpuRequest
    priority: int = Field(
        default=0, ge=-(2**31), lt=2**31, description="PriorityClass value; QoS orders equal values"
    )
    eviction_protection_s: int = Field(
        default=0, ge=0, description="seconds after placement during which preemption never evicts it"
    )
    tolerations: tuple[dict[str, str], ...] = Field(default=(), description="Kubernetes tolerations")
    node_selector: dict[str, str] = Field(default_factory=dict, description="required node labels")
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="the pod's metadata.labels; local disruption budgets (TF_DEFRAG_PDB_FILE) select on them",
    )
    takeover: Takeover | None = Field(
        default=None, description="the enabled-replicas cap this pod is taken over under, if any"
    )
    gang: Gang | None = Field(default=None, description="the gang this workload is placed with, if any")

    @model_validator(mode="after")
    def _fits_the_ledger(self) -> Submission:
        document = self.model_dump(mode="json")
        path = _path_of_nul(document, "")
        if path is not None:
            raise ValueError(f"{path or 'a key'} contains the NUL character (\\u0000); remove it")
        path = _path_of_huge_integer(document, "")
        if path is not None:
            raise ValueError(f"{path} is larger than the ledger stores; use at most {BIGINT_MAX}")
        return self


def _path_of_nul(value: object, path: str) -> str | None:
    """The dotted path of the first string (value or key) holding NUL, which Postgres text refuses."""
    if isinstance(value, str):
        return path if "\x00" in value else None
    children: list[tuple[object, object]] = []
    if isinstance(value, dict):
        children = list(value.items())
    elif isinstance(value, list):
        children = list(enumerate(value))
    for key, item in children:
        child = f"{path}.{key}" if path else str(key)
        if isinstance(key, str) and "\x00" in key:
            return child
        found = _path_of_nul(item, child)
        if found is not None:
            return found
    return None


def _path_of_huge_integer(value: object, path: str) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool):
        return path if abs(value) > BIGINT_MAX else None
    children: list[tuple[object, object]] = []
    if isinstance(value, dict):
        children = list(value.items())
    elif isinstance(value, list):
        children = list(enumerate(value))
    for key, item in children:
        found = _path_of_huge_integer(item, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


class WorkloadStatus(BaseModel):
    """Where a submitted workload stands. `id` is its allocation id (use it with DELETE)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: UUID
    workload: WorkloadRef
    state: WorkloadState
    node: str | None = None
    gpu_uuids: tuple[str, ...] = ()
    reason: str | None = None
