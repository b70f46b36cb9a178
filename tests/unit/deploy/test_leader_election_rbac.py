"""k8s/base/scheduler.yaml grants the scheduler's leader-election Lease exactly what the code uses."""

from __future__ import annotations

from typing import Any

from deploy_support import REPO_ROOT, render_kustomization
from tfcommon.cluster.rbac import LEASE_RBAC
from tfcommon.settings import SchedulerKubernetesSettings


def scheduler_role() -> dict[str, Any]:
    (role,) = [
        obj
        for obj in render_kustomization(REPO_ROOT / "k8s" / "base")
        if obj["kind"] == "Role" and obj["metadata"]["name"] == "tfpool-scheduler"
    ]
    return role


def test_the_scheduler_role_grants_exactly_the_lease_verbs_the_elector_calls() -> None:
    role = scheduler_role()
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    required = {
        (rule.api_group, resource, verb)
        for rule in LEASE_RBAC["scheduler"]
        for resource in rule.resources
        for verb in rule.verbs
    }
    assert granted == required
    named = [rule["resourceNames"] for rule in role["rules"] if "resourceNames" in rule]
    assert named == [[SchedulerKubernetesSettings().lease_name]]


def test_the_scheduler_pod_knows_its_name_and_namespace_for_the_lease() -> None:
    (deployment,) = [
        obj
        for obj in render_kustomization(REPO_ROOT / "k8s" / "base")
        if obj["kind"] == "Deployment" and obj["metadata"]["name"] == "tfpool-scheduler"
    ]
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    fields = {
        e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in container["env"]
    }
    assert fields["POD_NAME"] == "metadata.name"
    assert fields["POD_NAMESPACE"] == "metadata.namespace"
    assert deployment["spec"]["replicas"] == 2
