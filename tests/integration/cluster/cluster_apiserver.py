"""A stateful Kubernetes API server for tests: kmock's HTTP server and scaffold, plus our reactions.

kmock's `KubernetesEmulator` keeps no resource versions, ignores selectors and knows no subresources, so
this module registers one reaction for resource requests that adds what the adapter relies on: resource
versions with optimistic concurrency (409 on PATCH and PUT, and on a POST of an existing name), list and
watch from a version with `410 Gone` after the history is compacted, field and label selectors,
`pods/binding`, `pods/eviction` with disruption budgets (429), strategic merge of pod conditions, status
subresources, core/v1 Events and coordination.k8s.io Leases.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
import uuid
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from kmock import KubernetesError, KubernetesScaffold, Request

Key = tuple[str, str | None, str]  # (resource "group/version/plural", namespace, name)


def _merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, Mapping):
        return copy.deepcopy(patch)
    merged = dict(target) if isinstance(target, Mapping) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = _merge(merged.get(key), value)
    return merged


def _field(obj: Mapping[str, Any], path: str) -> str:
    value: Any = obj
    for part in path.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    return "" if value is None else str(value)


def _selected(obj: Mapping[str, Any] | None, params: Mapping[str, str]) -> bool:
    if obj is None:
        return False
    for term in filter(None, params.get("fieldSelector", "").split(",")):
        if "!=" in term:
            path, _, value = term.partition("!=")
            if _field(obj, path) == value:
                return False
        else:
            path, _, value = term.partition("=")
            if _field(obj, path) != value:
                return False
    labels = (obj.get("metadata") or {}).get("labels") or {}
    for term in filter(None, params.get("labelSelector", "").split(",")):
        key, _, value = term.partition("=")
        if labels.get(key) != value:
            return False
    return True


def _status(code: int, reason: str, message: str, details: Mapping[str, Any] | None = None) -> Exception:
    return KubernetesError(status=code, reason=reason, message=message, details=dict(details or {}))


@dataclass
class ApiServerState:
    """Objects, a change log for watches, and recorded requests' effects, all in memory."""

    objects: dict[Key, dict[str, Any]] = field(default_factory=dict)
    history: list[tuple[int, str, str, dict[str, Any], dict[str, Any] | None]] = field(default_factory=list)
    compacted_through: int = 0
    version: int = 0
    _versions: itertools.count[int] = field(default_factory=lambda: itertools.count(1))
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    stopping: bool = False
    stalled: bool = False
    installed: bool = False
    generation: int = 0

    # -- direct access for seeding and assertions ------------------------------------------------

    def put(self, resource: str, manifest: Mapping[str, Any]) -> dict[str, Any]:
        obj = copy.deepcopy(dict(manifest))
        meta = obj.setdefault("metadata", {})
        key = (resource, meta.get("namespace"), meta["name"])
        previous = self.objects.get(key)
        meta.setdefault("uid", previous["metadata"]["uid"] if previous else str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", "2026-01-01T00:00:00Z")
        self._commit(key, obj, "MODIFIED" if previous else "ADDED", previous)
        return obj

    def delete(self, resource: str, namespace: str | None, name: str) -> dict[str, Any]:
        key = (resource, namespace, name)
        obj = self.objects.pop(key, None)
        if obj is None:
            raise _status(404, "NotFound", f'{resource.rsplit("/", 1)[-1]} "{name}" not found')
        self._bump(obj)
        self._log("DELETED", resource, obj, obj)
        return obj

    def compact(self) -> None:
        """Forget the change log, as etcd compaction does: older watch versions now get 410 Gone."""
        self.compacted_through = self.version
        self.history.clear()

    def stall_watches(self) -> None:
        """Open watch streams stop delivering, as over a hung connection; changes keep being logged."""
        self.stalled = True

    def break_watches(self) -> None:
        """End every open watch stream (an API server restart); clients must reconnect from their version."""
        self.stalled = False
        self.generation += 1
        self._changed.set()
        self._changed = asyncio.Event()

    def _bump(self, obj: dict[str, Any]) -> None:
        self.version = next(self._versions)
        obj["metadata"]["resourceVersion"] = str(self.version)

    def _commit(self, key: Key, obj: dict[str, Any], event: str, previous: dict[str, Any] | None) -> None:
        self._bump(obj)
        self.objects[key] = obj
        self._log(event, key[0], obj, previous)

    def _log(self, event: str, resource: str, obj: dict[str, Any], previous: dict[str, Any] | None) -> None:
        self.history.append((self.version, event, resource, copy.deepcopy(obj), previous))
        self._changed.set()
        self._changed = asyncio.Event()

    # -- the HTTP reaction -----------------------------------------------------------------------

    async def handle(self, request: Request) -> Any:
        assert request.resource is not None
        resource = f"{request.resource.group}/{request.resource.version}/{request.resource.plural}"
        method = str(request.method.value)
        params = dict(request.params)
        if method == "GET" and params.get("watch") == "true":
            return self._watch(request, resource, params)
        if method == "GET" and request.name is None:
            items = [
                copy.deepcopy(obj)
                for (res, ns, _), obj in sorted(self.objects.items(), key=lambda kv: str(kv[0]))
                if res == resource
                and (request.namespace is None or ns == request.namespace)
                and _selected(obj, params)
            ]
            return {"kind": "List", "metadata": {"resourceVersion": str(self.version)}, "items": items}
        key = (resource, request.namespace, request.name or "")
        if method == "POST" and request.name is None:
            body = dict(request.data)
            body.setdefault("metadata", {})["namespace"] = request.namespace
            name = body["metadata"].get("name") or ""
            if (resource, request.namespace, name) in self.objects:
                raise _status(409, "AlreadyExists", f'{request.resource.plural} "{name}" already exists')
            return self.put(resource, body)
        current = self.objects.get(key)
        if current is None:
            raise _status(404, "NotFound", f'{request.resource.plural} "{request.name}" not found')
        if method == "GET":
            return copy.deepcopy(current)
        if method == "POST" and request.subresource == "binding":
            return self._bind(key, current, request.data)
        if method == "POST" and request.subresource == "eviction":
            return self._evict(key, current)
        if method == "PATCH":
            return self._patch(key, current, request)
        if method == "PUT" and request.subresource is None:
            return self._replace(key, current, dict(request.data or {}))
        raise _status(405, "MethodNotAllowed", f"{method} {request.url.path}: not served by the test server")

    async def get_namespace(self, request: Request) -> Any:
        """`GET /api/v1/namespaces/<name>`: the namespace stored under resource `/v1/namespaces`."""
        if str(request.method.value) != "GET":
            raise _status(405, "MethodNotAllowed", f"{request.url.path}: only GET is served for namespaces")
        found = self.objects.get(("/v1/namespaces", None, request.namespace or ""))
        if found is None:
            raise _status(404, "NotFound", f'namespaces "{request.namespace}" not found')
        return copy.deepcopy(found)

    def _patch(self, key: Key, current: dict[str, Any], request: Request) -> dict[str, Any]:
        patch = dict(request.data or {})
        expected = (patch.get("metadata") or {}).get("resourceVersion")
        if expected and expected != current["metadata"]["resourceVersion"]:
            raise _status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {key[0].rsplit("/", 1)[-1]} "{key[2]}": the object has '
                "been modified; please apply your changes to the latest version and try again",
            )
        custom = not key[0].startswith("/v1/") and not key[0].startswith("policy/")
        if request.subresource == "status":
            patch = {"status": patch.get("status") or {}}
            if key[0] == "/v1/pods" and "strategic-merge-patch" in request.headers.get("Content-Type", ""):
                conditions = {c["type"]: c for c in (current.get("status") or {}).get("conditions") or ()}
                for condition in patch["status"].get("conditions") or ():
                    conditions[condition["type"]] = condition
                patch["status"]["conditions"] = list(conditions.values())
        elif custom:
            patch.pop("status", None)
        updated = _merge(current, patch)
        self._commit(key, updated, "MODIFIED", current)
        return copy.deepcopy(updated)

    def _replace(self, key: Key, current: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        """`PUT`: the whole object, only if `metadata.resourceVersion` is the stored one (409 otherwise)."""
        if (body.get("metadata") or {}).get("resourceVersion") != current["metadata"]["resourceVersion"]:
            raise _status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {key[0].rsplit("/", 1)[-1]} "{key[2]}": the object has '
                "been modified; please apply your changes to the latest version and try again",
            )
        body["metadata"] = {**body["metadata"], "uid": current["metadata"]["uid"], "namespace": key[1]}
        self._commit(key, body, "MODIFIED", current)
        return copy.deepcopy(body)

    def _bind(self, key: Key, pod: dict[str, Any], binding: Mapping[str, Any]) -> dict[str, Any]:
        uid = (binding.get("metadata") or {}).get("uid")
        if uid and uid != pod["metadata"]["uid"]:
            raise _status(409, "Conflict", f"Precondition failed: UID in precondition: {uid}")
        if (pod.get("spec") or {}).get("nodeName"):
            raise _status(
                409, "Conflict", f'pod {key[2]} is already assigned to node "{pod["spec"]["nodeName"]}"'
            )
        annotations = (binding.get("metadata") or {}).get("annotations") or {}
        updated = _merge(
            pod, {"metadata": {"annotations": annotations}, "spec": {"nodeName": binding["target"]["name"]}}
        )
        self._commit(key, updated, "MODIFIED", pod)
        return {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}

    def _evict(self, key: Key, pod: dict[str, Any]) -> dict[str, Any]:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        budgets = [
            (budget_key, budget)
            for budget_key, budget in self.objects.items()
            if budget_key[0] == "policy/v1/poddisruptionbudgets"
            and budget_key[1] == key[1]
            and (selector := (budget.get("spec") or {}).get("selector")) is not None
            and all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())
        ]
        if len(budgets) > 1:
            raise _status(500, "InternalError", "This pod has more than one PodDisruptionBudget")
        for budget_key, budget in budgets:
            status = budget.get("status") or {}
            if int(status.get("disruptionsAllowed") or 0) <= 0:
                name = budget["metadata"]["name"]
                cause = (
                    f"The disruption budget {name} needs {status.get('desiredHealthy', 0)} healthy pods "
                    f"and has {status.get('currentHealthy', 0)} currently"
                )
                raise _status(
                    429,
                    "TooManyRequests",
                    "Cannot evict pod as it would violate the pod's disruption budget.",
                    {"causes": [{"reason": "DisruptionBudget", "message": cause}]},
                )
            allowed = int(status["disruptionsAllowed"]) - 1
            spent = _merge(budget, {"status": {"disruptionsAllowed": allowed}})
            self._commit(budget_key, spent, "MODIFIED", budget)
        self.delete(key[0], key[1], key[2])
        return {"kind": "Status", "apiVersion": "v1", "status": "Success", "code": 201}

    async def _watch(self, request: Request, resource: str, params: Mapping[str, str]) -> AsyncIterator[Any]:
        since = int(params.get("resourceVersion") or 0)
        deadline = asyncio.get_running_loop().time() + float(params.get("timeoutSeconds") or 60)
        yield b""
        if since < self.compacted_through:
            yield {
                "type": "ERROR",
                "object": {
                    "kind": "Status",
                    "apiVersion": "v1",
                    "status": "Failure",
                    "code": 410,
                    "reason": "Expired",
                    "message": f"too old resource version: {since} ({self.compacted_through})",
                },
            }
            return
        generation = self.generation
        loop = asyncio.get_running_loop()
        while not self.stopping and generation == self.generation and loop.time() < deadline:
            changed = self._changed
            for version, event, res, obj, previous in list(self.history):
                if version <= since or res != resource or self.stalled:
                    continue
                since = version
                now_in = event != "DELETED" and _selected(obj, params)
                was_in = previous is not None and _selected(previous, params)
                if event == "DELETED":
                    now_in, was_in = False, _selected(obj, params)
                kind = ("MODIFIED" if was_in else "ADDED") if now_in else ("DELETED" if was_in else "")
                if kind:
                    yield {"type": kind, "object": obj}
            transport = request._raw_request.transport if request._raw_request is not None else None
            if transport is None or transport.is_closing():
                return
            try:
                await asyncio.wait_for(changed.wait(), timeout=0.2)
            except TimeoutError:
                continue


@dataclass
class RunningApiServer:
    state: ApiServerState
    url: str


def install(scaffold: KubernetesScaffold, state: ApiServerState) -> None:
    """Route every request for a Kubernetes resource to `state`; discovery stays with kmock's scaffold."""

    def is_resource_request(request: Request) -> bool:
        return request.resource is not None and bool(request.resource.plural)

    scaffold[is_resource_request] << state.handle

    def is_namespace_read(request: Request) -> bool:
        # kmock reads `/api/v1/namespaces/<name>` as the namespace of a resource with no plural.
        return (
            request.resource is not None
            and not request.resource.plural
            and request.namespace is not None
            and request.url.path == f"/api/v1/namespaces/{request.namespace}"
        )

    scaffold[is_namespace_read] << state.get_namespace
