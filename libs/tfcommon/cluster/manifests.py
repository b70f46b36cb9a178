"""Translate between raw Kubernetes JSON objects and the port's value types, and build request bodies.

Pure: the Kubernetes adapter and the in-memory fake share this code, so both read an object the same way.
It never talks to a server.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from tfcommon.cluster.model import (
    CUSTOM_RESOURCE_GROUP,
    CUSTOM_RESOURCE_VERSION,
    ContainerResources,
    CustomObject,
    CustomResource,
    LabelRequirement,
    LabelSelector,
    Namespace,
    Node,
    NodeCondition,
    OwnerReference,
    Pod,
    PodDisruptionBudget,
    Taint,
    Toleration,
)
from tfcommon.quantities import QuantityError, parse_quantity

Manifest = Mapping[str, Any]


class ManifestError(ValueError):
    """An object from the cluster with a field this code cannot read; the message names the field."""


def _mapping(value: Any) -> dict[str, Any]:
    return dict(value) if isinstance(value, Mapping) else {}


def _strings(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in _mapping(value).items()}


def parse_timestamp(value: Any) -> datetime | None:
    """RFC 3339 as the API server writes it (`2026-01-02T03:04:05Z`), timezone-aware."""
    if not value:
        return None
    return datetime.fromisoformat(str(value).replace("Z", "+00:00"))


def format_timestamp(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def _whole(quantity: Any, *, scale: int, where: str) -> int:
    if quantity is None:
        return 0
    try:
        return math.floor(parse_quantity(str(quantity), what=where) * scale)
    except QuantityError as error:
        raise ManifestError(str(error)) from error


def pod_from_manifest(manifest: Manifest) -> Pod:
    meta = _mapping(manifest.get("metadata"))
    spec = _mapping(manifest.get("spec"))
    status = _mapping(manifest.get("status"))
    containers = tuple(
        ContainerResources(
            name=str(container.get("name", "")),
            requests=_strings(_mapping(container.get("resources")).get("requests")),
            limits=_strings(_mapping(container.get("resources")).get("limits")),
        )
        for container in spec.get("containers") or ()
    )
    tolerations = tuple(
        Toleration(
            key=str(t.get("key") or ""),
            operator=str(t.get("operator") or "Equal"),
            value=str(t.get("value") or ""),
            effect=str(t.get("effect") or ""),
        )
        for t in spec.get("tolerations") or ()
    )
    owners = tuple(
        OwnerReference(
            kind=str(o.get("kind", "")),
            name=str(o.get("name", "")),
            uid=str(o.get("uid", "")),
            controller=bool(o.get("controller", False)),
        )
        for o in meta.get("ownerReferences") or ()
    )
    priority = spec.get("priority")
    return Pod(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name", "")),
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        labels=_strings(meta.get("labels")),
        annotations=_strings(meta.get("annotations")),
        scheduler_name=str(spec.get("schedulerName") or "default-scheduler"),
        node_name=str(spec["nodeName"]) if spec.get("nodeName") else None,
        phase=str(status.get("phase") or "Pending"),
        priority=int(priority) if priority is not None else None,
        priority_class_name=str(spec["priorityClassName"]) if spec.get("priorityClassName") else None,
        node_selector=_strings(spec.get("nodeSelector")),
        tolerations=tolerations,
        containers=containers,
        owner_references=owners,
        created_at=parse_timestamp(meta.get("creationTimestamp")),
        deleting_since=parse_timestamp(meta.get("deletionTimestamp")),
    )


def namespace_from_manifest(manifest: Manifest) -> Namespace:
    meta = _mapping(manifest.get("metadata"))
    return Namespace(name=str(meta.get("name", "")), labels=_strings(meta.get("labels")))


CORDON_TAINT = "node.kubernetes.io/unschedulable"
"""The taint Kubernetes' node lifecycle controller puts on a cordoned node; `Node.cordoned` carries it."""


def node_from_manifest(manifest: Manifest) -> Node:
    """A node; its taints leave out `CORDON_TAINT`, which only mirrors `spec.unschedulable` (`cordoned`)."""
    meta = _mapping(manifest.get("metadata"))
    spec = _mapping(manifest.get("spec"))
    status = _mapping(manifest.get("status"))
    name = str(meta.get("name", ""))
    allocatable = _mapping(status.get("allocatable"))
    return Node(
        name=name,
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        labels=_strings(meta.get("labels")),
        annotations=_strings(meta.get("annotations")),
        taints=tuple(
            Taint(key=str(t.get("key", "")), value=str(t.get("value") or ""), effect=str(t.get("effect", "")))
            for t in spec.get("taints") or ()
            if t.get("key") != CORDON_TAINT
        ),
        cordoned=bool(spec.get("unschedulable", False)),
        allocatable_cpu_milli=_whole(
            allocatable.get("cpu"), scale=1000, where=f"node {name}: status.allocatable.cpu"
        ),
        allocatable_memory_bytes=_whole(
            allocatable.get("memory"), scale=1, where=f"node {name}: status.allocatable.memory"
        ),
        allocatable_disk_bytes=_whole(
            allocatable.get("ephemeral-storage"),
            scale=1,
            where=f"node {name}: status.allocatable.ephemeral-storage",
        ),
        conditions=tuple(
            NodeCondition(
                type=str(c.get("type", "")),
                status=str(c.get("status", "")),
                reason=str(c.get("reason") or ""),
                message=str(c.get("message") or ""),
            )
            for c in status.get("conditions") or ()
        ),
        created_at=parse_timestamp(meta.get("creationTimestamp")),
        deleting_since=parse_timestamp(meta.get("deletionTimestamp")),
    )


def label_selector_from_manifest(selector: Any) -> LabelSelector | None:
    if not isinstance(selector, Mapping):
        return None
    return LabelSelector(
        match_labels=_strings(selector.get("matchLabels")),
        match_expressions=tuple(
            LabelRequirement(
                key=str(e.get("key", "")),
                operator=str(e.get("operator", "")),
                values=tuple(str(v) for v in e.get("values") or ()),
            )
            for e in selector.get("matchExpressions") or ()
        ),
    )


def pdb_from_manifest(manifest: Manifest) -> PodDisruptionBudget:
    meta = _mapping(manifest.get("metadata"))
    spec = _mapping(manifest.get("spec"))
    status = _mapping(manifest.get("status"))
    return PodDisruptionBudget(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name", "")),
        selector=label_selector_from_manifest(spec.get("selector")),
        disruptions_allowed=int(status.get("disruptionsAllowed") or 0),
        current_healthy=int(status.get("currentHealthy") or 0),
        desired_healthy=int(status.get("desiredHealthy") or 0),
    )


def custom_object_from_manifest(kind: CustomResource, manifest: Manifest) -> CustomObject:
    meta = _mapping(manifest.get("metadata"))
    return CustomObject(
        kind=kind,
        name=str(meta.get("name", "")),
        namespace=str(meta["namespace"]) if meta.get("namespace") else None,
        uid=str(meta.get("uid") or ""),
        resource_version=str(meta.get("resourceVersion") or ""),
        labels=_strings(meta.get("labels")),
        annotations=_strings(meta.get("annotations")),
        spec=_mapping(manifest.get("spec")),
        status=_mapping(manifest.get("status")),
        owner_references=_owner_references(meta),
    )


def _owner_references(meta: Mapping[str, Any]) -> tuple[OwnerReference, ...]:
    return tuple(
        OwnerReference(
            kind=str(o.get("kind", "")),
            name=str(o.get("name", "")),
            uid=str(o.get("uid", "")),
            controller=bool(o.get("controller", False)),
        )
        for o in meta.get("ownerReferences") or ()
    )


CUSTOM_KINDS = {
    CustomResource.GPU: "GPU",
    CustomResource.GPU_NODE: "GPUNode",
    CustomResource.GPU_POOL: "GPUPool",
    CustomResource.GPU_RESOURCE_QUOTA: "GPUResourceQuota",
    CustomResource.WORKLOAD_PROFILE: "WorkloadProfile",
    CustomResource.PROVIDER_CONFIG: "ProviderConfig",
}


def custom_owner_reference(owner: CustomObject) -> dict[str, Any]:
    """The controller ownerReference to one of our objects: the garbage collector deletes the dependent
    with its owner. `blockOwnerDeletion` is left out: setting it needs update rights on the owner."""
    if not owner.uid:
        raise ValueError(f"owner {owner.kind.plural}/{owner.name} has no uid: read it from the cluster first")
    return {
        "apiVersion": f"{CUSTOM_RESOURCE_GROUP}/{CUSTOM_RESOURCE_VERSION}",
        "kind": CUSTOM_KINDS[owner.kind],
        "name": owner.name,
        "uid": owner.uid,
        "controller": True,
    }


def metadata_patch(
    labels: Mapping[str, str | None],
    annotations: Mapping[str, str | None],
    resource_version: str | None,
) -> dict[str, Any]:
    """A JSON merge patch of labels and annotations; `None` removes a key; a version makes it conditional."""
    meta: dict[str, Any] = {}
    if labels:
        meta["labels"] = dict(labels)
    if annotations:
        meta["annotations"] = dict(annotations)
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"metadata": meta}


def unschedulable_condition(message: str, now: datetime) -> dict[str, Any]:
    """The `PodScheduled=False` condition kube-scheduler writes for a pod that fits nowhere."""
    return {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": message,
        "lastTransitionTime": format_timestamp(now),
    }


def scheduling_event(pod: Pod, message: str, reporter: str, now: datetime) -> dict[str, Any]:
    """A core/v1 Warning Event `FailedScheduling` about `pod`, as `kubectl describe pod` shows it."""
    involved = {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": pod.namespace,
        "name": pod.name,
        "uid": pod.uid,
        "resourceVersion": pod.resource_version,
    }
    return warning_event(pod.namespace, involved, "FailedScheduling", message, reporter, now)


def warning_event(
    namespace: str, involved: Mapping[str, Any], reason: str, message: str, reporter: str, now: datetime
) -> dict[str, Any]:
    """A core/v1 Warning Event in `namespace` about the `involved` object (`involvedObject`)."""
    stamp = format_timestamp(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "namespace": namespace,
            "name": f"{involved['name']}.{int(now.timestamp() * 1_000_000):x}",
        },
        "involvedObject": dict(involved),
        "type": "Warning",
        "reason": reason,
        "message": message,
        "source": {"component": reporter},
        "reportingComponent": reporter,
        "reportingInstance": reporter,
        "firstTimestamp": stamp,
        "lastTimestamp": stamp,
        "count": 1,
    }


def binding_body(
    namespace: str, name: str, node_name: str, uid: str | None, annotations: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """A Binding; with `uid` the API server refuses it if the pod was recreated under the same name. Its
    `annotations` are set on the pod in the same write as `spec.nodeName` (the API server copies them)."""
    meta: dict[str, Any] = {"namespace": namespace, "name": name}
    if uid:
        meta["uid"] = uid
    if annotations:
        meta["annotations"] = dict(annotations)
    return {
        "apiVersion": "v1",
        "kind": "Binding",
        "metadata": meta,
        "target": {"apiVersion": "v1", "kind": "Node", "name": node_name},
    }


def eviction_body(namespace: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"namespace": namespace, "name": name},
    }
