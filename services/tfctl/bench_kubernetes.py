"""The Kubernetes benchmark behind `tfctl bench kubernetes`: pods through a real API server, bound by
kube-scheduler and by our scheduler in the same run.

One run starts a real control plane (`LocalKubernetes`: etcd, kube-apiserver, controller manager,
kube-scheduler, KWOK), `nodes` KWOK nodes advertising `gpus_per_node` of `nvidia.com/gpu` in their
status capacity and allocatable, the production CRDs and RBAC from `k8s/base`, the same nodes and GPUs
in a fresh, migrated ledger (what the node agents would register) with their GPUNode and GPU objects
written by the node agent's own `KubernetesStatus`, and the scheduler service (`python -m tfscheduler`)
in Kubernetes mode with its own service account's token (and any other `TF_SCHEDULER_*` setting of the
caller, e.g. `TF_SCHEDULER_BIND_CONCURRENCY`). After a warm-up pod for each scheduler, and once our
status writer has written every new GPU's `available` (a patch per card, once, on a fresh cluster), the
phases run one after another, each in a namespace of its own:

- `kube_scheduler_whole`: `pods` pods with a `nvidia.com/gpu: 1` limit and kube-scheduler's name;
- `ours_whole`: `pods` whole-GPU pods for our scheduler, as the webhook leaves them (`isolation:
  shared`, `gpu-count: 1`, the native limit handed over);
- `ours_fractional` (unless `fractional` is off): `pods` pods of 20 TFLOPS / 16 GiB on one GPU.

Each phase creates its pods `create_concurrency` at a time through the API server and follows them with
its own watch: a pod's latency runs from its create request being sent to the watch showing it bound
(`spec.nodeName` set); pods/s is the phase's pods over the time from the first create request to the
last binding. The phase's pods are then deleted (and, for ours, their allocations released) before the
next one. Every pod is checked bound by the scheduler it names: ours' bindings are counted in the API
server's audit log under our service account, and each of ours holds its own `gpu-ids`.

kube-scheduler runs with the client limits of its own performance tests (`--kube-api-qps` and
`--kube-api-burst`, `kube_scheduler_qps`); its defaults (50 / 100) would cap it near 50 bindings/s.
This module only measures; it decides nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import ssl
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from tfagent.core.inventory import GpuDevice, NodeInventory
from tfagent.kubernetes_status import KubernetesStatus
from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.kube_local import ADMIN, LocalKubernetes, running
from tfcommon.ledger.sql import SqlLedger
from tfscheduler.bench import (
    GPU_TFLOPS_MILLI,
    GPU_VRAM_BYTES,
    register_simulated_nodes,
    scheduler_service,
)

from tfctl.bench_servers import nats_server, postgres_server, scratch_database
from tfctl.kube_stack import (
    DEVICE_PLUGIN_RESOURCE,
    KUBECTL,
    MANIFESTS,
    NAMESPACE,
    SERVICE_ACCOUNTS,
    kwok_node,
    local_manifests,
    token_kubeconfig,
)

DEFAULT_PODS = 1000
DEFAULT_NODES = 100
DEFAULT_GPUS_PER_NODE = 16
"""Sixteen cards a node so that the 1,000 whole-GPU pods of the default size fit 100 nodes (62%)."""
DEFAULT_CREATE_CONCURRENCY = 32
KUBE_SCHEDULER_QPS = 5000
"""kube-scheduler's client limits in its own performance tests (scheduler_perf: QPS and burst 5000)."""
OUR_SCHEDULER = "tensor-fusion-scheduler"
KUBE_SCHEDULER = "default-scheduler"
OUR_SERVICE_ACCOUNT = f"system:serviceaccount:{NAMESPACE}:{SERVICE_ACCOUNTS['scheduler']}"
NODE_PREFIX = "bench"
GPU_RESOURCE = DEVICE_PLUGIN_RESOURCE
FRACTIONAL_TFLOPS = "20"
FRACTIONAL_VRAM = "16Gi"
SETUP_CONCURRENCY = 16
PHASE_TIMEOUT_MIN_S = 60.0
BIND_RATE_FLOOR = 10.0
"""The slowest binding rate a phase waits for (pods/s) before it gives up on the rest."""
SETTLE_TIMEOUT_S = 300.0
SCHEDULER_SET_HERE = frozenset(
    {
        "TF_SCHEDULER_MODE",
        "TF_SCHEDULER_KUBECONFIG",
        "TF_SCHEDULER_LEASE_NAMESPACE",
        "TF_SCHEDULER_HEARTBEAT_TIMEOUT_S",
    }
)
"""Scheduler settings the benchmark decides; any other `TF_SCHEDULER_*` of the caller is passed on."""
Progress = Callable[[str], None]
Manifest = dict[str, Any]


class KubernetesBenchmarkError(ValueError):
    """Bad sizes, or a control plane or scheduler that did not come up; the message says which."""


@dataclass(frozen=True)
class Phase:
    """One measured batch of pods: who binds them and how each is written."""

    key: str
    title: str
    scheduler_name: str
    pod: Callable[[str, str], Manifest]


def _container(limits: Mapping[str, str] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "registry.k8s.io/pause:3.10"}
    if limits:
        container["resources"] = {"limits": dict(limits)}
    return container


def _pod(
    name: str,
    namespace: str,
    scheduler_name: str,
    *,
    limits: Mapping[str, str] | None = None,
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
) -> Manifest:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app": "tfpool-bench", **(labels or {})},
            "annotations": dict(annotations or {}),
        },
        "spec": {
            "schedulerName": scheduler_name,
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 0,
            "containers": [_container(limits)],
        },
    }


def native_whole_gpu_pod(name: str, namespace: str) -> Manifest:
    """A pod asking for one card through the device plugin's resource, for kube-scheduler."""
    return _pod(name, namespace, KUBE_SCHEDULER, limits={GPU_RESOURCE: "1"})


_OURS_LABELS = {"tensor-fusion.ai/enabled": "true", "tensor-fusion.ai/gpupool": "default"}
_OURS_ANNOTATIONS = {
    "tensor-fusion.ai/gpupool": "default",
    "tensor-fusion.ai/gpu-count": "1",
    "tensor-fusion.ai/qos": "medium",
    "tensor-fusion.ai/inject-container": "main",
    "tensor-fusion.ai/container-gpu-count": '{"main":1}',
}


def ours_whole_gpu_pod(name: str, namespace: str) -> Manifest:
    """The same pod as the webhook leaves it for our scheduler: `isolation: shared` (a whole idle card),
    the native limit handed over."""
    annotations = {**_OURS_ANNOTATIONS, "tensor-fusion.ai/isolation": "shared"}
    return _pod(name, namespace, OUR_SCHEDULER, annotations=annotations, labels=_OURS_LABELS)


def ours_fractional_pod(name: str, namespace: str) -> Manifest:
    """A pod of 20 TFLOPS / 16 GiB on one GPU (four or five share a card), annotated as the webhook does."""
    annotations = {
        **_OURS_ANNOTATIONS,
        "tensor-fusion.ai/isolation": "soft",
        "tensor-fusion.ai/tflops-request": FRACTIONAL_TFLOPS,
        "tensor-fusion.ai/tflops-limit": FRACTIONAL_TFLOPS,
        "tensor-fusion.ai/vram-request": FRACTIONAL_VRAM,
        "tensor-fusion.ai/vram-limit": FRACTIONAL_VRAM,
    }
    return _pod(name, namespace, OUR_SCHEDULER, annotations=annotations, labels=_OURS_LABELS)


PHASES = (
    Phase("kube_scheduler_whole", "kube-scheduler, whole GPUs", KUBE_SCHEDULER, native_whole_gpu_pod),
    Phase("ours_whole", "our scheduler, whole GPUs", OUR_SCHEDULER, ours_whole_gpu_pod),
    Phase("ours_fractional", "our scheduler, fractional GPUs", OUR_SCHEDULER, ours_fractional_pod),
)


def gpu_node(name: str, gpus: int) -> Manifest:
    """A KWOK node as `tfctl up --kubernetes` makes it, advertising `gpus` cards of `nvidia.com/gpu`."""
    return kwok_node(name, f"H100:{gpus}")


def node_names(nodes: int) -> list[str]:
    """The node names both Kubernetes and the ledger use (`register_simulated_nodes`' naming)."""
    return [f"{NODE_PREFIX}-node-{n}" for n in range(nodes)]


def _inventory(node: str, position: int, gpus: int) -> NodeInventory:
    devices = tuple(
        GpuDevice(
            uuid=f"{NODE_PREFIX}-gpu-{position}-{index}",
            index=index,
            model="H100",
            product_name="NVIDIA H100 80GB HBM3",
            tflops_milli=GPU_TFLOPS_MILLI,
            vram_bytes=GPU_VRAM_BYTES,
            pci_bus_id=f"00000000:{index + 1:02x}:00.0",
            numa_node=0,
            nvlink_peers=(),
            mig_enabled=False,
            capacity_source="simulated",
            simulated=True,
        )
        for index in range(gpus)
    )
    return NodeInventory(node=node, driver_version="simulated", cuda_version="simulated", gpus=devices)


def _percentile(values: list[float], share: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(share * (len(ordered) - 1)))]


def scheduler_settings(environment: Mapping[str, str] | None = None) -> dict[str, str]:
    """The caller's `TF_SCHEDULER_*` settings the scheduler service is started with (e.g.
    `TF_SCHEDULER_BIND_CONCURRENCY`), less those the benchmark sets itself (`SCHEDULER_SET_HERE`)."""
    source = os.environ if environment is None else environment
    return {
        name: value
        for name, value in sorted(source.items())
        if name.startswith("TF_SCHEDULER_") and name not in SCHEDULER_SET_HERE
    }


# -- the control plane ---------------------------------------------------------------------------


def _kubectl(control: LocalKubernetes, *arguments: str, stdin: str | None = None) -> str:
    result = subprocess.run(
        [str(KUBECTL), f"--kubeconfig={control.kubeconfig}", *arguments],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if result.returncode != 0:
        raise KubernetesBenchmarkError(f"kubectl {' '.join(arguments)} failed: {result.stderr.strip()}")
    return result.stdout


def _apply_production_manifests(control: LocalKubernetes, folder: Path) -> Path:
    """The CRDs, RBAC and PriorityClasses of `k8s/base` (no webhook registration: pods are created as
    the webhook leaves them); returns a kubeconfig with the scheduler service account's token."""
    rendered = _kubectl(control, "kustomize", str(MANIFESTS))
    objects = [
        document
        for document in local_manifests(rendered, "https://127.0.0.1:1", b"")
        if document["kind"] != "MutatingWebhookConfiguration"
    ]
    documents = "".join(f"---\n{json.dumps(document)}\n" for document in objects)
    _kubectl(control, "apply", "--server-side", "--field-manager=tfctl-bench", "-f", "-", stdin=documents)
    _kubectl(
        control, "wait", "--for=condition=Established", "--timeout=60s", "crd", "-l",
        "app.kubernetes.io/part-of=tfpool",
    )  # fmt: skip
    token = _kubectl(control, "create", "token", SERVICE_ACCOUNTS["scheduler"], "-n", NAMESPACE)
    path = folder / "scheduler.kubeconfig"
    path.touch(mode=0o600)
    path.write_text(
        token_kubeconfig(control.api_url, control.pki.ca.cert_file, OUR_SERVICE_ACCOUNT, token.strip())
    )
    return path


class _BoundPods:
    """Pod name -> when a watch first showed it bound (`at`), and a wait for a set of names."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self._changed = asyncio.Event()

    def saw(self, pod: Mapping[str, Any]) -> None:
        name = pod.get("metadata", {}).get("name")
        if name and name not in self.at and pod.get("spec", {}).get("nodeName"):
            self.at[name] = time.monotonic()
            self._changed.set()

    async def until(self, names: set[str], timeout_s: float) -> bool:
        """Wait until every one of `names` is bound (True) or `timeout_s` passed (False)."""
        deadline = time.monotonic() + timeout_s
        while not names <= self.at.keys():
            self._changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)
        return True


class _Api:
    """The admin's HTTPS client to the API server, with keep-alive connections for the creators."""

    def __init__(self, control: LocalKubernetes, connections: int) -> None:
        context = ssl.create_default_context(cafile=str(control.pki.ca.cert_file))
        admin = control.pki.client(ADMIN)
        context.load_cert_chain(str(admin.cert_file), str(admin.key_file))
        limits = httpx.Limits(max_connections=connections + 4, max_keepalive_connections=connections + 4)
        self.client = httpx.AsyncClient(
            base_url=control.api_url, verify=context, limits=limits, timeout=httpx.Timeout(60.0)
        )

    async def call(self, method: str, path: str, body: Any = None, **params: Any) -> dict[str, Any]:
        reply = await self.client.request(method, path, json=body, params=params or None)
        if reply.status_code >= 300:
            raise KubernetesBenchmarkError(f"{method} {path}: HTTP {reply.status_code}: {reply.text[:300]}")
        decoded: dict[str, Any] = reply.json()
        return decoded

    async def create_namespace(self, name: str) -> None:
        await self.call("POST", "/api/v1/namespaces", {"metadata": {"name": name}})
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while time.monotonic() < deadline:  # pods are refused until its default service account exists
            reply = await self.client.get(f"/api/v1/namespaces/{name}/serviceaccounts/default")
            if reply.status_code == 200:
                return
            await asyncio.sleep(0.1)
        raise KubernetesBenchmarkError(f"namespace {name}: no default service account in time")

    @contextlib.asynccontextmanager
    async def bound_pods(self, namespace: str) -> AsyncIterator[_BoundPods]:
        """Watch the namespace's pods from now on, noting when each is first seen bound."""
        path = f"/api/v1/namespaces/{namespace}/pods"
        bound = _BoundPods()
        take = bound.saw

        async def relist() -> str:
            listed = await self.call("GET", path)
            for pod in listed["items"]:
                take(pod)
            return str(listed["metadata"]["resourceVersion"])

        async def follow(version: str) -> None:
            # A watch the server ends (or a `410 Gone`) resumes from the last version seen, else relists.
            while True:
                request = self.client.build_request(
                    "GET",
                    path,
                    params={"watch": "1", "resourceVersion": version, "allowWatchBookmarks": "true"},
                    timeout=httpx.Timeout(60.0, read=None),
                )
                try:
                    async with contextlib.aclosing(await self.client.send(request, stream=True)) as reply:
                        async for line in reply.aiter_lines():
                            event = json.loads(line) if line else {}
                            if event.get("type") == "ERROR":
                                version = await relist()
                                break
                            pod = event.get("object") or {}
                            version = pod.get("metadata", {}).get("resourceVersion") or version
                            take(pod)
                except httpx.HTTPError:
                    version = await relist()

        watching = asyncio.create_task(follow(await relist()))
        try:
            yield bound
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching

    async def delete_pods(self, namespace: str) -> None:
        """Delete the namespace's pods, a few at a time (a collection delete runs one by one on the
        server), and wait until they are gone."""
        path = f"/api/v1/namespaces/{namespace}/pods"
        gate = asyncio.Semaphore(SETUP_CONCURRENCY)

        async def delete(name: str) -> None:
            async with gate:
                reply = await self.client.delete(f"{path}/{name}", params={"gracePeriodSeconds": "0"})
            if reply.status_code not in (200, 202, 404):
                raise KubernetesBenchmarkError(f"DELETE {path}/{name}: HTTP {reply.status_code}")

        listed = await self.call("GET", path)
        await asyncio.gather(*(delete(pod["metadata"]["name"]) for pod in listed["items"]))
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while time.monotonic() < deadline:
            listed = await self.call("GET", f"/api/v1/namespaces/{namespace}/pods")
            if not listed["items"]:
                return
            await asyncio.sleep(0.2)
        raise KubernetesBenchmarkError(f"namespace {namespace}: pods still there after deleting them")


async def _create_nodes(api: _Api, names: list[str], gpus: int) -> None:
    gate = asyncio.Semaphore(SETUP_CONCURRENCY)

    async def create(name: str) -> None:
        async with gate:
            await api.call("POST", "/api/v1/nodes", gpu_node(name, gpus))

    await asyncio.gather(*(create(name) for name in names))


async def _write_gpu_objects(control: LocalKubernetes, names: list[str], gpus: int) -> None:
    """Each node's GPUNode and GPU objects, written by the node agent's own code (`KubernetesStatus`)."""
    cluster = KubernetesCluster.from_environment(
        kubeconfig=str(control.kubeconfig), max_concurrent_requests=SETUP_CONCURRENCY
    )
    try:
        gate = asyncio.Semaphore(SETUP_CONCURRENCY)

        async def write(position: int, name: str) -> None:
            async with gate:
                await KubernetesStatus(cluster, node=name, pool="default").sync(
                    _inventory(name, position, gpus)
                )

        await asyncio.gather(*(write(position, name) for position, name in enumerate(names)))
    finally:
        cluster.close()


async def _wait_schedulable(api: _Api, names: list[str]) -> None:
    """Every node Ready, advertising its cards, without a NoSchedule taint (not-ready ones go once KWOK
    reports the node Ready)."""
    wanted = set(names)
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while time.monotonic() < deadline:
        listed = await api.call("GET", "/api/v1/nodes", labelSelector="type=kwok")
        ready = {
            node["metadata"]["name"]
            for node in listed["items"]
            if any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in node.get("status", {}).get("conditions") or ()
            )
            and GPU_RESOURCE in (node.get("status", {}).get("allocatable") or {})
            and not any(t.get("effect") == "NoSchedule" for t in node.get("spec", {}).get("taints") or ())
        }
        if wanted <= ready:
            return
        await asyncio.sleep(0.5)
    raise KubernetesBenchmarkError(f"{len(wanted)} KWOK nodes: not all Ready within {SETTLE_TIMEOUT_S:.0f} s")


async def _wait_status_written(api: _Api, gpus: int) -> None:
    """Every GPU object with the `available` our scheduler's status writer owns: a new GPU has none until
    the writer's first pass, which on a fresh cluster is a patch per card (1,600 at the default size),
    a start-up cost, not one of placing pods, so no phase is measured while it runs."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while time.monotonic() < deadline:
        listed = await api.call("GET", "/apis/tensor-fusion.ai/v1/gpus")
        written = sum(1 for gpu in listed["items"] if (gpu.get("status") or {}).get("available"))
        if written >= gpus:
            return
        await asyncio.sleep(0.5)
    raise KubernetesBenchmarkError(
        f"{gpus} GPUs: not all with a status written within {SETTLE_TIMEOUT_S:.0f} s"
    )


async def _wait_released(ledger: SqlLedger) -> None:
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while await ledger.active_allocations():
        if time.monotonic() > deadline:
            raise KubernetesBenchmarkError("our scheduler did not release the deleted pods' allocations")
        await asyncio.sleep(0.2)


# -- measuring ---------------------------------------------------------------------------------


def _bindings_by_us(audit_log: Path, namespace: str) -> int:
    """Pods of `namespace` our scheduler's service account bound, from the API server's audit log."""
    names = set()
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        target = event.get("objectRef") or {}
        if (
            event.get("user", {}).get("username") == OUR_SERVICE_ACCOUNT
            and event.get("verb") == "create"
            and target.get("subresource") == "binding"
            and target.get("namespace") == namespace
            and 200 <= int(event.get("responseStatus", {}).get("code", 0)) < 300
        ):
            names.add(target.get("name"))
    return len(names)


async def _measure_phase(
    api: _Api, control: LocalKubernetes, phase: Phase, pods: int, concurrency: int, namespace: str
) -> dict[str, Any]:
    await api.create_namespace(namespace)
    names = [f"{phase.key.replace('_', '-')}-{n:05d}" for n in range(pods)]
    sent: dict[str, float] = {}
    answered: dict[str, float] = {}
    gate = asyncio.Semaphore(concurrency)
    path = f"/api/v1/namespaces/{namespace}/pods"

    async def create(name: str) -> None:
        manifest = phase.pod(name, namespace)
        async with gate:
            sent[name] = time.monotonic()
            await api.call("POST", path, manifest)
            answered[name] = time.monotonic()

    timeout_s = max(PHASE_TIMEOUT_MIN_S, pods / BIND_RATE_FLOOR)
    async with api.bound_pods(namespace) as bound:
        started = time.monotonic()
        await asyncio.gather(*(create(name) for name in names))
        await bound.until(set(names), timeout_s - (time.monotonic() - started))
    listed = await api.call("GET", path)
    items = listed["items"]
    placed = [name for name in names if name in bound.at]
    latencies_ms = [(bound.at[name] - sent[name]) * 1000 for name in placed]
    first = min(sent.values())
    last_bound = max((bound.at[name] for name in placed), default=first)
    last_answered = max(answered.values())
    gpu_ids = [
        ids
        for pod in items
        if (ids := (pod["metadata"].get("annotations") or {}).get("tensor-fusion.ai/gpu-ids"))
    ]
    return {
        "title": phase.title,
        "scheduler_name": phase.scheduler_name,
        "namespace": namespace,
        "pods": pods,
        "bound": len(placed),
        "unbound": pods - len(placed),
        "pods_per_second": round(len(placed) / (last_bound - first), 1) if last_bound > first else None,
        "created_per_second": round(pods / (last_answered - first), 1) if last_answered > first else None,
        "seconds_to_last_bound": round(last_bound - first, 2),
        "p50_ms": round(_percentile(latencies_ms, 0.50), 1),
        "p90_ms": round(_percentile(latencies_ms, 0.90), 1),
        "p99_ms": round(_percentile(latencies_ms, 0.99), 1),
        "max_ms": round(max(latencies_ms, default=0.0), 1),
        "bound_in_api": sum(1 for pod in items if pod["spec"].get("nodeName")),
        "scheduler_names": sorted({pod["spec"].get("schedulerName") for pod in items}),
        "bound_by_our_service_account": _bindings_by_us(control.audit_log, namespace),
        "with_gpu_ids": len(gpu_ids),
        "distinct_gpu_ids": len(set(gpu_ids)),
        "most_pods_on_a_node": max(
            (
                sum(1 for pod in items if pod["spec"].get("nodeName") == node)
                for node in {pod["spec"].get("nodeName") for pod in items}
            ),
            default=0,
        ),
    }


async def _warm_up(api: _Api) -> None:
    """One pod for each scheduler, bound and deleted before anything is measured (our scheduler's watch
    and lease, kube-scheduler's caches)."""
    namespace = "bench-warm-up"
    await api.create_namespace(namespace)
    pods = [native_whole_gpu_pod("warm-up-kube", namespace), ours_whole_gpu_pod("warm-up-ours", namespace)]
    names = {pod["metadata"]["name"] for pod in pods}
    async with api.bound_pods(namespace) as bound:
        for manifest in pods:
            await api.call("POST", f"/api/v1/namespaces/{namespace}/pods", manifest)
        if not await bound.until(names, SETTLE_TIMEOUT_S):
            missing = ", ".join(sorted(names - bound.at.keys()))
            raise KubernetesBenchmarkError(f"warm-up pods not bound in time: {missing}")
    await api.delete_pods(namespace)


async def _run(
    control: LocalKubernetes,
    database_url: str,
    nats_url: str,
    scheduler_kubeconfig: Path,
    *,
    pods: int,
    nodes: int,
    gpus_per_node: int,
    create_concurrency: int,
    fractional: bool,
    say: Progress,
) -> dict[str, Any]:
    api = _Api(control, create_concurrency)
    ledger = SqlLedger.create(database_url, pool_size=2)
    scheduler_overrides = scheduler_settings()
    setup_started = time.monotonic()
    try:
        names = node_names(nodes)
        say(f"{nodes} KWOK nodes of {gpus_per_node} x {GPU_RESOURCE}, the same in the ledger")
        await _create_nodes(api, names, gpus_per_node)
        await register_simulated_nodes(ledger, nodes, gpus_per_node, NODE_PREFIX)
        say(f"their GPUNode and {nodes * gpus_per_node} GPU objects, through the node agent's writer")
        await _write_gpu_objects(control, names, gpus_per_node)
        await _wait_schedulable(api, names)
        environment = {
            **scheduler_overrides,
            "TF_SCHEDULER_MODE": "kubernetes",
            "TF_SCHEDULER_KUBECONFIG": str(scheduler_kubeconfig),
            "TF_SCHEDULER_LEASE_NAMESPACE": NAMESPACE,
            "KUBECONFIG": str(scheduler_kubeconfig),
        }
        async with scheduler_service(database_url, nats_url, environment):
            await _warm_up(api)
            await _wait_status_written(api, nodes * gpus_per_node)
            setup_s = time.monotonic() - setup_started
            phases: dict[str, Any] = {}
            for phase in PHASES if fractional else PHASES[:2]:
                say(f"{phase.title}: {pods} pods, {create_concurrency} creations in flight")
                namespace = f"bench-{phase.key.replace('_', '-')}"
                measured = await _measure_phase(api, control, phase, pods, create_concurrency, namespace)
                phases[phase.key] = measured
                say(
                    f"{phase.title}: {measured['bound']}/{pods} bound, {measured['pods_per_second']} pods/s, "
                    f"p99 {measured['p99_ms']} ms"
                )
                deleting = time.monotonic()
                await api.delete_pods(namespace)
                if phase.scheduler_name == OUR_SCHEDULER:
                    await _wait_released(ledger)
                measured["deleted_and_released_seconds"] = round(time.monotonic() - deleting, 1)
    finally:
        await api.client.aclose()
        await ledger.close()
    kube, ours = phases["kube_scheduler_whole"], phases["ours_whole"]
    return {
        "benchmark": "kubernetes",
        "pods": pods,
        "nodes": nodes,
        "gpus_per_node": gpus_per_node,
        "create_concurrency": create_concurrency,
        "scheduler_settings": scheduler_overrides,
        "setup_seconds": round(setup_s, 1),
        "phases": phases,
        "ratio_pods_per_second": round(ours["pods_per_second"] / kube["pods_per_second"], 3)
        if ours["pods_per_second"] and kube["pods_per_second"]
        else None,
        "ratio_p99": round(ours["p99_ms"] / kube["p99_ms"], 3) if kube["p99_ms"] else None,
    }


def run_kubernetes_benchmark(
    *,
    pods: int = DEFAULT_PODS,
    nodes: int = DEFAULT_NODES,
    gpus_per_node: int = DEFAULT_GPUS_PER_NODE,
    create_concurrency: int = DEFAULT_CREATE_CONCURRENCY,
    kube_scheduler_qps: int = KUBE_SCHEDULER_QPS,
    fractional: bool = True,
    database_url: str | None = None,
    nats_url: str | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Run the whole benchmark (see the module docstring); call it from the main thread (the control
    plane's processes die with it). Returns `phases` (each with `pods_per_second`, `p50_ms`/`p99_ms`
    from creation to bound, `created_per_second`, `deleted_and_released_seconds` (the pods deleted and,
    for ours, their allocations released), and the checks: `bound_in_api`, `scheduler_names`,
    `bound_by_our_service_account`, `with_gpu_ids`, `distinct_gpu_ids`) and `ratio_pods_per_second`
    and `ratio_p99` (ours over kube-scheduler on whole GPUs)."""
    say = progress or (lambda message: None)
    if pods < 1 or nodes < 1 or gpus_per_node < 1 or create_concurrency < 1 or kube_scheduler_qps < 1:
        raise KubernetesBenchmarkError(
            "--pods, --nodes, --gpus-per-node, --create-concurrency and --kube-scheduler-qps: each must be "
            "at least 1"
        )
    if pods > nodes * gpus_per_node:
        raise KubernetesBenchmarkError(
            f"--pods {pods}: the whole-GPU phases need a card each and {nodes} nodes of {gpus_per_node} "
            f"have {nodes * gpus_per_node}; add --nodes or --gpus-per-node, or lower --pods"
        )
    qps = str(kube_scheduler_qps)
    with (
        tempfile.TemporaryDirectory(prefix="tf-bench-k8s-") as folder,
        postgres_server(database_url) as server_url,
        nats_server(nats_url) as bus_url,
        scratch_database(server_url, "bench_kubernetes") as url,
    ):
        control = LocalKubernetes(
            state_dir=Path(folder) / "kubernetes",
            die_with_parent=True,
            scheduler_arguments=(f"--kube-api-qps={qps}", f"--kube-api-burst={qps}"),
            progress=say,
        )
        say("starting Kubernetes (etcd, kube-apiserver, controller manager, kube-scheduler, KWOK)")
        with running(control):
            kubeconfig = _apply_production_manifests(control, Path(folder))
            return asyncio.run(
                _run(
                    control,
                    url,
                    bus_url,
                    kubeconfig,
                    pods=pods,
                    nodes=nodes,
                    gpus_per_node=gpus_per_node,
                    create_concurrency=create_concurrency,
                    fractional=fractional,
                    say=say,
                )
            )
