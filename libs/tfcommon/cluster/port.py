"""The `Cluster` port: everything the scheduler and the defrag planner ask of the cluster, nothing more.

Adapters: `KubernetesCluster` (the API server through the `kubernetes` client) and `InMemoryCluster`
(an honest fake, held to the same contract tests). Expected refusals (a stale version, a pod already
bound, a disruption budget) come back as typed results; only unexpected failures raise `ClusterError`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from tfcommon.cluster.model import (
    BindResult,
    CustomObject,
    CustomResource,
    EvictionResult,
    LeaseRecord,
    Namespace,
    Node,
    PatchResult,
    Pod,
    PodDisruptionBudget,
    PodEvent,
    PodList,
    WatchCursor,
)


class PodWatch(Protocol):
    """An endless stream of pod changes; `cursor` says where to resume (in this process or after a restart).

    It survives `410 Gone` by relisting and delivering only what changed; it never repeats an event.
    Close it with `aclose()`.
    """

    @property
    def cursor(self) -> WatchCursor: ...

    def __aiter__(self) -> PodWatch: ...

    async def __anext__(self) -> PodEvent: ...

    async def aclose(self) -> None: ...


class Cluster(Protocol):
    """The cluster as our control plane sees it. All methods are safe to call concurrently."""

    async def list_pending_pods(self, scheduler_name: str) -> PodList:
        """Pods with `spec.schedulerName == scheduler_name`, not bound, not finished, not being deleted."""
        ...

    def watch_pods(self, scheduler_name: str, *, cursor: WatchCursor | None = None) -> PodWatch:
        """Every pod of `scheduler_name` (pending, bound, deleted). Without a cursor it starts with a list:
        each existing pod arrives once as ADDED."""
        ...

    async def get_pod(self, namespace: str, name: str) -> Pod | None: ...

    async def list_pods(
        self,
        *,
        namespace: str | None = None,
        node_name: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> list[Pod]:
        """Pods, optionally only in `namespace`, only on `node_name`, only with all of `labels`."""
        ...

    async def get_node(self, name: str) -> Node | None: ...

    async def get_namespace(self, name: str) -> Namespace | None:
        """The namespace and its labels; None when there is no such namespace."""
        ...

    async def list_nodes(self, *, labels: Mapping[str, str] | None = None) -> list[Node]: ...

    async def list_disruption_budgets(self, namespace: str | None = None) -> list[PodDisruptionBudget]: ...

    async def patch_pod_metadata(
        self,
        namespace: str,
        name: str,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
    ) -> PatchResult:
        """Merge labels and annotations (`None` removes a key). With `resource_version` the write only
        happens if nobody changed the pod since: otherwise `Conflict`, and the caller re-reads and retries."""
        ...

    async def bind_pod(
        self,
        namespace: str,
        name: str,
        node_name: str,
        *,
        uid: str | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> BindResult:
        """Create the pod's Binding to `node_name`, setting `annotations` on the pod in the same write.

        `Conflict` if it is already bound, or if `uid` no longer matches (the pod was recreated); then
        no annotation is written either."""
        ...

    async def evict_pod(self, namespace: str, name: str) -> EvictionResult:
        """Evict through the Eviction API (`policy/v1`): disruption budgets are enforced by the server;
        a refusal is `EvictionBlocked` with the server's reason."""
        ...

    async def report_unschedulable(self, pod: Pod, message: str, *, reporter: str) -> None:
        """Set `PodScheduled=False` (reason Unschedulable, `message`) and record a `FailedScheduling` Event,
        as kube-scheduler does."""
        ...

    async def patch_node_metadata(
        self,
        name: str,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
    ) -> PatchResult:
        """Merge node labels and annotations (defrag markers); `None` removes a key."""
        ...

    async def get_custom_object(
        self, kind: CustomResource, name: str, *, namespace: str | None = None
    ) -> CustomObject | None: ...

    async def list_custom_objects(
        self, kind: CustomResource, *, namespace: str | None = None
    ) -> list[CustomObject]: ...

    async def create_custom_object(
        self,
        kind: CustomResource,
        name: str,
        *,
        namespace: str | None = None,
        labels: Mapping[str, str] | None = None,
        spec: Mapping[str, Any] | None = None,
        owner: CustomObject | None = None,
    ) -> PatchResult:
        """Create the object (status empty: write it with `patch_custom_status`); `Conflict` when an object
        of that name already exists. With `owner` it is deleted with that object (controller reference)."""
        ...

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
    ) -> PatchResult:
        """Merge labels and annotations (`None` removes a key; other keys, e.g. users' labels, stay); with
        `owner`, that object becomes the only owner. Spec and status are untouched."""
        ...

    async def patch_custom_status(
        self,
        kind: CustomResource,
        name: str,
        status: Mapping[str, Any],
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
    ) -> PatchResult:
        """Merge `status` through the status subresource (spec untouched); `None` values remove fields."""
        ...


class LeaseStore(Protocol):
    """`coordination.k8s.io/v1` Leases, for leader election (`tfscheduler.leader_election`).

    Writes are optimistic: `update_lease` only succeeds if the Lease still has `record.resource_version`
    and `create_lease` only if there is none, otherwise `Conflict`; `Applied` carries the new version."""

    async def get_lease(self, namespace: str, name: str) -> LeaseRecord | None: ...

    async def create_lease(self, namespace: str, name: str, record: LeaseRecord) -> PatchResult: ...

    async def update_lease(self, namespace: str, name: str, record: LeaseRecord) -> PatchResult: ...
