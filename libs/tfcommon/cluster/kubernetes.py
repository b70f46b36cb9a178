"""`KubernetesCluster`: the `Cluster` port over a real API server, through the `kubernetes` client.

The client is synchronous: each call runs in a bounded pool of worker threads, each pod watch in a
daemon thread of its own that hands events to the event loop. Objects are read as raw JSON and
translated by `tfcommon.cluster.manifests`, the same code the in-memory fake uses; leader-election
Leases go through the client's typed `CoordinationV1Api`. Every verb and
resource used here is listed in `tfcommon.cluster.rbac.REQUIRED_RBAC`; keep the two in step.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import partial
from typing import Any
from urllib.parse import quote

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from tfcommon.cluster.kubernetes_watch import KubernetesPodWatch
from tfcommon.cluster.manifests import (
    binding_body,
    custom_object_from_manifest,
    custom_owner_reference,
    eviction_body,
    metadata_patch,
    namespace_from_manifest,
    node_from_manifest,
    pdb_from_manifest,
    pod_from_manifest,
    scheduling_event,
    unschedulable_condition,
)
from tfcommon.cluster.model import (
    CUSTOM_RESOURCE_GROUP,
    CUSTOM_RESOURCE_VERSION,
    Applied,
    BindResult,
    Bound,
    ClusterError,
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
    PodList,
    WatchCursor,
)

DEFAULT_CONCURRENT_REQUESTS = 16
SPARE_CONNECTIONS = 4
"""Kept-alive connections beyond one per worker thread: each pod watch holds one while it streams."""
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
_CUSTOM_KINDS = {
    CustomResource.GPU: "GPU",
    CustomResource.GPU_NODE: "GPUNode",
    CustomResource.GPU_POOL: "GPUPool",
    CustomResource.GPU_RESOURCE_QUOTA: "GPUResourceQuota",
    CustomResource.WORKLOAD_PROFILE: "WorkloadProfile",
    CustomResource.PROVIDER_CONFIG: "ProviderConfig",
}


def _utc_now() -> datetime:
    return datetime.now(UTC)


def _segment(value: str) -> str:
    if not value:
        raise ValueError("an empty name or namespace was given: pass the object's metadata.name / namespace")
    return quote(value, safe="")


def _pods_path(namespace: str | None = None, name: str | None = None, sub: str | None = None) -> str:
    path = f"/api/v1/namespaces/{_segment(namespace)}/pods" if namespace is not None else "/api/v1/pods"
    if name is not None:
        path += f"/{_segment(name)}"
    if sub:
        path += f"/{sub}"
    return path


def _custom_path(kind: CustomResource, namespace: str | None, name: str | None = None, sub: str = "") -> str:
    path = f"/apis/{CUSTOM_RESOURCE_GROUP}/{CUSTOM_RESOURCE_VERSION}"
    if kind.namespaced and namespace is not None:
        path += f"/namespaces/{_segment(namespace)}"
    path += f"/{kind.plural}"
    if name is not None:
        path += f"/{_segment(name)}"
    if sub:
        path += f"/{sub}"
    return path


def _micro_time(moment: datetime | None) -> datetime | None:
    """A Lease time the API server accepts: the client writes `isoformat()`, which drops a zero fraction
    that `MicroTime` requires, so a whole second is nudged by one microsecond."""
    if moment is None or moment.microsecond:
        return moment
    return moment.replace(microsecond=1)


def _lease_body(namespace: str, name: str, record: LeaseRecord) -> Any:
    return k8s_client.V1Lease(
        api_version="coordination.k8s.io/v1",
        kind="Lease",
        metadata=k8s_client.V1ObjectMeta(
            name=name, namespace=namespace, resource_version=record.resource_version or None
        ),
        spec=k8s_client.V1LeaseSpec(
            holder_identity=record.holder_identity,
            lease_duration_seconds=record.lease_duration_s,
            acquire_time=_micro_time(record.acquire_time),
            renew_time=_micro_time(record.renew_time),
            lease_transitions=record.lease_transitions,
        ),
    )


def _lease_record(lease: Any) -> LeaseRecord:
    spec = lease.spec or k8s_client.V1LeaseSpec()
    return LeaseRecord(
        holder_identity=spec.holder_identity or "",
        lease_duration_s=int(spec.lease_duration_seconds or 0),
        acquire_time=spec.acquire_time,
        renew_time=spec.renew_time,
        lease_transitions=int(spec.lease_transitions or 0),
        resource_version=str(lease.metadata.resource_version or ""),
    )


def _api_error(error: Any) -> ClusterError:
    try:
        body = json.loads(error.body) if error.body else {}
    except ValueError:
        body = {}
    message = body.get("message") if isinstance(body, dict) else None
    return ClusterError(int(error.status or 0), str(error.reason or "Error"), str(message or error.reason))


def _label_selector(labels: Mapping[str, str] | None) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted((labels or {}).items()))


def _api_client(configuration: Any, options: Mapping[str, Any]) -> Any:
    """The client with a connection kept alive for every worker thread (and the watches): the client's
    own default (five per CPU) is below the thread count on a small machine, and every request beyond it
    paid a fresh TLS handshake, on both sides, and was then dropped."""
    wanted = int(options.get("max_concurrent_requests", DEFAULT_CONCURRENT_REQUESTS)) + SPARE_CONNECTIONS
    configuration.connection_pool_maxsize = max(int(configuration.connection_pool_maxsize or 0), wanted)
    return k8s_client.ApiClient(configuration)


@dataclass(frozen=True)
class _Reply:
    status: int
    body: dict[str, Any]

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def message(self) -> str:
        return str(self.body.get("message") or self.body.get("reason") or f"HTTP {self.status}")

    def error(self) -> ClusterError:
        return ClusterError(self.status, str(self.body.get("reason") or "Error"), self.message)


class KubernetesCluster:
    """The `Cluster` port on a Kubernetes API server. Build it with `from_environment()` or `for_url()`."""

    def __init__(
        self,
        api_client: Any,
        *,
        request_timeout_s: float = 10.0,
        watch_timeout_s: int = 60,
        max_concurrent_requests: int = DEFAULT_CONCURRENT_REQUESTS,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        """`max_concurrent_requests` bounds the worker threads (and so the connections) used for calls;
        each pod watch has its own thread on top."""
        self._api = api_client
        self._executor = ThreadPoolExecutor(max_concurrent_requests, thread_name_prefix="tf-kube")
        self.request_timeout_s = request_timeout_s
        self.watch_timeout_s = watch_timeout_s
        self._clock = clock

    @classmethod
    def from_environment(
        cls, *, kubeconfig: str | None = None, context: str | None = None, **options: Any
    ) -> KubernetesCluster:
        """In a pod: its service account. Elsewhere: `kubeconfig` (default `$KUBECONFIG`, ~/.kube/config)."""
        configuration = k8s_client.Configuration()
        try:
            k8s_config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
        except k8s_config.ConfigException:
            k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=configuration
            )
        return cls(_api_client(configuration, options), **options)

    @classmethod
    def for_url(cls, url: str, *, token: str | None = None, **options: Any) -> KubernetesCluster:
        """An API server at `url` (plain HTTP or HTTPS with system trust), optionally with a bearer token."""
        configuration = k8s_client.Configuration(host=url.rstrip("/"))
        if token:
            configuration.api_key = {"authorization": token}
            configuration.api_key_prefix = {"authorization": "Bearer"}
        return cls(_api_client(configuration, options), **options)

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)
        self._api.close()

    # -- transport ---------------------------------------------------------------------------------

    def open_request(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
        timeout: Any = None,
    ) -> Any:
        """Send one request (blocking) and return the unread response: watches stream it line by line."""
        headers = {"Accept": "application/json", "Content-Type": content_type}
        request = self._api.param_serialize(
            method=method,
            resource_path=path,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            return self._api.call_api(*request, _request_timeout=timeout or self.request_timeout_s)
        except (urllib3.exceptions.HTTPError, OSError) as error:
            raise ClusterError(0, "Unreachable", f"{method} {path}: {error}") from error

    def _call(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> _Reply:
        response = self.open_request(method, path, query, body, content_type)
        raw = response.read()
        try:
            decoded = json.loads(raw) if raw else {}
        except ValueError:
            decoded = {"message": raw.decode(errors="replace")[:500]}
        return _Reply(response.status, decoded if isinstance(decoded, dict) else {})

    async def _request(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]] | None = None,
        body: Any = None,
        content_type: str = "application/json",
    ) -> _Reply:
        call = partial(self._call, method, path, query, body, content_type)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def _get_one(self, path: str) -> dict[str, Any] | None:
        reply = await self._request("GET", path)
        if reply.status == 404:
            return None
        if not reply.ok:
            raise reply.error()
        return reply.body

    async def _get_list(self, path: str, query: list[tuple[str, str]] | None = None) -> _Reply:
        reply = await self._request("GET", path, query)
        if not reply.ok:
            raise reply.error()
        return reply

    async def _patch(self, path: str, body: dict[str, Any], content_type: str = MERGE_PATCH) -> PatchResult:
        reply = await self._request("PATCH", path, body=body, content_type=content_type)
        if reply.ok:
            return Applied(str(reply.body.get("metadata", {}).get("resourceVersion", "")))
        if reply.status == 409:
            return Conflict(reply.message)
        if reply.status == 404:
            return NotFound(reply.message)
        raise reply.error()

    async def _leases(self, call: Callable[[Any], Any]) -> Any:
        def run() -> Any:
            try:
                return call(k8s_client.CoordinationV1Api(self._api))
            except (urllib3.exceptions.HTTPError, OSError) as error:
                raise ClusterError(0, "Unreachable", f"leases: {error}") from error

        return await asyncio.get_running_loop().run_in_executor(self._executor, run)

    # -- leases (leader election) ----------------------------------------------------------------

    async def get_lease(self, namespace: str, name: str) -> LeaseRecord | None:
        lease = await self._read_lease(namespace, name)
        return _lease_record(lease) if lease is not None else None

    async def _read_lease(self, namespace: str, name: str) -> Any:
        timeout = self.request_timeout_s
        try:
            return await self._leases(
                lambda api: api.read_namespaced_lease(name, namespace, _request_timeout=timeout)
            )
        except k8s_client.ApiException as error:
            if error.status == 404:
                return None
            raise _api_error(error) from error

    async def create_lease(self, namespace: str, name: str, record: LeaseRecord) -> PatchResult:
        body = _lease_body(namespace, name, replace(record, resource_version=""))
        timeout = self.request_timeout_s
        return await self._write_lease(
            lambda api: api.create_namespaced_lease(namespace, body, _request_timeout=timeout)
        )

    async def update_lease(self, namespace: str, name: str, record: LeaseRecord) -> PatchResult:
        """Replace the Lease only at `record.resource_version`; never create it. The API server's PUT
        would create a missing Lease (Leases allow create-on-update), so the write carries the stored
        Lease's uid as a precondition: a deleted Lease is `NotFound`, a recreated one a `Conflict`."""
        if not record.resource_version:
            raise ValueError("update_lease needs the resource_version read with the lease (optimistic write)")
        timeout = self.request_timeout_s
        uid = await self._lease_uid(namespace, name)
        if uid is None:
            return NotFound(f'leases.coordination.k8s.io "{name}" not found')
        body = _lease_body(namespace, name, record)
        body.metadata.uid = uid
        written = await self._write_lease(
            lambda api: api.replace_namespaced_lease(name, namespace, body, _request_timeout=timeout)
        )
        if isinstance(written, Conflict) and await self._lease_uid(namespace, name) is None:
            return NotFound(f'leases.coordination.k8s.io "{name}" not found')
        return written

    async def _lease_uid(self, namespace: str, name: str) -> str | None:
        lease = await self._read_lease(namespace, name)
        return str(lease.metadata.uid or "") if lease is not None else None

    async def _write_lease(self, call: Callable[[Any], Any]) -> PatchResult:
        try:
            lease = await self._leases(call)
        except k8s_client.ApiException as error:
            if error.status == 409:
                return Conflict(str(error.reason or "Conflict"))
            if error.status == 404:
                return NotFound(str(error.reason or "NotFound"))
            raise _api_error(error) from error
        return Applied(str(lease.metadata.resource_version or ""))

    # -- pods ------------------------------------------------------------------------------------

    async def list_pending_pods(self, scheduler_name: str) -> PodList:
        selector = (
            f"spec.schedulerName={scheduler_name},spec.nodeName=,status.phase!=Succeeded,status.phase!=Failed"
        )
        reply = await self._get_list(_pods_path(), [("fieldSelector", selector)])
        pods = (pod_from_manifest(item) for item in reply.body.get("items") or ())
        return PodList(
            items=tuple(pod for pod in pods if pod.is_pending_for(scheduler_name)),
            resource_version=str(reply.body.get("metadata", {}).get("resourceVersion", "")),
        )

    async def list_scheduler_pods(self, scheduler_name: str) -> PodList:
        """Every pod of `scheduler_name`, whatever its state: what a pod watch starts from."""
        reply = await self._get_list(
            _pods_path(), [("fieldSelector", f"spec.schedulerName={scheduler_name}")]
        )
        pods = (pod_from_manifest(item) for item in reply.body.get("items") or ())
        return PodList(
            items=tuple(pod for pod in pods if pod.scheduler_name == scheduler_name),
            resource_version=str(reply.body.get("metadata", {}).get("resourceVersion", "")),
        )

    def watch_pods(self, scheduler_name: str, *, cursor: WatchCursor | None = None) -> KubernetesPodWatch:
        return KubernetesPodWatch(self, scheduler_name, cursor)

    async def get_pod(self, namespace: str, name: str) -> Pod | None:
        manifest = await self._get_one(_pods_path(namespace, name))
        return pod_from_manifest(manifest) if manifest is not None else None

    async def list_pods(
        self,
        *,
        namespace: str | None = None,
        node_name: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> list[Pod]:
        query: list[tuple[str, str]] = []
        if node_name:
            query.append(("fieldSelector", f"spec.nodeName={node_name}"))
        if labels:
            query.append(("labelSelector", _label_selector(labels)))
        reply = await self._get_list(_pods_path(namespace), query)
        pods = [pod_from_manifest(item) for item in reply.body.get("items") or ()]
        return [
            pod
            for pod in pods
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
        body = metadata_patch(labels or {}, annotations or {}, resource_version)
        return await self._patch(_pods_path(namespace, name), body)

    async def bind_pod(
        self,
        namespace: str,
        name: str,
        node_name: str,
        *,
        uid: str | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> BindResult:
        body = binding_body(namespace, name, node_name, uid, annotations)
        reply = await self._request("POST", _pods_path(namespace, name, "binding"), body=body)
        if reply.ok:
            return Bound(node_name)
        if reply.status == 409:
            return Conflict(reply.message)
        if reply.status == 404:
            return NotFound(reply.message)
        raise reply.error()

    async def evict_pod(self, namespace: str, name: str) -> EvictionResult:
        reply = await self._request(
            "POST", _pods_path(namespace, name, "eviction"), body=eviction_body(namespace, name)
        )
        if reply.ok:
            return Evicted()
        if reply.status == 429:
            causes = (reply.body.get("details") or {}).get("causes") or ()
            reasons = [str(c.get("message")) for c in causes if c.get("message")]
            retry = (reply.body.get("details") or {}).get("retryAfterSeconds")
            return EvictionBlocked(
                reason="; ".join([reply.message, *reasons]),
                retry_after_s=int(retry) if retry is not None else None,
            )
        if reply.status == 404:
            return NotFound(reply.message)
        raise reply.error()

    async def report_unschedulable(self, pod: Pod, message: str, *, reporter: str) -> None:
        now = self._clock()
        status_patch = {"status": {"conditions": [unschedulable_condition(message, now)]}}
        reply = await self._request(
            "PATCH",
            _pods_path(pod.namespace, pod.name, "status"),
            body=status_patch,
            content_type=STRATEGIC_MERGE_PATCH,
        )
        if reply.status == 404:
            return
        if not reply.ok:
            raise reply.error()
        event = scheduling_event(pod, message, reporter, now)
        created = await self._request(
            "POST", f"/api/v1/namespaces/{_segment(pod.namespace)}/events", body=event
        )
        if not created.ok:
            raise created.error()

    # -- nodes and budgets -----------------------------------------------------------------------

    async def get_node(self, name: str) -> Node | None:
        manifest = await self._get_one(f"/api/v1/nodes/{_segment(name)}")
        return node_from_manifest(manifest) if manifest is not None else None

    async def get_namespace(self, name: str) -> Namespace | None:
        manifest = await self._get_one(f"/api/v1/namespaces/{_segment(name)}")
        return namespace_from_manifest(manifest) if manifest is not None else None

    async def list_nodes(self, *, labels: Mapping[str, str] | None = None) -> list[Node]:
        query = [("labelSelector", _label_selector(labels))] if labels else []
        reply = await self._get_list("/api/v1/nodes", query)
        nodes = [node_from_manifest(item) for item in reply.body.get("items") or ()]
        return [n for n in nodes if all(n.labels.get(k) == v for k, v in (labels or {}).items())]

    async def patch_node_metadata(
        self,
        name: str,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
    ) -> PatchResult:
        body = metadata_patch(labels or {}, annotations or {}, resource_version)
        return await self._patch(f"/api/v1/nodes/{_segment(name)}", body)

    async def list_disruption_budgets(self, namespace: str | None = None) -> list[PodDisruptionBudget]:
        path = (
            f"/apis/policy/v1/namespaces/{_segment(namespace)}/poddisruptionbudgets"
            if namespace is not None
            else "/apis/policy/v1/poddisruptionbudgets"
        )
        reply = await self._get_list(path)
        budgets = [pdb_from_manifest(item) for item in reply.body.get("items") or ()]
        return [b for b in budgets if namespace is None or b.namespace == namespace]

    # -- custom resources ------------------------------------------------------------------------

    async def get_custom_object(
        self, kind: CustomResource, name: str, *, namespace: str | None = None
    ) -> CustomObject | None:
        manifest = await self._get_one(_custom_path(kind, namespace, name))
        return custom_object_from_manifest(kind, manifest) if manifest is not None else None

    async def list_custom_objects(
        self, kind: CustomResource, *, namespace: str | None = None
    ) -> list[CustomObject]:
        reply = await self._get_list(_custom_path(kind, namespace))
        objects = [custom_object_from_manifest(kind, item) for item in reply.body.get("items") or ()]
        return [o for o in objects if namespace is None or o.namespace == namespace]

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
        metadata: dict[str, Any] = {"name": name, "labels": dict(labels or {})}
        if kind.namespaced and namespace is not None:
            metadata["namespace"] = namespace
        if owner is not None:
            metadata["ownerReferences"] = [custom_owner_reference(owner)]
        body = {
            "apiVersion": f"{CUSTOM_RESOURCE_GROUP}/{CUSTOM_RESOURCE_VERSION}",
            "kind": _CUSTOM_KINDS[kind],
            "metadata": metadata,
            "spec": dict(spec or {}),
        }
        reply = await self._request("POST", _custom_path(kind, namespace), body=body)
        if reply.ok:
            return Applied(str(reply.body.get("metadata", {}).get("resourceVersion", "")))
        if reply.status == 409:
            return Conflict(reply.message)
        if reply.status == 404:
            return NotFound(reply.message)
        raise reply.error()

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
        body = metadata_patch(labels or {}, annotations or {}, resource_version)
        if owner is not None:
            body["metadata"]["ownerReferences"] = [custom_owner_reference(owner)]
        return await self._patch(_custom_path(kind, namespace, name), body)

    async def patch_custom_status(
        self,
        kind: CustomResource,
        name: str,
        status: Mapping[str, Any],
        *,
        namespace: str | None = None,
        resource_version: str | None = None,
    ) -> PatchResult:
        body: dict[str, Any] = {"status": dict(status)}
        if resource_version:
            body["metadata"] = {"resourceVersion": resource_version}
        return await self._patch(_custom_path(kind, namespace, name, "status"), body)
