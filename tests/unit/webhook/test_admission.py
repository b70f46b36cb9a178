"""The admission decision: every behaviour and denial of issue 4, table-driven, on the pure core."""

from __future__ import annotations

import json
from typing import Any

import pytest
from tfcommon.config import TfConfig, parse_config
from tfwebhook.core.admission import AdmissionContext, Admitted, Denied, admit
from tfwebhook.testing import GPU, a_gpu_container, a_pod, apply, opted_in

ENABLED = {"tensor-fusion.ai/enabled": "true"}
T = "tensor-fusion.ai/"
POOLS = parse_config(
    """
gpuPools:
  - name: training
    isDefault: true
    specTemplate: {qosConfig: {defaultQoS: low}}
  - name: inference
  - name: remote-only
    specTemplate: {defaultUsingLocalGPU: false}
"""
)


def decide(pod: dict[str, Any], config: TfConfig | None = None, **context: Any) -> Admitted | Denied:
    return admit(pod, AdmissionContext(config or TfConfig(), **context))


def admitted(
    pod: dict[str, Any], config: TfConfig | None = None, **context: Any
) -> tuple[Admitted, dict[str, Any]]:
    verdict = decide(pod, config, **context)
    assert isinstance(verdict, Admitted), verdict
    return verdict, apply(pod, verdict.patch)


def annotations_of(pod: dict[str, Any]) -> dict[str, str]:
    return {
        k.removeprefix(T): v for k, v in pod["metadata"].get("annotations", {}).items() if k.startswith(T)
    }


UNCHANGED_CASES = [
    pytest.param(a_pod(), id="no label and no native GPU"),
    pytest.param(a_pod(containers=[a_gpu_container()]), id="native GPU without opt-in or auto-migration"),
    pytest.param(
        a_pod(labels={f"{T}enabled": "false"}, annotations=opted_in(tflops_request="1")),
        id="enabled false keeps a pod out",
    ),
    pytest.param(
        a_pod(annotations=opted_in(tflops_request="-1")), id="annotations are ignored without opt-in"
    ),
]


@pytest.mark.parametrize("pod", UNCHANGED_CASES)
def test_pods_that_are_not_gpu_pool_pods_pass_with_no_patch(pod: dict[str, Any]) -> None:
    verdict = decide(pod)
    assert isinstance(verdict, Admitted)
    assert verdict.patch == []
    assert not verdict.is_gpu_pod


def test_fractional_pod_gets_every_resolved_value_written_back() -> None:
    pod = a_pod(labels=ENABLED, annotations=opted_in(tflops_limit="20", vram_request="4Gi", vram_limit="8Gi"))
    verdict, mutated = admitted(pod)
    assert annotations_of(mutated) == {
        "tflops-request": "20",
        "tflops-limit": "20",
        "vram-request": "4Gi",
        "vram-limit": "8Gi",
        "gpu-count": "1",
        "qos": "medium",
        "isolation": "soft",
        "gpupool": "default",
        "inject-container": "app",
        "container-gpu-count": '{"app":1}',
    }
    assert mutated["metadata"]["labels"] == {
        **ENABLED,
        f"{T}component": "worker",
        f"{T}workload": "trainer",
        f"{T}gpupool": "default",
    }
    assert mutated["spec"]["schedulerName"] == "tensor-fusion-scheduler"
    assert mutated["spec"]["containers"][0]["resources"]["limits"] == {}
    assert verdict.awaiting_pod_index == (0,)
    assert verdict.request is not None
    assert (verdict.request.tflops_request_milli, verdict.request.vram_limit_bytes) == (20_000, 8 * 1024**3)


@pytest.mark.parametrize(
    ("annotations", "expected"),
    [
        pytest.param(
            opted_in(tflops_request="10", vram_request="8Gi"),
            ("10", "10", "8Gi", "8Gi"),
            id="limits from requests",
        ),
        pytest.param(
            opted_in(tflops_limit="10", vram_limit="8Gi"),
            ("10", "10", "8Gi", "8Gi"),
            id="requests from limits",
        ),
        pytest.param(
            opted_in(tflops_request="1.5", tflops_limit="3", vram_request="1G", vram_limit="2G"),
            ("1.5", "3", "1G", "2G"),
            id="user spelling kept",
        ),
    ],
)
def test_a_missing_request_or_limit_takes_the_other_value(
    annotations: dict[str, str], expected: tuple[str, ...]
) -> None:
    _, mutated = admitted(a_pod(labels=ENABLED, annotations=annotations))
    written = annotations_of(mutated)
    assert (
        written["tflops-request"],
        written["tflops-limit"],
        written["vram-request"],
        written["vram-limit"],
    ) == expected


@pytest.mark.parametrize(
    ("annotations", "config", "qos", "priority_class"),
    [
        pytest.param(
            opted_in(tflops_request="10", vram_request="8Gi"), None, "high", "tensor-fusion-high", id="equal"
        ),
        pytest.param(
            opted_in(tflops_request="10", tflops_limit="20", vram_request="8Gi"),
            None,
            "medium",
            None,
            id="unequal",
        ),
        pytest.param(
            opted_in(tflops_request="10", tflops_limit="20", vram_request="8Gi"),
            POOLS,
            "low",
            None,
            id="pool default",
        ),
        pytest.param(
            opted_in(tflops_request="10", vram_request="0"), None, "medium", None, id="zero vram never high"
        ),
        pytest.param(
            opted_in(compute_percent_request="50", vram_request="1Gi"),
            None,
            "high",
            "tensor-fusion-high",
            id="percent",
        ),
        pytest.param(
            opted_in(tflops_request="1", vram_request="1Gi", qos="critical"),
            None,
            "critical",
            "tensor-fusion-critical",
            id="critical",
        ),
        pytest.param(
            opted_in(tflops_request="1", vram_request="1Gi", qos="low"), None, "low", None, id="explicit low"
        ),
    ],
)
def test_qos_default_and_priority_class(
    annotations: dict[str, str], config: TfConfig | None, qos: str, priority_class: str | None
) -> None:
    verdict, mutated = admitted(a_pod(labels=ENABLED, annotations=annotations, priority=0), config)
    assert annotations_of(mutated)["qos"] == qos
    assert mutated["spec"].get("priorityClassName") == priority_class
    assert ("priority" in mutated["spec"]) == (priority_class is None)
    assert verdict.request is not None
    assert verdict.request.qos == qos


def test_a_named_priority_class_is_kept() -> None:
    pod = a_pod(
        labels=ENABLED, annotations=opted_in(tflops_request="1", vram_request="1Gi"), priorityClassName="mine"
    )
    _, mutated = admitted(pod)
    assert mutated["spec"]["priorityClassName"] == "mine"


def test_native_gpu_conversion_touches_only_the_gpu_containers() -> None:
    sidecar = {"name": "log", "image": "img", "resources": {"limits": {"cpu": "1"}}}
    pod = a_pod(
        labels=ENABLED,
        annotations=opted_in(isolation="shared"),
        containers=[a_gpu_container("app", {"nvidia.com/gpu": "2", "memory": "1Gi"}), sidecar],
    )
    verdict, mutated = admitted(pod)
    app, log = mutated["spec"]["containers"]
    assert app["resources"]["limits"] == {"memory": "1Gi"}
    assert verdict.awaiting_pod_index == (0,)
    assert log == sidecar
    written = annotations_of(mutated)
    assert (written["gpu-count"], written["inject-container"], written["container-gpu-count"]) == (
        "2",
        "app",
        '{"app":2}',
    )
    assert written["vendor"] == "NVIDIA"
    assert "tflops-request" not in written
    assert verdict.migrated_resource == "nvidia.com/gpu"


def test_gpu_count_is_the_sum_of_native_limits_and_requests_go_too() -> None:
    first = a_gpu_container("a", {"amd.com/gpu": 1})
    first["resources"]["requests"] = {"amd.com/gpu": 1}
    pod = a_pod(
        labels=ENABLED,
        annotations=opted_in(isolation="shared"),
        containers=[first, a_gpu_container("b", {"amd.com/gpu": 3})],
    )
    _, mutated = admitted(pod)
    assert annotations_of(mutated)["gpu-count"] == "4"
    assert annotations_of(mutated)["container-gpu-count"] == '{"a":1,"b":3}'
    assert "requests" not in mutated["spec"]["containers"][0]["resources"]
    assert annotations_of(mutated)["vendor"] == "AMD"


@pytest.mark.parametrize(
    ("annotations", "count"),
    [
        pytest.param(opted_in(gpu_count="4"), "4", id="gpu-count"),
        pytest.param(opted_in(gpu_indices="0,3,5"), "3", id="gpu-indices"),
        pytest.param({}, "1", id="default"),
    ],
)
def test_gpu_count_sources(annotations: dict[str, str], count: str) -> None:
    pod = a_pod(
        labels=ENABLED, annotations={**annotations, **opted_in(tflops_request="1", vram_request="1Gi")}
    )
    _, mutated = admitted(pod)
    assert annotations_of(mutated)["gpu-count"] == count


def test_dedicated_gpu_takes_the_whole_card_of_the_model() -> None:
    pod = a_pod(labels=ENABLED, annotations=opted_in(dedicated_gpu="true", gpu_model="H100"))
    verdict, mutated = admitted(pod)
    written = annotations_of(mutated)
    assert (written["tflops-request"], written["tflops-limit"], written["vram-limit"]) == (
        "989400m",
        "989400m",
        "80Gi",
    )
    assert written["qos"] == "high"
    assert verdict.request is not None
    assert verdict.request.gpu_model == "H100"


def test_workload_label_comes_from_the_controller_even_before_the_pod_has_a_name() -> None:
    pod = a_pod(
        labels={**ENABLED, "pod-template-hash": "5d8f7c"},
        annotations=opted_in(tflops_request="1", vram_request="1Gi"),
        name=None,
        owner=("ReplicaSet", "web-5d8f7c"),
    )
    verdict, mutated = admitted(pod)
    assert mutated["metadata"]["labels"][f"{T}workload"] == "web"
    assert verdict.workload is not None
    assert verdict.workload.name == "web-5d8f7c"


@pytest.mark.parametrize(
    ("owner", "name", "workload"),
    [
        pytest.param(("Job", "nightly-29123456"), None, "nightly", id="cronjob"),
        pytest.param(("StatefulSet", "db"), "db-0", "db", id="statefulset"),
        pytest.param(None, "solo", "solo", id="bare pod"),
        pytest.param(("Job", "x" * 80), None, "x" * 54 + "-", id="long name shortened"),
    ],
)
def test_workload_naming(owner: tuple[str, str] | None, name: str | None, workload: str) -> None:
    pod = a_pod(
        labels=ENABLED, annotations=opted_in(tflops_request="1", vram_request="1Gi"), name=name, owner=owner
    )
    _, mutated = admitted(pod)
    label = mutated["metadata"]["labels"][f"{T}workload"]
    assert label.startswith(workload)
    assert len(label) <= 63


def test_enabled_replicas_claims_a_slot_for_a_controlled_pod() -> None:
    pod = a_pod(
        labels={**ENABLED, "pod-template-hash": "abc"},
        annotations=opted_in(isolation="shared", enabled_replicas="2"),
        containers=[a_gpu_container()],
        name=None,
        owner=("ReplicaSet", "web-abc"),
    )
    verdict, mutated = admitted(pod, takeover_slot_id="req-7")
    assert verdict.takeover is not None
    assert (verdict.takeover.workload_key, verdict.takeover.limit) == ("ml-team-a/ReplicaSet/web-abc/abc", 2)
    assert annotations_of(mutated)["takeover-slot"] == "req-7"
    again = decide(mutated, takeover_slot_id="req-8")
    assert isinstance(again, Admitted)
    assert again.patch == []
    assert again.takeover is not None
    assert again.takeover.slot_id == "req-7"


@pytest.mark.parametrize(
    "pod",
    [
        pytest.param(
            a_pod(
                labels=ENABLED,
                annotations=opted_in(tflops_request="1", vram_request="1Gi", enabled_replicas="1"),
            ),
            id="no controller",
        ),
        pytest.param(
            a_pod(
                annotations=opted_in(enabled_replicas="1"),
                containers=[a_gpu_container()],
                owner=("ReplicaSet", "w-1"),
            ),
            id="not opted in",
        ),
    ],
)
def test_enabled_replicas_has_no_effect(pod: dict[str, Any]) -> None:
    verdict = decide(pod)
    assert isinstance(verdict, Admitted)
    assert verdict.takeover is None


AUTO = parse_config(
    """
dynamicConfig:
  autoMigration:
    enable: true
    scope:
      includes:
        namespaceNames: [ml-team-a]
        namespaceSelector: {matchLabels: {gpu: migrate}}
      excludes:
        podSelector:
          matchLabels:
            gpu-migration: skip
"""
)


@pytest.mark.parametrize(
    ("namespace", "namespace_labels", "pod_labels", "migrated"),
    [
        pytest.param("ml-team-a", None, {}, True, id="included by name"),
        pytest.param("other", {"gpu": "migrate"}, {}, True, id="included by namespace selector"),
        pytest.param("other", None, {}, False, id="not included"),
        pytest.param("ml-team-a", None, {"gpu-migration": "skip"}, False, id="excludes first"),
        pytest.param("ml-team-a", None, {f"{T}enabled": "false"}, False, id="opted out"),
    ],
)
def test_automatic_migration_scope(
    namespace: str, namespace_labels: dict[str, str] | None, pod_labels: dict[str, str], migrated: bool
) -> None:
    pod = a_pod(labels=pod_labels, containers=[a_gpu_container()], namespace=namespace)
    verdict, mutated = admitted(pod, AUTO, namespace=namespace, namespace_labels=namespace_labels)
    assert verdict.is_gpu_pod == migrated
    if migrated:
        assert mutated["metadata"]["labels"][f"{T}enabled"] == "true"
        assert annotations_of(mutated)["isolation"] == "shared"


def test_automatic_migration_keeps_a_named_isolation_and_needs_no_scope() -> None:
    config = parse_config("dynamicConfig: {autoMigration: {enable: true}}")
    pod = a_pod(
        annotations=opted_in(isolation="soft", tflops_request="5", vram_request="1Gi"),
        containers=[a_gpu_container()],
        namespace="any",
    )
    _, mutated = admitted(pod, config)
    assert annotations_of(mutated)["isolation"] == "soft"


def test_pool_annotation_selects_the_pool_and_becomes_a_label() -> None:
    pod = a_pod(
        labels=ENABLED, annotations=opted_in(gpupool="inference", tflops_request="1", vram_request="1Gi")
    )
    _, mutated = admitted(pod, POOLS)
    assert mutated["metadata"]["labels"][f"{T}gpupool"] == "inference"


DENIALS = [
    ("tflops-request", opted_in(tflops_request="lots", vram_request="1Gi"), "e.g. 20"),
    ("tflops-request", opted_in(tflops_request="-2"), "negative"),
    ("vram-request", opted_in(tflops_request="1", vram_request="1.5"), "16Gi"),
    (
        "tflops-limit is below",
        opted_in(tflops_request="20", tflops_limit="10", vram_request="1Gi"),
        "at least as large",
    ),
    (
        "vram-limit is below",
        opted_in(tflops_request="1", vram_request="2Gi", vram_limit="1Gi"),
        "at least as large",
    ),
    ("compute-percent-request", opted_in(compute_percent_request="150", vram_request="1Gi"), "0 to 100"),
    (
        "compute-percent",
        opted_in(compute_percent_request="50", tflops_request="10", vram_request="1Gi"),
        "not both",
    ),
    ("gpu-count", opted_in(gpu_count="0", tflops_request="1", vram_request="1Gi"), "1 to 128"),
    ("gpu-count", opted_in(gpu_count="129", tflops_request="1", vram_request="1Gi"), "1 to 128"),
    ("gpu-indices", opted_in(gpu_indices="0,a", tflops_request="1", vram_request="1Gi"), "0,1"),
    (
        "isolation",
        opted_in(isolation="strict", tflops_request="1", vram_request="1Gi"),
        "shared, soft, hard, partitioned",
    ),
    ("qos", opted_in(qos="urgent", tflops_request="1", vram_request="1Gi"), "low, medium, high, critical"),
    ("gpu-model", opted_in(dedicated_gpu="true"), "e.g. H100"),
    ("gpu-model", opted_in(dedicated_gpu="true", gpu_model="Z9000"), "H100"),
    ("gpupool", opted_in(gpupool="nope", tflops_request="1", vram_request="1Gi"), "known pools"),
    (
        "is-local-gpu",
        opted_in(is_local_gpu="false", tflops_request="1", vram_request="1Gi"),
        "not supported yet",
    ),
    (
        "is-local-gpu",
        opted_in(gpupool="remote-only", tflops_request="1", vram_request="1Gi"),
        "defaultUsingLocalGPU",
    ),
    ("tflops-request", opted_in(), "isolation: shared"),
    ("enabled-replicas", opted_in(enabled_replicas="25%", isolation="shared"), "whole number"),
    (
        "autoscale-target",
        opted_in(autoscale="true", autoscale_target="gpu", tflops_request="1", vram_request="1Gi"),
        "compute, vram, all",
    ),
    (
        "inject-container",
        opted_in(inject_container="missing", tflops_request="1", vram_request="1Gi"),
        "from: app",
    ),
]


@pytest.mark.parametrize(
    ("annotation", "annotations", "hint"), DENIALS, ids=[f"{d[0]}-{i}" for i, d in enumerate(DENIALS)]
)
def test_denials_name_the_annotation_and_a_valid_value(
    annotation: str, annotations: dict[str, str], hint: str
) -> None:
    verdict = decide(a_pod(labels=ENABLED, annotations=annotations), POOLS)
    assert isinstance(verdict, Denied), verdict
    assert annotation in verdict.message
    assert hint in verdict.message
    assert verdict.code == 400


def test_several_containers_without_a_choice_are_denied() -> None:
    containers = [{"name": "app", "image": "i"}, {"name": "proxy", "image": "i"}]
    verdict = decide(
        a_pod(
            labels=ENABLED,
            annotations=opted_in(tflops_request="1", vram_request="1Gi"),
            containers=containers,
        )
    )
    assert isinstance(verdict, Denied)
    assert "tensor-fusion.ai/inject-container" in verdict.message
    assert "e.g. app" in verdict.message


def test_shared_mode_allows_all_zero_requests() -> None:
    verdict = decide(a_pod(labels=ENABLED, annotations=opted_in(isolation="shared")))
    assert isinstance(verdict, Admitted)
    assert verdict.is_gpu_pod


@pytest.mark.parametrize(
    "pod",
    [
        pytest.param(
            a_pod(
                labels=ENABLED, annotations=opted_in(tflops_limit="20", vram_request="4Gi", vram_limit="8Gi")
            ),
            id="fractional",
        ),
        pytest.param(
            a_pod(
                labels=ENABLED,
                annotations=opted_in(isolation="shared"),
                containers=[a_gpu_container(), {"name": "s"}],
            ),
            id="native",
        ),
        pytest.param(a_pod(containers=[a_gpu_container()]), id="auto-migrated"),
        pytest.param(
            a_pod(
                labels=ENABLED, annotations=opted_in(compute_percent_limit="30", vram_limit="1Gi", qos="high")
            ),
            id="percent",
        ),
    ],
)
def test_admitting_a_mutated_pod_again_yields_an_empty_patch(pod: dict[str, Any]) -> None:
    config = parse_config("dynamicConfig: {autoMigration: {enable: true}}")
    first, mutated = admitted(pod, config)
    assert first.patch
    second = decide(mutated, config)
    assert isinstance(second, Admitted)
    assert second.patch == []
    assert second.request == first.request


def test_the_patch_is_one_diff_that_reproduces_the_mutated_pod() -> None:
    pod = a_pod(labels=ENABLED, annotations=opted_in(isolation="shared"), containers=[a_gpu_container()])
    verdict, mutated = admitted(pod)
    paths = [operation["path"] for operation in verdict.patch]
    assert len(paths) == len(set(paths))
    assert json.loads(json.dumps(mutated)) == mutated
    assert "/spec/containers/0/resources/limits/nvidia.com~1gpu" in paths
    assert GPU.keys().isdisjoint(mutated["spec"]["containers"][0]["resources"]["limits"])
