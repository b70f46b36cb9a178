"""`tensor-fusion.ai/*` keys outside the vocabulary are denied with the key they resemble; every key the
code reads or writes, and TensorFusion's others, are accepted; docs/webhook.md lists exactly them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from tfcommon import pod_request, pod_spec
from tfcommon.config import TfConfig
from tfcommon.device_slots import POD_INDEX_ANNOTATION, RESOURCE_PREFIX
from tfctl.commands.submit import submission_for
from tfctl.main import main
from tfscheduler.core import binding
from tfwebhook.core import admission, vocabulary
from tfwebhook.core.admission import AdmissionContext, Admitted, Denied, admit
from tfwebhook.core.autoscale import AUTOSCALE_SOURCE
from tfwebhook.testing import a_gpu_container, a_pod, apply, opted_in

T = "tensor-fusion.ai/"
ENABLED = {f"{T}enabled": "true"}
DOCS = Path(__file__).resolve().parents[3] / "docs" / "webhook.md"


def decide(pod: dict[str, Any]) -> Admitted | Denied:
    return admit(pod, AdmissionContext(TfConfig()))


def denial(pod: dict[str, Any]) -> str:
    verdict = decide(pod)
    assert isinstance(verdict, Denied), verdict
    return verdict.message


def test_a_misspelled_annotation_is_denied_with_the_key_it_resembles() -> None:
    pod = a_pod(labels=ENABLED, annotations=opted_in(tflop_request="20", vram_request="16Gi"))
    assert denial(pod) == (
        "unknown annotation tensor-fusion.ai/tflop-request; did you mean tensor-fusion.ai/tflops-request?"
    )


@pytest.mark.parametrize(
    ("labels", "annotations", "message"),
    [
        pytest.param(
            {**ENABLED, f"{T}gpu-pool": "default"},
            {},
            "unknown label tensor-fusion.ai/gpu-pool; did you mean tensor-fusion.ai/gpupool?",
            id="a misspelled label",
        ),
        pytest.param(
            ENABLED,
            {f"{T}VRAM-limit": "8Gi"},
            "unknown annotation tensor-fusion.ai/VRAM-limit; did you mean tensor-fusion.ai/vram-limit?",
            id="wrong case",
        ),
        pytest.param(
            ENABLED,
            {f"{T}enabled": "true"},
            "annotation tensor-fusion.ai/enabled is read as a label: move it to metadata.labels",
            id="a label written as an annotation",
        ),
        pytest.param(
            {**ENABLED, f"{T}qos": "high"},
            {},
            "label tensor-fusion.ai/qos is read as an annotation: move it to metadata.annotations",
            id="an annotation written as a label",
        ),
        pytest.param(
            ENABLED,
            {f"{T}zzzz": "1", f"{T}gpu-cuont": "2"},
            "unknown annotation tensor-fusion.ai/gpu-cuont; did you mean tensor-fusion.ai/gpu-count?; "
            "unknown annotation tensor-fusion.ai/zzzz; it is no TensorFusion key (docs/webhook.md lists "
            "them): correct its spelling or remove it",
            id="every unknown key is named",
        ),
    ],
)
def test_unknown_or_misplaced_keys_of_a_pod_taken_over_are_denied(
    labels: dict[str, str], annotations: dict[str, str], message: str
) -> None:
    assert (
        denial(a_pod(labels=labels, annotations={**opted_in(tflops_request="1"), **annotations})) == message
    )


def test_a_migrated_native_gpu_pod_is_checked_too() -> None:
    config = TfConfig.model_validate({"dynamicConfig": {"autoMigration": {"enable": True}}})
    pod = a_pod(annotations={f"{T}gpu-modle": "H100"}, containers=[a_gpu_container()])
    verdict = admit(pod, AdmissionContext(config))
    assert isinstance(verdict, Denied)
    assert "did you mean tensor-fusion.ai/gpu-model?" in verdict.message


def test_a_pod_not_taken_over_is_admitted_unchanged_and_the_reason_names_the_unknown_key() -> None:
    verdict = decide(a_pod(labels={f"{T}enable": "true"}, annotations=opted_in(tflops_request="20")))
    assert isinstance(verdict, Admitted)
    assert verdict.patch == []
    assert "unknown label tensor-fusion.ai/enable; did you mean tensor-fusion.ai/enabled?" in verdict.reason


def test_tensorfusions_other_keys_are_accepted_and_left_as_they_are() -> None:
    ignored_annotations = dict.fromkeys(vocabulary.IGNORED_ANNOTATIONS, "x")
    ignored_labels = dict.fromkeys(vocabulary.IGNORED_LABELS, "true")
    pod = a_pod(
        labels={**ENABLED, **ignored_labels},
        annotations={**opted_in(tflops_request="20", vram_request="16Gi"), **ignored_annotations},
    )
    verdict = decide(pod)
    assert isinstance(verdict, Admitted), verdict
    mutated = apply(pod, verdict.patch)
    assert ignored_annotations.items() <= mutated["metadata"]["annotations"].items()
    assert ignored_labels.items() <= mutated["metadata"]["labels"].items()


def test_a_pod_admitted_again_carries_only_known_keys() -> None:
    pod = a_pod(
        labels=ENABLED,
        annotations=opted_in(tflops_request="20", vram_request="16Gi", enabled_replicas="2"),
        owner=("ReplicaSet", "web-abc"),
    )
    first = decide(pod)
    assert isinstance(first, Admitted)
    again = decide(apply(pod, first.patch))
    assert isinstance(again, Admitted), again
    assert again.patch == []


def _prefixed_constants(module: object) -> set[str]:
    return {
        value
        for name, value in vars(module).items()
        if name.isupper() and isinstance(value, str) and value.startswith(T) and value != T
    }


def test_every_key_the_webhook_and_the_scheduler_read_or_write_is_in_the_vocabulary() -> None:
    known = vocabulary.ANNOTATIONS | vocabulary.LABELS
    used = _prefixed_constants(admission) | _prefixed_constants(binding) | _prefixed_constants(pod_request)
    used |= _prefixed_constants(pod_spec)
    used |= {POD_INDEX_ANNOTATION, AUTOSCALE_SOURCE}
    assert used - known == {RESOURCE_PREFIX}  # a resource name (index_0..f), not a label or annotation


def _documented() -> tuple[set[str], set[str]]:
    text = DOCS.read_text(encoding="utf-8")
    section = text.split("## The `tensor-fusion.ai/*` keys a pod may carry", 1)[1].split("\n## ", 1)[0]
    annotations: set[str] = set()
    labels: set[str] = set()
    for row in re.findall(r"^\| (`.+?) \| (.+?) \| .+ \|$", section, flags=re.MULTILINE):
        keys = {T + key for key in re.findall(r"`([a-z0-9-]+)`", row[0])}
        if "annotation" in row[1]:
            annotations |= keys
        if "label" in row[1]:
            labels |= keys
    return annotations, labels


def test_docs_list_exactly_the_vocabulary() -> None:
    annotations, labels = _documented()
    assert annotations == vocabulary.ANNOTATIONS
    assert labels == vocabulary.LABELS


def test_tfctl_mutate_and_submit_refuse_a_misspelled_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pod = a_pod(labels=ENABLED, annotations=opted_in(tflop_request="20", vram_request="16Gi"))
    expected = (
        "unknown annotation tensor-fusion.ai/tflop-request; did you mean tensor-fusion.ai/tflops-request?"
    )
    assert submission_for(pod, "default", None) == f"denied by admission: {expected}"
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(json.dumps(pod))
    assert main(["mutate", "-f", str(manifest)]) == 1
    assert expected in capsys.readouterr().err
