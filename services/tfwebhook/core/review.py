"""AdmissionReview `admission.k8s.io/v1` in and out: parse a request, render a verdict. Pure: no I/O.

`parse_review` raises `MalformedReviewError` (the shell answers HTTP 400) for anything that is not a v1
AdmissionReview with a request UID; everything else, including odd pods, gets a well-formed response.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson

from tfwebhook.core.admission import Admitted, Verdict

API_VERSION = "admission.k8s.io/v1"
KIND = "AdmissionReview"


class MalformedReviewError(ValueError):
    """The body is not an AdmissionReview v1 request; the message says what is missing or wrong."""


@dataclass(frozen=True)
class ReviewRequest:
    """The parts of `AdmissionReview.request` the webhook uses. `pod` is None for non-pod objects."""

    uid: str
    operation: str
    namespace: str
    dry_run: bool
    pod: Mapping[str, Any] | None

    @property
    def is_pod_creation(self) -> bool:
        return self.operation == "CREATE" and self.pod is not None


def parse_review(body: bytes | str) -> ReviewRequest:
    try:
        document = orjson.loads(body)
    except (ValueError, UnicodeDecodeError) as error:
        raise MalformedReviewError(f"the body is not JSON: {error}") from None
    if not isinstance(document, dict):
        raise MalformedReviewError("the body must be an AdmissionReview object")
    if document.get("apiVersion") != API_VERSION or document.get("kind") != KIND:
        raise MalformedReviewError(f"apiVersion must be {API_VERSION} and kind {KIND}")
    request = document.get("request")
    if not isinstance(request, dict):
        raise MalformedReviewError(
            "request is missing; an AdmissionReview to review carries a request object"
        )
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise MalformedReviewError("request.uid is missing; it must be a non-empty string")
    operation = request.get("operation")
    if not isinstance(operation, str):
        raise MalformedReviewError("request.operation is missing; expected CREATE, UPDATE, DELETE or CONNECT")
    kind = request.get("kind")
    is_pod = isinstance(kind, dict) and kind.get("kind") == "Pod" and kind.get("group", "") == ""
    pod = request.get("object")
    if is_pod and operation == "CREATE" and not isinstance(pod, dict):
        raise MalformedReviewError("request.object must be the Pod being created")
    namespace = request.get("namespace")
    return ReviewRequest(
        uid=uid,
        operation=operation,
        namespace=namespace if isinstance(namespace, str) and namespace else "default",
        dry_run=request.get("dryRun") is True,
        pod=pod if is_pod and isinstance(pod, dict) else None,
    )


def render_response(uid: str, verdict: Verdict) -> dict[str, Any]:
    """The AdmissionReview answering request `uid`: allowed with a base64 JSONPatch, or denied."""
    response: dict[str, Any] = {"uid": uid}
    if isinstance(verdict, Admitted):
        response["allowed"] = True
        if verdict.patch:
            response["patchType"] = "JSONPatch"
            response["patch"] = verdict.encoded_patch
    else:
        response["allowed"] = False
        response["status"] = {"code": verdict.code, "message": verdict.message}
    return {"apiVersion": API_VERSION, "kind": KIND, "response": response}


def encode_review(review: dict[str, Any]) -> bytes:
    """Compact JSON bytes of an AdmissionReview (or any JSON document)."""
    return orjson.dumps(review)
