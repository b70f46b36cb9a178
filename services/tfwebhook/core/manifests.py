"""Offline admission of user manifests (`tfctl mutate`): a Pod, or the pod template of a workload.

A Deployment, StatefulSet, DaemonSet, ReplicaSet, Job or CronJob is admitted as the pod its controller
would create (owned by it, in its namespace); the mutation is written back into its template. Pure.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tfwebhook.core.admission import AdmissionContext, Admitted, Verdict, admit

TEMPLATE_PATHS: dict[str, tuple[str, ...]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
SUPPORTED_KINDS = ("Pod", *TEMPLATE_PATHS)


class ManifestError(ValueError):
    """The manifest cannot be admitted offline; the message names the field that is wrong."""


@dataclass(frozen=True)
class ManifestResult:
    """The verdict for the manifest's pod and the manifest as it would be after admission."""

    verdict: Verdict
    mutated: dict[str, Any]


def _template(manifest: Mapping[str, Any], kind: str) -> dict[str, Any]:
    node: Any = manifest
    walked: list[str] = []
    for key in TEMPLATE_PATHS[kind]:
        walked.append(key)
        node = node.get(key) if isinstance(node, dict) else None
        if not isinstance(node, dict):
            raise ManifestError(f"{kind}: {'.'.join(walked)} is missing; a {kind} needs a pod template there")
    if not isinstance(node.get("spec"), dict):
        raise ManifestError(f"{kind}: {'.'.join(TEMPLATE_PATHS[kind])}.spec is missing")
    template: dict[str, Any] = node
    return template


def admit_manifest(manifest: Mapping[str, Any], context: AdmissionContext) -> ManifestResult:
    """Admit a Pod or a workload's pod template; raises `ManifestError` for an unsupported document."""
    kind = manifest.get("kind")
    if kind not in SUPPORTED_KINDS:
        raise ManifestError(f"kind: {kind!r} is not supported; use one of {', '.join(SUPPORTED_KINDS)}")
    metadata = manifest.get("metadata")
    if not isinstance(metadata, dict):
        raise ManifestError(f"{kind}: metadata is missing")
    named_namespace = metadata.get("namespace")
    namespace = named_namespace if isinstance(named_namespace, str) and named_namespace else context.namespace
    context = AdmissionContext(context.config, namespace, context.namespace_labels, context.takeover_slot_id)
    if kind == "Pod":
        if not isinstance(manifest.get("spec"), dict):
            raise ManifestError("Pod: spec is missing")
        verdict = admit(manifest, context)
        mutated = copy.deepcopy(dict(manifest))
        if isinstance(verdict, Admitted) and verdict.patch:
            mutated = _apply(dict(manifest), verdict.patch)
        return ManifestResult(verdict, mutated)

    name = metadata.get("name")
    if not isinstance(name, str) or not name:
        raise ManifestError(f"{kind}: metadata.name is missing")
    template = _template(manifest, kind)
    template_metadata = template.get("metadata")
    if not isinstance(template_metadata, dict):
        template_metadata = {}
    pod_metadata = {
        **copy.deepcopy(template_metadata),
        "namespace": namespace,
        "generateName": f"{name}-",
        "ownerReferences": [{"apiVersion": "v1", "kind": kind, "name": name, "uid": "", "controller": True}],
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": pod_metadata,
        "spec": copy.deepcopy(template["spec"]),
    }
    verdict = admit(pod, context)
    mutated_manifest = copy.deepcopy(dict(manifest))
    if isinstance(verdict, Admitted) and verdict.patch:
        mutated_pod = _apply(pod, verdict.patch)
        new_template = _template(mutated_manifest, kind)
        new_metadata = new_template.setdefault("metadata", {})
        for key in ("labels", "annotations"):
            if key in mutated_pod["metadata"]:
                new_metadata[key] = mutated_pod["metadata"][key]
        new_template["spec"] = mutated_pod["spec"]
    return ManifestResult(verdict, mutated_manifest)


def _apply(document: dict[str, Any], patch: list[dict[str, Any]]) -> dict[str, Any]:
    """Apply our own patches (add/remove/replace only, as `json_diff` emits them)."""
    result = copy.deepcopy(document)
    for operation in patch:
        tokens = [t.replace("~1", "/").replace("~0", "~") for t in operation["path"].split("/")[1:]]
        if not tokens:
            replaced: dict[str, Any] = copy.deepcopy(operation["value"])
            return replaced
        parent: Any = result
        for token in tokens[:-1]:
            parent = parent[int(token)] if isinstance(parent, list) else parent[token]
        last = tokens[-1]
        key: Any = int(last) if isinstance(parent, list) else last
        if operation["op"] == "remove":
            del parent[key]
        else:
            parent[key] = operation["value"]
    return result
