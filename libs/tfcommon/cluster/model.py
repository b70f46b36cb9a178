"""Value types the `Cluster` port speaks: pods, nodes, disruption budgets, our custom resources, results.

Plain frozen data, no I/O. Adapters build these from API objects; the scheduler and the defrag planner
decide on them without knowing whether a Kubernetes API server or an in-memory fake is behind the port.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

CUSTOM_RESOURCE_GROUP = "tensor-fusion.ai"
CUSTOM_RESOURCE_VERSION = "v1"


class CustomResource(enum.Enum):
    """Our `tensor-fusion.ai/v1` resources: value = (plural, namespaced)."""

    GPU = ("gpus", False)
    GPU_NODE = ("gpunodes", False)
    GPU_POOL = ("gpupools", False)
    GPU_RESOURCE_QUOTA = ("gpuresourcequotas", True)
    WORKLOAD_PROFILE = ("workloadprofiles", True)
    PROVIDER_CONFIG = ("providerconfigs", False)

    @property
    def plural(self) -> str:
        return str(self.value[0])

    @property
    def namespaced(self) -> bool:
        return bool(self.value[1])


@dataclass(frozen=True)
class PodKey:
    """Namespace and name: how the API addresses a pod."""

    namespace: str
    name: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""


@dataclass(frozen=True)
class Taint:
    key: str
    value: str = ""
    effect: str = "NoSchedule"


@dataclass(frozen=True)
class ContainerResources:
    """A container's name and its raw resource quantities (`requests`, `limits`), e.g. `nvidia.com/gpu`."""

    name: str
    requests: Mapping[str, str] = field(default_factory=dict)
    limits: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class OwnerReference:
    kind: str
    name: str
    uid: str = ""
    controller: bool = False


@dataclass(frozen=True)
class Pod:
    """The parts of a pod that placement, release and defrag read."""

    namespace: str
    name: str
    uid: str = ""
    resource_version: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    scheduler_name: str = "default-scheduler"
    node_name: str | None = None
    phase: str = "Pending"
    priority: int | None = None
    priority_class_name: str | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    containers: tuple[ContainerResources, ...] = ()
    owner_references: tuple[OwnerReference, ...] = ()
    created_at: datetime | None = None
    deleting_since: datetime | None = None

    @property
    def key(self) -> PodKey:
        return PodKey(self.namespace, self.name)

    @property
    def is_bound(self) -> bool:
        return bool(self.node_name)

    @property
    def is_finished(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    def is_pending_for(self, scheduler_name: str) -> bool:
        """Waiting for `scheduler_name` to place it: not bound, not finished, not being deleted."""
        return (
            self.scheduler_name == scheduler_name
            and not self.is_bound
            and not self.is_finished
            and self.deleting_since is None
        )


@dataclass(frozen=True)
class NodeCondition:
    type: str
    status: str
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class Node:
    """A Kubernetes node: placement filters (taints, cordon, readiness) and defrag markers read these."""

    name: str
    uid: str = ""
    resource_version: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Taint, ...] = ()
    cordoned: bool = False
    allocatable_cpu_milli: int = 0
    allocatable_memory_bytes: int = 0
    conditions: tuple[NodeCondition, ...] = ()
    created_at: datetime | None = None
    deleting_since: datetime | None = None
    allocatable_disk_bytes: int = 0
    """`status.allocatable.ephemeral-storage`: the disk an oversubscribed pool counts as virtual VRAM."""

    @property
    def ready(self) -> bool:
        return any(c.type == "Ready" and c.status == "True" for c in self.conditions)


@dataclass(frozen=True)
class Namespace:
    """A namespace: the admission webhook's `namespaceSelector` scopes read its labels."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class LabelRequirement:
    """One `matchExpressions` entry: operator is In, NotIn, Exists or DoesNotExist."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        if self.operator == "In":
            return labels.get(self.key) in self.values
        if self.operator == "NotIn":
            return labels.get(self.key) not in self.values
        if self.operator == "Exists":
            return self.key in labels
        if self.operator == "DoesNotExist":
            return self.key not in labels
        return False


@dataclass(frozen=True)
class LabelSelector:
    match_labels: Mapping[str, str] = field(default_factory=dict)
    match_expressions: tuple[LabelRequirement, ...] = ()

    @property
    def is_empty(self) -> bool:
        """An empty selector matches every pod; the defrag rules treat it as no budget at all."""
        return not self.match_labels and not self.match_expressions

    def matches(self, labels: Mapping[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match_labels.items()) and all(
            requirement.matches(labels) for requirement in self.match_expressions
        )


@dataclass(frozen=True)
class PodDisruptionBudget:
    namespace: str
    name: str
    selector: LabelSelector | None = None
    disruptions_allowed: int = 0
    current_healthy: int = 0
    desired_healthy: int = 0

    def covers(self, pod: Pod) -> bool:
        """True when this budget explicitly selects `pod` (same namespace, a non-empty matching selector)."""
        return (
            pod.namespace == self.namespace
            and self.selector is not None
            and not self.selector.is_empty
            and self.selector.matches(pod.labels)
        )


@dataclass(frozen=True)
class CustomObject:
    """One of our custom resources, with its spec and status as plain JSON data."""

    kind: CustomResource
    name: str
    namespace: str | None = None
    uid: str = ""
    resource_version: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    spec: Mapping[str, Any] = field(default_factory=dict)
    status: Mapping[str, Any] = field(default_factory=dict)
    owner_references: tuple[OwnerReference, ...] = ()


@dataclass(frozen=True)
class PodList:
    """Pods and the resource version to watch from so that nothing after this list is missed."""

    items: tuple[Pod, ...]
    resource_version: str


class PodEventType(enum.StrEnum):
    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


@dataclass(frozen=True)
class PodEvent:
    type: PodEventType
    pod: Pod


@dataclass(frozen=True)
class WatchCursor:
    """Where a pod watch stands: resume a watch from it (after a restart too) without gaps or repeats.

    `seen` maps each pod uid delivered so far to (namespace, name, resource version).
    """

    resource_version: str
    seen: Mapping[str, tuple[str, str, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Applied:
    """The change was written; `resource_version` is the object's new version."""

    resource_version: str


@dataclass(frozen=True)
class Conflict:
    """Someone changed the object first (stale resourceVersion) or it is already bound: re-read, retry."""

    message: str


@dataclass(frozen=True)
class NotFound:
    message: str


@dataclass(frozen=True)
class Bound:
    node_name: str


@dataclass(frozen=True)
class Evicted:
    """The API server accepted the eviction; the pod is being deleted."""


@dataclass(frozen=True)
class EvictionBlocked:
    """Refused (HTTP 429): a PodDisruptionBudget allows no disruption now. `reason` is the server's text."""

    reason: str
    retry_after_s: int | None = None


PatchResult = Applied | Conflict | NotFound
BindResult = Bound | Conflict | NotFound
EvictionResult = Evicted | EvictionBlocked | NotFound


class ClusterError(Exception):
    """An unexpected failure talking to the cluster (forbidden, server error, unreachable)."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class LeaseRecord:
    """A Lease's fields that leader election reads and writes; `resource_version` is empty before creation."""

    holder_identity: str
    lease_duration_s: int
    acquire_time: datetime | None
    renew_time: datetime | None
    lease_transitions: int = 0
    resource_version: str = ""
