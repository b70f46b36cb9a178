"""`ControlPlaneHarness`: the `Cluster` contract's seeding and inspection on a real control plane.

Objects are written as the admin through the API, as `kubectl` would: a pod's status through its
`status` subresource after creation (the API server resets it on create), a custom object's likewise.
After each write the harness waits for what the cluster's own controllers do about it before the test
goes on, as a user waiting for the cluster to settle: the disruption controller's budget status, the
node lifecycle controller's taints. `forget_watch_history` compacts etcd to its current revision and
restarts kube-apiserver, whose watch cache is then rebuilt from a fresh list: a watch resuming from an
older version gets `410 Gone`, as a client does after a long disconnection. What a test leaves behind
is deleted when it ends (`close`).
"""

from __future__ import annotations

import copy
import ssl
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import httpx
from tfcommon.cluster import Cluster, CustomResource
from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.kube_local import ADMIN, LocalKubernetes

SETTLE_TIMEOUT_S = 30.0
NAMESPACES = ("default", "team", "tfpool-system")
_CUSTOM = "/apis/tensor-fusion.ai/v1"
_UNSCHEDULABLE = "node.kubernetes.io/unschedulable"
_NOT_READY = "node.kubernetes.io/not-ready"


def kubectl(control_plane: LocalKubernetes, *args: str, stdin: str | None = None) -> str:
    """Run the pinned kubectl as the admin, as a user types it; fails the test naming its error."""
    result = subprocess.run(
        [str(Path(sys.executable).parent / "kubectl"), f"--kubeconfig={control_plane.kubeconfig}", *args],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
    return result.stdout


def admin_client(control_plane: LocalKubernetes) -> httpx.Client:
    """A synchronous HTTP client on the API server, authenticated as the admin."""
    pki = control_plane.pki
    admin = pki.client(ADMIN)
    trust = ssl.create_default_context(cafile=str(pki.ca.cert_file))
    trust.load_cert_chain(str(admin.cert_file), str(admin.key_file))
    return httpx.Client(base_url=control_plane.api_url, verify=trust, timeout=10.0)


def _settle(what: str, check: Callable[[], str | None]) -> None:
    """Poll `check` (None once settled, else what is still awaited) for `SETTLE_TIMEOUT_S`."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while (waiting := check()) is not None:
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not settle within {SETTLE_TIMEOUT_S:.0f}s: {waiting}")
        time.sleep(0.05)


def _pods_path(namespace: str, name: str = "") -> str:
    return f"/api/v1/namespaces/{namespace}/pods" + (f"/{name}" if name else "")


def _custom_path(kind: CustomResource, name: str = "") -> str:
    return f"{_CUSTOM}/{kind.plural}" + (f"/{name}" if name else "")


def _matches(selector: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())


def _ready(pod: Mapping[str, Any]) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or ()
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


class ControlPlaneHarness:
    """Seeds and inspects a real API server as the admin; `cluster` is a `KubernetesCluster` on it."""

    def __init__(self, control_plane: LocalKubernetes) -> None:
        self.control_plane = control_plane
        self.api = admin_client(control_plane)
        self.cluster: Cluster = KubernetesCluster.from_environment(
            kubeconfig=str(control_plane.kubeconfig), watch_timeout_s=2
        )
        self._nodes: set[str] = set()
        self._pod_uids: set[str] = set()
        for namespace in NAMESPACES:
            self._ensure_namespace(namespace)

    # -- requests ----------------------------------------------------------------------------------

    def _ok(self, response: httpx.Response) -> dict[str, Any]:
        if response.is_error:
            request = response.request
            raise AssertionError(
                f"{request.method} {request.url.path}: {response.status_code} {response.text}"
            )
        body: dict[str, Any] = response.json()
        return body

    def _get(self, path: str, **params: str) -> dict[str, Any] | None:
        response = self.api.get(path, params=params)
        return None if response.status_code == 404 else self._ok(response)

    def _merge_patch(self, path: str, body: Mapping[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/merge-patch+json"}
        return self._ok(self.api.patch(path, json=dict(body), headers=headers))

    def _ensure_namespace(self, namespace: str) -> None:
        if self._get(f"/api/v1/namespaces/{namespace}") is None:
            manifest = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
            response = self.api.post("/api/v1/namespaces", json=manifest)
            if response.status_code != 409:
                self._ok(response)
        # The ServiceAccount admission plugin refuses pods until the namespace's `default` account exists.
        _settle(
            f"namespace {namespace}'s default service account",
            lambda: (
                None
                if self._get(f"/api/v1/namespaces/{namespace}/serviceaccounts/default")
                else "not created yet"
            ),
        )

    def _create_or_replace(self, path: str, manifest: dict[str, Any]) -> dict[str, Any]:
        name = manifest["metadata"]["name"]
        response = self.api.post(path, json=manifest)
        if response.status_code != 409:
            return self._ok(response)
        current = self._get(f"{path}/{name}")
        assert current is not None, f"{path}/{name}: conflict on create, then not found"
        manifest["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
        return self._ok(self.api.put(f"{path}/{name}", json=manifest))

    # -- the Harness protocol ----------------------------------------------------------------------

    def put_pod(self, manifest: dict[str, Any]) -> None:
        manifest = copy.deepcopy(manifest)
        namespace = manifest["metadata"].setdefault("namespace", "default")
        self._ensure_namespace(namespace)
        status = manifest.pop("status", None) or {}
        created = self._create_or_replace(_pods_path(namespace), manifest)
        self._pod_uids.add(created["metadata"]["uid"])
        if status.get("phase", "Pending") != "Pending" or status.get("conditions"):
            self._merge_patch(
                f"{_pods_path(namespace, manifest['metadata']['name'])}/status", {"status": status}
            )
        self._settle_budgets(namespace)

    def put_node(self, manifest: dict[str, Any]) -> None:
        manifest = copy.deepcopy(manifest)
        name = manifest["metadata"]["name"]
        self._create_or_replace("/api/v1/nodes", manifest)
        self._nodes.add(name)
        self._settle_node(name, manifest)

    def put_budget(self, manifest: dict[str, Any]) -> None:
        manifest = copy.deepcopy(manifest)
        manifest.pop("status", None)
        namespace = manifest["metadata"].setdefault("namespace", "default")
        self._create_or_replace(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets", manifest)
        self._settle_budgets(namespace)

    def put_custom(self, kind: CustomResource, manifest: dict[str, Any]) -> None:
        manifest = copy.deepcopy(manifest)
        status = manifest.pop("status", None)
        self._create_or_replace(_custom_path(kind), manifest)
        if status:
            self._merge_patch(
                f"{_custom_path(kind, manifest['metadata']['name'])}/status", {"status": status}
            )

    def delete_pod(self, namespace: str, name: str) -> None:
        self._ok(self.api.delete(_pods_path(namespace, name), params={"gracePeriodSeconds": "0"}))
        self._settle_budgets(namespace)

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return self._get(_pods_path(namespace, name))

    def custom(self, kind: CustomResource, name: str) -> dict[str, Any] | None:
        return self._get(_custom_path(kind, name))

    def events(self) -> list[dict[str, Any]]:
        """Events about the pods this harness put (the cluster's own components report on nodes too)."""
        items = (self._get("/api/v1/events") or {}).get("items") or []
        return [e for e in items if (e.get("involvedObject") or {}).get("uid") in self._pod_uids]

    def forget_watch_history(self) -> None:
        self.control_plane.compact_etcd()
        self.control_plane.restart_api_server()
        self._settle_watch_cache()

    def close(self) -> None:
        """Delete what the test made (pods at once, whatever their grace period) and wait until it is gone."""
        try:
            for namespace in NAMESPACES:
                base = f"/api/v1/namespaces/{namespace}"
                self._ok(self.api.delete(f"{base}/pods", params={"gracePeriodSeconds": "0"}))
                self._ok(self.api.delete(f"{base}/events"))
                self._ok(self.api.delete(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets"))
                self._ok(self.api.delete(f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"))
            for path in self._custom_collections():
                self._ok(self.api.delete(path))
            for node in self._nodes:
                response = self.api.delete(f"/api/v1/nodes/{node}")
                if response.status_code != 404:
                    self._ok(response)
            _settle("the test's objects' deletion", self._leftovers)
        finally:
            assert isinstance(self.cluster, KubernetesCluster)
            self.cluster.close()
            self.api.close()

    # -- what the cluster's controllers do -----------------------------------------------------------

    def _leftovers(self) -> str | None:
        paths = [_pods_path(namespace) for namespace in NAMESPACES] + self._custom_collections()
        for path in paths:
            items = (self._get(path) or {}).get("items") or []
            if items:
                return f"{path}: {[i['metadata']['name'] for i in items]}"
        left = [node for node in self._nodes if self._get(f"/api/v1/nodes/{node}") is not None]
        return f"nodes {left}" if left else None

    @staticmethod
    def _custom_collections() -> list[str]:
        cluster_wide = [_custom_path(kind) for kind in CustomResource if not kind.namespaced]
        namespaced = [
            f"{_CUSTOM}/namespaces/{namespace}/{kind.plural}"
            for kind in CustomResource
            if kind.namespaced
            for namespace in NAMESPACES
        ]
        return cluster_wide + namespaced

    def _settle_budgets(self, namespace: str) -> None:
        """Wait until the disruption controller has counted the namespace's pods into every budget."""

        def unsettled() -> str | None:
            budgets = (self._get(f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets") or {})[
                "items"
            ]
            pods = [
                pod
                for pod in (self._get(_pods_path(namespace)) or {})["items"]
                if not pod["metadata"].get("deletionTimestamp")
            ]
            for budget in budgets:
                selector = budget["spec"].get("selector") or {}
                selected = [p for p in pods if _matches(selector, p["metadata"].get("labels") or {})]
                status = budget.get("status") or {}
                seen = (
                    status.get("observedGeneration"),
                    status.get("expectedPods", 0),
                    status.get("currentHealthy", 0),
                )
                wanted = (budget["metadata"]["generation"], len(selected), sum(map(_ready, selected)))
                if seen != wanted:
                    name = budget["metadata"]["name"]
                    return f"budget {name}: (generation, pods, healthy) {seen}, expected {wanted}"
            return None

        _settle(f"disruption budgets in {namespace}", unsettled)

    def _settle_node(self, name: str, manifest: Mapping[str, Any]) -> None:
        """Wait for the node lifecycle controller's taints: `not-ready` gone from a Ready node (admission
        adds it to every new node), `unschedulable` on a cordoned one."""
        cordoned = bool((manifest.get("spec") or {}).get("unschedulable"))
        ready = _ready(manifest)

        def unsettled() -> str | None:
            node = self._get(f"/api/v1/nodes/{name}") or {}
            keys = {t["key"] for t in (node.get("spec") or {}).get("taints") or ()}
            if ready and _NOT_READY in keys:
                return f"{_NOT_READY} still on Ready node {name}"
            if cordoned != (_UNSCHEDULABLE in keys):
                return f"{_UNSCHEDULABLE} {'missing from' if cordoned else 'still on'} node {name}"
            return None

        _settle(f"node {name}'s taints", unsettled)

    def _settle_watch_cache(self) -> None:
        """After a restart the pod watch cache fills from a list; until then watches are refused (429)."""

        def unsettled() -> str | None:
            listed = self._get("/api/v1/pods", limit="1") or {}
            version = listed.get("metadata", {}).get("resourceVersion", "")
            params = {"watch": "true", "resourceVersion": version, "timeoutSeconds": "1"}
            response = self.api.get("/api/v1/pods", params=params, timeout=5)
            return None if response.status_code == 200 else f"pod watch: {response.status_code}"

        _settle("the API server's pod watch cache", unsettled)
