"""`InMemoryCluster`: a fake `Cluster` for unit tests of the scheduler and defrag cores' shells.

It keeps raw manifests like an API server does (resource versions, merge patches, a bounded watch
history that can be forgotten to provoke `410 Gone`, disruption budgets enforced on eviction) and is held
to the same contract tests as `KubernetesCluster`. Not for production; no persistence.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import uuid
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from tfcommon.cluster.manifests import (
    custom_object_from_manifest,
    custom_owner_reference,
    format_timestamp,
    label_selector_from_manifest,
    metadata_patch,
    namespace_from_manifest,
    node_from_manifest,
    pdb_from_manifest,
    pod_from_manifest,
    scheduling_event,
    unschedulable_condition,
)
from tfcommon.cluster.model import (
    Applied,
    BindResult,
    Bound,
    Conflict,
    CustomObject,
    CustomResource,
    Evicted,
    EvictionBlocked,
    EvictionResult,
    LeaseRecord,
    Namespace,
    Node,
    NotFound,
    PatchResult,
    Pod,
    PodDisruptionBudget,
    PodEvent,
    PodEventType,
    PodList,
    WatchCursor,
)
from tfcommon.cluster.reflector import PodReflector

ObjectKey = tuple[str, str | None, str]


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: mappings merge recursively, `None` deletes, anything else replaces."""
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def _utc_now() -> datetime:
    return datetime.now(UTC)


class InMemoryCluster:
    """A `Cluster` held in memory. Seed it with `put_*`; inspect `events` and `manifest()`."""

    def __init__(self, *, clock: Callable[[], datetime] = _utc_now) -> None:
        self._clock = clock
        self._objects: dict[ObjectKey, dict[str, Any]] = {}
        self._versions = itertools.count(1)
        self._version = 0
        self._pod_history: deque[tuple[int, PodEventType, dict[str, Any]]] = deque()
        self._history_starts_after = 0
        self._pod_version = 0
        self._changed = asyncio.Event()
        self.events: list[dict[str, Any]] = []
        self._leases: dict[tuple[str, str], LeaseRecord] = {}

    # -- seeding and inspection (not part of the port) ------------------------------------------

    def put_pod(self, manifest: Mapping[str, Any]) -> Pod:
        meta = manifest.get("metadata") or {}
        return pod_from_manifest(self._store("pods", meta.get("namespace") or "default", manifest))

    def put_node(self, manifest: Mapping[str, Any]) -> Node:
        return node_from_manifest(self._store("nodes", None, manifest))

    def put_namespace(self, manifest: Mapping[str, Any]) -> Namespace:
        return namespace_from_manifest(self._store("namespaces", None, manifest))

    def put_disruption_budget(self, manifest: Mapping[str, Any]) -> PodDisruptionBudget:
        meta = manifest.get("metadata") or {}
        return pdb_from_manifest(
            self._store("poddisruptionbudgets", meta.get("namespace") or "default", manifest)
        )

    def put_custom_object(self, kind: CustomResource, manifest: Mapping[str, Any]) -> CustomObject:
        namespace = (manifest.get("metadata") or {}).get("namespace") if kind.namespaced else None
        return custom_object_from_manifest(kind, self._store(kind.plural, namespace, manifest))

    def delete_pod(self, namespace: str, name: str) -> None:
        stored = self._objects.pop(("pods", namespace, name), None)
        if stored is not None:
            self._record(PodEventType.DELETED, self._stamp(stored))

    def manifest(self, resource: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        stored = self._objects.get((resource, namespace, name))
        return copy.deepcopy(stored) if stored is not None else None

    def forget_watch_history(self) -> None:
        """Drop the change log, as an API server compacts it: a watch resuming from before gets 410."""
        self._history_starts_after = self._version
        self._pod_history.clear()
        self._changed.set()
        self._changed = asyncio.Event()

    # -- internals -------------------------------------------------------------------------------

    def _stamp(self, manifest: dict[str, Any]) -> dict[str, Any]:
        self._version = next(self._versions)
        manifest.setdefault("metadata", {})["resourceVersion"] = str(self._version)
        return manifest

    def _store(self, resource: str, namespace: str | None, manifest: Mapping[str, Any]) -> dict[str, Any]:
        stored = copy.deepcopy(dict(manifest))
        meta = stored.setdefault("metadata", {})
        key = (resource, namespace, str(meta["name"]))
        if namespace is not None:
            meta["namespace"] = namespace
        existing = self._objects.get(key)
        meta.setdefault("uid", existing["metadata"]["uid"] if existing else str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", format_timestamp(self._clock()))
        self._objects[key] = self._stamp(stored)
        if resource == "pods":
            self._record(PodEventType.MODIFIED if existing else PodEventType.ADDED, stored)
        return copy.deepcopy(stored)

    def _record(self, event_type: PodEventType, manifest: dict[str, Any]) -> None:
        self._pod_history.append((self._version, event_type, copy.deepcopy(manifest)))
        self._pod_version = self._version
        self._changed.set()
        self._changed = asyncio.Event()

    def _update(self, key: ObjectKey, patch: Mapping[str, Any]) -> PatchResult:
        stored = self._objects.get(key)
        if stored is None:
            return NotFound(f'{key[0]} "{key[2]}" not found')
        expected = (patch.get("metadata") or {}).get("resourceVersion")
        if expected and expected != stored["metadata"]["resourceVersion"]:
            return Conflict(
                f'Operation cannot be fulfilled on {key[0]} "{key[2]}": the object has been modified; '
                "please apply your changes to the latest version and try again"
            )
        updated = self._stamp(merge_patch(stored, patch))
        self._objects[key] = updated
        if key[0] == "pods":
            self._record(PodEventType.MODIFIED, updated)
        return Applied(updated["metadata"]["resourceVersion"])

    def _pods(self) -> list[Pod]:
        return [
            pod_from_manifest(m)
            for (resource, _, _), m in sorted(self._objects.items())
            if resource == "pods"
        ]

    async def _wait_for_pod_change(self, after_version: int) -> None:
        while self._pod_version <= after_version and self._history_starts_after <= after_version:
            await self._changed.wait()

    # -- the port --------------------------------------------------------------------------------

    async def list_pending_pods(self, scheduler_name: str) -> PodList:
        pods = tuple(p for p in self._pods() if p.is_pending_for(scheduler_name))
        return PodList(items=pods, resource_version=str(self._version))

    def watch_pods(self, scheduler_name: str, *, cursor: WatchCursor | None = None) -> InMemoryPodWatch:
        return InMemoryPodWatch(self, scheduler_name, cursor)

    async def get_pod(self, namespace: str, name: str) -> Pod | None:
        stored = self._objects.get(("pods", namespace, name))
        return pod_from_manifest(stored) if stored is not None else None

    async def list_pods(
        self,
        *,
        namespace: str | None = None,
        node_name: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> list[Pod]:
        return [
            pod
            for pod in self._pods()
            if (namespace is None or pod.namespace == namespace)
            and (node_name is None or pod.node_name == node_name)
            and all(pod.labels.get(k) == v for k, v in (labels or {}).items())
        ]

    async def patch_pod_metadata(
        self,
        namespace: str,
        name: str,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
    ) -> PatchResult:
        meta: dict[str, Any] = {"labels": dict(labels or {}), "annotations": dict(annotations or {})}
        if resource_version:
            meta["resourceVersion"] = resource_version
        patch = {"metadata": meta}
        return self._update(("pods", namespace, name), patch)

    async def bind_pod(
        self,
        namespace: str,
        name: str,
        node_name: str,
        *,
        uid: str | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> BindResult:
        stored = self._objects.get(("pods", namespace, name))
        if stored is None:
            return NotFound(f'pods "{name}" not found')
        if uid and stored["metadata"]["uid"] != uid:
            return Conflict(f'pods "{name}": uid {uid} does not match {stored["metadata"]["uid"]}')
        if (stored.get("spec") or {}).get("nodeName"):
            return Conflict(f'pod {name} is already assigned to node "{stored["spec"]["nodeName"]}"')
        update: dict[str, Any] = {"spec": {"nodeName": node_name}}
        if annotations:
            update["metadata"] = {"annotations": dict(annotations)}
        self._update(("pods", namespace, name), update)
        return Bound(node_name)

    async def evict_pod(self, namespace: str, name: str) -> EvictionResult:
        pod = await self.get_pod(namespace, name)
        if pod is None:
            return NotFound(f'pods "{name}" not found')
        budgets = [
            (key, manifest)
            for key, manifest in self._objects.items()
            if key[0] == "poddisruptionbudgets"
            and key[1] == namespace
            and (selector := label_selector_from_manifest((manifest.get("spec") or {}).get("selector")))
            is not None
            and selector.matches(pod.labels)
        ]
        for key, manifest in budgets:
            budget = pdb_from_manifest(manifest)
            if budget.disruptions_allowed <= 0:
                return EvictionBlocked(
                    "Cannot evict pod as it would violate the pod's disruption budget.; "
                    f"The disruption budget {budget.name} needs {budget.desired_healthy} healthy pods "
                    f"and has {budget.current_healthy} currently"
                )
            self._update(key, {"status": {"disruptionsAllowed": budget.disruptions_allowed - 1}})
        self.delete_pod(namespace, name)
        return Evicted()

    async def report_unschedulable(self, pod: Pod, message: str, *, reporter: str) -> None:
        stored = self._objects.get(("pods", pod.namespace, pod.name))
        if stored is None:
            return
        now = self._clock()
        conditions = [
            c for c in (stored.get("status") or {}).get("conditions") or () if c.get("type") != "PodScheduled"
        ]
        conditions.append(unschedulable_condition(message, now))
        self._update(("pods", pod.namespace, pod.name), {"status": {"conditions": conditions}})
        self.events.append(scheduling_event(pod, message, reporter, now))

    async def get_node(self, name: str) -> Node | None:
        stored = self._objects.get(("nodes", None, name))
        return node_from_manifest(stored) if stored is not None else None

    async def get_namespace(self, name: str) -> Namespace | None:
        stored = self._objects.get(("namespaces", None, name))
        return namespace_from_manifest(stored) if stored is not None else None

    async def list_nodes(self, *, labels: Mapping[str, str] | None = None) -> list[Node]:
        nodes = [node_from_manifest(m) for (r, _, _), m in sorted(self._objects.items()) if r == "nodes"]
        return [n for n in nodes if all(n.labels.get(k) == v for k, v in (labels or {}).items())]

    async def patch_node_metadata(
        self,
        name: str,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
    ) -> PatchResult:
        meta: dict[str, Any] = {"labels": dict(labels or {}), "annotations": dict(annotations or {})}
        if resource_version:
            meta["resourceVersion"] = resource_version
        patch = {"metadata": meta}
        return self._update(("nodes", None, name), patch)

    async def list_disruption_budgets(self, namespace: str | None = None) -> list[PodDisruptionBudget]:
        return [
            pdb_from_manifest(m)
            for (r, ns, _), m in sorted(self._objects.items(), key=lambda item: str(item[0]))
            if r == "poddisruptionbudgets" and (namespace is None or ns == namespace)
        ]

    async def get_custom_object(
        self, kind: CustomResource, name: str, *, namespace: str | None = None
    ) -> CustomObject | None:
        stored = self._objects.get((kind.plural, namespace if kind.namespaced else None, name))
        return custom_object_from_manifest(kind, stored) if stored is not None else None

    async def list_custom_objects(
        self, kind: CustomResource, *, namespace: str | None = None
    ) -> list[CustomObject]:
        return [
            custom_object_from_manifest(kind, m)
            for (r, ns, _), m in sorted(self._objects.items(), key=lambda item: str(item[0]))
            if r == kind.plural and (namespace is None or ns == namespace)
        ]

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
        scope = namespace if kind.namespaced else None
        if (kind.plural, scope, name) in self._objects:
            return Conflict(f'{kind.plural} "{name}" already exists')
        metadata: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
        if scope is not None:
            metadata["namespace"] = scope
        if owner is not None:
            metadata["ownerReferences"] = [custom_owner_reference(owner)]
        stored = self._store(kind.plural, scope, {"metadata": metadata, "spec": dict(spec or {})})
        return Applied(stored["metadata"]["resourceVersion"])

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
        patch = metadata_patch(labels or {}, annotations or {}, resource_version)
        if owner is not None:
            patch["metadata"]["ownerReferences"] = [custom_owner_reference(owner)]
        return self._update((kind.plural, namespace if kind.namespaced else None, name), patch)

    async def patch_custom_status(
        self,
        kind: CustomResource,
        name: str,
        status: Mapping[str, Any],
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
    ) -> PatchResult:
        patch: dict[str, Any] = {"status": dict(status)}
        if resource_version:
            patch["metadata"] = {"resourceVersion": resource_version}
        return self._update((kind.plural, namespace if kind.namespaced else None, name), patch)

    # -- leases ----------------------------------------------------------------------------------

    async def get_lease(self, namespace: str, name: str) -> LeaseRecord | None:
        return self._leases.get((namespace, name))

    async def create_lease(self, namespace: str, name: str, record: LeaseRecord) -> PatchResult:
        if (namespace, name) in self._leases:
            return Conflict(f'leases.coordination.k8s.io "{name}" already exists')
        return self._store_lease(namespace, name, record)

    async def update_lease(self, namespace: str, name: str, record: LeaseRecord) -> PatchResult:
        if not record.resource_version:
            raise ValueError("update_lease needs the resource_version read with the lease (optimistic write)")
        stored = self._leases.get((namespace, name))
        if stored is None:
            return NotFound(f'leases.coordination.k8s.io "{name}" not found')
        if stored.resource_version != record.resource_version:
            return Conflict(
                f'Operation cannot be fulfilled on leases.coordination.k8s.io "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again"
            )
        return self._store_lease(namespace, name, record)

    def _store_lease(self, namespace: str, name: str, record: LeaseRecord) -> Applied:
        self._version = next(self._versions)
        self._leases[(namespace, name)] = replace(record, resource_version=str(self._version))
        return Applied(str(self._version))


class InMemoryPodWatch:
    """The fake's pod watch: replays the change log after the cursor, relists when the log was forgotten."""

    def __init__(self, cluster: InMemoryCluster, scheduler_name: str, cursor: WatchCursor | None) -> None:
        self._cluster = cluster
        self._scheduler_name = scheduler_name
        self._reflector = PodReflector(cursor)
        self._ready: deque[PodEvent] = deque()
        self._closed = False

    @property
    def cursor(self) -> WatchCursor:
        return self._reflector.cursor

    def __aiter__(self) -> InMemoryPodWatch:
        return self

    async def __anext__(self) -> PodEvent:
        cluster = self._cluster
        while not self._ready:
            if self._closed:
                raise StopAsyncIteration
            since = self._reflector.resource_version
            if not since or int(since) < cluster._history_starts_after:
                pods = [p for p in cluster._pods() if p.scheduler_name == self._scheduler_name]
                self._ready.extend(self._reflector.resync(pods, str(cluster._version)))
                continue
            for version, event_type, manifest in list(cluster._pod_history):
                if version > int(since):
                    pod = pod_from_manifest(manifest)
                    event = (
                        self._reflector.observe(event_type, pod)
                        if pod.scheduler_name == self._scheduler_name
                        else None
                    )
                    self._reflector.bookmark(str(version))
                    if event is not None:
                        self._ready.append(event)
            if not self._ready:
                await cluster._wait_for_pod_change(int(self._reflector.resource_version or 0))
        return self._ready.popleft()

    async def aclose(self) -> None:
        self._closed = True
