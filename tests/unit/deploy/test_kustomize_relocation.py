"""k8s/base is relocatable: an overlay into another namespace (k8s/examples/other-namespace: `namespace:`
plus the base's relocate/ transformer) leaves nothing of tfpool-system behind: not in ServiceAccount
subjects, the webhook's Service reference, the certificate's DNS names or cert-manager's CA injection."""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import Any

import yaml
from deploy_support import REPO_ROOT, kubernetes_problem, objects_of_kind, render_kustomization

NAMESPACE = "gpu-platform"
K8S = REPO_ROOT / "k8s"
CERT_MANAGER = {"Issuer", "Certificate"}


@functools.cache
def relocated() -> tuple[dict[str, Any], ...]:
    return tuple(render_kustomization(K8S / "examples" / "other-namespace"))


def test_nothing_of_the_default_namespace_is_left() -> None:
    objects = relocated()
    assert "tfpool-system" not in json.dumps(objects)
    assert {obj["metadata"].get("namespace") for obj in objects} == {NAMESPACE, None}
    assert objects_of_kind(objects, "Namespace").keys() == {NAMESPACE}


def test_every_binding_names_the_service_accounts_in_the_new_namespace() -> None:
    objects = relocated()
    bindings = [obj for obj in objects if obj["kind"] in {"RoleBinding", "ClusterRoleBinding"}]
    assert len(bindings) >= 6
    for binding in bindings:
        for subject in binding["subjects"]:
            assert subject["namespace"] == NAMESPACE, binding["metadata"]["name"]


def test_webhook_is_called_and_served_in_the_new_namespace() -> None:
    objects = relocated()
    registration = objects_of_kind(objects, "MutatingWebhookConfiguration")["tfpool-webhook"]
    webhook = registration["webhooks"][0]
    assert webhook["clientConfig"]["service"]["namespace"] == NAMESPACE
    assert (
        registration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        == f"{NAMESPACE}/tfpool-webhook"
    )
    assert webhook["namespaceSelector"]["matchExpressions"][0]["values"] == ["kube-system", NAMESPACE]
    certificate = objects_of_kind(objects, "Certificate")["tfpool-webhook"]
    assert certificate["spec"]["dnsNames"] == [
        f"tfpool-webhook.{NAMESPACE}.svc",
        f"tfpool-webhook.{NAMESPACE}.svc.cluster.local",
    ]


def test_relocated_objects_are_valid_for_current_kubernetes() -> None:
    problems = [
        problem
        for obj in relocated()
        if obj["kind"] not in CERT_MANAGER
        if (problem := kubernetes_problem(obj))
    ]
    assert problems == []


def test_the_base_itself_still_installs_into_tfpool_system() -> None:
    objects = render_kustomization(K8S / "base")
    registration = objects_of_kind(objects, "MutatingWebhookConfiguration")["tfpool-webhook"]
    assert registration["webhooks"][0]["clientConfig"]["service"]["namespace"] == "tfpool-system"
    assert (
        registration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        == "tfpool-system/tfpool-webhook"
    )
    certificate = objects_of_kind(objects, "Certificate")["tfpool-webhook"]
    assert certificate["spec"]["dnsNames"][0] == "tfpool-webhook.tfpool-system.svc"


def test_any_overlay_written_as_documented_relocates(tmp_path: Path) -> None:
    relative = Path(os.path.relpath(K8S, tmp_path))
    tmp_path.joinpath("kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "namespace": "team-gpu",
                "resources": [str(relative / "evaluation")],
                "transformers": [str(relative / "base" / "relocate")],
            }
        )
    )
    objects = render_kustomization(tmp_path)
    assert "tfpool-system" not in json.dumps(objects)
    certificate = objects_of_kind(objects, "Certificate")["tfpool-webhook"]
    assert certificate["spec"]["dnsNames"][0] == "tfpool-webhook.team-gpu.svc"
