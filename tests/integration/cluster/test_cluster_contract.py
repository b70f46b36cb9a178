"""The `Cluster` contract, run against the in-memory fake and against the Kubernetes adapter over HTTP."""

from __future__ import annotations

from cluster_harness import SCHEDULER, Harness, a_budget, a_node, a_pod, next_event, summary
from tfcommon.cluster import (
    Applied,
    Bound,
    Conflict,
    CustomResource,
    Evicted,
    EvictionBlocked,
    NotFound,
    PodEventType,
    Taint,
)


async def test_lists_only_pods_waiting_for_our_scheduler(harness: Harness) -> None:
    harness.put_pod(a_pod("waiting"))
    harness.put_pod(a_pod("bound", node="node-a"))
    harness.put_pod(a_pod("foreign", scheduler="default-scheduler"))
    harness.put_pod(a_pod("done", phase="Succeeded"))

    pending = await harness.cluster.list_pending_pods(SCHEDULER)

    assert [pod.name for pod in pending.items] == ["waiting"]
    assert pending.resource_version


async def test_gets_a_pod_and_none_when_it_is_missing(harness: Harness) -> None:
    harness.put_pod(a_pod("one", labels={"app": "x"}))

    pod = await harness.cluster.get_pod("default", "one")

    assert pod is not None
    assert (pod.name, pod.labels["app"], pod.scheduler_name) == ("one", "x", SCHEDULER)
    assert pod.uid
    assert pod.resource_version
    assert await harness.cluster.get_pod("default", "absent") is None


async def test_lists_pods_by_node_namespace_and_labels(harness: Harness) -> None:
    harness.put_pod(a_pod("a1", node="node-a", labels={"app": "web"}))
    harness.put_pod(a_pod("a2", node="node-a", labels={"app": "db"}))
    harness.put_pod(a_pod("b1", node="node-b", labels={"app": "web"}))
    harness.put_pod(a_pod("other", namespace="team", node="node-a", labels={"app": "web"}))

    on_a = await harness.cluster.list_pods(node_name="node-a")
    web_on_a_here = await harness.cluster.list_pods(
        namespace="default", node_name="node-a", labels={"app": "web"}
    )

    assert sorted(p.name for p in on_a) == ["a1", "a2", "other"]
    assert [p.name for p in web_on_a_here] == ["a1"]


async def test_reads_node_taints_cordon_capacity_and_readiness(harness: Harness) -> None:
    harness.put_node(
        a_node("gpu-1", unschedulable=True, taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    )
    harness.put_node(a_node("gpu-2"))

    node = await harness.cluster.get_node("gpu-1")
    listed = await harness.cluster.list_nodes(labels={"kubernetes.io/hostname": "gpu-2"})

    assert node is not None
    assert node.cordoned
    assert node.taints == (Taint(key="nvidia.com/gpu", value="", effect="NoSchedule"),)
    assert (node.allocatable_cpu_milli, node.allocatable_memory_bytes) == (7910, 32 * 1024**3)
    assert node.ready
    assert [n.name for n in listed] == ["gpu-2"]
    assert await harness.cluster.get_node("absent") is None


async def test_lists_disruption_budgets_with_selector_and_allowance(harness: Harness) -> None:
    harness.put_budget(a_budget("web-pdb", "web", allowed=0))

    [budget] = await harness.cluster.list_disruption_budgets("default")

    assert budget.name == "web-pdb"
    assert budget.disruptions_allowed == 0
    assert budget.selector is not None
    assert dict(budget.selector.match_labels) == {"app": "web"}
    assert await harness.cluster.list_disruption_budgets("elsewhere") == []


async def test_patches_pod_annotations_and_labels_and_none_removes_a_key(harness: Harness) -> None:
    harness.put_pod(a_pod("p", labels={"keep": "1", "drop": "1"}))

    result = await harness.cluster.patch_pod_metadata(
        "default",
        "p",
        labels={"drop": None},
        annotations={"tensor-fusion.ai/gpu-ids": "gpu-aaaa,gpu-bbbb"},
    )

    pod = await harness.cluster.get_pod("default", "p")
    assert isinstance(result, Applied)
    assert pod is not None
    assert dict(pod.labels) == {"keep": "1"}
    assert pod.annotations["tensor-fusion.ai/gpu-ids"] == "gpu-aaaa,gpu-bbbb"
    assert pod.resource_version == result.resource_version


async def test_a_stale_resource_version_is_a_conflict_and_changes_nothing(harness: Harness) -> None:
    harness.put_pod(a_pod("p"))
    before = await harness.cluster.get_pod("default", "p")
    assert before is not None
    first = await harness.cluster.patch_pod_metadata(
        "default", "p", annotations={"owner": "replica-1"}, resource_version=before.resource_version
    )

    second = await harness.cluster.patch_pod_metadata(
        "default", "p", annotations={"owner": "replica-2"}, resource_version=before.resource_version
    )

    after = await harness.cluster.get_pod("default", "p")
    assert isinstance(first, Applied)
    assert isinstance(second, Conflict)
    assert "modified" in second.message
    assert after is not None
    assert after.annotations["owner"] == "replica-1"


async def test_patching_a_missing_pod_is_not_found(harness: Harness) -> None:
    result = await harness.cluster.patch_pod_metadata("default", "ghost", annotations={"a": "b"})

    assert isinstance(result, NotFound)


async def test_binds_a_pod_once_and_a_second_binding_conflicts(harness: Harness) -> None:
    harness.put_pod(a_pod("p"))
    pod = await harness.cluster.get_pod("default", "p")
    assert pod is not None

    first = await harness.cluster.bind_pod("default", "p", "node-a", uid=pod.uid)
    second = await harness.cluster.bind_pod("default", "p", "node-b", uid=pod.uid)

    bound = await harness.cluster.get_pod("default", "p")
    assert first == Bound("node-a")
    assert isinstance(second, Conflict)
    assert bound is not None
    assert bound.node_name == "node-a"
    assert (await harness.cluster.list_pending_pods(SCHEDULER)).items == ()


async def test_a_binding_sets_its_annotations_on_the_pod_in_the_same_write(harness: Harness) -> None:
    manifest = a_pod("p")
    manifest["metadata"]["annotations"] = {"kept": "yes"}
    harness.put_pod(manifest)
    pod = await harness.cluster.get_pod("default", "p")
    assert pod is not None
    ids = {"tensor-fusion.ai/gpu-ids": "gpu-1,gpu-2"}

    first = await harness.cluster.bind_pod("default", "p", "node-a", uid=pod.uid, annotations=ids)
    second = await harness.cluster.bind_pod(
        "default", "p", "node-b", uid=pod.uid, annotations={"tensor-fusion.ai/gpu-ids": "gpu-9"}
    )

    bound = await harness.cluster.get_pod("default", "p")
    assert first == Bound("node-a")
    assert isinstance(second, Conflict)
    assert bound is not None
    assert bound.node_name == "node-a"
    assert bound.annotations["tensor-fusion.ai/gpu-ids"] == "gpu-1,gpu-2"  # the refused binding wrote nothing
    assert bound.annotations["kept"] == "yes"


async def test_binding_a_recreated_pod_with_the_old_uid_conflicts(harness: Harness) -> None:
    harness.put_pod(a_pod("p"))

    result = await harness.cluster.bind_pod("default", "p", "node-a", uid="uid-of-an-earlier-pod")

    pod = await harness.cluster.get_pod("default", "p")
    assert isinstance(result, Conflict)
    assert pod is not None
    assert pod.node_name is None


async def test_binding_a_missing_pod_is_not_found(harness: Harness) -> None:
    assert isinstance(await harness.cluster.bind_pod("default", "ghost", "node-a"), NotFound)


async def test_eviction_allowed_by_the_budget_removes_the_pod(harness: Harness) -> None:
    harness.put_budget(a_budget("web-pdb", "web", allowed=1))
    harness.put_pod(a_pod("web-1", node="node-a", labels={"app": "web"}))

    result = await harness.cluster.evict_pod("default", "web-1")

    [budget] = await harness.cluster.list_disruption_budgets("default")
    assert result == Evicted()
    assert await harness.cluster.get_pod("default", "web-1") is None
    assert budget.disruptions_allowed == 0


async def test_eviction_refused_by_the_budget_is_a_typed_result_with_the_reason(harness: Harness) -> None:
    harness.put_budget(a_budget("web-pdb", "web", allowed=0))
    harness.put_pod(a_pod("web-1", node="node-a", labels={"app": "web"}))

    result = await harness.cluster.evict_pod("default", "web-1")

    assert isinstance(result, EvictionBlocked)
    assert "disruption budget" in result.reason
    assert "web-pdb" in result.reason
    assert await harness.cluster.get_pod("default", "web-1") is not None


async def test_evicting_a_missing_pod_is_not_found(harness: Harness) -> None:
    assert isinstance(await harness.cluster.evict_pod("default", "ghost"), NotFound)


async def test_unschedulable_pod_gets_the_condition_and_an_event(harness: Harness) -> None:
    harness.put_pod(a_pod("p"))
    pod = await harness.cluster.get_pod("default", "p")
    assert pod is not None
    message = "0/3 GPUs fit: 2 insufficient VRAM, 1 wrong GPU model"

    await harness.cluster.report_unschedulable(pod, message, reporter=SCHEDULER)

    stored = harness.pod("default", "p")
    assert stored is not None
    [condition] = [c for c in stored["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert (condition["status"], condition["reason"]) == ("False", "Unschedulable")
    assert condition["message"] == message
    [event] = harness.events()
    assert (event["type"], event["reason"], event["message"]) == ("Warning", "FailedScheduling", message)
    assert event["involvedObject"]["name"] == "p"
    assert event["involvedObject"]["uid"] == pod.uid
    assert event["source"]["component"] == SCHEDULER


async def test_node_markers_are_set_and_cleared(harness: Harness) -> None:
    harness.put_node(a_node("gpu-1"))

    marked = await harness.cluster.patch_node_metadata(
        "gpu-1",
        labels={"tensor-fusion.ai/defrag-source": "true"},
        annotations={
            "tensor-fusion.ai/defrag-source-since": "2026-01-01T03:00:00Z",
            "tensor-fusion.ai/defrag-source-pool": "pool-a",
        },
    )
    during = await harness.cluster.list_nodes(labels={"tensor-fusion.ai/defrag-source": "true"})
    cleared = await harness.cluster.patch_node_metadata(
        "gpu-1",
        labels={"tensor-fusion.ai/defrag-source": None},
        annotations={
            "tensor-fusion.ai/defrag-source-since": None,
            "tensor-fusion.ai/defrag-source-pool": None,
        },
    )
    after = await harness.cluster.get_node("gpu-1")

    assert isinstance(marked, Applied)
    assert isinstance(cleared, Applied)
    assert [n.annotations["tensor-fusion.ai/defrag-source-pool"] for n in during] == ["pool-a"]
    assert after is not None
    assert "tensor-fusion.ai/defrag-source" not in after.labels
    assert not any(key.startswith("tensor-fusion.ai/defrag") for key in after.annotations)


async def test_custom_resource_status_is_patched_through_the_status_subresource(harness: Harness) -> None:
    harness.put_custom(
        CustomResource.GPU,
        {
            "apiVersion": "tensor-fusion.ai/v1",
            "kind": "GPU",
            "metadata": {"name": "gpu-0a1b"},
            "status": {"capacity": {"tflops": "989", "vram": "80Gi"}, "available": {"tflops": "989"}},
        },
    )
    before = await harness.cluster.get_custom_object(CustomResource.GPU, "gpu-0a1b")
    assert before is not None

    result = await harness.cluster.patch_custom_status(
        CustomResource.GPU,
        "gpu-0a1b",
        {"available": {"tflops": "969", "vram": "64Gi"}},
        resource_version=before.resource_version,
    )
    stale = await harness.cluster.patch_custom_status(
        CustomResource.GPU,
        "gpu-0a1b",
        {"available": {"tflops": "1"}},
        resource_version=before.resource_version,
    )

    after = await harness.cluster.get_custom_object(CustomResource.GPU, "gpu-0a1b")
    listed = await harness.cluster.list_custom_objects(CustomResource.GPU)
    assert isinstance(result, Applied)
    assert isinstance(stale, Conflict)
    assert after is not None
    assert after.status["available"] == {"tflops": "969", "vram": "64Gi"}
    assert after.status["capacity"] == {"tflops": "989", "vram": "80Gi"}
    assert [o.name for o in listed] == ["gpu-0a1b"]
    assert await harness.cluster.get_custom_object(CustomResource.GPU_POOL, "absent") is None
    assert isinstance(
        await harness.cluster.patch_custom_status(CustomResource.GPU_POOL, "absent", {"phase": "Running"}),
        NotFound,
    )


async def test_watch_lists_existing_pods_once_then_streams_changes(harness: Harness) -> None:
    harness.put_pod(a_pod("a"))
    harness.put_pod(a_pod("b", node="node-a"))
    harness.put_pod(a_pod("foreign", scheduler="default-scheduler"))
    watch = harness.cluster.watch_pods(SCHEDULER)
    try:
        initial = sorted([summary(await next_event(watch)), summary(await next_event(watch))])
        harness.put_pod(a_pod("c"))
        added = await next_event(watch)
        assert isinstance(await harness.cluster.bind_pod("default", "c", "node-b"), Bound)
        bound = await next_event(watch)
        harness.delete_pod("default", "a")
        deleted = await next_event(watch)
    finally:
        await watch.aclose()

    assert initial == [("ADDED", "a"), ("ADDED", "b")]
    assert summary(added) == ("ADDED", "c")
    assert summary(bound) == ("MODIFIED", "c")
    assert bound.pod.node_name == "node-b"
    assert summary(deleted) == ("DELETED", "a")


async def test_watch_resumed_from_its_cursor_delivers_only_later_changes(harness: Harness) -> None:
    harness.put_pod(a_pod("a"))
    first = harness.cluster.watch_pods(SCHEDULER)
    try:
        assert summary(await next_event(first)) == ("ADDED", "a")
    finally:
        await first.aclose()
    cursor = first.cursor
    harness.put_pod(a_pod("b"))

    resumed = harness.cluster.watch_pods(SCHEDULER, cursor=cursor)
    try:
        event = await next_event(resumed)
        harness.put_pod(a_pod("sentinel"))
        after = await next_event(resumed)
    finally:
        await resumed.aclose()

    assert summary(event) == ("ADDED", "b")
    assert summary(after) == ("ADDED", "sentinel")


async def test_watch_after_410_gone_relists_and_delivers_exactly_the_missed_changes(harness: Harness) -> None:
    for name in ("changed", "unchanged", "removed"):
        harness.put_pod(a_pod(name))
    first = harness.cluster.watch_pods(SCHEDULER)
    try:
        assert sorted([summary(await next_event(first)) for _ in range(3)]) == [
            ("ADDED", "changed"),
            ("ADDED", "removed"),
            ("ADDED", "unchanged"),
        ]
    finally:
        await first.aclose()
    cursor = first.cursor
    changed = await harness.cluster.patch_pod_metadata("default", "changed", annotations={"x": "1"})
    assert isinstance(changed, Applied)
    harness.delete_pod("default", "removed")
    harness.put_pod(a_pod("new"))
    harness.forget_watch_history()

    resumed = harness.cluster.watch_pods(SCHEDULER, cursor=cursor)
    try:
        missed = [summary(await next_event(resumed)) for _ in range(3)]
        harness.put_pod(a_pod("sentinel"))
        after = await next_event(resumed)
    finally:
        await resumed.aclose()

    assert missed == [("DELETED", "removed"), ("MODIFIED", "changed"), ("ADDED", "new")]
    assert summary(after) == ("ADDED", "sentinel")
    assert after.type is PodEventType.ADDED
