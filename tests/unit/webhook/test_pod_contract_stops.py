"""Every stop that reads a pod's GPU request agrees on it: the webhook, the scheduler's binding, the
device plugin and `tfctl submit` (local mode) read the same annotations the same way."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any
from uuid import uuid4

import pytest
from hypothesis import given
from hypothesis import strategies as st
from tfagent.core.deviceplugin import AllocationRefusedError, container_envs
from tfcommon.cluster.model import Pod
from tfcommon.config import TfConfig
from tfcommon.events import GpuRequest, WorkloadRef
from tfcommon.pod_request import gpu_request_annotations, gpu_request_of
from tfctl.commands.submit import submission_for
from tfdefrag.adapters.scheduler_api import pod_from_workload
from tfscheduler.api import workload_listing
from tfscheduler.core import binding
from tfscheduler.submission import Submission
from tfscheduler.workloads import StoredWorkload
from tfwebhook.core.admission import AdmissionContext, Admitted, Denied, admit
from tfwebhook.testing import a_pod, apply, opted_in

T = "tensor-fusion.ai/"
ENABLED = {f"{T}enabled": "true"}
PERCENT_LIMIT = f"{T}compute-percent-limit"
PERCENT_HINT = "a whole percentage of one GPU from 0 to 100, e.g. 50"


def _cluster_pod(annotations: dict[str, str]) -> Pod:
    return Pod(namespace="ml-team-a", name="trainer", uid="u-1", annotations=annotations)


@pytest.mark.parametrize("value", ["50%", "fifty", "150"])
def test_a_percent_the_webhook_refuses_is_refused_by_the_scheduler_and_the_device_plugin(value: str) -> None:
    pod = a_pod(labels=ENABLED, annotations=opted_in(compute_percent_limit=value, vram_request="1Gi"))
    verdict = admit(pod, AdmissionContext(TfConfig()))
    assert isinstance(verdict, Denied), verdict
    assert verdict.message.startswith(f"annotation {PERCENT_LIMIT}: {value!r} is ")
    assert verdict.message.endswith(PERCENT_HINT)

    annotations = {PERCENT_LIMIT: value, f"{T}vram-request": "1Gi", f"{T}isolation": "soft"}
    with pytest.raises(binding.PodRequestError) as scheduler_error:
        binding.pod_work(_cluster_pod(annotations))
    assert str(scheduler_error.value) == verdict.message

    with pytest.raises(AllocationRefusedError) as plugin_error:
        container_envs(_cluster_pod(annotations), ["gpu-a"], {"gpu-a": 100_000}, None)
    assert str(plugin_error.value) == f"pod ml-team-a/trainer: {verdict.message}"


def test_a_percent_the_webhook_admits_is_the_same_percent_at_every_stop() -> None:
    pod = a_pod(labels=ENABLED, annotations=opted_in(compute_percent_limit="50", vram_request="1Gi"))
    verdict = admit(pod, AdmissionContext(TfConfig()))
    assert isinstance(verdict, Admitted)
    assert verdict.request is not None
    written = apply(pod, verdict.patch)["metadata"]["annotations"]
    admitted = _cluster_pod(written)
    assert binding.pod_work(admitted).submission.request == verdict.request
    envs, _ = container_envs(admitted, ["gpu-a"], {"gpu-a": 100_000}, None)
    assert envs["CUDA_DEVICE_SM_LIMIT"] == "50"


def _submitted(annotations: dict[str, str], **spec: Any) -> dict[str, Any]:
    pod = a_pod(labels=ENABLED, annotations=opted_in(tflops_request="20", vram_request="1Gi", **annotations))
    pod["spec"].update(spec)
    submission = submission_for(pod, "ml-team-a", None)
    assert isinstance(submission, dict), submission
    return submission


@pytest.mark.parametrize(
    ("qos", "priority"), [("low", 0), ("medium", 0), ("high", 10_000), ("critical", 100_000)]
)
def test_tfctl_submit_gives_a_qos_the_priority_its_priority_class_has_in_kubernetes(
    qos: str, priority: int
) -> None:
    assert _submitted({"qos": qos})["priority"] == priority


def test_tfctl_submit_keeps_a_priority_class_the_pod_names_itself() -> None:
    assert _submitted({"qos": "high"}, priorityClassName="tensor-fusion-critical")["priority"] == 100_000


def test_tfctl_submit_carries_eviction_protection_as_the_scheduler_reads_it_in_kubernetes() -> None:
    submission = _submitted({"eviction_protection": "1h30m"})
    assert submission["eviction_protection_s"] == 5400
    annotations = {f"{T}tflops-request": "20", f"{T}vram-request": "1Gi", f"{T}eviction-protection": "1h30m"}
    assert binding.pod_work(_cluster_pod(annotations)).submission.eviction_protection_s == 5400


def test_tfctl_submit_refuses_an_eviction_protection_that_is_no_duration() -> None:
    pod = a_pod(labels=ENABLED, annotations=opted_in(tflops_request="20", eviction_protection="soon"))
    assert submission_for(pod, "ml-team-a", None) == (
        f"denied by admission: annotation {T}eviction-protection: 'soon' is not a duration; "
        "use Go syntax, e.g. 30m or 1h30m"
    )


def test_the_local_scheduler_api_lists_a_workload_with_the_request_the_defrag_planner_reads_back() -> None:
    request = GpuRequest(
        pool="training",
        gpu_count=2,
        tflops_request_milli=0,
        tflops_limit_milli=0,
        vram_request_bytes=8 * 1024**3,
        vram_limit_bytes=16 * 1024**3,
        compute_percent_request=30,
        gpu_model="H100",
        qos="high",
        isolation="hard",
    )
    submission = Submission(workload=WorkloadRef(namespace="ml-team-a", name="trainer"), request=request)
    stored = StoredWorkload(uuid4(), submission, "placed", None, datetime.now(UTC))
    listed = pod_from_workload(workload_listing(stored, None))
    assert gpu_request_of(listed) == request


@given(
    st.builds(
        GpuRequest,
        pool=st.sampled_from(["default", "training"]),
        gpu_count=st.integers(1, 128),
        tflops_request_milli=st.integers(0, 10**6),
        tflops_limit_milli=st.just(0),
        vram_request_bytes=st.integers(0, 2**40),
        vram_limit_bytes=st.just(0),
        compute_percent_request=st.none(),
        gpu_model=st.sampled_from([None, "H100", "A100-SXM4-80GB"]),
        qos=st.sampled_from(["low", "medium", "high", "critical"]),
        isolation=st.sampled_from(["shared", "soft", "hard", "partitioned"]),
    ),
    st.integers(0, 10**6),
    st.integers(0, 2**40),
    st.one_of(st.none(), st.integers(0, 100)),
)
def test_a_request_written_as_annotations_reads_back_the_same(
    base: GpuRequest, tflops_extra: int, vram_extra: int, percent: int | None
) -> None:
    request = base.model_copy(
        update={
            "tflops_request_milli": 0 if percent is not None else base.tflops_request_milli,
            "tflops_limit_milli": 0 if percent is not None else base.tflops_request_milli + tflops_extra,
            "vram_limit_bytes": base.vram_request_bytes + vram_extra,
            "compute_percent_request": percent,
        }
    )
    written = gpu_request_annotations(request)
    assert gpu_request_of(_cluster_pod(written)) == request
