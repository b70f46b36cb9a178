"""Least privilege, measured: what each service account used in one `tfctl up --kubernetes` run against
what the ClusterRoles and Roles of `k8s/base` grant it.

One run exercises every service's Kubernetes path: the node agents create and label their GPUNode and
GPU objects and write their status (and put back a pool label a user changed); the webhook reads the
namespace's labels (a `namespaceSelector` is configured) while mutating pods; our scheduler binds them,
patches their annotations and the custom resources' status, reports a pod that fits nowhere (condition
and Event), preempts a low-QoS pod through the Eviction API and holds its Lease; the defrag planner
drains a node through the Eviction API under a PodDisruptionBudget, marking the node and the evicted
pods; the metrics service answers from the ledger. The API server's audit log then lists every
(verb, resource[/subresource]) each service account used. The tests fail when a service was refused
(403), or when a role grants a verb that no service used and `NOT_REACHED` does not explain.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from kube_stack_up import (
    KUBECTL,
    SERVICE_ACCOUNT_PREFIX,
    KubeStack,
    audited_requests,
    create_namespace,
    eventually,
    running_kube_stack,
)
from stack_up import DEFRAG_EVERY_SECOND

pytestmark = pytest.mark.e2e

BASE = Path(__file__).resolve().parents[2] / "k8s" / "base"
NAMESPACE = "rbac-audit"
TF = "tensor-fusion.ai"
POOL_LABEL = f"{TF}/gpupool"
TERMINATION_HOLD = f"{NAMESPACE}.{TF}/hold"
"""A finalizer that keeps an evicted pod Terminating, as a real kubelet's grace period does (KWOK
deletes at once), so the planner marks the evicted pod as it does in production."""
CONFIG = {
    "dynamicConfig": {
        "autoMigration": {
            "enable": True,
            "scope": {"includes": {"namespaceSelector": {"matchLabels": {"gpu-migration": "enabled"}}}},
        }
    },
    "gpuPools": [{**pool, "isDefault": True} for pool in DEFRAG_EVERY_SECOND["gpuPools"]],
}
"""A namespace selector (so the webhook reads namespaces) and defrag of any node, of pods older than 1 s."""

UNUSABLE_POOL = "pool-" + "x" * 64

Grant = tuple[str, str, str]
"""(API group, resource[/subresource], verb), as RBAC and the audit log name them."""

NOT_REACHED: dict[tuple[str, Grant], str] = {
    # Only a kubelet calls the device plugins' Allocate; KWOK nodes have no kubelet.
    ("tfpool-node-agent", ("", "pods", "list")): "device-plugin Allocate lists the pods on its node",
    # Only when a full enabled-replicas workload is refused a slot (test_takeover_replacement_kubernetes).
    ("tfpool-webhook", ("", "pods", "list")): "freeing the slots of a full workload's gone taken-over pods",
    # After a refused binding (409): is the pod bound already (a replayed event, another replica)?
    ("tfpool-scheduler", ("", "pods", "get")): "telling a pod bound already from a lost binding race",
    # Written only for a GPUResourceQuota object (its usage, conditions); this run creates none.
    ("tfpool-scheduler", (TF, "gpuresourcequotas/status", "patch")): "a quota's status and conditions",
}
"""Grants kept although this run does not reach them, with the path that needs them."""


@dataclass(frozen=True)
class Audited:
    """What the audit log of the run says about our service accounts."""

    used: dict[str, set[Grant]]
    denied: list[str]
    seen: set[str]


def share_pod(name: str, vram_gib: int, *, app: str, qos: str = "medium") -> dict[str, Any]:
    """An opted-in pod asking 10 TFLOPS and `vram_gib` of one GPU."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"app": app, f"{TF}/enabled": "true"},
            "annotations": share_annotations(vram_gib, qos),
        },
        "spec": {"containers": [{"name": "app", "image": "vllm"}]},
    }


def share_annotations(vram_gib: int, qos: str = "medium") -> dict[str, str]:
    return {
        f"{TF}/tflops-request": "10",
        f"{TF}/tflops-limit": "10",
        f"{TF}/vram-request": f"{vram_gib}Gi",
        f"{TF}/vram-limit": f"{vram_gib}Gi",
        f"{TF}/qos": qos,
    }


def serve_deployment(replicas: int) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "serve", "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": "serve"}},
            "template": {
                "metadata": {
                    "labels": {"app": "serve", f"{TF}/enabled": "true"},
                    "annotations": share_annotations(20),
                    "finalizers": [TERMINATION_HOLD],
                },
                "spec": {"containers": [{"name": "app", "image": "vllm"}]},
            },
        },
    }


def pods(stack: KubeStack) -> dict[str, dict[str, Any]]:
    listed = stack.kubectl_json("get", "pods", "-n", NAMESPACE)["items"]
    return {pod["metadata"]["name"]: pod for pod in listed}


def running_on(stack: KubeStack, name: str) -> str:
    """Wait until pod `name` runs; its node."""

    def node() -> str | None:
        pod = pods(stack).get(name)
        if pod is None or pod["status"].get("phase") != "Running":
            return None
        return str(pod["spec"]["nodeName"])

    return eventually(f"pod {name} Running", node)


def serve_pods(stack: KubeStack) -> dict[str, str | None]:
    """The serve replicas that are not terminating, with their nodes once Running."""
    return {
        name: pod["spec"].get("nodeName") if pod["status"].get("phase") == "Running" else None
        for name, pod in pods(stack).items()
        if name.startswith("serve-") and "deletionTimestamp" not in pod["metadata"]
    }


def delete(stack: KubeStack, *names: str) -> None:
    stack.kubectl("delete", "pod", "-n", NAMESPACE, "--wait=true", *names)


def exercise_node_agents(stack: KubeStack) -> None:
    """The agents' objects, and a pool label a user changed put back at the next rediscovery."""
    eventually("both agents' GPUNodes", lambda: len(stack.kubectl_json("get", "gpunodes")["items"]) == 2)
    eventually("both agents' GPUs", lambda: len(stack.kubectl_json("get", "gpus")["items"]) == 2)
    stack.kubectl("label", "gpunode", "sim-node-1", f"{POOL_LABEL}=elsewhere", "--overwrite")
    eventually(
        "the agent putting its pool label back",
        lambda: (
            stack.kubectl_json("get", "gpunode", "sim-node-1")["metadata"]["labels"][POOL_LABEL] == "default"
        ),
    )


def add_unusable_pool(stack: KubeStack) -> None:
    """A GPUPool object whose name is too long for a pool (a label value): every service that reads its
    pools from GPUPool objects says so on it (status condition and Event)."""
    stack.apply(
        {"apiVersion": f"{TF}/v1", "kind": "GPUPool", "metadata": {"name": UNUSABLE_POOL}, "spec": {}}
    )


def exercise_preemption_and_unschedulable(stack: KubeStack) -> None:
    """Both GPUs full of low-QoS pods; a critical pod preempts one; a pod larger than any GPU waits."""
    for name in ("low-1", "low-2"):
        stack.apply(share_pod(name, 80, app="low", qos="low"))
        running_on(stack, name)
    stack.apply(share_pod("urgent", 80, app="urgent", qos="critical"))
    running_on(stack, "urgent")
    left = {"low-1", "low-2"} & set(pods(stack))
    assert len(left) == 1, f"one low pod evicted by preemption, left: {left}"
    stack.apply(share_pod("too-big", 100, app="too-big"))

    def refused() -> bool:
        events = stack.kubectl_json("get", "events", "-n", NAMESPACE)["items"]
        return any(
            e["reason"] == "FailedScheduling" and e["involvedObject"]["name"] == "too-big" for e in events
        )

    eventually("the FailedScheduling event of too-big", refused)
    delete(stack, "urgent", "too-big", *left)


def exercise_defrag(stack: KubeStack) -> None:
    """Lay out serve (two replicas, a budget) on one node and solo (no budget) on the other, then run a
    campaign: the serve node is drained onto the other one replica at a time."""
    stack.apply(serve_deployment(1))
    first = eventually("serve's first replica", lambda: next(iter(serve_pods(stack)), None))
    source = running_on(stack, first)
    stack.apply(share_pod("wall", 80, app="placeholder"))
    target = running_on(stack, "wall")
    assert target != source
    stack.apply(serve_deployment(2))
    eventually("both serve replicas on the source", lambda: list(serve_pods(stack).values()) == [source] * 2)
    stack.apply(share_pod("block", 40, app="placeholder"))
    assert running_on(stack, "block") == source
    delete(stack, "wall")
    stack.apply(share_pod("solo", 20, app="solo"))
    assert running_on(stack, "solo") == target
    delete(stack, "block")
    stack.apply(
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "serve", "namespace": NAMESPACE},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "serve"}}},
        }
    )
    urls = {service["name"]: service["url"] for service in stack.summary["services"]}

    def planned_drain() -> list[Any]:
        plan = httpx.get(f"{urls['defrag-planner']}/api/v1/defrag/plan", params={"pool": "default"}).json()
        return [drain["node"] for drain in plan["drains"]]

    assert eventually("a plan draining the source", planned_drain) == [source]
    before = set(serve_pods(stack))
    nats = next(item["url"] for item in stack.summary["infrastructure"] if item["name"] == "nats")
    started = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfctl.main",
            "defrag",
            "run",
            "--pool",
            "default",
            "--now",
            "--max-duration-minutes",
            "2",
        ],
        env={**os.environ, "TF_NATS_URL": nats},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert started.returncode == 0, started.stderr

    def moved() -> bool:
        now = serve_pods(stack)
        return len(now) == 2 and not set(now) & before and set(now.values()) == {target}

    try:
        eventually("both serve replicas replaced on the target", moved, within_s=60)
    except AssertionError as failure:
        plan = httpx.get(f"{urls['defrag-planner']}/api/v1/defrag/plan", params={"pool": "default"}).text
        story = f"source {source}, target {target}, plan now {plan}\n{defrag_story(stack)}"
        raise AssertionError(f"{failure}; {story}") from None


def defrag_story(stack: KubeStack) -> str:
    """What a failed drain left behind: every pod of the namespace, the budget's status, and what the
    planner's and the scheduler's logs say of the campaign, the pods and their holds."""
    budget = stack.kubectl("get", "pdb", "serve", "-n", NAMESPACE, "-o", "jsonpath={.status}", check=False)
    lines = [f"budget serve: {budget}"]
    lines += [
        f"{name}: {pod['spec'].get('nodeName')} {pod['status'].get('phase')}"
        f"{' terminating' if 'deletionTimestamp' in pod['metadata'] else ''} {pod['metadata'].get('uid')}"
        for name, pod in sorted(pods(stack).items())
    ]
    for service, worth_reading in (
        ("defrag-planner", ("tfdefrag", "WARNING", "ERROR")),
        ("scheduler", ("hold", NAMESPACE, "WARNING", "ERROR")),
    ):
        log = stack.state_dir / "logs" / f"{service}.log"
        read = log.read_text().splitlines() if log.exists() else []
        lines += [f"{log}:", *[line for line in read if any(word in line for word in worth_reading)][-30:]]
    return "\n".join(lines)


def exercise_metrics(stack: KubeStack) -> None:
    """The metrics service answers from the ledger and the bus, with no Kubernetes rights at all."""
    url = next(service["url"] for service in stack.summary["services"] if service["name"] == "metrics")
    assert httpx.get(f"{url}/metrics").status_code == 200
    dashboard = httpx.get(f"{url}/api/v1/dashboard")
    assert dashboard.status_code == 200, dashboard.text


def audited(audit_log: Path) -> Audited:
    """Each service account's granted requests (not refused) as RBAC grants, and what was refused."""
    used: dict[str, set[Grant]] = defaultdict(set)
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        user = event["user"]["username"]
        target = event.get("objectRef") or {}
        if not user.startswith(SERVICE_ACCOUNT_PREFIX) or "resource" not in target:
            continue
        if event["responseStatus"]["code"] == 403:
            continue
        resource = "/".join(part for part in (target["resource"], target.get("subresource")) if part)
        used[user.removeprefix(SERVICE_ACCOUNT_PREFIX)].add(
            (target.get("apiGroup", ""), resource, event["verb"])
        )
    seen, denied = audited_requests(audit_log)
    return Audited(dict(used), denied, seen)


def granted_by_base() -> dict[str, dict[Grant, str]]:
    """What `k8s/base` grants each of its service accounts through role bindings, with the role."""
    rendered = subprocess.run(
        [KUBECTL, "kustomize", str(BASE)], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    objects = [document for document in yaml.safe_load_all(rendered) if document]
    roles = {
        (item["kind"], item["metadata"]["name"]): item.get("rules") or []
        for item in objects
        if item["kind"] in ("ClusterRole", "Role")
    }
    granted: dict[str, dict[Grant, str]] = defaultdict(dict)
    for binding in objects:
        if binding["kind"] not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        reference = binding["roleRef"]
        key = (reference["kind"], reference["name"])
        assert key in roles, f"{binding['kind']} {binding['metadata']['name']} names no role of k8s/base"
        for subject in binding["subjects"]:
            assert subject["kind"] == "ServiceAccount", f"{binding['metadata']['name']}: {subject}"
            for rule in roles[key]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        for verb in rule["verbs"]:
                            granted[subject["name"]][(group, resource, verb)] = f"{key[0]} {key[1]}"
    return dict(granted)


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Audited]:
    config = tmp_path_factory.mktemp("rbac-audit") / "tensor-fusion.yaml"
    config.write_text(yaml.safe_dump(CONFIG))
    nodes = ["--fake-gpus", "H100:1", "--fake-gpus", "H100:1"]
    with running_kube_stack(nodes, TF_CONFIG_FILE=str(config), TF_DISCOVERY_INTERVAL_S="2") as stack:
        add_unusable_pool(stack)
        exercise_node_agents(stack)
        create_namespace(stack, NAMESPACE, labels={"gpu-migration": "enabled"})
        exercise_preemption_and_unschedulable(stack)
        exercise_defrag(stack)
        exercise_metrics(stack)
        yield audited(stack.audit_log)


def test_no_service_account_was_refused_anything(run: Audited) -> None:
    assert {"tfpool-webhook", "tfpool-scheduler", "tfpool-defrag-planner", "tfpool-node-agent"} <= run.seen
    assert run.denied == [], "a role of k8s/base lacks a verb a service uses"


def test_every_granted_verb_was_used_in_the_run(run: Audited) -> None:
    unused = [
        f"{role} grants {verb} on {f'{group}/' if group else ''}{resource} to {account}; no service used it"
        for account, grants in sorted(granted_by_base().items())
        for (group, resource, verb), role in sorted(grants.items())
        if (group, resource, verb) not in run.used.get(account, set())
        and (account, (group, resource, verb)) not in NOT_REACHED
    ]
    assert unused == [], "\n".join(unused)


def test_what_the_run_does_not_reach_is_still_granted() -> None:
    granted = granted_by_base()
    stale = [entry for entry in NOT_REACHED if entry[1] not in granted.get(entry[0], {})]
    assert stale == [], "NOT_REACHED names grants k8s/base no longer has"
