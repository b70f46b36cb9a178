"""Pod Security, in the kustomize base and the Helm chart: every tfpool pod but the node agent meets the
`restricted` profile; the agent (hostPID, the kubelet's device-plugin folder, priority
system-node-critical) runs where the namespace allows `privileged`."""

from __future__ import annotations

from typing import Any

import pytest
from deploy_support import REPO_ROOT, objects_of_kind, render_kustomization
from test_helm_chart import AGENT_NAMESPACE, NAMESPACE, one, pod_specs, template

RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
PSA = "pod-security.kubernetes.io/"
DEVICE_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"


def restricted_violations(spec: dict[str, Any]) -> list[str]:
    """What in a pod spec the Pod Security `restricted` profile (Kubernetes 1.37) refuses."""
    found = [f"{field}: true" for field in ("hostPID", "hostIPC", "hostNetwork") if spec.get(field)]
    found += [
        f"volume {volume['name']} is not a restricted volume type"
        for volume in spec.get("volumes", [])
        if not set(volume) - {"name"} <= RESTRICTED_VOLUMES
    ]
    pod = spec.get("securityContext", {})
    for container in spec.get("initContainers", []) + spec["containers"]:
        context = {**pod, **container.get("securityContext", {})}
        name = container["name"]
        if context.get("privileged"):
            found.append(f"{name}: privileged")
        if context.get("allowPrivilegeEscalation") is not False:
            found.append(f"{name}: allowPrivilegeEscalation is not false")
        if context.get("runAsNonRoot") is not True or context.get("runAsUser") == 0:
            found.append(f"{name}: may run as root")
        if context.get("seccompProfile", {}).get("type") not in {"RuntimeDefault", "Localhost"}:
            found.append(f"{name}: no seccomp profile")
        capabilities = context.get("capabilities", {})
        if "ALL" not in capabilities.get("drop", []) or set(capabilities.get("add", [])) - {
            "NET_BIND_SERVICE"
        }:
            found.append(f"{name}: capabilities not dropped")
        if any(port.get("hostPort") for port in container.get("ports", [])):
            found.append(f"{name}: hostPort")
    return found


def assert_node_agent_sees_the_host(spec: dict[str, Any]) -> None:
    assert spec["hostPID"] is True
    assert spec["priorityClassName"] == "system-node-critical"
    (container,) = spec["containers"]
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    host_paths = {
        volume["name"]: volume["hostPath"]["path"] for volume in spec["volumes"] if "hostPath" in volume
    }
    assert host_paths == {"device-plugins": DEVICE_PLUGIN_DIR}
    assert mounts["device-plugins"] == DEVICE_PLUGIN_DIR
    env = {item["name"]: item.get("value") for item in container["env"]}
    assert env["TF_DEVICE_PLUGIN_DIR"] == DEVICE_PLUGIN_DIR  # where kubelet.sock is and our sockets go


def test_the_checker_refuses_what_restricted_refuses() -> None:
    agent = objects_of_kind(render_kustomization(REPO_ROOT / "k8s" / "base"), "DaemonSet")[
        "tfpool-node-agent"
    ]
    problems = restricted_violations(agent["spec"]["template"]["spec"])
    assert "hostPID: true" in problems
    assert "volume device-plugins is not a restricted volume type" in problems
    assert "node-agent: may run as root" in problems


@pytest.mark.parametrize(
    "variant", [{}, {"certificates.mode": "cert-manager", "autoMigration.enabled": "true"}]
)
def test_chart_release_namespace_pods_meet_restricted(variant: dict[str, str]) -> None:
    objects = template(variant)
    for name, spec in pod_specs(objects).items():
        namespace = next(o for o in objects if f"{o['kind']}/{o['metadata']['name']}" == name)["metadata"][
            "namespace"
        ]
        if namespace == NAMESPACE:
            assert restricted_violations(spec) == [], name
        else:
            assert name == "DaemonSet/tfpool-node-agent"


def test_chart_node_agent_runs_in_its_own_privileged_namespace() -> None:
    objects = template()
    labels = one(objects, "Namespace", AGENT_NAMESPACE)["metadata"]["labels"]
    assert {key: value for key, value in labels.items() if key.startswith(PSA)} == {
        f"{PSA}enforce": "privileged",
        f"{PSA}audit": "privileged",
        f"{PSA}warn": "privileged",
    }
    agent = one(objects, "DaemonSet", "tfpool-node-agent")
    assert agent["metadata"]["namespace"] == AGENT_NAMESPACE
    assert_node_agent_sees_the_host(agent["spec"]["template"]["spec"])


@pytest.mark.parametrize("kustomization", ["base", "evaluation"])
def test_kustomize_pods_but_the_agent_meet_restricted(kustomization: str) -> None:
    objects = render_kustomization(REPO_ROOT / "k8s" / kustomization)
    checked = 0
    for obj in objects:
        if obj["kind"] in {"Deployment", "StatefulSet", "Job"}:
            assert restricted_violations(obj["spec"]["template"]["spec"]) == [], obj["metadata"]["name"]
            checked += 1
    assert checked >= 5


def test_kustomize_namespace_enforces_privileged_for_the_agent_and_reports_restricted() -> None:
    objects = render_kustomization(REPO_ROOT / "k8s" / "base")
    labels = objects_of_kind(objects, "Namespace")["tfpool-system"]["metadata"]["labels"]
    assert labels[f"{PSA}enforce"] == "privileged"
    assert labels[f"{PSA}audit"] == labels[f"{PSA}warn"] == "restricted"
    agent = objects_of_kind(objects, "DaemonSet")["tfpool-node-agent"]
    assert_node_agent_sees_the_host(agent["spec"]["template"]["spec"])
