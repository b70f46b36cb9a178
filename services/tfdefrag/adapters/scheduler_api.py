"""`SchedulerApiCluster`: the `Cluster` port of the defrag planner in local mode (`tfctl up`, no Kubernetes).

Locally the workloads live in the scheduler (`tfctl submit`, `tfctl run`, `POST /api/v1/workloads`), so
this adapter reads them over the scheduler's HTTP API as pods (`GET /api/v1/workloads`, nodes from
`GET /api/v1/nodes`) and evicts through the scheduler's local Eviction API
(`POST /api/v1/workloads/{id}/eviction`, bearer `TF_API_TOKEN`): the scheduler releases the workload as
evicted and recreates it (same name, new uid), as a controller would. PodDisruptionBudgets come from a
YAML file of `policy/v1` manifests (`TF_DEFRAG_PDB_FILE`); like the API server, this adapter computes
their status from the live workloads and refuses an eviction a budget does not allow.

Node markers live in the ledger's node rows, which the planner writes itself
(`Ledger.set_node_markers`), so node patches have nothing else to write here. The pure parts
(`pod_from_workload`, `node_from_api`, `parse_budgets`, `budget_status`) make no I/O. Never used in
Kubernetes mode.
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import yaml
from tfcommon.cluster.memory import InMemoryCluster, InMemoryPodWatch
from tfcommon.cluster.model import (
    Applied,
    BindResult,
    ClusterError,
    Conflict,
    Evicted,
    EvictionBlocked,
    EvictionResult,
    LabelRequirement,
    LabelSelector,
    Namespace,
    Node,
    NotFound,
    OwnerReference,
    PatchResult,
    Pod,
    PodDisruptionBudget,
    PodKey,
    PodList,
    Toleration,
    WatchCursor,
)

log = logging.getLogger("tfdefrag.adapters.scheduler_api")

LOCAL_SCHEDULER_NAME = "tensor-fusion-scheduler"
OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist")
_PERCENT = re.compile(r"^(\d{1,3})%$")


class DisruptionBudgetError(ValueError):
    """The PodDisruptionBudget file is invalid; the message names the file, the document, the field and
    the fix."""


@dataclass(frozen=True)
class BudgetSpec:
    """One PodDisruptionBudget's spec: exactly one of `min_available` / `max_unavailable` (a count, or a
    percentage such as "50%")."""

    namespace: str
    name: str
    selector: LabelSelector
    min_available: int | str | None = None
    max_unavailable: int | str | None = None


def _problem(where: str, field: str, value: object, fix: str) -> DisruptionBudgetError:
    return DisruptionBudgetError(f"{where}: {field} is {value!r}; {fix}")


def _int_or_percent(where: str, field: str, value: object) -> int | str:
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and (match := _PERCENT.match(value)) and int(match.group(1)) <= 100:
        return value
    raise _problem(where, field, value, "use a whole number >= 0 or a percentage such as 50%")


def _selector(where: str, raw: object) -> LabelSelector:
    fix = "select the workloads by label, e.g. selector: {matchLabels: {app: serve}}"
    if not isinstance(raw, Mapping):
        raise _problem(where, "spec.selector", raw, fix)
    labels = raw.get("matchLabels") or {}
    expressions = raw.get("matchExpressions") or []
    if not isinstance(labels, Mapping) or not isinstance(expressions, list):
        raise _problem(where, "spec.selector", dict(raw), fix)
    requirements = []
    for position, expression in enumerate(expressions):
        field = f"spec.selector.matchExpressions[{position}]"
        if not isinstance(expression, Mapping) or not isinstance(expression.get("key"), str):
            raise _problem(where, field, expression, "give a key, an operator and (for In, NotIn) values")
        operator = expression.get("operator")
        values = expression.get("values") or []
        if operator not in OPERATORS:
            raise _problem(where, f"{field}.operator", operator, f"use one of {', '.join(OPERATORS)}")
        if operator in ("In", "NotIn") and (not isinstance(values, list) or not values):
            raise _problem(where, f"{field}.values", values, f"{operator} needs a non-empty list of values")
        requirements.append(LabelRequirement(expression["key"], operator, tuple(str(v) for v in values)))
    selector = LabelSelector(
        match_labels={str(key): str(value) for key, value in labels.items()},
        match_expressions=tuple(requirements),
    )
    if selector.is_empty:
        raise _problem(
            where, "spec.selector", dict(raw), "an empty selector protects nothing in defrag; " + fix
        )
    return selector


def parse_budgets(text: str, source: str) -> list[BudgetSpec]:
    """The PodDisruptionBudget manifests of a YAML file (documents separated by `---`; empty ones skipped)."""
    try:
        documents = list(yaml.safe_load_all(text))
    except yaml.YAMLError as error:
        raise DisruptionBudgetError(f"{source}: not valid YAML: {error}") from error
    budgets: list[BudgetSpec] = []
    for position, document in enumerate(documents, start=1):
        if document is None:
            continue
        where = f"{source} (document {position})"
        if not isinstance(document, Mapping):
            raise _problem(where, "the document", document, "write a PodDisruptionBudget manifest")
        if document.get("kind") != "PodDisruptionBudget":
            raise _problem(where, "kind", document.get("kind"), "use kind: PodDisruptionBudget")
        if document.get("apiVersion") != "policy/v1":
            raise _problem(where, "apiVersion", document.get("apiVersion"), "use apiVersion: policy/v1")
        meta = document.get("metadata") or {}
        name = meta.get("name") if isinstance(meta, Mapping) else None
        if not isinstance(name, str) or not name:
            raise _problem(where, "metadata.name", name, "name the budget")
        namespace = meta.get("namespace") or "default"
        if not isinstance(namespace, str):
            raise _problem(where, "metadata.namespace", namespace, "use the workloads' namespace")
        spec = document.get("spec")
        if not isinstance(spec, Mapping):
            raise _problem(where, "spec", spec, "give a selector and minAvailable or maxUnavailable")
        given = [field for field in ("minAvailable", "maxUnavailable") if spec.get(field) is not None]
        if len(given) != 1:
            raise _problem(where, "spec", dict(spec), "set exactly one of minAvailable and maxUnavailable")
        field = given[0]
        amount = _int_or_percent(where, f"spec.{field}", spec[field])
        budgets.append(
            BudgetSpec(
                namespace=namespace,
                name=name,
                selector=_selector(where, spec.get("selector")),
                min_available=amount if field == "minAvailable" else None,
                max_unavailable=amount if field == "maxUnavailable" else None,
            )
        )
    return budgets


def load_budgets(path: Path) -> list[BudgetSpec]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise DisruptionBudgetError(
            f"{path}: cannot read the PodDisruptionBudget file (TF_DEFRAG_PDB_FILE): {error.strerror}"
        ) from error
    return parse_budgets(text, str(path))


def _scaled(amount: int | str, expected: int) -> int:
    """A count as is; a percentage of `expected`, rounded up (as the disruption controller does)."""
    if isinstance(amount, int):
        return amount
    return math.ceil(int(amount.rstrip("%")) * expected / 100)


def budget_status(spec: BudgetSpec, pods: Iterable[Pod]) -> PodDisruptionBudget:
    """The budget with its status computed from the live workloads, as the disruption controller would:
    expected = matching workloads, healthy = those placed, allowed = healthy - desired (never below 0)."""
    matching = [pod for pod in pods if pod.namespace == spec.namespace and spec.selector.matches(pod.labels)]
    expected = len(matching)
    healthy = sum(1 for pod in matching if pod.node_name and pod.deleting_since is None)
    if spec.min_available is not None:
        desired = _scaled(spec.min_available, expected)
    else:
        assert spec.max_unavailable is not None
        desired = max(0, expected - _scaled(spec.max_unavailable, expected))
    return PodDisruptionBudget(
        namespace=spec.namespace,
        name=spec.name,
        selector=spec.selector,
        disruptions_allowed=max(0, healthy - desired),
        current_healthy=healthy,
        desired_healthy=desired,
    )


def _strings(value: Any) -> dict[str, str]:
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, Mapping) else {}


def _time(value: Any) -> datetime | None:
    return datetime.fromisoformat(value) if isinstance(value, str) and value else None


def pod_from_workload(item: Mapping[str, Any]) -> Pod:
    """One entry of the scheduler's `GET /api/v1/workloads` as the pod a controller would have made."""
    name = str(item["name"])
    owner = item.get("owner")
    node = item.get("node")
    return Pod(
        namespace=str(item["namespace"]),
        name=name,
        uid=str(item.get("uid") or ""),
        resource_version=str(item.get("uid") or ""),
        labels=_strings(item.get("labels")),
        annotations=_strings(item.get("annotations")),
        scheduler_name=LOCAL_SCHEDULER_NAME,
        node_name=str(node) if node else None,
        phase="Running" if node else "Pending",
        node_selector=_strings(item.get("node_selector")),
        tolerations=tuple(
            Toleration(
                key=str(t.get("key") or ""),
                operator=str(t.get("operator") or "Equal"),
                value=str(t.get("value") or ""),
                effect=str(t.get("effect") or ""),
            )
            for t in item.get("tolerations") or ()
            if isinstance(t, Mapping)
        ),
        owner_references=(
            (OwnerReference(kind="", name=str(owner), controller=True),) if owner and owner != name else ()
        ),
        created_at=_time(item.get("submitted_at")),
    )


def node_from_api(item: Mapping[str, Any]) -> Node:
    """One entry of the scheduler's `GET /api/v1/nodes`. No conditions: readiness stays the ledger's."""
    return Node(
        name=str(item["name"]),
        labels=_strings(item.get("labels")),
        annotations=_strings(item.get("annotations")),
        cordoned=bool(item.get("cordoned", False)),
    )


def _merge(base: Mapping[str, str], patch: Mapping[str, str | None] | None) -> dict[str, str]:
    merged = dict(base)
    for key, value in (patch or {}).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


class SchedulerApiCluster(InMemoryCluster):
    """Pods and nodes read from the scheduler's API, evictions through it, budgets from a file.

    What the planner never asks of local mode (binding, the pod watch, scheduling reports) raises
    `ClusterError` 501; custom resources and leases stay in process memory (none exist locally).
    """

    def __init__(
        self,
        scheduler_url: str,
        *,
        api_token: str | None,
        pdb_file: Path | None = None,
        eviction_reason: str = "evicted by the defrag planner",
        timeout_s: float = 30.0,
    ) -> None:
        super().__init__()
        self.scheduler_url = scheduler_url.rstrip("/")
        self.pdb_file = pdb_file
        self.eviction_reason = eviction_reason
        headers = {"Authorization": f"Bearer {api_token}"} if api_token else {}
        self._client = httpx.AsyncClient(base_url=self.scheduler_url, headers=headers, timeout=timeout_s)
        self._budgets: list[BudgetSpec] = load_budgets(pdb_file) if pdb_file is not None else []
        self._budgets_mtime = pdb_file.stat().st_mtime_ns if pdb_file is not None else 0
        self._pod_metadata: dict[str, tuple[dict[str, str], dict[str, str]]] = {}

    async def aclose(self) -> None:
        await self._client.aclose()

    async def _get(self, path: str) -> Any:
        try:
            response = await self._client.get(path)
        except httpx.HTTPError as error:
            raise ClusterError(
                503,
                "Unreachable",
                f"the scheduler at {self.scheduler_url} did not answer ({error}); start it (tfctl up) or "
                "set TF_DEFRAG_SCHEDULER_URL",
            ) from error
        if response.status_code != 200:
            raise ClusterError(response.status_code, response.reason_phrase, response.text)
        return response.json()

    async def _workloads(self) -> list[tuple[str, Pod]]:
        listed = []
        for item in await self._get("/api/v1/workloads"):
            pod = pod_from_workload(item)
            if pod.uid in self._pod_metadata:
                labels, annotations = self._pod_metadata[pod.uid]
                pod = replace(pod, labels=labels, annotations=annotations)
            listed.append((str(item["id"]), pod))
        return listed

    async def list_pods(
        self,
        *,
        namespace: str | None = None,
        node_name: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> list[Pod]:
        return [
            pod
            for _id, pod in await self._workloads()
            if (namespace is None or pod.namespace == namespace)
            and (node_name is None or pod.node_name == node_name)
            and all(pod.labels.get(key) == value for key, value in (labels or {}).items())
        ]

    async def get_pod(self, namespace: str, name: str) -> Pod | None:
        found = [pod for pod in await self.list_pods(namespace=namespace) if pod.name == name]
        placed = [pod for pod in found if pod.node_name]
        return next(iter(placed or found), None)

    async def list_pending_pods(self, scheduler_name: str) -> PodList:
        pods = [pod for pod in await self.list_pods() if pod.is_pending_for(scheduler_name)]
        return PodList(items=tuple(pods), resource_version="")

    def watch_pods(self, scheduler_name: str, *, cursor: WatchCursor | None = None) -> InMemoryPodWatch:
        raise ClusterError(501, "NotImplemented", "local mode has no pod watch; list the workloads instead")

    async def bind_pod(
        self,
        namespace: str,
        name: str,
        node_name: str,
        *,
        uid: str | None = None,
        annotations: Mapping[str, str] | None = None,
    ) -> BindResult:
        raise ClusterError(501, "NotImplemented", "local mode: the scheduler places its workloads itself")

    async def report_unschedulable(self, pod: Pod, message: str, *, reporter: str) -> None:
        raise ClusterError(501, "NotImplemented", "local mode: the scheduler reports its workloads itself")

    async def patch_pod_metadata(
        self,
        namespace: str,
        name: str,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
    ) -> PatchResult:
        """Kept in this process for the pod's uid (the scheduler stores no pod metadata but labels)."""
        pod = await self.get_pod(namespace, name)
        if pod is None:
            return NotFound(f'pods "{name}" not found')
        if resource_version is not None and resource_version != pod.resource_version:
            return Conflict(f"pod {namespace}/{name} changed: it is now uid {pod.uid}")
        self._pod_metadata[pod.uid] = (_merge(pod.labels, labels), _merge(pod.annotations, annotations))
        return Applied(pod.resource_version)

    async def evict_pod(self, namespace: str, name: str) -> EvictionResult:
        workloads = await self._workloads()
        placed = [(id_, pod) for id_, pod in workloads if pod.node_name]
        target = next(((id_, pod) for id_, pod in placed if pod.key == PodKey(namespace, name)), None)
        if target is None:
            return NotFound(f'pods "{name}" not found')
        workload_id, pod = target
        for budget in self._statuses([pod for _id, pod in workloads]):
            if budget.covers(pod) and budget.disruptions_allowed <= 0:
                return EvictionBlocked(
                    "Cannot evict pod as it would violate the pod's disruption budget.; "
                    f"The disruption budget {budget.name} needs {budget.desired_healthy} healthy pods "
                    f"and has {budget.current_healthy} currently"
                )
        try:
            response = await self._client.post(
                f"/api/v1/workloads/{workload_id}/eviction",
                json={"reason": self.eviction_reason, "by": "defrag", "announce": False},
            )
        except httpx.HTTPError as error:
            raise ClusterError(
                503, "Unreachable", f"the scheduler at {self.scheduler_url} did not answer ({error})"
            ) from error
        if response.status_code == 200:
            return Evicted()
        if response.status_code in (404, 409):
            return NotFound(response.json().get("detail", response.text))
        if response.status_code in (401, 403):
            raise ClusterError(
                response.status_code,
                response.reason_phrase,
                f"{response.json().get('detail', response.text)} (the planner sends TF_API_TOKEN; give it "
                "the scheduler's)",
            )
        raise ClusterError(response.status_code, response.reason_phrase, response.text)

    async def list_nodes(self, *, labels: Mapping[str, str] | None = None) -> list[Node]:
        nodes = [node_from_api(item) for item in await self._get("/api/v1/nodes")]
        return [
            node
            for node in nodes
            if all(node.labels.get(key) == value for key, value in (labels or {}).items())
        ]

    async def get_node(self, name: str) -> Node | None:
        return next((node for node in await self.list_nodes() if node.name == name), None)

    async def patch_node_metadata(
        self,
        name: str,
        *,
        labels: Mapping[str, str | None] | None = None,
        annotations: Mapping[str, str | None] | None = None,
        resource_version: str | None = None,
    ) -> PatchResult:
        """The node's markers are its ledger row's, which the planner writes itself: nothing more here."""
        node = await self.get_node(name)
        return NotFound(f'nodes "{name}" not found') if node is None else Applied(node.resource_version)

    async def get_namespace(self, name: str) -> Namespace | None:
        return Namespace(name=name)

    async def list_disruption_budgets(self, namespace: str | None = None) -> list[PodDisruptionBudget]:
        return [
            budget
            for budget in self._statuses(await self.list_pods())
            if namespace is None or budget.namespace == namespace
        ]

    def _statuses(self, pods: list[Pod]) -> list[PodDisruptionBudget]:
        return [budget_status(spec, pods) for spec in self._current_budgets()]

    def _current_budgets(self) -> list[BudgetSpec]:
        """The file's budgets, read again when it changed; an invalid edit is logged, the last good kept."""
        if self.pdb_file is None:
            return self._budgets
        try:
            mtime = self.pdb_file.stat().st_mtime_ns
            if mtime != self._budgets_mtime:
                self._budgets_mtime = mtime
                self._budgets = load_budgets(self.pdb_file)
        except (OSError, DisruptionBudgetError) as error:
            log.warning(
                "keeping the last good PodDisruptionBudgets: %s",
                error,
                extra={"event": "defrag.pdb_file_invalid"},
            )
        return self._budgets
