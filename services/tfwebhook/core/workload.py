"""Which workload a pod belongs to, from its owner references alone (no API call). Pure: no I/O.

Follows TensorFusion's naming: a ReplicaSet owned by a Deployment is named after the Deployment, a Job
created by a CronJob after the CronJob, any other controller after itself, and a pod without a
controller after its own name (or its `generateName` prefix, since the API server has not named it yet).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

LABEL_VALUE_MAX = 63
_CRONJOB_JOB_SUFFIX = re.compile(r"^(?P<cronjob>.+)-\d{8,}$")
_TEMPLATE_HASH_LABELS = ("pod-template-hash", "controller-revision-hash")


@dataclass(frozen=True)
class Controller:
    kind: str
    name: str


@dataclass(frozen=True)
class WorkloadIdentity:
    """`name` is the workload label value; `takeover_key` scopes `enabled-replicas` (None: no controller)."""

    name: str
    controller: Controller | None
    takeover_key: str | None


def pod_display_name(metadata: Mapping[str, Any]) -> str:
    name = metadata.get("name")
    if isinstance(name, str) and name:
        return name
    generate_name = metadata.get("generateName")
    if isinstance(generate_name, str) and generate_name:
        return generate_name.rstrip("-") or generate_name
    return "unnamed-pod"


def controller_of(metadata: Mapping[str, Any]) -> Controller | None:
    owners = metadata.get("ownerReferences")
    if not isinstance(owners, list):
        return None
    for owner in owners:
        if isinstance(owner, dict) and owner.get("controller") is True:
            kind, name = owner.get("kind"), owner.get("name")
            if isinstance(kind, str) and isinstance(name, str) and kind and name:
                return Controller(kind=kind, name=name)
    return None


def _workload_name(controller: Controller, labels: Mapping[str, str]) -> str:
    if controller.kind == "ReplicaSet":
        template_hash = labels.get("pod-template-hash")
        if template_hash and controller.name.endswith(f"-{template_hash}"):
            return controller.name.removesuffix(f"-{template_hash}")
    if controller.kind == "Job":
        match = _CRONJOB_JOB_SUFFIX.match(controller.name)
        if match:
            return match["cronjob"]
    return controller.name


def as_label_value(name: str) -> str:
    """`name` shortened to a valid label value, keeping it unique with a hash suffix when cut."""
    if len(name) <= LABEL_VALUE_MAX:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: LABEL_VALUE_MAX - 9].rstrip('-_.')}-{digest}"


def identify(metadata: Mapping[str, Any], namespace: str) -> WorkloadIdentity:
    labels_raw = metadata.get("labels")
    labels: Mapping[str, str] = labels_raw if isinstance(labels_raw, dict) else {}
    controller = controller_of(metadata)
    if controller is None:
        return WorkloadIdentity(as_label_value(pod_display_name(metadata)), None, None)
    template_hash = next((labels[key] for key in _TEMPLATE_HASH_LABELS if labels.get(key)), "-")
    key = f"{namespace}/{controller.kind}/{controller.name}/{template_hash}"
    return WorkloadIdentity(as_label_value(_workload_name(controller, labels)), controller, key)
