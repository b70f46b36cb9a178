"""Builders of pods and AdmissionReviews for tests and benchmarks of the webhook (no I/O)."""

from __future__ import annotations

import copy
import json
from typing import Any

import jsonpatch

GPU = {"nvidia.com/gpu": 1}


def a_pod(
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    containers: list[dict[str, Any]] | None = None,
    namespace: str = "ml-team-a",
    name: str | None = "trainer",
    owner: tuple[str, str] | None = None,
    **spec: Any,
) -> dict[str, Any]:
    metadata: dict[str, Any] = {"namespace": namespace}
    if name is not None:
        metadata["name"] = name
    else:
        metadata["generateName"] = f"{owner[1] if owner else 'pod'}-"
    if labels is not None:
        metadata["labels"] = labels
    if annotations is not None:
        metadata["annotations"] = annotations
    if owner is not None:
        metadata["ownerReferences"] = [
            {"apiVersion": "apps/v1", "kind": owner[0], "name": owner[1], "uid": "u-1", "controller": True}
        ]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": {"containers": containers or [{"name": "app", "image": "img"}], **spec},
    }


def a_gpu_container(name: str = "app", limits: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "image": "img", "resources": {"limits": dict(GPU if limits is None else limits)}}


def opted_in(**annotations: str) -> dict[str, str]:
    return {f"tensor-fusion.ai/{key.replace('_', '-')}": value for key, value in annotations.items()}


def apply(pod: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = jsonpatch.apply_patch(copy.deepcopy(pod), patch)
    return result


def a_review(
    pod: dict[str, Any] | None, *, uid: str = "req-1", dry_run: bool = False, namespace: str = "ml-team-a"
) -> bytes:
    request: dict[str, Any] = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "operation": "CREATE",
        "namespace": namespace,
        "object": pod,
        "dryRun": dry_run,
    }
    return json.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    ).encode()
