"""Faults of the real Kubernetes API, on the session's real control plane (`local_kubernetes`).

- A scheduler whose pod watch is cut off while pods are created and deleted, etcd is compacted and
  kube-apiserver restarts resumes from a version the server no longer has (`410 Gone`), relists, and
  ends holding exactly the pods that exist: the pod created in the gap bound, the deleted one released.
- Two scheduler processes (`python -m tfscheduler`, Kubernetes mode, each with its own service account
  bound to the production RBAC) elect one leader through the real `coordination.k8s.io` Lease; when the
  leader is killed the other takes over within the lease duration plus one retry period, and every pod
  is bound exactly once, by whichever replica held the Lease (the API server's audit log says who).
- With the webhook registered as `k8s/` registers it and no replica answering, an opted-in pod is
  refused naming the webhook (`failurePolicy: Fail`); kube-system, tfpool-system and pods that did not
  opt in are never affected.

The scheduler processes reach the API server with service-account tokens, so RBAC applies as in
production; GPUs are registered in the ledger as the node agent would, on a KWOK node that runs the pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import pytest
from cluster_control_plane import admin_client
from support.polling import wait_for
from tfcommon.infra import EmbeddedNats, free_port
from tfcommon.kube_local import KWOK_NODE_ANNOTATION, LocalKubernetes
from tfcommon.ledger.sql import SqlLedger
from tfctl.kube_stack import MANIFESTS, local_manifests, token_kubeconfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scheduler"))
from scheduler_builders import register_named_node

pytestmark = pytest.mark.integration
T = TypeVar("T")

KUBECTL = str(Path(sys.executable).parent / "kubectl")
SYSTEM_NAMESPACE = "tfpool-system"
SCHEDULER_NAME = "tensor-fusion-scheduler"
WEBHOOK_NAME = "mpod.tensor-fusion.ai"
ENABLED_LABEL = "tensor-fusion.ai/enabled"
REPLICAS = ("scheduler-a", "scheduler-b")
"""Service accounts of the two replicas, bound to the production scheduler roles."""
SETTLE_S = 60.0


eventually = functools.partial(wait_for, within_s=SETTLE_S, every_s=0.05)
"""`eventually(what, check, within_s=...)`: poll `check` until truthy, failing after `within_s`."""


# -- the control plane as the admin ----------------------------------------------------------------


@dataclass
class Admin:
    """The session's control plane as the admin: kubectl and the HTTP API."""

    control_plane: LocalKubernetes
    api: httpx.Client

    def kubectl(self, *arguments: str, stdin: str | None = None, check: bool = True) -> str:
        result = subprocess.run(
            [KUBECTL, f"--kubeconfig={self.control_plane.kubeconfig}", *arguments],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if check:
            assert result.returncode == 0, f"kubectl {' '.join(arguments)}: {result.stderr}"
            return result.stdout
        return result.stdout + result.stderr

    def apply(self, documents: list[dict[str, Any]]) -> None:
        text = "".join(f"---\n{json.dumps(document)}\n" for document in documents)
        self.kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=test-api-faults",
            "-f",
            "-",
            stdin=text,
        )

    def namespace(self, name: str) -> str:
        self.apply([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}])
        eventually(
            f"namespace {name}'s default service account",
            lambda: self.api.get(f"/api/v1/namespaces/{name}/serviceaccounts/default").status_code == 200,
        )
        return name

    def pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        response = self.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        if response.status_code == 404:
            return None
        response.raise_for_status()
        body: dict[str, Any] = response.json()
        return body

    def create_pod(self, manifest: dict[str, Any]) -> httpx.Response:
        namespace = manifest["metadata"]["namespace"]
        return self.api.post(f"/api/v1/namespaces/{namespace}/pods", json=manifest)

    def delete_pod(self, namespace: str, name: str) -> None:
        response = self.api.delete(
            f"/api/v1/namespaces/{namespace}/pods/{name}", params={"gracePeriodSeconds": "0"}
        )
        assert response.status_code in (200, 202), response.text

    def token_kubeconfig(self, account: str, folder: Path, server: str | None = None) -> Path:
        """A kubeconfig holding a fresh token of `tfpool-system/account`, for `server` (default: the
        API server itself)."""
        token = self.kubectl("create", "token", account, "-n", SYSTEM_NAMESPACE, "--duration=1h").strip()
        path = folder / f"{account}.kubeconfig"
        path.write_text(
            token_kubeconfig(
                server or self.control_plane.api_url,
                self.control_plane.pki.ca.cert_file,
                f"system:serviceaccount:{SYSTEM_NAMESPACE}:{account}",
                token,
            )
        )
        return path

    def wait_for_watch_cache(self) -> None:
        """After a restart kube-apiserver refuses pod watches (429) until its watch cache is filled."""

        def serving() -> bool:
            version = self.api.get("/api/v1/pods", params={"limit": "1"}).json()["metadata"][
                "resourceVersion"
            ]
            params = {"watch": "true", "resourceVersion": version, "timeoutSeconds": "1"}
            return self.api.get("/api/v1/pods", params=params, timeout=5).status_code == 200

        eventually("the API server's pod watch cache", serving)


@pytest.fixture
def admin(local_kubernetes: LocalKubernetes) -> Iterator[Admin]:
    with admin_client(local_kubernetes) as api:
        yield Admin(local_kubernetes, api)


def production_objects(admin: Admin) -> list[dict[str, Any]]:
    """What `tfctl up --kubernetes` applies, rendered from `k8s/base` with kubectl kustomize; the
    webhook's URL points at a port nobody listens on (every replica down)."""
    rendered = admin.kubectl("kustomize", str(MANIFESTS))
    down = f"https://127.0.0.1:{free_port()}"
    return local_manifests(rendered, down, admin.control_plane.pki.ca.cert_file.read_bytes())


def with_replica_accounts(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The production identities and RBAC, without the webhook registration; every binding of the
    scheduler's service account also binds the two replicas' accounts."""
    scheduler = {"kind": "ServiceAccount", "name": "tfpool-scheduler", "namespace": SYSTEM_NAMESPACE}
    chosen = []
    for document in objects:
        if document["kind"] == "MutatingWebhookConfiguration":
            continue
        if document["kind"] in ("RoleBinding", "ClusterRoleBinding") and scheduler in document["subjects"]:
            document["subjects"] += [{**scheduler, "name": name} for name in REPLICAS]
        chosen.append(document)
    accounts = [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": n, "namespace": SYSTEM_NAMESPACE}}
        for n in REPLICAS
    ]
    return chosen + accounts


SHARED_KINDS = ("CustomResourceDefinition", "PriorityClass", "Namespace")


@pytest.fixture
def production_rbac(admin: Admin) -> Iterator[Admin]:
    """The production identities and RBAC applied, and no scheduler Lease left by an earlier test;
    afterwards every applied object but the CRDs, PriorityClasses and Namespaces is deleted again, so a
    later suite on this control plane (`helm install`) finds no ClusterRole it does not own."""
    objects = with_replica_accounts(production_objects(admin))
    admin.apply(objects)
    admin.api.delete(f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM_NAMESPACE}/leases/tfpool-scheduler")
    yield admin
    owned = [document for document in objects if document["kind"] not in SHARED_KINDS]
    text = "".join(f"---\n{json.dumps(document)}\n" for document in owned)
    admin.kubectl("delete", "--ignore-not-found", "-f", "-", stdin=text)


# -- the scheduler as a process --------------------------------------------------------------------


@dataclass
class SchedulerProcess:
    """`python -m tfscheduler` in Kubernetes mode with leader election, its log in `log`."""

    identity: str
    process: subprocess.Popen[bytes]
    url: str
    log: Path

    def leader_view(self) -> dict[str, Any]:
        body: dict[str, Any] = httpx.get(f"{self.url}/api/v1/leader", timeout=5).json()
        return body

    def wait_ready(self) -> None:
        def ready() -> bool:
            assert self.process.poll() is None, f"{self.identity} exited:\n{self.log.read_text()[-3000:]}"
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200
            return False

        eventually(f"{self.identity} ready", ready)

    def stop(self, stop_signal: signal.Signals = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(stop_signal)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@contextlib.contextmanager
def scheduler_processes(
    folder: Path, database_url: str, nats_url: str, kubeconfigs: dict[str, Path], **timings: str
) -> Iterator[dict[str, SchedulerProcess]]:
    """One scheduler process per identity (its kubeconfig given), all started before any is awaited."""
    started: dict[str, SchedulerProcess] = {}
    try:
        for identity, kubeconfig in kubeconfigs.items():
            port = free_port()
            environment = {k: v for k, v in os.environ.items() if not k.startswith("TF_")}
            environment.update(
                TF_PORT=str(port),
                TF_BIND_HOST="127.0.0.1",
                TF_DATABASE_URL=database_url,
                TF_NATS_URL=nats_url,
                TF_SCHEDULER_MODE="kubernetes",
                TF_SCHEDULER_KUBECONFIG=str(kubeconfig),
                TF_SCHEDULER_LEASE_NAMESPACE=SYSTEM_NAMESPACE,
                TF_SCHEDULER_PENDING_RETRY_INTERVAL_S="0.5",
                TF_SCHEDULER_HEARTBEAT_TIMEOUT_S="3600",
                POD_NAME=identity,
                **{f"TF_SCHEDULER_{name.upper()}": value for name, value in timings.items()},
            )
            log = folder / f"{identity}.log"
            with log.open("ab") as output:
                process = subprocess.Popen(
                    [sys.executable, "-m", "tfscheduler"],
                    env=environment,
                    cwd=folder,
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            started[identity] = SchedulerProcess(identity, process, f"http://127.0.0.1:{port}", log)
        for replica in started.values():
            replica.wait_ready()
        yield started
    finally:
        for replica in started.values():
            replica.stop()


async def registered_by_the_agent(database_url: str, node: str) -> None:
    """What the node agent writes for `node`: the node, a heartbeat and two 80 GiB GPUs."""
    ledger = SqlLedger.create(database_url, pool_size=2)
    try:
        await register_named_node(ledger, node, 2)
    finally:
        await ledger.close()


async def active_workloads(database_url: str, namespace: str) -> list[str]:
    """Names of the workloads in `namespace` holding GPUs in the ledger, one entry per allocation."""
    ledger = SqlLedger.create(database_url, pool_size=1)
    try:
        allocations = await ledger.active_allocations()
    finally:
        await ledger.close()
    return sorted(a.workload.name for a in allocations if a.workload.namespace == namespace)


def admitted_pod(namespace: str, name: str) -> dict[str, Any]:
    """A pod as our webhook leaves it: our scheduler's name and a 10 TFLOPS / 8 GiB share of one GPU."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"tensor-fusion.ai/component": "worker"},
            "annotations": {
                "tensor-fusion.ai/gpupool": "default",
                "tensor-fusion.ai/tflops-request": "10",
                "tensor-fusion.ai/tflops-limit": "10",
                "tensor-fusion.ai/vram-request": "8Gi",
                "tensor-fusion.ai/vram-limit": "8Gi",
                "tensor-fusion.ai/gpu-count": "1",
                "tensor-fusion.ai/qos": "medium",
                "tensor-fusion.ai/isolation": "soft",
                "tensor-fusion.ai/inject-container": "main",
                "tensor-fusion.ai/container-gpu-count": '{"main":1}',
            },
        },
        "spec": {
            "schedulerName": SCHEDULER_NAME,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "main", "image": "cuda"}],
        },
    }


@contextlib.contextmanager
def kwok_gpu_node(admin: Admin, name: str) -> Iterator[str]:
    """A Node that KWOK keeps Ready and whose bound pods it runs, until the block ends."""
    key, value = KWOK_NODE_ANNOTATION
    metadata = {"name": name, "annotations": {key: value}, "labels": {"kubernetes.io/hostname": name}}
    admin.apply([{"apiVersion": "v1", "kind": "Node", "metadata": metadata, "spec": {}}])
    try:
        yield name
    finally:
        admin.api.delete(f"/api/v1/nodes/{name}")


@contextlib.contextmanager
def scratch_namespace(admin: Admin, name: str) -> Iterator[str]:
    admin.namespace(name)
    try:
        yield name
    finally:
        admin.kubectl("delete", "namespace", name, "--wait=false", check=False)
        eventually(
            f"namespace {name} deleted",
            lambda: admin.api.get(f"/api/v1/namespaces/{name}").status_code == 404,
            within_s=120,
        )


def node_of(admin: Admin, namespace: str, name: str) -> str | None:
    pod = admin.pod(namespace, name)
    return None if pod is None else pod["spec"].get("nodeName")


def audited(control_plane: LocalKubernetes, account: str) -> list[dict[str, Any]]:
    """The API server's audit records of `tfpool-system/account`'s requests."""
    user = f"system:serviceaccount:{SYSTEM_NAMESPACE}:{account}"
    events = (json.loads(line) for line in control_plane.audit_log.read_text().splitlines())
    return [event for event in events if event["user"]["username"] == user]


# -- a watch cut off across a compaction -----------------------------------------------------------


class Partition:
    """A TCP forwarder between a client and the API server that can be cut (every connection dropped,
    new ones refused) and healed: a network partition that leaves the server serving everyone else."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.port = free_port()
        self._sockets: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self.heal()

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def heal(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(64)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def cut(self) -> None:
        with self._lock:
            doomed = [*self._sockets, *([self._listener] if self._listener else [])]
            self._sockets.clear()
            self._listener = None
        for sock in doomed:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
                upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            except OSError:
                return
            with self._lock:
                if self._listener is not listener:
                    client.close()
                    upstream.close()
                    return
                self._sockets.update((client, upstream))
            for source, target in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, target), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, target: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                target.sendall(data)
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)


def watch_requests(control_plane: LocalKubernetes, account: str, since: datetime) -> list[tuple[str, int]]:
    """(`list` or `watch`, response code) of `account`'s requests for all pods received after `since`."""
    return [
        (event["verb"], event["responseStatus"]["code"])
        for event in audited(control_plane, account)
        if event["objectRef"].get("resource") == "pods"
        and "namespace" not in event["objectRef"]
        and event["verb"] in ("list", "watch")
        and event["stage"] == "ResponseComplete"
        and datetime.fromisoformat(event["requestReceivedTimestamp"]) > since
    ]


async def test_a_pod_watch_cut_off_across_a_compaction_relists_on_410_and_loses_no_pod(
    production_rbac: Admin, migrated_database_url: str, own_nats: EmbeddedNats, tmp_path: Path
) -> None:
    admin, control_plane = production_rbac, production_rbac.control_plane
    partition = Partition(control_plane.ports["apiserver"])
    kubeconfig = admin.token_kubeconfig("tfpool-scheduler", tmp_path, server=partition.url)
    # Leadership outlives the partition, so the same pod watch has to resume across it.
    timings = {"lease_duration_s": "120", "renew_deadline_s": "90", "retry_period_s": "2"}
    try:
        with (
            kwok_gpu_node(admin, "faults-watch-node") as node,
            scratch_namespace(admin, "faults-watch") as team,
        ):
            await registered_by_the_agent(migrated_database_url, node)
            with scheduler_processes(
                tmp_path, migrated_database_url, own_nats.url, {"scheduler-w": kubeconfig}, **timings
            ) as replicas:
                eventually("the scheduler leading", lambda: replicas["scheduler-w"].leader_view()["leader"])
                for name in ("kept", "doomed"):
                    admin.create_pod(admitted_pod(team, name)).raise_for_status()
                eventually(
                    "both bound", lambda: node_of(admin, team, "kept") and node_of(admin, team, "doomed")
                )

                partition.cut()
                cut_at = datetime.now().astimezone()
                admin.delete_pod(team, "doomed")
                admin.create_pod(admitted_pod(team, "born-in-the-gap")).raise_for_status()
                control_plane.compact_etcd()
                control_plane.restart_api_server()
                admin.wait_for_watch_cache()
                partition.heal()

                assert (
                    eventually("the gap's pod bound", lambda: node_of(admin, team, "born-in-the-gap")) == node
                )
                deadline = time.monotonic() + SETTLE_S
                while (held := await active_workloads(migrated_database_url, team)) != [
                    "born-in-the-gap",
                    "kept",
                ]:
                    assert time.monotonic() < deadline, held
                    await asyncio.sleep(0.1)
                # The resumed watch was refused (410 Gone, sent in the stream) and a relist followed,
                # in the same leadership term (a new term would list all pods first).
                requests = watch_requests(control_plane, "tfpool-scheduler", cut_at)
                assert requests[:2] == [("watch", 200), ("list", 200)], requests
                assert replicas["scheduler-w"].leader_view()["leader"] is True
    finally:
        partition.cut()


# -- the webhook down ------------------------------------------------------------------------------


def plain_pod(namespace: str, name: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {"terminationGracePeriodSeconds": 0, "containers": [{"name": "app", "image": "vllm"}]},
    }


@contextlib.contextmanager
def webhook_registered(admin: Admin, objects: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    """The production MutatingWebhookConfiguration among `objects`, applied until the block ends (and
    then deleted, waiting until the API server no longer calls it)."""
    [registration] = [o for o in objects if o["kind"] == "MutatingWebhookConfiguration"]
    admin.apply([registration])
    name = registration["metadata"]["name"]
    try:
        yield registration
    finally:
        admin.kubectl("delete", "mutatingwebhookconfiguration", name, "--ignore-not-found")
        probe = plain_pod("default", "webhook-gone-probe", {ENABLED_LABEL: "true"})

        def admitted() -> bool:
            response = admin.create_pod(probe)
            if response.status_code == 201:
                admin.delete_pod("default", "webhook-gone-probe")
            return response.status_code == 201

        eventually("pod creation without the webhook", admitted)


def refusal(admin: Admin, manifest: dict[str, Any]) -> str | None:
    """None when the pod was created (it is deleted again), else the API server's message."""
    response = admin.create_pod(manifest)
    if response.status_code == 201:
        admin.delete_pod(manifest["metadata"]["namespace"], manifest["metadata"]["name"])
        return None
    message: str = response.json().get("message", response.text)
    return message


def test_with_the_webhook_down_opted_in_pods_are_refused_naming_it_and_system_namespaces_never_wait(
    admin: Admin,
) -> None:
    objects = production_objects(admin)
    admin.apply([o for o in objects if o["kind"] == "Namespace"])
    with (
        scratch_namespace(admin, "faults-webhook") as team,
        webhook_registered(admin, objects) as registration,
    ):
        [webhook] = registration["webhooks"]
        assert (webhook["name"], webhook["failurePolicy"]) == (WEBHOOK_NAME, "Fail")
        opted_in = plain_pod(team, "share", {ENABLED_LABEL: "true"})

        message = eventually("the webhook's registration in force", lambda: refusal(admin, opted_in))

        assert f'failed calling webhook "{WEBHOOK_NAME}"' in message, message
        assert admin.pod(team, "share") is None
        assert refusal(admin, plain_pod(team, "native")) is None, "a pod that did not opt in waited"
        assert refusal(admin, plain_pod(team, "opted-out", {ENABLED_LABEL: "false"})) is None
        for system in ("kube-system", SYSTEM_NAMESPACE):
            assert refusal(admin, plain_pod(system, "system-share", {ENABLED_LABEL: "true"})) is None, system
            assert refusal(admin, plain_pod(system, "system-native")) is None, system


# -- two scheduler replicas ------------------------------------------------------------------------

LEASE_DURATION_S = 3
RENEW_DEADLINE_S = 2.0
RETRY_PERIOD_S = 0.5


def lease_spec(admin: Admin) -> dict[str, Any] | None:
    response = admin.api.get(
        f"/apis/coordination.k8s.io/v1/namespaces/{SYSTEM_NAMESPACE}/leases/tfpool-scheduler"
    )
    if response.status_code == 404:
        return None
    spec: dict[str, Any] = response.json()["spec"]
    return spec


def bindings(control_plane: LocalKubernetes, namespace: str) -> list[tuple[str, str, int]]:
    """(replica, pod, response code) of every `pods/binding` request either replica made in `namespace`."""
    return sorted(
        (account, event["objectRef"]["name"], event["responseStatus"]["code"])
        for account in REPLICAS
        for event in audited(control_plane, account)
        if event["verb"] == "create"
        and event["objectRef"].get("subresource") == "binding"
        and event["objectRef"].get("namespace") == namespace
    )


def pod_requests_before(control_plane: LocalKubernetes, account: str, moment: datetime) -> list[str]:
    return [
        f"{event['verb']} {event['requestURI']}"
        for event in audited(control_plane, account)
        if event["objectRef"].get("resource") == "pods"
        and datetime.fromisoformat(event["requestReceivedTimestamp"]) < moment
    ]


async def test_two_scheduler_replicas_elect_one_leader_and_the_other_takes_over_within_the_lease(
    production_rbac: Admin, migrated_database_url: str, own_nats: EmbeddedNats, tmp_path: Path
) -> None:
    admin, control_plane = production_rbac, production_rbac.control_plane
    kubeconfigs = {name: admin.token_kubeconfig(name, tmp_path) for name in REPLICAS}
    timings = {
        "lease_duration_s": str(LEASE_DURATION_S),
        "renew_deadline_s": str(RENEW_DEADLINE_S),
        "retry_period_s": str(RETRY_PERIOD_S),
    }
    with (
        kwok_gpu_node(admin, "faults-leader-node") as node,
        scratch_namespace(admin, "faults-leader") as team,
    ):
        await registered_by_the_agent(migrated_database_url, node)
        with scheduler_processes(
            tmp_path, migrated_database_url, own_nats.url, kubeconfigs, **timings
        ) as replicas:
            spec = eventually("a leader", lambda: (s := lease_spec(admin)) and s.get("holderIdentity") and s)
            leader = replicas[spec["holderIdentity"]]
            [follower] = [r for r in replicas.values() if r is not leader]
            eventually(
                "the follower sees the leader",
                lambda: (
                    follower.leader_view()
                    == {
                        "leader": False,
                        "election": True,
                        "identity": follower.identity,
                        "holder": leader.identity,
                        "lease": f"{SYSTEM_NAMESPACE}/tfpool-scheduler",
                    }
                ),
            )
            assert leader.leader_view()["leader"] is True
            admin.create_pod(admitted_pod(team, "before")).raise_for_status()
            assert eventually("the first pod bound", lambda: node_of(admin, team, "before")) == node

            leader.process.kill()
            killed_at = datetime.now().astimezone()
            admin.create_pod(admitted_pod(team, "in-the-gap")).raise_for_status()
            taken = eventually(
                "the takeover",
                lambda: (s := lease_spec(admin)) and s["holderIdentity"] == follower.identity and s,
                within_s=LEASE_DURATION_S + 10,
            )
            takeover_s = (datetime.fromisoformat(taken["acquireTime"]) - killed_at).total_seconds()
            print(f"takeover {takeover_s:.2f} s after the leader was killed")

            assert takeover_s <= LEASE_DURATION_S + RETRY_PERIOD_S, takeover_s
            assert takeover_s >= LEASE_DURATION_S - RENEW_DEADLINE_S, "taken before the lease expired"
            assert taken["leaseTransitions"] == spec["leaseTransitions"] + 1
            assert eventually("the gap's pod bound", lambda: node_of(admin, team, "in-the-gap")) == node
            admin.create_pod(admitted_pod(team, "after")).raise_for_status()
            assert eventually("the last pod bound", lambda: node_of(admin, team, "after")) == node
            assert follower.leader_view()["leader"] is True

            assert bindings(control_plane, team) == sorted(
                [
                    (leader.identity, "before", 201),
                    (follower.identity, "in-the-gap", 201),
                    (follower.identity, "after", 201),
                ]
            )
            acquired = datetime.fromisoformat(taken["acquireTime"])
            assert pod_requests_before(control_plane, follower.identity, acquired) == []
            assert await active_workloads(migrated_database_url, team) == ["after", "before", "in-the-gap"]
