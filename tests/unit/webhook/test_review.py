"""AdmissionReview in and out: response shape, malformed reviews, and a property over random pods."""

from __future__ import annotations

import base64
import json
from typing import Any

import jsonpatch
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tfcommon.config import TfConfig
from tfwebhook.core.admission import AdmissionContext, admit
from tfwebhook.core.review import MalformedReviewError, parse_review, render_response
from tfwebhook.testing import a_pod, a_review, opted_in

CONFIG = TfConfig()


def respond(body: bytes) -> dict[str, Any]:
    request = parse_review(body)
    verdict = admit(
        request.pod or {}, AdmissionContext(CONFIG, request.namespace, takeover_slot_id=request.uid)
    )
    return render_response(request.uid, verdict)


def test_an_admitted_pod_gets_a_base64_json_patch_and_its_uid_back() -> None:
    pod = a_pod(labels={"tensor-fusion.ai/enabled": "true"}, annotations=opted_in(isolation="shared"))
    review = respond(a_review(pod, uid="7f3c"))
    assert review["apiVersion"] == "admission.k8s.io/v1"
    assert review["kind"] == "AdmissionReview"
    response = review["response"]
    assert (response["uid"], response["allowed"], response["patchType"]) == ("7f3c", True, "JSONPatch")
    patched = jsonpatch.apply_patch(pod, json.loads(base64.b64decode(response["patch"])))
    assert patched["spec"]["schedulerName"] == "tensor-fusion-scheduler"


def test_a_denied_pod_gets_status_code_and_message() -> None:
    pod = a_pod(
        labels={"tensor-fusion.ai/enabled": "true"}, annotations=opted_in(qos="urgent", tflops_request="1")
    )
    response = respond(a_review(pod))["response"]
    assert response["allowed"] is False
    assert response["status"]["code"] == 400
    assert "tensor-fusion.ai/qos" in response["status"]["message"]
    assert "patch" not in response


def test_an_unchanged_pod_gets_no_patch() -> None:
    response = respond(a_review(a_pod()))["response"]
    assert response == {"uid": "req-1", "allowed": True}


@pytest.mark.parametrize(
    ("body", "message"),
    [
        pytest.param(b"{", "not JSON", id="json"),
        pytest.param(b"[]", "AdmissionReview object", id="array"),
        pytest.param(
            b'{"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}',
            "apiVersion",
            id="v1beta1",
        ),
        pytest.param(
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}',
            "request is missing",
            id="request",
        ),
        pytest.param(
            b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", '
            b'"request": {"operation": "CREATE"}}',
            "request.uid",
            id="uid",
        ),
        pytest.param(a_review(None), "request.object", id="no pod"),
        pytest.param(b"\xff\xfe", "not JSON", id="binary"),
    ],
)
def test_malformed_reviews_are_refused_naming_the_problem(body: bytes, message: str) -> None:
    with pytest.raises(MalformedReviewError, match=message):
        parse_review(body)


KEYS = [
    "tflops-request", "tflops-limit", "vram-request", "vram-limit", "compute-percent-request",
    "compute-percent-limit", "gpu-count", "gpu-indices", "gpupool", "gpu-model", "vendor", "dedicated-gpu",
    "qos", "isolation", "inject-container", "enabled-replicas", "autoscale", "autoscale-target",
    "is-local-gpu", "container-gpu-count",
]  # fmt: skip
VALUES = st.one_of(
    st.sampled_from(
        ["0", "1", "-1", "1.5", "500m", "16Gi", "true", "false", "shared", "high", "H100", "app", "100"]
    ),
    st.text(max_size=12),
    st.integers(-5, 300).map(str),
)
JSONISH = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5), children, max_size=3)
    ),
    max_leaves=6,
)
LIMITS = st.dictionaries(
    st.sampled_from(["nvidia.com/gpu", "amd.com/gpu", "cpu"]),
    st.one_of(st.integers(-2, 200), st.sampled_from(["1", "2", "0.5", "x", "1e2"]), JSONISH),
    max_size=3,
)
CONTAINER = st.fixed_dictionaries(
    {"name": st.sampled_from(["app", "side", "proxy"])},
    optional={
        "resources": st.one_of(
            st.fixed_dictionaries({}, optional={"limits": LIMITS, "requests": LIMITS}), JSONISH
        )
    },
)
POD = st.builds(
    lambda labels, annotations, containers, owner, extra: {
        "metadata": {
            "generateName": "w-",
            "labels": labels,
            "annotations": {f"tensor-fusion.ai/{key}": value for key, value in annotations.items()},
            **({"ownerReferences": [{"kind": owner, "name": "w-1", "controller": True}]} if owner else {}),
        },
        "spec": {"containers": containers, **extra},
    },
    st.dictionaries(
        st.sampled_from(["tensor-fusion.ai/enabled", "app"]), st.sampled_from(["true", "false", "x"])
    ),
    st.dictionaries(st.sampled_from(KEYS), VALUES, max_size=6),
    st.lists(CONTAINER, min_size=0, max_size=3),
    st.sampled_from([None, "ReplicaSet", "Job", "StatefulSet"]),
    st.dictionaries(st.sampled_from(["priority", "priorityClassName", "schedulerName"]), JSONISH, max_size=2),
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pod=st.one_of(POD, JSONISH.filter(lambda value: isinstance(value, dict))), dry_run=st.booleans())
def test_random_pods_always_get_a_well_formed_admission_review(pod: dict[str, Any], dry_run: bool) -> None:
    before = json.dumps(pod, sort_keys=True)
    verdict = admit(pod, AdmissionContext(CONFIG, "ml-team-a", takeover_slot_id="u-9"))
    assert json.dumps(pod, sort_keys=True) == before, "admit() must never change its input"
    review = render_response("u-9", verdict)
    assert review == respond(a_review(pod, uid="u-9", dry_run=dry_run))
    assert set(review) == {"apiVersion", "kind", "response"}
    response = review["response"]
    assert response["uid"] == "u-9"
    assert isinstance(response["allowed"], bool)
    if response["allowed"]:
        assert ("patch" in response) == ("patchType" in response)
        if "patch" in response:
            operations = json.loads(base64.b64decode(response["patch"], validate=True))
            mutated = jsonpatch.apply_patch(pod, operations)
            assert mutated["spec"]["schedulerName"] == "tensor-fusion-scheduler"
    else:
        assert set(response["status"]) == {"code", "message"}
        assert response["status"]["code"] == 400
        assert response["status"]["message"]
    json.dumps(review)
