"""The Kubernetes side of the user's story: a stack and a stand-in Deployment controller.

`KubeStack` is what a cluster with tfpool installed looks like to the test: the stateful test API server
over HTTP (kmock plus `tests/integration/cluster/cluster_apiserver.py`), the scheduler in Kubernetes mode
as `tfctl serve scheduler` wires it (real Postgres ledger, real NATS JetStream), the webhook's
`AdmissionService` with the takeover ledger, and `kubectl`: reads through `KubernetesCluster` (the real
`kubernetes` client over HTTP).

`DeploymentController` plays kube-controller-manager for Deployments: each template change makes a new
ReplicaSet (named by the template's hash), whose pods carry `generateName`, the `pod-template-hash` label
and an `ownerReference`; every pod goes through the webhook (as the API server calls it) before it is
stored, then the old ReplicaSet's pods are deleted (a rolling update). Pods the webhook leaves alone keep
`nvidia.com/gpu` and are bound by a stand-in kube-scheduler to the node where the device plugin serves
them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import copy
import hashlib
import json
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

import jsonpatch
from cluster_apiserver import ApiServerState
from k8s_scheduler_support import PODS, Running
from tfcommon.bus import NatsEventBus
from tfcommon.cluster import CustomResource, Pod, PodEvent, PodEventType
from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.ledger.sql import SqlLedger
from tfwebhook.http import AdmissionService

GIB = 1024**3
TF_SCHEDULER = "tensor-fusion-scheduler"
COMPONENT = "tensor-fusion.ai/component"
GPU_IDS = "tensor-fusion.ai/gpu-ids"
ENABLED = "tensor-fusion.ai/enabled"
NATIVE_GPU = "nvidia.com/gpu"
DEVICE_PLUGIN_NODE = "gpu-node-device-plugin"


@dataclass
class KubeStack:
    """The cluster as the user's story sees it; `kubectl` is a `KubernetesCluster` over HTTP."""

    state: ApiServerState
    ledger: SqlLedger
    bus: NatsEventBus
    scheduler: Running
    kubectl: KubernetesCluster

    def delete_pod(self, namespace: str, name: str) -> None:
        """`kubectl delete pod` (the kubelet's part is instant here: the object is gone)."""
        self.state.delete(PODS, namespace, name)

    async def pods(self, namespace: str, labels: dict[str, str] | None = None) -> list[Pod]:
        return await self.kubectl.list_pods(namespace=namespace, labels=labels)

    async def gpu_available(self) -> dict[str, tuple[str, str]]:
        """`kubectl get gpu -o custom-columns=NAME,AVAILABLE`: GPU name -> (available TFLOPS, VRAM)."""
        gpus = await self.kubectl.list_custom_objects(CustomResource.GPU)
        result = {}
        for gpu in gpus:
            available = gpu.status.get("available") or {}
            result[gpu.name] = (str(available.get("tflops")), str(available.get("vram")))
        return result


def taken_over(pod: Pod) -> bool:
    """What `kubectl get pod -L tensor-fusion.ai/component` shows: a value when tfpool took the pod over."""
    return bool(pod.labels.get(COMPONENT))


def gpu_ids(pod: Pod) -> list[str]:
    text = pod.annotations.get(GPU_IDS, "")
    return [uuid for uuid in text.split(",") if uuid]


def native_limit(pod: Pod) -> str | None:
    return next((c.limits[NATIVE_GPU] for c in pod.containers if NATIVE_GPU in c.limits), None)


@dataclass
class Deployment:
    """A Deployment's desired state: replicas and the pod template (metadata and spec)."""

    namespace: str
    name: str
    replicas: int
    labels: dict[str, str] = field(default_factory=dict)
    annotations: dict[str, str] = field(default_factory=dict)
    limits: dict[str, Any] = field(default_factory=lambda: {NATIVE_GPU: 1})

    def template(self) -> dict[str, Any]:
        container: dict[str, Any] = {"name": "app", "image": "vllm/vllm-openai:v0.6"}
        container["resources"] = {"limits": dict(self.limits)} if self.limits else {}
        return {
            "metadata": {"labels": {"app": self.name, **self.labels}, "annotations": dict(self.annotations)},
            "spec": {"containers": [container]},
        }


@dataclass
class Admission:
    uid: str
    allowed: bool
    message: str


class DeploymentController:
    """Rolls Deployments out through the webhook, as the ReplicaSet controller and the API server do."""

    def __init__(self, stack: KubeStack, webhook: AdmissionService) -> None:
        self.stack = stack
        self.webhook = webhook
        self.current: dict[tuple[str, str], str] = {}
        self._templates: dict[str, dict[str, Any]] = {}

    def use_webhook(self, webhook: AdmissionService) -> None:
        """The webhook was redeployed (e.g. `helm upgrade` with new `dynamicConfig`)."""
        self.webhook = webhook

    async def apply(self, deployment: Deployment) -> str:
        """`kubectl apply`: a new ReplicaSet with all replicas, then the old one's pods are deleted.

        Returns the ReplicaSet's name; with an unchanged template, only missing replicas are created.
        """
        template = deployment.template()
        template_hash = hashlib.sha256(json.dumps(template, sort_keys=True).encode()).hexdigest()[:10]
        replica_set = f"{deployment.name}-{template_hash}"
        key = (deployment.namespace, deployment.name)
        previous = self.current.get(key)
        existing = await self.stack.pods(deployment.namespace, {"pod-template-hash": template_hash})
        for _ in range(deployment.replicas - len(existing)):
            await self._create_pod(deployment.namespace, replica_set, template_hash, template)
        self.current[key] = replica_set
        if previous is not None and previous != replica_set:
            for pod in await self.stack.pods(deployment.namespace, {"pod-template-hash": previous[-10:]}):
                self.stack.delete_pod(pod.namespace, pod.name)
        return replica_set

    async def replace_deleted(self, pod: Pod) -> str | None:
        """The ReplicaSet controller replacing a deleted pod of a current ReplicaSet; returns its name
        (None for a pod of an old ReplicaSet, which a rolling update deleted on purpose)."""
        [owner] = [ref.name for ref in pod.owner_references if ref.kind == "ReplicaSet"]
        if owner not in self.current.values():
            return None
        return await self._create_pod(pod.namespace, owner, owner[-10:], self._templates[owner])

    async def _create_pod(
        self, namespace: str, replica_set: str, template_hash: str, template: dict[str, Any]
    ) -> str:
        self._templates[replica_set] = template
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "namespace": namespace,
                "generateName": f"{replica_set}-",
                "labels": {**template["metadata"]["labels"], "pod-template-hash": template_hash},
                "annotations": dict(template["metadata"]["annotations"]),
                "ownerReferences": [
                    {
                        "apiVersion": "apps/v1",
                        "kind": "ReplicaSet",
                        "name": replica_set,
                        "uid": f"uid-{replica_set}",
                        "controller": True,
                        "blockOwnerDeletion": True,
                    }
                ],
            },
            "spec": copy.deepcopy(template["spec"]),
        }
        admission = await self._admit(namespace, pod)
        assert admission.allowed, f"the webhook refused a pod of {replica_set}: {admission.message}"
        metadata = pod["metadata"]
        metadata["name"] = metadata["generateName"] + secrets.token_hex(3)[:5]
        if pod["spec"].get("schedulerName", "default-scheduler") == "default-scheduler":
            pod["spec"]["nodeName"] = DEVICE_PLUGIN_NODE  # kube-scheduler and the device plugin's part
            pod["status"] = {"phase": "Running"}
        else:
            pod["status"] = {"phase": "Pending"}
        self.stack.state.put(PODS, pod)
        return str(metadata["name"])

    async def _admit(self, namespace: str, pod: dict[str, Any]) -> Admission:
        """The API server's call to `POST /mutate-v1-pod`, applying the returned JSONPatch in place."""
        uid = str(uuid4())
        review = {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": uid,
                "kind": {"group": "", "version": "v1", "kind": "Pod"},
                "resource": {"group": "", "version": "v1", "resource": "pods"},
                "operation": "CREATE",
                "namespace": namespace,
                "object": pod,
                "dryRun": False,
            },
        }
        status, body = await self.webhook.review(json.dumps(review).encode())
        assert status == 200, body
        response = json.loads(body)["response"]
        assert response["uid"] == uid
        if not response["allowed"]:
            return Admission(uid, False, str((response.get("status") or {}).get("message")))
        if "patch" in response:
            patched = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
            pod.clear()
            pod.update(patched)
        return Admission(uid, True, "")


@dataclass
class PodHistory:
    """What `kubectl get pods -w` showed: ("deleted" | "bound", namespace/name, node) in order."""

    seen: list[tuple[str, str, str | None]] = field(default_factory=list)
    replacements: dict[str, str] = field(default_factory=dict)


@contextlib.asynccontextmanager
async def replica_sets_running(controller: DeploymentController) -> AsyncIterator[PodHistory]:
    """The ReplicaSet controller's loop: every deleted pod of a current ReplicaSet is replaced.
    Needs at least one pod of ours in the cluster (the first listed one shows the watch is live)."""
    history = PodHistory()
    watch = controller.stack.kubectl.watch_pods(TF_SCHEDULER)
    bound: set[str] = set()

    async def handle(event: PodEvent) -> None:
        pod = event.pod
        key = f"{pod.namespace}/{pod.name}"
        if event.type is PodEventType.DELETED:
            history.seen.append(("deleted", key, pod.node_name))
            replacement = await controller.replace_deleted(pod)
            if replacement:
                history.replacements[key] = f"{pod.namespace}/{replacement}"
        elif pod.node_name and key not in bound:
            bound.add(key)
            history.seen.append(("bound", key, pod.node_name))

    async def follow() -> None:
        async for event in watch:
            await handle(event)

    await handle(await anext(watch))  # the watch has listed: no later deletion can be missed
    task = asyncio.create_task(follow())
    try:
        yield history
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        await watch.aclose()
