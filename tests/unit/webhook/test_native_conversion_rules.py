"""TensorFusion's conversion of native device-plugin GPUs (`nvidia.com/gpu`, ...) at admission, one test
per rule of the reference (tensorfusion-behaviour.md §1.2 step 1 and §1.7 "nvidia.com/gpu conversion"), on
the pure core. `docs/webhook.md` ("Native GPU conversion") lists each rule with the test that pins it,
and says where we differ on purpose."""

from __future__ import annotations

from typing import Any

import pytest
from tfcommon.config import TfConfig, parse_config
from tfcommon.quota import parse_quota
from tfwebhook.core.admission import AdmissionContext, Admitted, Denied, admit
from tfwebhook.testing import a_gpu_container, a_pod, apply, opted_in

T = "tensor-fusion.ai/"
ENABLED = {f"{T}enabled": "true"}
AUTO = parse_config(
    "dynamicConfig: {autoMigration: {enable: true, scope: {includes: {namespaceNames: [ml-team-a]}}}}"
)


def native_pod(
    *containers: dict[str, Any], labels: dict[str, str] | None = None, **annotations: str
) -> dict[str, Any]:
    """A pod in the migrated namespace whose containers hold native GPU limits (one `nvidia.com/gpu`)."""
    return a_pod(
        labels=labels, annotations=opted_in(**annotations), containers=list(containers) or [a_gpu_container()]
    )


def converted(
    pod: dict[str, Any], config: TfConfig = AUTO, **context: Any
) -> tuple[Admitted, dict[str, Any]]:
    verdict = admit(pod, AdmissionContext(config, **context))
    assert isinstance(verdict, Admitted), verdict
    assert verdict.is_gpu_pod, verdict.reason
    return verdict, apply(pod, verdict.patch)


def written(pod: dict[str, Any]) -> dict[str, str]:
    annotations: dict[str, str] = pod["metadata"].get("annotations", {})
    return {key.removeprefix(T): value for key, value in annotations.items() if key.startswith(T)}


def test_rule_automatic_migration_labels_the_pod_enabled() -> None:
    _, pod = converted(native_pod())
    assert pod["metadata"]["labels"][f"{T}enabled"] == "true"
    assert pod["spec"]["schedulerName"] == "tensor-fusion-scheduler"


@pytest.mark.parametrize(
    ("named", "isolation"),
    [(None, "shared"), ("soft", "soft"), ("hard", "hard"), ("partitioned", "partitioned")],
)
def test_rule_automatic_migration_sets_shared_only_where_the_pod_names_no_isolation(
    named: str | None, isolation: str
) -> None:
    verdict, pod = converted(native_pod(**({"isolation": named} if named else {})))
    assert written(pod)["isolation"] == isolation
    assert verdict.request is not None
    assert verdict.request.isolation == isolation


def test_rule_a_pod_labelled_enabled_false_is_never_migrated() -> None:
    pod = native_pod(labels={f"{T}enabled": "false"}, isolation="soft")
    verdict = admit(pod, AdmissionContext(AUTO))
    assert isinstance(verdict, Admitted)
    assert (verdict.patch, verdict.is_gpu_pod) == ([], False)


def test_rule_gpu_count_is_the_sum_of_the_native_limits_unless_annotated() -> None:
    containers = (a_gpu_container("a", {"nvidia.com/gpu": 2}), a_gpu_container("b", {"nvidia.com/gpu": "1"}))
    verdict, pod = converted(native_pod(*containers))
    assert written(pod)["gpu-count"] == "3"
    assert verdict.request is not None
    assert verdict.request.gpu_count == 3
    _, pod = converted(native_pod(*containers, gpu_count="1"))
    assert written(pod)["gpu-count"] == "1"


def test_rule_inject_container_lists_the_containers_with_native_limits_unless_annotated() -> None:
    sidecar = {"name": "log", "image": "img", "resources": {"limits": {"cpu": "1"}}}
    containers = (a_gpu_container("app"), sidecar, a_gpu_container("worker"))
    _, pod = converted(native_pod(*containers))
    assert written(pod)["inject-container"] == "app,worker"
    assert pod["spec"]["containers"][1] == sidecar
    _, pod = converted(native_pod(*containers, inject_container="worker"))
    assert written(pod)["inject-container"] == "worker"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {"nvidia.com/gpu": 1}


def test_rule_container_gpu_count_records_each_containers_native_limit() -> None:
    containers = (a_gpu_container("app", {"nvidia.com/gpu": 2}), a_gpu_container("worker"))
    _, pod = converted(native_pod(*containers))
    assert written(pod)["container-gpu-count"] == '{"app":2,"worker":1}'


@pytest.mark.parametrize(("resource", "vendor"), [("nvidia.com/gpu", "NVIDIA"), ("amd.com/gpu", "AMD")])
def test_rule_the_vendor_comes_from_the_resource_name_unless_annotated(resource: str, vendor: str) -> None:
    container = a_gpu_container(limits={resource: 1})
    verdict, pod = converted(native_pod(container))
    assert written(pod)["vendor"] == vendor
    assert verdict.migrated_resource == resource
    _, pod = converted(native_pod(container, vendor="Other"))
    assert written(pod)["vendor"] == "Other"


def test_rule_shared_reserves_whole_gpus_with_no_fractional_request() -> None:
    verdict, pod = converted(native_pod(a_gpu_container(limits={"nvidia.com/gpu": 2})))
    assert verdict.request is not None
    request = verdict.request
    assert (request.isolation, request.gpu_count) == ("shared", 2)
    assert (request.tflops_request_milli, request.compute_percent_request, request.vram_request_bytes) == (
        0,
        None,
        0,
    )
    assert {"tflops-request", "compute-percent-request", "vram-request"}.isdisjoint(written(pod))


@pytest.mark.parametrize("isolation", ["soft", "hard", "partitioned"])
def test_rule_another_isolation_asks_for_100_percent_of_each_gpu(isolation: str) -> None:
    """Issue 16 item 7: such a pod was denied ("every GPU request is zero")."""
    verdict, pod = converted(native_pod(a_gpu_container(limits={"nvidia.com/gpu": 2}), isolation=isolation))
    annotations = written(pod)
    assert (annotations["compute-percent-request"], annotations["compute-percent-limit"]) == ("100", "100")
    assert "tflops-request" not in annotations
    assert verdict.request is not None
    assert (verdict.request.compute_percent_request, verdict.request.gpu_count) == (100, 2)
    assert verdict.request.isolation == isolation
    assert "nvidia.com/gpu" not in pod["spec"]["containers"][0]["resources"]["limits"]


def test_rule_an_opted_in_pod_that_names_no_isolation_takes_the_default_with_100_percent() -> None:
    verdict, pod = converted(native_pod(labels=ENABLED), TfConfig())
    assert written(pod)["isolation"] == "soft"
    assert verdict.request is not None
    assert verdict.request.compute_percent_request == 100


@pytest.mark.parametrize(
    ("annotations", "tflops"),
    [
        pytest.param({"tflops_request": "20"}, (20_000, 20_000), id="tflops-request"),
        pytest.param({"tflops_limit": "40"}, (40_000, 40_000), id="tflops-limit"),
        pytest.param({"tflops_request": "10", "tflops_limit": "30"}, (10_000, 30_000), id="both"),
    ],
)
def test_rule_tflops_annotations_clear_the_100_percent(
    annotations: dict[str, str], tflops: tuple[int, int]
) -> None:
    verdict, pod = converted(native_pod(isolation="soft", **annotations))
    assert verdict.request is not None
    assert verdict.request.compute_percent_request is None
    assert (verdict.request.tflops_request_milli, verdict.request.tflops_limit_milli) == tflops
    assert {"compute-percent-request", "compute-percent-limit"}.isdisjoint(written(pod))


@pytest.mark.parametrize(
    ("annotations", "percent"),
    [
        pytest.param({"compute_percent_limit": "60"}, ("60", "60"), id="limit"),
        pytest.param({"compute_percent_request": "30"}, ("30", "100"), id="request"),
    ],
)
def test_rule_compute_percent_annotations_keep_their_values(
    annotations: dict[str, str], percent: tuple[str, str]
) -> None:
    _, pod = converted(native_pod(isolation="hard", **annotations))
    assert (written(pod)["compute-percent-request"], written(pod)["compute-percent-limit"]) == percent


def test_rule_native_limits_and_requests_are_removed_from_the_handed_over_containers() -> None:
    container = a_gpu_container(limits={"nvidia.com/gpu": 1, "memory": "1Gi"})
    container["resources"]["requests"] = {"nvidia.com/gpu": 1, "cpu": "2"}
    verdict, pod = converted(native_pod(container, isolation="soft"))
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["requests"] == {"cpu": "2"}
    assert resources["limits"] == {"memory": "1Gi"}
    assert {"op": "remove", "path": "/spec/containers/0/resources/limits/nvidia.com~1gpu"} in verdict.patch


def test_rule_the_native_resource_names_come_from_the_configuration() -> None:
    config = parse_config(
        "nativeGpuResourceNames: [example.com/gpu]\ndynamicConfig: {autoMigration: {enable: true}}"
    )
    verdict, pod = converted(native_pod(a_gpu_container(limits={"example.com/gpu": 1})), config)
    assert verdict.migrated_resource == "example.com/gpu"
    assert pod["spec"]["containers"][0]["resources"]["limits"] == {}
    untouched = admit(native_pod(), AdmissionContext(config))
    assert isinstance(untouched, Admitted)
    assert (untouched.patch, untouched.is_gpu_pod) == ([], False)


def test_rule_a_pod_with_no_request_and_no_native_gpu_is_still_denied() -> None:
    pod = a_pod(labels=ENABLED, annotations=opted_in(isolation="soft"))
    verdict = admit(pod, AdmissionContext(AUTO))
    assert isinstance(verdict, Denied)
    assert "every GPU request is zero" in verdict.message


@pytest.mark.parametrize("isolation", ["soft", None])
def test_a_converted_pod_admitted_again_keeps_its_request_and_gets_an_empty_patch(
    isolation: str | None,
) -> None:
    first, pod = converted(native_pod(**({"isolation": isolation} if isolation else {})))
    again = admit(pod, AdmissionContext(AUTO))
    assert isinstance(again, Admitted)
    assert (again.patch, again.request) == ([], first.request)


def test_difference_a_gpu_count_annotation_does_not_stop_the_conversion() -> None:
    containers = (a_gpu_container("app"), {"name": "log", "image": "img"})
    verdict, pod = converted(native_pod(*containers, isolation="soft", gpu_count="2"))
    annotations = written(pod)
    assert (annotations["inject-container"], annotations["container-gpu-count"]) == ("app", '{"app":2}')
    assert verdict.request is not None
    assert (verdict.request.gpu_count, verdict.request.compute_percent_request) == (2, 100)


@pytest.mark.parametrize("value", ["1.5", "-1", "lots"])
def test_difference_an_unreadable_native_limit_is_denied_naming_it(value: str) -> None:
    verdict = admit(native_pod(a_gpu_container(limits={"nvidia.com/gpu": value})), AdmissionContext(AUTO))
    assert isinstance(verdict, Denied)
    assert "container 'app' limits[nvidia.com/gpu]" in verdict.message
    assert "whole number" in verdict.message


def test_difference_a_namespace_quota_fills_only_the_vram_of_a_converted_pod() -> None:
    quota = parse_quota(
        {
            "kind": "GPUResourceQuota",
            "metadata": {"namespace": "ml-team-a", "name": "team"},
            "spec": {
                "single": {
                    "defaultRequests": {"tflops": "250m", "vram": "512Mi"},
                    "defaultLimits": {"vram": "1Gi"},
                }
            },
        }
    )
    verdict, pod = converted(native_pod(isolation="soft"), quota=quota)
    assert verdict.request is not None
    request = verdict.request
    assert (request.compute_percent_request, request.tflops_request_milli) == (100, 0)
    assert (written(pod)["vram-request"], written(pod)["vram-limit"]) == ("512Mi", "1Gi")
