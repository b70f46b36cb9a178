"""Harnesses for the `Cluster` contract (one per adapter, seeded and inspected the same way) and builders.

`MemoryHarness` drives `InMemoryCluster`; `KubernetesHarness` drives `KubernetesCluster` over HTTP against
kmock with the stateful reactions of `cluster_apiserver`; `ControlPlaneHarness` drives it against the
session's real control plane (`tfcommon.kube_local`), seeding and inspecting as the admin.

The builders describe objects a real API server accepts and a real cluster would hold: pods with an
image and no termination grace period (nothing runs them on the contract's nodes), a bound pod Running
and Ready as its kubelet would report it, a disruption budget whose spec yields the status it carries.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from cluster_apiserver import ApiServerState
from tfcommon.cluster import Cluster, CustomResource, PodEvent, PodWatch
from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.cluster.memory import InMemoryCluster

_CORE = "/v1"


def _resource_path(kind: CustomResource) -> str:
    return f"tensor-fusion.ai/v1/{kind.plural}"


class Harness(Protocol):
    cluster: Cluster

    def put_pod(self, manifest: dict[str, Any]) -> None: ...
    def put_node(self, manifest: dict[str, Any]) -> None: ...
    def put_budget(self, manifest: dict[str, Any]) -> None: ...
    def put_custom(self, kind: CustomResource, manifest: dict[str, Any]) -> None: ...
    def delete_pod(self, namespace: str, name: str) -> None: ...
    def pod(self, namespace: str, name: str) -> dict[str, Any] | None: ...
    def custom(self, kind: CustomResource, name: str) -> dict[str, Any] | None: ...
    def events(self) -> list[dict[str, Any]]: ...
    def forget_watch_history(self) -> None: ...


class MemoryHarness:
    def __init__(self) -> None:
        self.fake = InMemoryCluster()
        self.cluster: Cluster = self.fake

    def put_pod(self, manifest: dict[str, Any]) -> None:
        self.fake.put_pod(manifest)

    def put_node(self, manifest: dict[str, Any]) -> None:
        self.fake.put_node(manifest)

    def put_budget(self, manifest: dict[str, Any]) -> None:
        self.fake.put_disruption_budget(manifest)

    def put_custom(self, kind: CustomResource, manifest: dict[str, Any]) -> None:
        self.fake.put_custom_object(kind, manifest)

    def delete_pod(self, namespace: str, name: str) -> None:
        self.fake.delete_pod(namespace, name)

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.fake.manifest("pods", namespace, name)

    def custom(self, kind: CustomResource, name: str) -> dict[str, Any] | None:
        return self.fake.manifest(kind.plural, None, name)

    def events(self) -> list[dict[str, Any]]:
        return list(self.fake.events)

    def forget_watch_history(self) -> None:
        self.fake.forget_watch_history()


class KubernetesHarness:
    def __init__(self, state: ApiServerState, url: str) -> None:
        self.state = state
        self.cluster: Cluster = KubernetesCluster.for_url(url, watch_timeout_s=2)

    def put_pod(self, manifest: dict[str, Any]) -> None:
        manifest["metadata"].setdefault("namespace", "default")
        self.state.put(f"{_CORE}/pods", manifest)

    def put_node(self, manifest: dict[str, Any]) -> None:
        self.state.put(f"{_CORE}/nodes", manifest)

    def put_budget(self, manifest: dict[str, Any]) -> None:
        self.state.put("policy/v1/poddisruptionbudgets", manifest)

    def put_custom(self, kind: CustomResource, manifest: dict[str, Any]) -> None:
        self.state.put(_resource_path(kind), manifest)

    def delete_pod(self, namespace: str, name: str) -> None:
        self.state.delete(f"{_CORE}/pods", namespace, name)

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self.state.objects.get((f"{_CORE}/pods", namespace, name))

    def custom(self, kind: CustomResource, name: str) -> dict[str, Any] | None:
        return self.state.objects.get((_resource_path(kind), None, name))

    def events(self) -> list[dict[str, Any]]:
        return [obj for (res, _, _), obj in self.state.objects.items() if res == f"{_CORE}/events"]

    def forget_watch_history(self) -> None:
        self.state.compact()

    def close(self) -> None:
        assert isinstance(self.cluster, KubernetesCluster)
        self.cluster.close()


SCHEDULER = "tensor-fusion-scheduler"


PAUSE_IMAGE = "registry.k8s.io/pause:3.10"


def a_pod(
    name: str,
    *,
    namespace: str = "default",
    scheduler: str = SCHEDULER,
    node: str | None = None,
    phase: str | None = None,
    labels: dict[str, str] | None = None,
) -> dict[str, Any]:
    """A pod of `scheduler`; bound to `node`, it is Running and Ready unless `phase` says otherwise."""
    spec: dict[str, Any] = {
        "schedulerName": scheduler,
        "containers": [{"name": "main", "image": PAUSE_IMAGE}],
        "terminationGracePeriodSeconds": 0,
    }
    if node:
        spec["nodeName"] = node
    status: dict[str, Any] = {"phase": phase or ("Running" if node else "Pending")}
    if status["phase"] == "Running":
        status["conditions"] = [{"type": "Ready", "status": "True"}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": spec,
        "status": status,
    }


def a_node(name: str, **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        "spec": spec,
        "status": {
            "allocatable": {"cpu": "7910m", "memory": "32Gi"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def a_budget(name: str, app: str, allowed: int, *, healthy: int = 1) -> dict[str, Any]:
    """A budget over the `app` pods that allows `allowed` disruptions while `healthy` of them are Ready:
    `minAvailable` is what the disruption controller turns into that status."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"selector": {"matchLabels": {"app": app}}, "minAvailable": healthy - allowed},
        "status": {
            "disruptionsAllowed": allowed,
            "currentHealthy": healthy,
            "desiredHealthy": healthy - allowed,
            "expectedPods": healthy,
        },
    }


async def next_event(watch: PodWatch) -> PodEvent:
    return await asyncio.wait_for(anext(watch), timeout=10)


def summary(event: PodEvent) -> tuple[str, str]:
    return (event.type.value, event.pod.name)
