"""The live-migration guide (`../shared/seeds/gpu-live-migration.en.txt`) on `tfctl up --kubernetes`, with
kubectl as a user types it.

One stack (a real API server, kube-controller-manager with its disruption and ReplicaSet controllers,
KWOK nodes `sim-node-1` and `sim-node-2` with one H100 each, our five services in Kubernetes mode) whose
pool `default` lets the defrag planner drain any node of workloads older than a second. The layout is
shaped with `kubectl cordon`: the Deployment `serve` (two replicas, a PodDisruptionBudget of
maxUnavailable 1) runs on `sim-node-1`, the Deployment `solo` (no budget) on `sim-node-2`. In order:
- `kubectl label gpunode sim-node-1 tensor-fusion.ai/do-not-disrupt=true` keeps a campaign off the node;
- without the label, a campaign drains `sim-node-1` through the Eviction API, one pod at a time, and
  the ReplicaSet's replacements land on `sim-node-2`; `solo`, without a budget, is never moved;
- a budget the disruption controller computes as allowing nothing (minAvailable 2 of 2) keeps a
  campaign off the node, and the API server refuses the planner's own eviction of such a pod (its
  service account's token, through the planner's Kubernetes evictor);
- `kubectl cordon`, `kubectl delete pod`: the ReplicaSet's replacement is placed by our scheduler on
  the other node; `kubectl uncordon`.
"""

from __future__ import annotations

import asyncio
import copy
import json
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kube_stack_up import KubeStack, create_namespace, eventually, running_kube_stack
from stack_up import DEFRAG_EVERY_SECOND, bus_events, serve_budget
from test_manual_moves_local_stack import Stack as Tfctl
from tfcommon.cluster import EvictionBlocked
from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.events import DefragCampaignFinished

pytestmark = pytest.mark.e2e

NAMESPACE = "ml-serving"
SOURCE, TARGET = "sim-node-1", "sim-node-2"
DO_NOT_DISRUPT = "tensor-fusion.ai/do-not-disrupt"
PLANNER = "system:serviceaccount:tfpool-system:tfpool-defrag-planner"


def guide_configuration() -> dict[str, Any]:
    """`DEFRAG_EVERY_SECOND` with `default` as the default pool, and a minimum capacity that keeps
    compaction from marking an emptied node for deletion while the tests run."""
    configuration = copy.deepcopy(DEFRAG_EVERY_SECOND)
    [pool] = configuration["gpuPools"]
    pool["isDefault"] = True
    pool["specTemplate"]["capacityConfig"] = {"minResources": {"tflops": "10000", "vram": "10Ti"}}
    return configuration


def deployment(name: str, replicas: int) -> dict[str, Any]:
    """A Deployment whose pods each ask for 10 TFLOPS and 20Gi of one GPU."""
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {
                    "labels": {"app": name, "tensor-fusion.ai/enabled": "true"},
                    "annotations": {
                        "tensor-fusion.ai/tflops-request": "10",
                        "tensor-fusion.ai/tflops-limit": "10",
                        "tensor-fusion.ai/vram-request": "20Gi",
                        "tensor-fusion.ai/vram-limit": "20Gi",
                    },
                },
                "spec": {"containers": [{"name": "app", "image": "vllm"}]},
            },
        },
    }


class Guide:
    """The stack, kubectl, and tfctl as a user's shell has them (only `TF_STATE_DIR` and the URLs)."""

    def __init__(self, stack: KubeStack) -> None:
        self.stack = stack
        urls = {service["service"]: service["url"] for service in stack.summary["services"]}
        self.nats_url = next(i["url"] for i in stack.summary["infrastructure"] if i["name"] == "nats")
        self.tfctl = Tfctl(urls, self.nats_url, stack.state_dir, stack.state_dir.parent)

    def pods(self, app: str) -> dict[str, dict[str, Any]]:
        """The app's pods not being deleted, by name: uid, node, phase."""
        items = self.stack.kubectl_json("get", "pods", "-n", NAMESPACE, "-l", f"app={app}")["items"]
        return {
            pod["metadata"]["name"]: {
                "uid": pod["metadata"]["uid"],
                "node": pod["spec"].get("nodeName"),
                "phase": pod["status"].get("phase"),
            }
            for pod in items
            if not pod["metadata"].get("deletionTimestamp")
        }

    def running(self, app: str, replicas: int) -> dict[str, dict[str, Any]] | None:
        pods = self.pods(app)
        return pods if len(pods) == replicas and all(p["phase"] == "Running" for p in pods.values()) else None

    def plan(self) -> dict[str, Any]:
        document: dict[str, Any] = self.tfctl.read("defrag", "plan", "--pool", "default")
        return document

    def settled_plan(self) -> dict[str, Any]:
        """The plan once it judges both nodes, every workload is older than maxDuration (1s), both nodes
        are Ready (a KWOK node's heartbeat can lag on a loaded host) and the fixture's `kubectl uncordon`
        has reached the ledger's copy of the cordon (the scheduler checks every 0.5 s)."""

        def settled() -> dict[str, Any] | None:
            plan = self.plan()
            judged = {drain["node"] for drain in plan["drains"]} | {skip["node"] for skip in plan["skipped"]}
            passing = {skip["reason"] for skip in plan["skipped"]} & {"fresh-worker", "not-ready", "cordoned"}
            return plan if judged == {SOURCE, TARGET} and not passing else None

        return eventually("a plan judging both Ready nodes, without fresh workers", settled)

    def budget_status(self, name: str) -> dict[str, Any] | None:
        """The budget's status once the disruption controller has computed it for its current spec."""
        budget = self.stack.kubectl_json("get", "pdb", name, "-n", NAMESPACE)
        status: dict[str, Any] = budget.get("status") or {}
        fresh = status.get("observedGeneration") == budget["metadata"]["generation"]
        return status if fresh and "disruptionsAllowed" in status else None

    def run_campaign(self) -> DefragCampaignFinished:
        """`tfctl defrag run --pool default --now` and the campaign's DefragCampaignFinished."""
        finished_before = len(self.finished_campaigns())
        self.tfctl.ok("defrag", "run", "--pool", "default", "--now", "--max-duration-minutes", "2")
        finished = eventually(
            "the campaign's DefragCampaignFinished",
            lambda: (f := self.finished_campaigns())[finished_before:] and f,
            within_s=90,
        )
        return finished[finished_before]

    def finished_campaigns(self) -> list[DefragCampaignFinished]:
        events = asyncio.run(bus_events(self.nats_url))
        return [event for event in events if isinstance(event, DefragCampaignFinished)]

    def audited(self, user: str) -> list[dict[str, Any]]:
        """The API server's audit events of `user`'s requests on pods in the guide's namespace."""
        events = [json.loads(line) for line in self.stack.audit_log.read_text().splitlines()]
        return [
            event
            for event in events
            if event["user"]["username"] == user
            and event.get("objectRef", {}).get("resource") == "pods"
            and event["objectRef"].get("namespace") == NAMESPACE
        ]

    def evictions(self) -> list[dict[str, Any]]:
        """The audit events of the defrag planner's requests to the Eviction API."""
        return [e for e in self.audited(PLANNER) if e["objectRef"].get("subresource") == "eviction"]


@pytest.fixture(scope="module")
def guide(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guide]:
    """The stack with `serve` (two replicas and its budget) on SOURCE and `solo` on TARGET."""
    configuration = tmp_path_factory.mktemp("live-migration") / "tensor-fusion.yaml"
    configuration.write_text(yaml.safe_dump(guide_configuration()))
    arguments = ["--fake-gpus", "H100:1", "--fake-gpus", "H100:1"]
    with running_kube_stack(arguments, TF_CONFIG_FILE=str(configuration)) as stack:
        guide = Guide(stack)
        eventually("both GPUNodes", lambda: len(stack.kubectl_json("get", "gpunodes")["items"]) == 2)
        create_namespace(stack, NAMESPACE)
        stack.kubectl("cordon", TARGET)
        stack.apply(deployment("serve", 2))
        serve = eventually("serve's two pods Running", lambda: guide.running("serve", 2), within_s=60)
        assert {pod["node"] for pod in serve.values()} == {SOURCE}
        stack.kubectl("uncordon", TARGET)
        stack.kubectl("cordon", SOURCE)
        stack.apply(deployment("solo", 1))
        solo = eventually("solo's pod Running", lambda: guide.running("solo", 1), within_s=60)
        assert {pod["node"] for pod in solo.values()} == {TARGET}
        stack.kubectl("uncordon", SOURCE)
        stack.apply(serve_budget(NAMESPACE))
        yield guide


def test_the_disruption_controller_computes_the_budget_of_serve(guide: Guide) -> None:
    status = eventually("the budget's status", lambda: guide.budget_status("serve"))

    assert (status["currentHealthy"], status["desiredHealthy"], status["expectedPods"]) == (2, 1, 2)
    assert status["disruptionsAllowed"] == 1
    listed = guide.stack.kubectl("get", "pdb", "-n", NAMESPACE)
    assert listed.splitlines()[1].split()[:4] == ["serve", "N/A", "1", "1"]


def test_do_not_disrupt_on_the_gpunode_keeps_a_campaign_off_the_node(guide: Guide) -> None:
    plan = guide.settled_plan()
    assert [drain["node"] for drain in plan["drains"]] == [SOURCE], f"unlabelled, serve's node drains: {plan}"
    before = {**guide.pods("serve"), **guide.pods("solo")}

    labelled = guide.stack.kubectl("label", "gpunode", SOURCE, f"{DO_NOT_DISRUPT}=true")
    assert labelled.strip() == f"gpunode.tensor-fusion.ai/{SOURCE} labeled"
    kept = eventually("the plan to honour the label", lambda: (p := guide.plan())["drains"] == [] and p)
    [skip] = [skip for skip in kept["skipped"] if skip["node"] == SOURCE]
    assert skip["reason"] == "do-not-disrupt"
    finished = guide.run_campaign()

    assert (finished.outcome, finished.nodes_drained, finished.pods_evicted) == ("completed", 0, 0)
    assert {**guide.pods("serve"), **guide.pods("solo")} == before
    assert guide.evictions() == []
    guide.stack.kubectl("label", "gpunode", SOURCE, f"{DO_NOT_DISRUPT}-")
    eventually("the plan to drain the node again", lambda: guide.plan()["drains"])


def test_a_campaign_evicts_through_the_eviction_api_one_pod_at_a_time_and_skips_solo(guide: Guide) -> None:
    before = {"serve": guide.pods("serve"), "solo": guide.pods("solo")}
    plan = guide.settled_plan()
    assert [drain["node"] for drain in plan["drains"]] == [SOURCE], plan
    [drain] = plan["drains"]
    assert sorted(move["pod"] for move in drain["moves"]) == sorted(
        f"{NAMESPACE}/{name}" for name in before["serve"]
    )
    assert {move["to"] for move in drain["moves"]} == {TARGET}
    [kept] = [skip for skip in plan["skipped"] if skip["node"] == TARGET]
    [solo] = before["solo"]
    assert kept["reason"] == "missing-pdb"
    assert f"worker {NAMESPACE}/{solo} is not covered by a PodDisruptionBudget" in kept["message"]

    finished = guide.run_campaign()

    assert (finished.outcome, finished.nodes_drained, finished.pods_evicted) == ("completed", 1, 2)
    serve = eventually("serve's replacements Running", lambda: guide.running("serve", 2))
    assert {pod["node"] for pod in serve.values()} == {TARGET}
    assert not set(serve) & set(before["serve"]), "the ReplicaSet recreated both pods"
    assert guide.pods("solo") == before["solo"], "the workload without a budget is not moved"
    planner = guide.audited(PLANNER)
    evictions = guide.evictions()
    granted = [e["objectRef"]["name"] for e in evictions if e["responseStatus"]["code"] == 201]
    assert sorted(granted) == sorted(before["serve"]), "each pod evicted once, through the Eviction API"
    refused = {e["responseStatus"]["code"] for e in evictions} - {201}
    assert refused <= {429}, "the API server refused for the budget only"
    assert [e for e in planner if e["verb"] == "delete"] == [], "never deleted directly"
    scheduler = guide.audited("system:serviceaccount:tfpool-system:tfpool-scheduler")
    bindings = [
        (e["requestReceivedTimestamp"], e["objectRef"]["name"])
        for e in scheduler
        if e["objectRef"].get("subresource") == "binding" and e["responseStatus"]["code"] == 201
    ]
    last_eviction = max(
        e["requestReceivedTimestamp"] for e in evictions if e["responseStatus"]["code"] == 201
    )
    assert any(name in serve and at < last_eviction for at, name in bindings), (
        "one pod at a time: the first replacement was bound before the second eviction"
    )


def test_the_api_server_refuses_an_eviction_the_budget_forbids(guide: Guide) -> None:
    selector = serve_budget(NAMESPACE)["spec"]["selector"]
    guide.stack.apply({**serve_budget(NAMESPACE), "spec": {"minAvailable": 2, "selector": selector}})
    status = eventually("the stricter budget's status", lambda: guide.budget_status("serve"))
    assert (status["currentHealthy"], status["desiredHealthy"], status["disruptionsAllowed"]) == (2, 2, 0)
    before = guide.pods("serve")

    plan = guide.settled_plan()
    [skip] = [skip for skip in plan["skipped"] if skip["node"] == TARGET]
    assert skip["reason"] == "pdb-blocked"
    assert f"PodDisruptionBudget {NAMESPACE}/serve allows no disruption now" in skip["message"]
    assert plan["drains"] == []
    evictions_before = guide.evictions()
    finished = guide.run_campaign()
    assert (finished.nodes_drained, finished.pods_evicted) == (0, 0)
    assert guide.evictions() == evictions_before, "the planner sent no eviction"

    planner = KubernetesCluster.from_environment(
        kubeconfig=str(guide.stack.state_dir / "kubernetes" / "services" / "defrag-planner.kubeconfig")
    )
    try:
        refused = asyncio.run(planner.evict_pod(NAMESPACE, sorted(before)[0]))
    finally:
        planner.close()
    assert isinstance(refused, EvictionBlocked), refused
    assert "Cannot evict pod as it would violate the pod's disruption budget" in refused.reason
    assert "The disruption budget serve needs 2 healthy pods and has 2 currently" in refused.reason
    assert guide.pods("serve") == before
    guide.stack.apply(serve_budget(NAMESPACE))


def test_cordon_delete_the_replicaset_replacement_lands_on_the_other_node_uncordon(guide: Guide) -> None:
    serve = eventually("serve Running", lambda: guide.running("serve", 2))
    pod = sorted(serve)[0]
    node = serve[pod]["node"]
    [other] = {SOURCE, TARGET} - {node}

    assert guide.stack.kubectl("cordon", node) == f"node/{node} cordoned\n"
    deleted = guide.stack.kubectl("delete", "pod", pod, "-n", NAMESPACE)
    assert deleted.startswith(f'pod "{pod}" deleted')

    def replaced() -> list[str] | None:
        rows = guide.stack.kubectl("get", "pods", "-n", NAMESPACE, "-o", "wide").splitlines()[1:]
        columns = [row.split() for row in rows]
        new = [c for c in columns if c[0].startswith("serve-") and c[0] not in serve and c[2] == "Running"]
        return new[0] if new else None

    row = eventually("the replacement Running", replaced)
    assert row[6] == other, f"the replacement runs on {row[6]}, not on the other node {other}"
    replacement = guide.stack.kubectl_json("get", "pod", row[0], "-n", NAMESPACE)
    assert replacement["spec"]["schedulerName"] == "tensor-fusion-scheduler"
    assert replacement["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet"

    assert guide.stack.kubectl("uncordon", node) == f"node/{node} uncordoned\n"
    assert not guide.stack.kubectl_json("get", "node", node)["spec"].get("unschedulable")
