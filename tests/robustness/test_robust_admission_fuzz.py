"""The admission handler fuzzed with hypothesis: random pods, random `tensor-fusion.ai/*` values and random
AdmissionReview shapes (wrong types, missing fields) always get a well-formed AdmissionReview whose patch
applies to the pod, or an HTTP 400 naming what is wrong; never an exception, a 500 or an internal-error
denial. The pure path runs many examples; the HTTP path (httpx through the webhook's ASGI app) fewer."""

from __future__ import annotations

import base64
import json
from collections import Counter
from typing import Any

import httpx
import jsonpatch
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tfcommon.config import TfConfig, parse_config
from tfcommon.config_source import ConfigSource
from tfcommon.runtime import build_app, with_front_routes
from tfwebhook.core import admission
from tfwebhook.core.admission import AdmissionContext, Admitted, admit
from tfwebhook.core.review import MalformedReviewError, parse_review, render_response
from tfwebhook.http import MUTATE_PATH, AdmissionService, build_router, front_routes

PURE_EXAMPLES = 600
HTTP_EXAMPLES = 120

ANNOTATIONS = [
    value
    for name, value in vars(admission).items()
    if name.isupper()
    and isinstance(value, str)
    and value.startswith(admission.PREFIX)
    and value != admission.PREFIX
]
CONFIGS = [
    TfConfig(),
    parse_config(
        """
dynamicConfig:
  autoMigration:
    enable: true
gpuPools:
  - name: training
    isDefault: true
  - name: default
"""
    ),
]

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
quantity_like = st.sampled_from(
    ["1", "0", "-1", "10Gi", "1.5", "500m", "1e309", "NaN", "inf", "", " ", "100%", "0x10", "9" * 40, "1Ei"]
)
annotation_values = (
    quantity_like | st.sampled_from(["true", "false", "shared", "hard", "high", "H100"]) | st.text()
)
annotation_maps = st.dictionaries(
    st.sampled_from(ANNOTATIONS) | st.text(max_size=20), annotation_values, max_size=8
)
resource_values = st.integers(-2, 2**62) | quantity_like | json_values
resources = st.dictionaries(
    st.sampled_from(["nvidia.com/gpu", "amd.com/gpu", "cpu", "memory", "tensor-fusion.ai/tflops"]),
    resource_values,
    max_size=3,
)
containers = st.lists(
    st.fixed_dictionaries(
        {"name": st.text(max_size=10), "image": st.just("img")},
        optional={
            "resources": st.fixed_dictionaries({}, optional={"limits": resources, "requests": resources})
            | json_values,
            "env": json_values,
        },
    )
    | json_values,
    max_size=3,
)
metadata = st.fixed_dictionaries(
    {},
    optional={
        "name": st.text(max_size=20) | json_values,
        "namespace": st.text(max_size=10),
        "labels": st.dictionaries(
            st.sampled_from(["tensor-fusion.ai/enabled", "app"]) | st.text(max_size=10),
            st.sampled_from(["true", "false"]) | st.text(max_size=5) | json_values,
            max_size=3,
        )
        | json_values,
        "annotations": annotation_maps | json_values,
        "ownerReferences": json_values,
        "generateName": st.text(max_size=10),
    },
)
pods = st.fixed_dictionaries(
    {"apiVersion": st.just("v1"), "kind": st.just("Pod")},
    optional={
        "metadata": metadata | json_values,
        "spec": st.fixed_dictionaries(
            {},
            optional={
                "containers": containers | json_values,
                "initContainers": containers,
                "schedulerName": st.text(max_size=10),
                "nodeSelector": json_values,
            },
        )
        | json_values,
    },
)


VALID_ANNOTATIONS = {
    admission.TFLOPS_REQUEST: st.sampled_from(["10", "20", "0.5", "100"]),
    admission.TFLOPS_LIMIT: st.sampled_from(["100", "400"]),
    admission.VRAM_REQUEST: st.sampled_from(["1Gi", "4Gi", "10Gi", "512Mi"]),
    admission.VRAM_LIMIT: st.sampled_from(["40Gi", "80Gi"]),
    admission.GPU_COUNT: st.sampled_from(["1", "2"]),
    admission.QOS: st.sampled_from(["low", "medium", "high", "critical"]),
    admission.ISOLATION: st.sampled_from(["shared", "soft", "hard"]),
    admission.GPUPOOL: st.sampled_from(["default", "training"]),
    admission.GPU_MODEL: st.sampled_from(["H100", "A100"]),
    admission.ENABLED_REPLICAS: st.sampled_from(["1", "2", "5"]),
}
REQUIRED = (admission.TFLOPS_REQUEST, admission.VRAM_REQUEST)
plausible_annotations = st.fixed_dictionaries(
    {key: VALID_ANNOTATIONS[key] for key in REQUIRED},
    optional={key: values for key, values in VALID_ANNOTATIONS.items() if key not in REQUIRED},
) | st.fixed_dictionaries(
    {}, optional={key: values | annotation_values for key, values in VALID_ANNOTATIONS.items()}
)
gpu_pods = st.builds(
    lambda annotations, labels, gpus, owner: {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml", "labels": labels, "annotations": annotations, **owner},
        "spec": {
            "containers": [{"name": "app", "image": "img", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]
        },
    },
    plausible_annotations,
    st.sampled_from([{"tensor-fusion.ai/enabled": "true"}, {"tensor-fusion.ai/enabled": "true"}, {}]),
    st.one_of(st.sampled_from([1, 2, "1"]), st.sampled_from([1, 2]), resource_values),
    st.just({})
    | st.just(
        {
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "rs", "controller": True}
            ]
        }
    ),
)


def review_of(pod: Any, request_extra: dict[str, Any]) -> dict[str, Any]:
    request: dict[str, Any] = {
        "uid": "fuzz-uid",
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "operation": "CREATE",
        "namespace": "ml",
        "object": pod,
    }
    request.update(request_extra)
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


request_variations = st.dictionaries(
    st.sampled_from(["uid", "kind", "operation", "namespace", "object", "dryRun"]),
    json_values | st.sampled_from(["CREATE", "UPDATE", "Pod", ""]),
    max_size=2,
)


def encoded(reviews: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes]:
    return reviews.map(lambda review: json.dumps(review).encode())


gpu_reviews = encoded(st.builds(review_of, gpu_pods, st.just({})))
bodies = st.one_of(
    gpu_reviews,
    gpu_reviews,
    gpu_reviews,
    encoded(st.builds(review_of, gpu_pods, request_variations)),
    encoded(st.builds(review_of, pods, st.just({}) | request_variations)),
    encoded(st.builds(review_of, json_values, st.just({}))),
    encoded(st.dictionaries(st.sampled_from(["apiVersion", "kind", "request"]), json_values, max_size=3)),
    encoded(json_values),
    st.binary(max_size=64),
)


def assert_well_formed(body: bytes, review: dict[str, Any]) -> None:
    """`review` answers `body`'s request: same uid; allowed with a patch that applies, or a clear denial."""
    assert (review["apiVersion"], review["kind"]) == ("admission.k8s.io/v1", "AdmissionReview")
    response = review["response"]
    request = json.loads(body)["request"]
    assert response["uid"] == request["uid"]
    if response["allowed"] is True:
        assert set(response) <= {"uid", "allowed", "patchType", "patch"}
        if "patch" in response:
            assert response["patchType"] == "JSONPatch"
            operations = json.loads(base64.b64decode(response["patch"]))
            jsonpatch.apply_patch(request["object"], operations)
    else:
        assert response["allowed"] is False
        status = response["status"]
        assert 400 <= status["code"] < 500, status
        assert isinstance(status["message"], str)
        assert status["message"].strip()


@settings(max_examples=PURE_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(body=bodies, config=st.sampled_from(CONFIGS))
def test_any_body_gets_a_well_formed_review_or_a_clear_malformed_error(body: bytes, config: TfConfig) -> None:
    try:
        request = parse_review(body)
    except MalformedReviewError as error:
        malformed = str(error)
    else:
        malformed = ""
    if malformed:
        assert any(name in malformed for name in ("JSON", "AdmissionReview", "request")), malformed
        return
    verdict = admit(
        request.pod or {}, AdmissionContext(config, request.namespace, takeover_slot_id=request.uid)
    )

    review = json.loads(orjson.dumps(render_response(request.uid, verdict)))

    if request.pod is not None:
        assert_well_formed(body, review)


def outcome(body: bytes, config: TfConfig) -> str:
    try:
        request = parse_review(body)
    except MalformedReviewError:
        return "malformed"
    if request.pod is None:
        return "not a pod"
    verdict = admit(request.pod, AdmissionContext(config, request.namespace, takeover_slot_id=request.uid))
    if isinstance(verdict, Admitted):
        return "patched" if verdict.patch else "unchanged"
    return "denied"


def test_the_fuzzer_reaches_every_outcome() -> None:
    """Guards the properties above against generators that drift into only ever testing rejections."""
    seen: Counter[str] = Counter()

    @settings(
        max_examples=300,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(body=bodies, config=st.sampled_from(CONFIGS))
    def draw(body: bytes, config: TfConfig) -> None:
        seen[outcome(body, config)] += 1

    draw()

    assert set(seen) == {"malformed", "not a pod", "patched", "unchanged", "denied"}, seen
    assert seen["patched"] >= 12, seen  # derandomized: the same 300 examples each run, 24 of them patched


def http_bodies() -> list[bytes]:
    """A bounded sample of `bodies`, drawn once with hypothesis, for the slower HTTP path."""
    drawn: list[bytes] = []

    @settings(
        max_examples=HTTP_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(body=bodies)
    def draw(body: bytes) -> None:
        drawn.append(body)

    draw()
    return drawn


@pytest.fixture(scope="module")
def webhook_client_app() -> Any:
    service = AdmissionService(config=ConfigSource(None))
    app = build_app("webhook", [build_router(service)], {})
    return with_front_routes(app, front_routes(service))


async def test_the_http_endpoint_answers_200_or_400_to_any_body(webhook_client_app: Any) -> None:
    transport = httpx.ASGITransport(app=webhook_client_app)
    async with httpx.AsyncClient(transport=transport, base_url="http://webhook") as client:
        for body in http_bodies():
            response = await client.post(
                MUTATE_PATH, content=body, headers={"content-type": "application/json"}
            )

            assert response.status_code in (200, 400), body
            answer = response.json()
            if response.status_code == 400:
                assert answer["error"].strip()
                continue
            assert answer["response"]["uid"] == json.loads(body)["request"]["uid"]
            if answer["response"]["allowed"] is False:
                assert answer["response"]["status"]["code"] < 500, answer
