"""`tfctl up --kubernetes`: the local stack in Kubernetes mode, on a real control plane on loopback.

On top of what `tfctl.stack.Stack` starts (NATS, Postgres, migrations, children, readiness, ordered
stop) it starts `LocalKubernetes` (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, KWOK)
under `<state dir>/kubernetes`, creates one KWOK node per `--fake-gpus` entry with the labels the node
agent's DaemonSet selects, and applies the production manifests rendered from `k8s/base` (`kubectl
kustomize`): the CRDs, ServiceAccounts, ClusterRoles, Roles, their bindings, the PriorityClasses and the
MutatingWebhookConfiguration, whose `service` reference becomes the loopback `url` of the webhook child
with its certificate as `caBundle`. Each service then runs in Kubernetes mode with a kubeconfig holding
its own service account's token (TokenRequest API), so RBAC applies to it as in production. The admin
kubeconfig is `<state dir>/kubernetes/kubeconfig`. The control plane stops after the services.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sys
from pathlib import Path
from typing import IO, Any

import yaml
from tfcommon.infra import InfrastructureError
from tfcommon.kube_local import KWOK_NODE_ANNOTATION, LocalKubernetes

from tfctl.stack import Child, Stack, StackError, StackOptions, plan_children, state_dir_lock

NAMESPACE = "tfpool-system"
MANIFESTS = Path(__file__).resolve().parents[2] / "k8s" / "base"
KUBECTL = Path(sys.executable).parent / "kubectl"
WEBHOOK_PATH = "/mutate-v1-pod"
TOKEN_DURATION = "720h"
NODE_LABELS = {"nvidia.com/gpu.present": "true", "type": "kwok"}
"""What the node agent's DaemonSet selects (`k8s/base/node-agent.yaml`), plus KWOK's usual `type`."""
NODE_RESOURCES = {"cpu": "1k", "memory": "1Ti", "pods": "1M"}
"""KWOK's default capacity for a node (its `node-initialize` stage keeps what a node already has)."""
DEVICE_PLUGIN_RESOURCE = "nvidia.com/gpu"
SERVICE_ACCOUNTS = {
    "webhook": "tfpool-webhook",
    "scheduler": "tfpool-scheduler",
    "defrag-planner": "tfpool-defrag-planner",
    "metrics": "tfpool-metrics",
    "node-agent": "tfpool-node-agent",
}
APPLIED_KINDS = frozenset(
    {
        "Namespace",
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "PriorityClass",
        "MutatingWebhookConfiguration",
    }
)


def _say(message: str) -> None:
    print(f"tfctl up: {message}", file=sys.stderr, flush=True)


def local_manifests(rendered: str, webhook_url: str, ca_bundle: bytes) -> list[dict[str, Any]]:
    """The objects of the rendered production manifests that `tfctl up --kubernetes` applies: the
    cluster-wide definitions and identities (no workloads), the webhook's `service` reference replaced by
    `webhook_url` with `ca_bundle` (PEM) as its trust, cert-manager's injection annotation dropped."""
    chosen: list[dict[str, Any]] = []
    for document in yaml.safe_load_all(rendered):
        if not document or document.get("kind") not in APPLIED_KINDS:
            continue
        if document["kind"] == "MutatingWebhookConfiguration":
            annotations = document["metadata"].get("annotations") or {}
            annotations.pop("cert-manager.io/inject-ca-from", None)
            document["metadata"]["annotations"] = annotations
            for webhook in document["webhooks"]:
                path = webhook["clientConfig"].get("service", {}).get("path", WEBHOOK_PATH)
                webhook["clientConfig"] = {
                    "url": f"{webhook_url}{path}",
                    "caBundle": base64.b64encode(ca_bundle).decode(),
                }
        chosen.append(document)
    return chosen


def kwok_node(name: str, gpus: str) -> dict[str, Any]:
    """A Node that KWOK keeps Ready, labelled as a GPU node for the node agent, advertising its
    `--fake-gpus` entry `gpus` as the NVIDIA device plugin would (`nvidia.com/gpu`), so that pods still
    asking for whole GPUs are placed by kube-scheduler as on a real GPU node."""
    key, value = KWOK_NODE_ANNOTATION
    resources = {**NODE_RESOURCES, DEVICE_PLUGIN_RESOURCE: str(fake_gpu_count(gpus))}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {key: value},
            "labels": {**NODE_LABELS, "kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
        },
        "spec": {},
        "status": {"capacity": resources, "allocatable": resources},
    }


def fake_gpu_count(gpus: str) -> int:
    """How many GPUs one `--fake-gpus` entry (`MODEL:N[,MODEL:N]`, already checked) simulates."""
    return sum(int(part.rpartition(":")[2]) for part in gpus.split(","))


def token_kubeconfig(api_url: str, ca_file: Path, user: str, token: str) -> str:
    """A kubeconfig that authenticates with a bearer `token` (a service account's)."""
    document = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "tfpool-local", "cluster": {"server": api_url, "certificate-authority": str(ca_file)}}
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "tfpool-local", "context": {"cluster": "tfpool-local", "user": user}}],
        "current-context": "tfpool-local",
    }
    return yaml.safe_dump(document, sort_keys=False)


class KubernetesStack(Stack):
    """`Stack` with a local Kubernetes control plane, the production manifests and Kubernetes mode."""

    def __init__(self, options: StackOptions, out: IO[str]) -> None:
        super().__init__(options, out)
        self.kubernetes = LocalKubernetes(
            state_dir=options.state_dir / "kubernetes",
            host=options.host,
            die_with_parent=True,
            progress=_say,
        )
        self.kubernetes_started = False

    async def _start_infrastructure(self) -> None:
        await super()._start_infrastructure()
        if self.stop_requested.is_set():
            return
        _say("starting Kubernetes (etcd, kube-apiserver, controller manager, scheduler, KWOK)")
        # On the main thread: each component's parent-death signal follows the launching thread.
        self.kubernetes_started = True
        self.kubernetes.start()

    async def _stop_infrastructure(self) -> None:
        if self.kubernetes_started:
            await asyncio.to_thread(self.kubernetes.stop)
        await super()._stop_infrastructure()

    async def _kubectl(self, *arguments: str, stdin: str | None = None) -> str:
        process = await asyncio.create_subprocess_exec(
            str(KUBECTL),
            f"--kubeconfig={self.kubernetes.kubeconfig}",
            *arguments,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        out, err = await process.communicate(None if stdin is None else stdin.encode())
        if process.returncode != 0:
            raise StackError(f"kubectl {' '.join(arguments)} failed: {err.decode(errors='replace').strip()}")
        return out.decode()

    async def _plan_children(self) -> list[Child]:
        children = plan_children(self.options)
        webhook = next(child for child in children if child.service == "webhook")
        rendered = await self._kubectl("kustomize", str(MANIFESTS))
        ca_bundle = (self.options.state_dir / "certs" / "tls.crt").read_bytes()
        objects = local_manifests(rendered, webhook.url, ca_bundle)
        agents = [child.node for child in children if child.node is not None]
        nodes = [kwok_node(node, gpus) for node, gpus in zip(agents, self.options.nodes, strict=True)]
        _say(f"applying the production manifests ({len(objects)} objects) and {len(nodes)} KWOK nodes")
        documents = "".join(f"---\n{json.dumps(document)}\n" for document in [*objects, *nodes])
        await self._kubectl(
            "apply",
            "--server-side",
            "--force-conflicts",
            "--field-manager=tfctl-up",
            "-f",
            "-",
            stdin=documents,
        )
        await self._kubectl(
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            "crd",
            "-l",
            "app.kubernetes.io/part-of=tfpool",
        )
        kubeconfigs = await self._service_kubeconfigs()
        for child in children:
            kubeconfig = str(kubeconfigs[child.service])
            child.environment.update({"KUBECONFIG": kubeconfig, "TF_GPU_POOLS": "cluster"})  # GPUPool objects
            if child.service == "scheduler":
                child.environment.update(
                    {
                        "TF_SCHEDULER_MODE": "kubernetes",
                        "TF_SCHEDULER_KUBECONFIG": kubeconfig,
                        "TF_SCHEDULER_LEASE_NAMESPACE": NAMESPACE,
                    }
                )
            elif child.service == "node-agent":
                child.environment.update({"TF_AGENT_KUBERNETES": "true", "TF_AGENT_KUBECONFIG": kubeconfig})
            elif child.service == "defrag-planner":
                child.environment.pop("TF_DEFRAG_SCHEDULER_URL", None)
        return children

    async def _service_kubeconfigs(self) -> dict[str, Path]:
        """One kubeconfig per service with a fresh token of its own service account."""
        folder = self.kubernetes.state_dir / "services"
        folder.mkdir(exist_ok=True)
        tokens = await asyncio.gather(
            *(
                self._kubectl("create", "token", account, "-n", NAMESPACE, f"--duration={TOKEN_DURATION}")
                for account in SERVICE_ACCOUNTS.values()
            )
        )
        kubeconfigs: dict[str, Path] = {}
        for (service, account), token in zip(SERVICE_ACCOUNTS.items(), tokens, strict=True):
            path = folder / f"{service}.kubeconfig"
            text = token_kubeconfig(
                self.kubernetes.api_url,
                self.kubernetes.pki.ca.cert_file,
                f"system:serviceaccount:{NAMESPACE}:{account}",
                token.strip(),
            )
            path.touch(mode=0o600)
            path.write_text(text)
            kubeconfigs[service] = path
        return kubeconfigs

    def _summary_extra(self) -> dict[str, Any]:
        return {"kubeconfig": str(self.kubernetes.kubeconfig), "kubernetes_api": self.kubernetes.api_url}


def run(options: StackOptions, out: IO[str] = sys.stdout) -> int:
    """Run the Kubernetes-mode stack in the foreground until Ctrl-C / SIGTERM or a crash."""
    try:
        with state_dir_lock(options.state_dir):
            return asyncio.run(KubernetesStack(options, out).run())
    except (StackError, InfrastructureError) as error:
        _say(f"error: {error}")
        return 1
