"""Every stop that reads a pod's GPU request agrees on it: the webhook, the scheduler's binding, the
device plugin and `tfctl submit` (local mode) read the same annotations the same way."""

from __future__ import annotations

from typing import Any

import pytest
from tfagent.core.deviceplugin import AllocationRefusedError, container_envs
from tfcommon.cluster.model import Pod
from tfcommon.config import TfConfig
from tfctl.commands.submit import submission_for
from tfscheduler.core import binding
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
