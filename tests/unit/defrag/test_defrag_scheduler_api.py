"""The local-mode cluster's pure parts: scheduler workloads as pods, nodes, the PodDisruptionBudget file
and the budgets' status computed from the workloads (as the disruption controller would)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from tfcommon.cluster import LabelSelector, Pod
from tfdefrag.adapters.scheduler_api import (
    BudgetSpec,
    DisruptionBudgetError,
    SchedulerApiCluster,
    budget_status,
    load_budgets,
    node_from_api,
    parse_budgets,
    pod_from_workload,
)

PLACED = {
    "id": "5f0c7a52-8d7e-4b0a-9a55-0d4c1f1d2a11",
    "namespace": "ml-serving",
    "name": "serve-1",
    "uid": "uid-1",
    "owner": "serve",
    "state": "placed",
    "pool": "default",
    "node": "sim-node-1",
    "gpu_uuids": ["gpu-a"],
    "labels": {"app": "serve"},
    "annotations": {"tensor-fusion.ai/gpu-model": "H100", "tensor-fusion.ai/gpu-ids": "gpu-a"},
    "node_selector": {"zone": "a"},
    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    "submitted_at": "2026-12-02T10:00:00Z",
    "placed_at": "2026-12-02T10:00:01Z",
    "reason": None,
}
BUDGET = """
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: serve, namespace: ml-serving}
spec:
  maxUnavailable: 1
  selector: {matchLabels: {app: serve}}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: batch}
spec:
  minAvailable: 50%
  selector:
    matchExpressions: [{key: tier, operator: In, values: [batch]}]
"""


def a_pod(
    name: str, *, node: str | None = "sim-node-1", namespace: str = "ml-serving", app: str = "serve"
) -> Pod:
    return Pod(namespace=namespace, name=name, uid=f"uid-{name}", labels={"app": app}, node_name=node)


def test_a_placed_workload_is_a_bound_running_pod_with_its_labels_owner_and_submission_time() -> None:
    pod = pod_from_workload(PLACED)

    assert (pod.namespace, pod.name, pod.uid) == ("ml-serving", "serve-1", "uid-1")
    assert (pod.node_name, pod.phase, pod.is_bound) == ("sim-node-1", "Running", True)
    assert pod.labels == {"app": "serve"}
    assert pod.annotations["tensor-fusion.ai/gpu-model"] == "H100"
    assert pod.node_selector == {"zone": "a"}
    assert [(t.key, t.operator, t.effect) for t in pod.tolerations] == [("gpu", "Exists", "NoSchedule")]
    [owner] = pod.owner_references
    assert (owner.name, owner.controller) == ("serve", True)
    assert pod.created_at == datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
    assert pod.resource_version == "uid-1", "a replacement (new uid) is a new version"


def test_a_pending_workload_is_an_unbound_pod_and_a_pod_owning_itself_has_no_owner() -> None:
    pod = pod_from_workload({**PLACED, "node": None, "state": "pending", "owner": "serve-1"})

    assert (pod.node_name, pod.phase) == (None, "Pending")
    assert pod.is_pending_for("tensor-fusion-scheduler")
    assert pod.owner_references == ()


def test_a_node_keeps_its_ledger_labels_and_cordon_and_leaves_readiness_to_the_ledger() -> None:
    node = node_from_api(
        {
            "name": "sim-node-1",
            "pool": "default",
            "schedulable": False,
            "cordoned": True,
            "labels": {"tensor-fusion.ai/defrag-source": "true"},
            "annotations": {"tensor-fusion.ai/defrag-source-pool": "default"},
        }
    )

    assert (node.name, node.cordoned) == ("sim-node-1", True)
    assert node.labels == {"tensor-fusion.ai/defrag-source": "true"}
    assert node.annotations == {"tensor-fusion.ai/defrag-source-pool": "default"}
    assert node.conditions == (), "the snapshot then takes readiness from the ledger row"


def test_the_budget_file_gives_each_budget_its_selector_and_amount() -> None:
    serve, batch = parse_budgets(BUDGET, "pdb.yaml")

    assert (serve.namespace, serve.name, serve.max_unavailable, serve.min_available) == (
        "ml-serving",
        "serve",
        1,
        None,
    )
    assert serve.selector.matches({"app": "serve"})
    assert (batch.namespace, batch.min_available) == ("default", "50%")
    assert batch.selector.matches({"tier": "batch"})
    assert not batch.selector.matches({"tier": "web"})


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ("kind: Pod\napiVersion: v1", "pdb.yaml (document 1): kind is 'Pod'; use kind: PodDisruptionBudget"),
        (
            "kind: PodDisruptionBudget\napiVersion: policy/v1beta1",
            "apiVersion is 'policy/v1beta1'; use apiVersion: policy/v1",
        ),
        (
            "kind: PodDisruptionBudget\napiVersion: policy/v1\nmetadata: {name: a}\n"
            "spec: {minAvailable: 1, maxUnavailable: 1, selector: {matchLabels: {app: a}}}",
            "set exactly one of minAvailable and maxUnavailable",
        ),
        (
            "kind: PodDisruptionBudget\napiVersion: policy/v1\nmetadata: {name: a}\n"
            "spec: {minAvailable: 150%, selector: {matchLabels: {app: a}}}",
            "spec.minAvailable is '150%'; use a whole number >= 0 or a percentage such as 50%",
        ),
        (
            "kind: PodDisruptionBudget\napiVersion: policy/v1\nmetadata: {name: a}\n"
            "spec: {maxUnavailable: 1, selector: {}}",
            "spec.selector is {}; an empty selector protects nothing in defrag",
        ),
        (
            "kind: PodDisruptionBudget\napiVersion: policy/v1\nmetadata: {name: a}\n"
            "spec: {maxUnavailable: 1, selector: {matchExpressions: [{key: a, operator: Is}]}}",
            "spec.selector.matchExpressions[0].operator is 'Is'; use one of In, NotIn, Exists, DoesNotExist",
        ),
        ("---\n- a list", "the document is ['a list']; write a PodDisruptionBudget manifest"),
    ],
)
def test_an_invalid_budget_names_the_document_the_field_and_the_fix(document: str, message: str) -> None:
    with pytest.raises(DisruptionBudgetError) as raised:
        parse_budgets(document, "pdb.yaml")

    assert message in str(raised.value)


def test_an_unreadable_budget_file_names_the_setting(tmp_path: Path) -> None:
    with pytest.raises(DisruptionBudgetError, match="TF_DEFRAG_PDB_FILE"):
        load_budgets(tmp_path / "missing.yaml")
    with pytest.raises(DisruptionBudgetError, match="TF_DEFRAG_PDB_FILE"):
        SchedulerApiCluster("http://127.0.0.1:1", api_token=None, pdb_file=tmp_path / "missing.yaml")


def test_a_budget_allows_what_its_placed_workloads_can_spare() -> None:
    spec = BudgetSpec("ml-serving", "serve", LabelSelector({"app": "serve"}), max_unavailable=1)
    others = [a_pod("web", app="web"), a_pod("serve-x", namespace="other")]

    both_placed = budget_status(spec, [a_pod("serve-1"), a_pod("serve-2"), *others])
    one_replacement_pending = budget_status(spec, [a_pod("serve-1"), a_pod("serve-2", node=None)])

    assert (both_placed.current_healthy, both_placed.desired_healthy, both_placed.disruptions_allowed) == (
        2,
        1,
        1,
    )
    assert one_replacement_pending.disruptions_allowed == 0, "one at a time: wait for the replacement"
    assert both_placed.covers(a_pod("serve-1"))


def test_a_percentage_rounds_up_as_the_disruption_controller_does() -> None:
    selector = LabelSelector({"app": "serve"})
    pods = [a_pod(f"serve-{n}") for n in range(3)]

    at_least_half = budget_status(BudgetSpec("ml-serving", "s", selector, min_available="50%"), pods)
    a_third_may_go = budget_status(BudgetSpec("ml-serving", "s", selector, max_unavailable="34%"), pods)

    assert (at_least_half.desired_healthy, at_least_half.disruptions_allowed) == (2, 1)
    assert (a_third_may_go.desired_healthy, a_third_may_go.disruptions_allowed) == (1, 2)
