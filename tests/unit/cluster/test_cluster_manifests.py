"""Reading Kubernetes JSON into the port's value types, and the selectors the defrag rules rely on."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from tfcommon.cluster import LabelSelector, Pod, PodDisruptionBudget
from tfcommon.cluster.manifests import (
    ManifestError,
    label_selector_from_manifest,
    node_from_manifest,
    pod_from_manifest,
    scheduling_event,
    unschedulable_condition,
)
from tfcommon.cluster.memory import merge_patch


def test_reads_the_pod_fields_placement_uses() -> None:
    pod = pod_from_manifest(
        {
            "metadata": {
                "name": "w",
                "namespace": "ml",
                "uid": "u1",
                "resourceVersion": "42",
                "annotations": {"tensor-fusion.ai/vram-request": "16Gi"},
                "creationTimestamp": "2026-03-01T10:00:00Z",
                "ownerReferences": [{"kind": "ReplicaSet", "name": "rs", "uid": "r", "controller": True}],
            },
            "spec": {
                "schedulerName": "tensor-fusion-scheduler",
                "priority": 1000,
                "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
                "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
            },
            "status": {"phase": "Pending"},
        }
    )

    assert pod.is_pending_for("tensor-fusion-scheduler")
    assert not pod.is_pending_for("default-scheduler")
    assert pod.priority == 1000
    assert pod.tolerations[0].operator == "Exists"
    assert pod.containers[0].limits == {"nvidia.com/gpu": "1"}
    assert pod.owner_references[0].controller
    assert pod.created_at == datetime(2026, 3, 1, 10, tzinfo=UTC)


def test_a_pod_being_deleted_or_finished_is_not_pending() -> None:
    deleting = pod_from_manifest({"metadata": {"name": "a", "deletionTimestamp": "2026-03-01T10:00:00Z"}})
    finished = pod_from_manifest({"metadata": {"name": "b"}, "status": {"phase": "Failed"}})

    assert not deleting.is_pending_for("default-scheduler")
    assert not finished.is_pending_for("default-scheduler")


def test_reads_node_capacity_exactly() -> None:
    node = node_from_manifest(
        {
            "metadata": {"name": "n"},
            "status": {"allocatable": {"cpu": "95500m", "memory": "1056947232Ki"}},
        }
    )

    assert node.allocatable_cpu_milli == 95_500
    assert node.allocatable_memory_bytes == 1_056_947_232 * 1024
    assert not node.ready


def test_a_malformed_node_quantity_names_the_node_and_field() -> None:
    with pytest.raises(ManifestError, match=r"node n: status\.allocatable\.memory"):
        node_from_manifest({"metadata": {"name": "n"}, "status": {"allocatable": {"memory": "lots"}}})


@pytest.mark.parametrize(
    ("selector", "labels", "matches"),
    [
        pytest.param({"matchLabels": {"app": "web"}}, {"app": "web", "x": "1"}, True, id="labels-match"),
        pytest.param({"matchLabels": {"app": "web"}}, {"app": "db"}, False, id="labels-differ"),
        pytest.param(
            {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["a", "b"]}]},
            {"tier": "b"},
            True,
            id="in",
        ),
        pytest.param(
            {"matchExpressions": [{"key": "tier", "operator": "NotIn", "values": ["a"]}]},
            {"tier": "a"},
            False,
            id="not-in",
        ),
        pytest.param({"matchExpressions": [{"key": "t", "operator": "Exists"}]}, {}, False, id="exists"),
        pytest.param({"matchExpressions": [{"key": "t", "operator": "DoesNotExist"}]}, {}, True, id="absent"),
    ],
)
def test_label_selectors_match_like_kubernetes(
    selector: dict[str, object], labels: dict[str, str], matches: bool
) -> None:
    parsed = label_selector_from_manifest(selector)

    assert parsed is not None
    assert parsed.matches(labels) is matches


def test_a_budget_with_an_empty_selector_covers_no_pod() -> None:
    pod = Pod(namespace="default", name="p", labels={"app": "web"})

    empty = PodDisruptionBudget(namespace="default", name="all", selector=LabelSelector())
    explicit = PodDisruptionBudget(namespace="default", name="web", selector=LabelSelector({"app": "web"}))
    elsewhere = PodDisruptionBudget(namespace="other", name="web", selector=LabelSelector({"app": "web"}))

    assert not empty.covers(pod)
    assert explicit.covers(pod)
    assert not elsewhere.covers(pod)


def test_unschedulable_condition_and_event_carry_the_message() -> None:
    now = datetime(2026, 3, 1, 10, tzinfo=UTC)
    pod = Pod(namespace="ml", name="w", uid="u1")

    condition = unschedulable_condition("0/2 GPUs fit", now)
    event = scheduling_event(pod, "0/2 GPUs fit", "tensor-fusion-scheduler", now)

    assert condition == {
        "type": "PodScheduled",
        "status": "False",
        "reason": "Unschedulable",
        "message": "0/2 GPUs fit",
        "lastTransitionTime": "2026-03-01T10:00:00Z",
    }
    assert event["metadata"]["namespace"] == "ml"
    assert event["involvedObject"] == {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": "ml",
        "name": "w",
        "uid": "u1",
        "resourceVersion": "",
    }
    assert (event["type"], event["reason"]) == ("Warning", "FailedScheduling")


def test_merge_patch_merges_maps_replaces_lists_and_deletes_nulls() -> None:
    target = {"a": {"b": 1, "c": 2}, "l": [1], "gone": 1}

    merged = merge_patch(target, {"a": {"c": 3}, "l": [2], "gone": None})

    assert merged == {"a": {"b": 1, "c": 3}, "l": [2]}
