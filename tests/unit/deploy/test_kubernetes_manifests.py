"""k8s/: the kustomizations render, every object is valid for Kubernetes 1.37, and they match the code."""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from deploy_support import (
    REPO_ROOT,
    SERVICE_SETTINGS,
    VENV_BIN,
    kubernetes_problem,
    objects_of_kind,
    render_kustomization,
    settings_env_names,
    tfctl_rejection,
)
from tfcommon.cluster.rbac import REQUIRED_RBAC
from tfcommon.config import parse_config

NAMESPACE = "tfpool-system"
K8S = REPO_ROOT / "k8s"
KUSTOMIZATIONS = {
    "base": K8S / "base",
    "evaluation": K8S / "evaluation",
    "existing-infra": K8S / "examples" / "existing-infra",
    "model-cache": K8S / "examples" / "model-cache",
}
CERT_MANAGER_KINDS = {("cert-manager.io/v1", "Issuer"), ("cert-manager.io/v1", "Certificate")}
WRITE_VERBS = {"create", "update", "patch", "delete", "deletecollection"}
TF = "tensor-fusion.ai"


@functools.cache
def rendered(name: str) -> tuple[dict[str, Any], ...]:
    return tuple(render_kustomization(KUSTOMIZATIONS[name]))


@functools.cache
def rendered_with_components(*components: str) -> tuple[dict[str, Any], ...]:
    """The evaluation overlay plus components, the way a user's own overlay would add them."""
    with tempfile.TemporaryDirectory() as folder:
        overlay = Path(folder)
        relative = Path(os.path.relpath(K8S, overlay))
        overlay.joinpath("kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    "resources": [str(relative / "evaluation")],
                    "components": [str(relative / "components" / component) for component in components],
                }
            )
        )
        return tuple(render_kustomization(overlay))


def base() -> tuple[dict[str, Any], ...]:
    return rendered("base")


def workloads() -> dict[str, dict[str, Any]]:
    """The five services' Deployments and the DaemonSet, by component name."""
    found = {}
    for obj in base():
        if obj["kind"] in ("Deployment", "DaemonSet"):
            found[obj["metadata"]["labels"]["app.kubernetes.io/component"]] = obj
    return found


def only_container(workload: dict[str, Any]) -> dict[str, Any]:
    (container,) = workload["spec"]["template"]["spec"]["containers"]
    return dict(container)


def rules_of(service: str) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) granted to a service's account, cluster-wide and in its namespace."""
    account = f"tfpool-{service}"
    granted: set[tuple[str, str, str]] = set()
    roles = {(obj["kind"], obj["metadata"]["name"]): obj for obj in base() if obj["kind"].endswith("Role")}
    for binding in base():
        if not binding["kind"].endswith("RoleBinding"):
            continue
        if not any(subject["name"] == account for subject in binding["subjects"]):
            continue
        role = roles[(binding["roleRef"]["kind"], binding["roleRef"]["name"])]
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    granted |= {(group, resource, verb) for verb in rule["verbs"]}
    return granted


def grants(group: str, resources: list[str], verbs: list[str]) -> set[tuple[str, str, str]]:
    return {(group, resource, verb) for resource in resources for verb in verbs}


def test_every_object_is_valid_for_current_kubernetes() -> None:
    objects = [
        *rendered("evaluation"),
        *rendered_with_components("auto-migration", "manual-webhook-certs"),
        *rendered("existing-infra"),
        *rendered("model-cache"),
    ]
    checked = [obj for obj in objects if (obj["apiVersion"], obj["kind"]) not in CERT_MANAGER_KINDS]
    assert len(checked) > 40
    assert [problem for obj in checked if (problem := kubernetes_problem(obj))] == []


def test_validation_catches_an_invalid_object() -> None:
    deployment = next(obj for obj in base() if obj["kind"] == "Deployment")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = ["Always"]
    assert kubernetes_problem(broken) is not None
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["replicaz"] = 2
    assert kubernetes_problem(broken) is not None


def test_existing_infrastructure_example_is_the_base_with_the_users_image() -> None:
    images = {
        only_container(obj)["image"]
        for obj in rendered("existing-infra")
        if obj["kind"] in ("Deployment", "DaemonSet")
    }
    assert images == {"registry.example.com/tfpool:0.1.0"}
    assert objects_of_kind(rendered("existing-infra"), "StatefulSet") == {}


def test_namespaced_objects_live_in_the_tfpool_namespace() -> None:
    cluster_scoped = {
        "Namespace", "CustomResourceDefinition", "PriorityClass", "ClusterRole", "ClusterRoleBinding",
        "MutatingWebhookConfiguration",
    }  # fmt: skip
    for obj in rendered("evaluation"):
        if obj["kind"] not in cluster_scoped:
            assert obj["metadata"].get("namespace") == NAMESPACE, f"{obj['kind']}/{obj['metadata']['name']}"


def test_cert_manager_issues_the_webhook_serving_certificate() -> None:
    certificate = objects_of_kind(base(), "Certificate")["tfpool-webhook"]
    issuer = objects_of_kind(base(), "Issuer")[certificate["spec"]["issuerRef"]["name"]]
    assert issuer["spec"] == {"selfSigned": {}}
    assert f"tfpool-webhook.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    webhook_volumes = workloads()["webhook"]["spec"]["template"]["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": certificate["spec"]["secretName"]}} in webhook_volumes
    configuration = objects_of_kind(base(), "MutatingWebhookConfiguration")["tfpool-webhook"]
    injected = configuration["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
    assert injected == f"{NAMESPACE}/tfpool-webhook"


def test_manual_certificates_component_leaves_no_cert_manager_object() -> None:
    objects = rendered_with_components("manual-webhook-certs")
    assert [obj for obj in objects if obj["apiVersion"].startswith("cert-manager.io")] == []
    configuration = objects_of_kind(objects, "MutatingWebhookConfiguration")["tfpool-webhook"]
    assert "cert-manager.io/inject-ca-from" not in configuration["metadata"].get("annotations", {})


def admission_webhook(objects: tuple[dict[str, Any], ...]) -> dict[str, Any]:
    (webhook,) = objects_of_kind(objects, "MutatingWebhookConfiguration")["tfpool-webhook"]["webhooks"]
    return dict(webhook)


def test_webhook_mutates_pod_creation_only_on_its_path() -> None:
    webhook = admission_webhook(base())
    assert webhook["clientConfig"]["service"] == {
        "name": "tfpool-webhook", "namespace": NAMESPACE, "path": "/mutate-v1-pod", "port": 443,
    }  # fmt: skip
    assert webhook["rules"] == [
        {"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"],
         "scope": "Namespaced"},
    ]  # fmt: skip
    assert webhook["admissionReviewVersions"] == ["v1"]
    assert webhook["sideEffects"] == "NoneOnDryRun"
    assert webhook["reinvocationPolicy"] == "IfNeeded"
    assert webhook["failurePolicy"] == "Fail"
    assert 1 <= webhook["timeoutSeconds"] <= 10


def test_webhook_service_reaches_the_webhook_port() -> None:
    service = objects_of_kind(base(), "Service")["tfpool-webhook"]
    (port,) = service["spec"]["ports"]
    (container_port,) = only_container(workloads()["webhook"])["ports"]
    assert port["port"] == 443
    assert port["targetPort"] == container_port["name"]
    assert container_port["containerPort"] == SERVICE_SETTINGS["webhook"].model_fields["port"].default


def test_webhook_never_sees_system_namespaces_and_only_opted_in_pods() -> None:
    webhook = admission_webhook(base())
    (excluded,) = webhook["namespaceSelector"]["matchExpressions"]
    assert excluded["key"] == "kubernetes.io/metadata.name"
    assert excluded["operator"] == "NotIn"
    assert set(excluded["values"]) == {"kube-system", NAMESPACE}
    assert webhook["objectSelector"] == {
        "matchExpressions": [{"key": f"{TF}/enabled", "operator": "In", "values": ["true"]}]
    }


def test_automatic_migration_drops_the_object_selector_and_enables_migration() -> None:
    objects = rendered_with_components("auto-migration")
    webhook = admission_webhook(objects)
    assert "objectSelector" not in webhook
    assert webhook["namespaceSelector"] == admission_webhook(base())["namespaceSelector"]
    (config_map,) = [obj for obj in objects if obj["metadata"]["name"].startswith("tfpool-config")]
    config = parse_config(config_map["data"]["config.yaml"], source="auto-migration config")
    assert config.dynamic_config.auto_migration.enable is True


def test_configuration_file_is_valid_and_mounted_where_the_services_read_it() -> None:
    (config_map,) = [obj for obj in base() if obj["metadata"]["name"].startswith("tfpool-config")]
    config = parse_config(config_map["data"]["config.yaml"], source="k8s/base config")
    assert config.dynamic_config.auto_migration.enable is False
    for name, workload in workloads().items():
        spec = workload["spec"]["template"]["spec"]
        env = {item["name"]: item.get("value") for item in only_container(workload)["env"]}
        mounts = {mount["name"]: mount for mount in only_container(workload)["volumeMounts"]}
        config_volume = next(volume for volume in spec["volumes"] if volume["name"] == "config")
        assert config_volume["configMap"]["name"] == config_map["metadata"]["name"], name
        assert mounts["config"]["mountPath"] == env["TF_CONFIG_FILE"], name


def test_priority_classes_match_tensor_fusion() -> None:
    classes = objects_of_kind(base(), "PriorityClass")
    assert {name: obj["value"] for name, obj in classes.items()} == {
        "tensor-fusion-high": 10000,
        "tensor-fusion-critical": 100000,
    }
    assert not any(obj.get("globalDefault") for obj in classes.values())


def test_services_run_with_the_replicas_the_design_asks_for() -> None:
    found = workloads()
    assert set(found) == set(SERVICE_SETTINGS)
    assert found["node-agent"]["kind"] == "DaemonSet"
    replicas = {
        name: obj["spec"].get("replicas") for name, obj in found.items() if obj["kind"] == "Deployment"
    }
    assert replicas == {"webhook": 2, "scheduler": 2, "defrag-planner": 1, "metrics": 1}


@pytest.mark.parametrize("name", sorted(SERVICE_SETTINGS))
def test_container_runs_tfctl_serve_on_the_default_port_with_known_settings(name: str) -> None:
    container = only_container(workloads()[name])
    assert container["args"] == ["serve", name]
    assert tfctl_rejection(container["args"]) is None
    (port,) = container["ports"]
    assert port["containerPort"] == SERVICE_SETTINGS[name].model_fields["port"].default
    variables = {item["name"] for item in container["env"] if item["name"].startswith("TF_")}
    unknown = variables - settings_env_names(SERVICE_SETTINGS[name])
    assert unknown == set()
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["port"] == port["name"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"


@pytest.mark.parametrize("name", sorted(SERVICE_SETTINGS))
def test_container_is_unprivileged_and_reads_secrets_from_kubernetes_secrets(name: str) -> None:
    workload = workloads()[name]
    pod = workload["spec"]["template"]["spec"]
    container = only_container(workload)
    if name != "node-agent":
        assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert not container["securityContext"].get("privileged", False)
    env = {item["name"]: item for item in container["env"]}
    secrets = (
        ("TF_API_TOKEN",) if name == "node-agent" else ("TF_NATS_PASSWORD", "TF_DATABASE_URL", "TF_API_TOKEN")
    )
    for secret in secrets:
        assert "value" not in env[secret]
        assert env[secret]["valueFrom"]["secretKeyRef"]["name"] in (
            "tfpool-nats",
            "tfpool-database",
            "tfpool-api-token",
        )
    if name == "node-agent":
        assert not any("DATABASE" in variable for variable in env), (
            "the node agent holds no database credential"
        )
    else:
        assert env["TF_DATABASE_URL"]["valueFrom"]["secretKeyRef"]["key"] == "app-url"
    if name == "node-agent":
        assert env["TF_NATS_USER"]["value"] == "node:$(TF_NODE_NAME)"
        assert "TF_NATS_PASSWORD" not in env, "no NATS password shared by every node"
        token = next(volume for volume in pod["volumes"] if volume["name"] == "nats-token")
        (source,) = token["projected"]["sources"]
        assert source["serviceAccountToken"]["audience"] == "tfpool-nats"
        mount = next(m for m in container["volumeMounts"] if m["name"] == "nats-token")
        assert (
            env["TF_NATS_PASSWORD_FILE"]["value"]
            == f"{mount['mountPath']}/{source['serviceAccountToken']['path']}"
        )
        names = [item["name"] for item in container["env"]]
        assert names.index("TF_NODE_NAME") < names.index("TF_NATS_USER"), (
            "$(TF_NODE_NAME) expands only once defined"
        )
    else:
        assert env["TF_NATS_USER"]["value"] == name


def test_migrate_job_runs_tfctl_migrate_as_the_schema_owner() -> None:
    job = objects_of_kind(base(), "Job")["tfpool-migrate"]
    (container,) = job["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["migrate"]
    assert tfctl_rejection(container["args"]) is None
    (database,) = [item for item in container["env"] if item["name"] == "TF_DATABASE_URL"]
    assert database["valueFrom"]["secretKeyRef"] == {"name": "tfpool-database", "key": "migrate-url"}
    assert job["spec"]["template"]["spec"]["automountServiceAccountToken"] is False


def test_node_agent_runs_on_gpu_nodes_and_knows_its_node() -> None:
    agent = workloads()["node-agent"]["spec"]["template"]["spec"]
    assert agent["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in agent["tolerations"]
    container = only_container(workloads()["node-agent"])
    env = {item["name"]: item for item in container["env"]}
    assert env["TF_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "TF_FAKE_GPUS" not in env


def test_node_agent_serves_device_plugins_in_the_kubelet_folder() -> None:
    agent = workloads()["node-agent"]
    container = only_container(agent)
    plugin_dir = next(item["value"] for item in container["env"] if item["name"] == "TF_DEVICE_PLUGIN_DIR")
    mount = next(mount for mount in container["volumeMounts"] if mount["mountPath"] == plugin_dir)
    volume = next(v for v in agent["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"])
    assert volume["hostPath"] == {"path": "/var/lib/kubelet/device-plugins", "type": "Directory"}
    assert grants("", ["pods"], ["list"]) <= rules_of("node-agent")


def test_our_services_have_disruption_budgets_that_never_block_a_drain_forever() -> None:
    budgets = objects_of_kind(base(), "PodDisruptionBudget")
    found = workloads()
    for name in ("webhook", "scheduler", "defrag-planner", "metrics"):
        budget = budgets[f"tfpool-{name}"]["spec"]
        assert budget["selector"]["matchLabels"] == found[name]["spec"]["selector"]["matchLabels"]
        if "minAvailable" in budget:
            assert budget["minAvailable"] < found[name]["spec"]["replicas"], name


def test_each_service_runs_under_its_own_service_account() -> None:
    for name, workload in workloads().items():
        assert workload["spec"]["template"]["spec"]["serviceAccountName"] == f"tfpool-{name}"
    accounts = set(objects_of_kind(base(), "ServiceAccount"))
    assert accounts == {f"tfpool-{name}" for name in [*SERVICE_SETTINGS, "migrate"]}


def required_by_code(service: str) -> set[tuple[str, str, str]]:
    return {
        (rule.api_group, resource, verb)
        for rule in REQUIRED_RBAC[service]
        for resource in rule.resources
        for verb in rule.verbs
    }


@pytest.mark.parametrize("service", sorted(REQUIRED_RBAC))
def test_cluster_role_grants_exactly_what_the_kubernetes_adapter_calls(service: str) -> None:
    (role,) = [
        obj
        for obj in base()
        if obj["kind"] == "ClusterRole" and obj["metadata"]["name"] == f"tfpool-{service}"
    ]
    granted = {
        (group, resource, verb)
        for rule in role["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    assert granted == required_by_code(service)


def test_scheduler_may_additionally_only_hold_its_leader_election_lease() -> None:
    extra = rules_of("scheduler") - required_by_code("scheduler")
    assert extra == grants("coordination.k8s.io", ["leases"], ["create", "get", "update"])
    (role,) = [
        obj for obj in base() if obj["kind"] == "Role" and obj["metadata"]["name"] == "tfpool-scheduler"
    ]
    updating = [rule for rule in role["rules"] if "update" in rule["verbs"]]
    assert [rule["resourceNames"] for rule in updating] == [["tfpool-scheduler"]]


def test_defrag_planner_has_no_rights_beyond_its_adapter() -> None:
    assert rules_of("defrag-planner") == required_by_code("defrag-planner")


def test_node_agent_may_only_keep_gpu_and_gpunode_objects() -> None:
    assert (
        rules_of("node-agent")
        == required_by_code("node-agent")
        == (
            grants("", ["pods"], ["list"])
            | grants(TF, ["gpunodes"], ["get"])
            | grants(TF, ["providerconfigs"], ["list"])
            | grants(TF, ["gpus", "gpunodes"], ["create", "patch"])
            | grants(TF, ["gpus/status", "gpunodes/status"], ["patch"])
        )
    )
    env = {item["name"]: item.get("value") for item in only_container(workloads()["node-agent"])["env"]}
    assert env["TF_AGENT_KUBERNETES"] == "true"


def test_webhook_and_metrics_only_read() -> None:
    assert (
        rules_of("webhook")
        == grants("", ["namespaces"], ["get"])
        | grants("", ["pods"], ["list"])
        | grants(TF, ["gpupools", "gpuresourcequotas", "workloadprofiles"], ["list", "watch"])
        == required_by_code("webhook")
    )
    assert rules_of("metrics") == grants(TF, ["gpupools", "providerconfigs"], ["list", "watch"])


def test_no_account_gets_wildcards_secrets_or_rbac_rights() -> None:
    for name in [*SERVICE_SETTINGS, "migrate"]:
        for group, resource, verb in rules_of(name):
            assert "*" not in (group, resource, verb), name
            assert resource not in ("secrets", "roles", "clusterroles", "rolebindings", "clusterrolebindings")
    assert rules_of("migrate") == set()


def test_evaluation_runs_nats_and_postgres_from_the_shared_files() -> None:
    objects = rendered("evaluation")
    sets = objects_of_kind(objects, "StatefulSet")
    assert set(sets) == {"tfpool-nats", "tfpool-postgres"}
    nats_config = next(obj for obj in objects if obj["metadata"]["name"].startswith("tfpool-nats-config"))
    assert nats_config["data"]["nats.conf"] == (REPO_ROOT / "deploy/nats/nats.conf").read_text()
    init = next(obj for obj in objects if obj["metadata"]["name"].startswith("tfpool-postgres-init"))
    assert init["data"]["roles.sql"] == (REPO_ROOT / "deploy/postgres/roles.sql").read_text()
    nats_env = {
        item["name"] for item in sets["tfpool-nats"]["spec"]["template"]["spec"]["containers"][0]["env"]
    }
    conf = (REPO_ROOT / "deploy/nats/nats.conf").read_text()
    assert {name for name in nats_env if f"${name}" in conf} == nats_env
    assert "$NATS_CALLOUT_ISSUER" in conf, "set from the init container's file by the container's command"
    secrets = objects_of_kind(objects, "Secret")
    nats_secret = next(secret for name, secret in secrets.items() if name.startswith("tfpool-nats-"))
    for service in (*(s for s in SERVICE_SETTINGS if s != "node-agent"), "nats-auth"):
        assert f"{service}-password" in nats_secret["data"], service
    assert "node-agent-password" not in nats_secret["data"]
    assert "callout-secret" in nats_secret["data"]
    callout = objects_of_kind(objects, "Deployment")["tfpool-nats-auth"]["spec"]["template"]["spec"]
    assert callout["containers"][0]["args"] == ["nats", "callout"]
    (issuer,) = sets["tfpool-nats"]["spec"]["template"]["spec"]["initContainers"]
    assert issuer["args"][:2] == ["nats", "issuer"]


def test_gpunode_takes_the_do_not_disrupt_label_with_kubectl() -> None:
    result = subprocess.run(
        [str(VENV_BIN / "kubectl"), "label", "--local", "-o", "yaml", "--overwrite",
         "-f", str(K8S / "examples" / "gpunode.yaml"), f"{TF}/do-not-disrupt=true"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert yaml.safe_load(result.stdout)["metadata"]["labels"][f"{TF}/do-not-disrupt"] == "true"
