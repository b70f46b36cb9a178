"""charts/tfpool: lint-clean, every rendered object valid for Kubernetes 1.37, the values a user sets take
effect, and what it shares with k8s/base (CRDs, RBAC, configuration) never drifts from it.

Runs the pinned Helm (`make helm`, built here when missing) offline: `helm lint` and `helm template`.
"""

from __future__ import annotations

import base64
import functools
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from cryptography import x509
from deploy_support import (
    REPO_ROOT,
    kubernetes_problem,
    objects_of_kind,
    render_kustomization,
    tfctl_rejection,
)
from tfcommon.config import DEFAULT_NATIVE_GPU_RESOURCES, parse_config
from tfcommon.kube_local.chart import stale_files, write_files
from tfcommon.kube_local.helm import ensure_helm

CHART = REPO_ROOT / "charts" / "tfpool"
NAMESPACE = "gpu-platform"
AGENT_NAMESPACE = f"{NAMESPACE}-node-agent"
EXTERNAL = {
    "nats.bundled": "false",
    "nats.url": "nats://nats.example:4222",
    **{
        f"nats.passwords.{user}": f"{user}-secret"
        for user in ("webhook", "scheduler", "defrag-planner", "metrics", "nats-auth")
    },
    "postgres.bundled": "false",
    "postgres.appUrl": "postgresql+psycopg://tfpool_app:a@db.example:5432/tfpool",
    "postgres.migrateUrl": "postgresql+psycopg://tfpool_migrate:m@db.example:5432/tfpool",
}
VARIANTS: dict[str, dict[str, str]] = {
    "defaults": {},
    "external-infrastructure": EXTERNAL,
    "cert-manager-monitoring-auto-migration": {
        "certificates.mode": "cert-manager",
        "monitoring.enabled": "true",
        "autoMigration.enabled": "true",
    },
}
CUSTOM_RESOURCE_KINDS = {
    ("cert-manager.io/v1", "Issuer"),
    ("cert-manager.io/v1", "Certificate"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
SERVICES = ("webhook", "scheduler", "defrag-planner", "metrics")


@functools.cache
def helm() -> str:
    return str(ensure_helm(lambda line: print(line, file=sys.stderr, flush=True)))


def run_helm(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([helm(), *args], capture_output=True, text=True, timeout=120, check=False)


def set_flags(values: dict[str, str]) -> list[str]:
    return [flag for key, value in values.items() for flag in ("--set", f"{key}={value}")]


@functools.cache
def _template(items: tuple[tuple[str, str], ...]) -> tuple[dict[str, Any], ...]:
    result = run_helm("template", "tfpool", str(CHART), "--namespace", NAMESPACE, *set_flags(dict(items)))
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def template(values: dict[str, str] | None = None) -> tuple[dict[str, Any], ...]:
    return _template(tuple(sorted((values or {}).items())))


def pod_specs(objects: tuple[dict[str, Any], ...]) -> dict[str, dict[str, Any]]:
    """`Kind/name` of each workload: its pod spec."""
    return {
        f"{obj['kind']}/{obj['metadata']['name']}": obj["spec"]["template"]["spec"]
        for obj in objects
        if obj["kind"] in {"Deployment", "DaemonSet", "StatefulSet", "Job"}
    }


def one(
    objects: tuple[dict[str, Any], ...], kind: str, name: str, namespace: str | None = None
) -> dict[str, Any]:
    found = [
        obj
        for obj in objects
        if obj["kind"] == kind
        and obj["metadata"]["name"] == name
        and (namespace is None or obj["metadata"].get("namespace") == namespace)
    ]
    assert len(found) == 1, f"{len(found)} {kind}/{name} in {namespace}"
    return found[0]


def test_generated_chart_files_match_k8s_base_and_deploy() -> None:
    assert stale_files(CHART, REPO_ROOT) == [], (
        "charts/tfpool is stale: run `python -m tfcommon.kube_local.chart`"
    )


def test_a_changed_source_makes_the_chart_stale(tmp_path: Path) -> None:
    for folder in ("k8s", "deploy"):
        subprocess.run(["cp", "-r", str(REPO_ROOT / folder), str(tmp_path / folder)], check=True)
    subprocess.run(["cp", "-r", str(CHART), str(tmp_path / "chart")], check=True)
    write_files(tmp_path / "chart", tmp_path)
    assert stale_files(tmp_path / "chart", tmp_path) == []
    crd = tmp_path / "k8s" / "base" / "crds" / "gpus.tensor-fusion.ai.yaml"
    crd.write_text(crd.read_text() + "# changed\n")
    scheduler = tmp_path / "k8s" / "base" / "scheduler.yaml"
    scheduler.write_text(scheduler.read_text().replace("  - patch\n", "  - update\n", 1))
    assert stale_files(tmp_path / "chart", tmp_path) == ["crds/gpus.tensor-fusion.ai.yaml", "files/rbac.yaml"]
    write_files(tmp_path / "chart", tmp_path)
    assert stale_files(tmp_path / "chart", tmp_path) == []


@pytest.mark.parametrize("variant", VARIANTS)
def test_helm_lint_is_clean(variant: str) -> None:
    result = run_helm("lint", "--strict", str(CHART), "--namespace", NAMESPACE, *set_flags(VARIANTS[variant]))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout, result.stdout
    assert "[ERROR]" not in result.stdout, result.stdout


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_rendered_object_is_valid_for_current_kubernetes(variant: str) -> None:
    objects = template(VARIANTS[variant])
    checked = [obj for obj in objects if (obj["apiVersion"], obj["kind"]) not in CUSTOM_RESOURCE_KINDS]
    assert len(checked) > 30
    problems = [problem for obj in checked if (problem := kubernetes_problem(obj))]
    assert problems == []


def test_crds_are_the_kustomize_base_crds() -> None:
    base = objects_of_kind(render_kustomization(REPO_ROOT / "k8s" / "base"), "CustomResourceDefinition")
    chart = {}
    for path in sorted((CHART / "crds").glob("*.yaml")):
        crd = yaml.safe_load(path.read_text())
        chart[crd["metadata"]["name"]] = crd
    assert chart.keys() == base.keys()
    for name, crd in chart.items():
        assert crd["spec"] == base[name]["spec"]


def test_rbac_rules_are_exactly_the_kustomize_base_rules() -> None:
    """The NATS auth callout's role comes with NATS: k8s/evaluation in kustomize, the chart here."""
    base = render_kustomization(REPO_ROOT / "k8s" / "base")
    evaluation = render_kustomization(REPO_ROOT / "k8s" / "evaluation")
    base += [obj for obj in evaluation if obj["metadata"]["name"] == "tfpool-nats-auth"]
    chart = template()
    for kind in ("ClusterRole", "Role"):
        expected = {
            name.removeprefix("tfpool-"): obj["rules"] for name, obj in objects_of_kind(base, kind).items()
        }
        rendered = {
            name.removeprefix("tfpool-"): obj["rules"] for name, obj in objects_of_kind(chart, kind).items()
        }
        assert rendered == expected, kind


def test_every_binding_names_a_service_account_in_its_workloads_namespace() -> None:
    objects = template()
    accounts = {
        (obj["metadata"]["namespace"], obj["metadata"]["name"])
        for obj in objects
        if obj["kind"] == "ServiceAccount"
    }
    for obj in objects:
        if obj["kind"] in {"ClusterRoleBinding", "RoleBinding"}:
            for subject in obj["subjects"]:
                assert (subject["namespace"], subject["name"]) in accounts, obj["metadata"]["name"]
    used = {
        (obj["metadata"]["namespace"], spec["serviceAccountName"])
        for obj in objects
        if obj["kind"] in {"Deployment", "DaemonSet"}
        for spec in [obj["spec"]["template"]["spec"]]
    }
    assert used <= accounts


def test_everything_lives_in_the_release_namespace_and_the_agents() -> None:
    for variant in VARIANTS.values():
        objects = template(variant)
        namespaces = {obj["metadata"].get("namespace") for obj in objects}
        assert namespaces == {NAMESPACE, AGENT_NAMESPACE, None}
        assert "tfpool-system" not in json.dumps(objects)
    agent = one(template(), "DaemonSet", "tfpool-node-agent")
    assert agent["metadata"]["namespace"] == AGENT_NAMESPACE


def test_values_set_image_replicas_resources_and_agent_placement() -> None:
    objects = template(
        {
            "image.repository": "registry.example.com/tfpool",
            "image.tag": "9.9.9",
            "webhook.replicas": "3",
            "scheduler.replicas": "1",
            "scheduler.resources.limits.memory": "2Gi",
            "nodeAgent.nodeSelector.gpu": "yes",
            "nodeAgent.tolerations[0].key": "dedicated",
            "nodeAgent.tolerations[0].operator": "Exists",
            "nodeAgent.namespace": "gpu-agents",
        }
    )
    images = {
        c["image"]
        for spec in pod_specs(objects).values()
        for c in spec["containers"] + spec.get("initContainers", [])
    }
    assert {"registry.example.com/tfpool:9.9.9"} == {image for image in images if "tfpool" in image}
    assert one(objects, "Deployment", "tfpool-webhook")["spec"]["replicas"] == 3
    scheduler = one(objects, "Deployment", "tfpool-scheduler")
    assert scheduler["spec"]["replicas"] == 1
    assert scheduler["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["memory"] == "2Gi"
    agent = one(objects, "DaemonSet", "tfpool-node-agent")
    assert agent["metadata"]["namespace"] == "gpu-agents"
    assert agent["spec"]["template"]["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.present": "true",
        "gpu": "yes",
    }
    assert agent["spec"]["template"]["spec"]["tolerations"] == [{"key": "dedicated", "operator": "Exists"}]


def test_image_tag_defaults_to_the_charts_app_version() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    webhook = one(template(), "Deployment", "tfpool-webhook")
    assert webhook["spec"]["template"]["spec"]["containers"][0]["image"] == f"tfpool:{chart['appVersion']}"


def test_webhook_failure_policy_and_timeout_come_from_values() -> None:
    registration = one(
        template({"webhook.failurePolicy": "Ignore", "webhook.timeoutSeconds": "12"}),
        "MutatingWebhookConfiguration",
        "tfpool-webhook",
    )
    webhook = registration["webhooks"][0]
    assert (webhook["failurePolicy"], webhook["timeoutSeconds"]) == ("Ignore", 12)
    assert webhook["clientConfig"]["service"]["namespace"] == NAMESPACE


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"webhook.failurePolicy": "Sometimes"}, "webhook.failurePolicy must be Fail or Ignore"),
        ({"webhook.timeoutSeconds": "60"}, "webhook.timeoutSeconds must be 1 to 30 seconds"),
        ({"certificates.mode": "manual"}, "certificates.mode must be helm or cert-manager"),
        ({"nats.bundled": "false"}, "nats.url is required with nats.bundled=false"),
        (
            {"nats.bundled": "false", "nats.url": "nats://nats.example:4222", "nats.passwords.webhook": "w"},
            "nats.passwords.scheduler is required with nats.bundled=false",
        ),
        ({"postgres.bundled": "false"}, "postgres.appUrl is required with postgres.bundled=false"),
        ({"nats.replicas": "1"}, "nats.streamReplicas (3) cannot exceed nats.replicas (1)"),
        ({"nats.replicas": "0", "nats.streamReplicas": "0"}, "nats.replicas must be 1 or more"),
    ],
)
def test_bad_values_are_refused_naming_the_value(values: dict[str, str], message: str) -> None:
    result = run_helm("template", "tfpool", str(CHART), "--namespace", NAMESPACE, *set_flags(values))
    assert result.returncode != 0
    assert message in result.stderr


def test_generated_certificate_serves_the_webhook_service_and_is_trusted_by_the_registration() -> None:
    objects = template()
    secret = one(objects, "Secret", "tfpool-webhook-tls")
    certificate = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["tls.crt"]))
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert f"tfpool-webhook.{NAMESPACE}.svc" in names.get_values_for_type(x509.DNSName)
    ca = x509.load_pem_x509_certificate(base64.b64decode(secret["data"]["ca.crt"]))
    certificate.verify_directly_issued_by(ca)
    registration = one(objects, "MutatingWebhookConfiguration", "tfpool-webhook")
    assert registration["webhooks"][0]["clientConfig"]["caBundle"] == secret["data"]["ca.crt"]
    assert "annotations" not in registration["metadata"]


def test_cert_manager_mode_issues_for_the_release_namespace() -> None:
    objects = template({"certificates.mode": "cert-manager"})
    certificate = one(objects, "Certificate", "tfpool-webhook")
    assert certificate["spec"]["dnsNames"][0] == f"tfpool-webhook.{NAMESPACE}.svc"
    registration = one(objects, "MutatingWebhookConfiguration", "tfpool-webhook")
    assert registration["metadata"]["annotations"] == {
        "cert-manager.io/inject-ca-from": f"{NAMESPACE}/tfpool-webhook"
    }
    assert "caBundle" not in registration["webhooks"][0]["clientConfig"]
    assert not [
        obj for obj in objects if obj["kind"] == "Secret" and obj["metadata"]["name"] == "tfpool-webhook-tls"
    ]


def test_migration_is_a_hook_job_before_install_and_upgrade_as_the_schema_owner() -> None:
    objects = template(EXTERNAL)
    job = one(objects, "Job", "tfpool-migrate")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["migrate"]
    source = container["env"][0]["valueFrom"]["secretKeyRef"]
    url_secret = one(objects, "Secret", source["name"])
    assert url_secret["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert int(url_secret["metadata"]["annotations"]["helm.sh/hook-weight"]) < 0
    assert base64.b64decode(url_secret["data"][source["key"]]).decode() == EXTERNAL["postgres.migrateUrl"]


def test_with_the_bundled_postgres_the_migration_runs_after_install() -> None:
    job = one(template(), "Job", "tfpool-migrate")
    assert job["metadata"]["annotations"]["helm.sh/hook"] == "post-install,pre-upgrade"


def test_every_service_waits_for_the_schema_instead_of_crash_looping() -> None:
    """But the node agent: it uses no database (it asks the scheduler), so it has nothing to wait for."""
    for name, spec in pod_specs(template()).items():
        if name == "DaemonSet/tfpool-node-agent":
            assert "initContainers" not in spec, name
            continue
        if "tfpool" not in spec["containers"][0]["image"] or name.startswith("Job/") or "nats-auth" in name:
            continue
        (wait,) = spec["initContainers"]
        assert wait["args"][:2] == ["migrate", "--wait"], name
        assert tfctl_rejection(wait["args"]) is None
        assert wait["env"][0]["valueFrom"]["secretKeyRef"]["key"] == "app-url"


def test_bundled_infrastructure_runs_the_shared_files_with_generated_passwords() -> None:
    objects = template()
    nats_config = one(objects, "ConfigMap", "tfpool-nats-config")
    assert nats_config["data"]["nats.conf"] == (REPO_ROOT / "deploy" / "nats" / "nats.conf").read_text()
    init = one(objects, "ConfigMap", "tfpool-postgres-init")
    assert init["data"]["roles.sql"] == (REPO_ROOT / "deploy" / "postgres" / "roles.sql").read_text()
    nats = {
        key: base64.b64decode(value).decode()
        for key, value in one(objects, "Secret", "tfpool-nats", NAMESPACE)["data"].items()
    }
    assert nats["url"] == f"nats://tfpool-nats.{NAMESPACE}.svc:4222"
    assert all(len(nats[f"{user}-password"]) == 32 for user in (*SERVICES, "nats-auth", "tfctl", "readonly"))
    assert len(nats["callout-secret"]) == 48
    assert not any("node-agent" in key for key in nats), "node agents have no shared NATS password"
    database = {
        key: base64.b64decode(value).decode()
        for key, value in one(objects, "Secret", "tfpool-database", NAMESPACE)["data"].items()
    }
    assert database["app-url"] == (
        f"postgresql+psycopg://tfpool_app:{database['app-password']}@tfpool-postgres.{NAMESPACE}.svc:5432/tfpool"
    )


def test_bundled_nats_is_a_three_server_cluster_fsyncing_every_write() -> None:
    objects = template()
    nats = one(objects, "StatefulSet", "tfpool-nats")
    assert nats["spec"]["replicas"] == 3
    assert nats["spec"]["podManagementPolicy"] == "Parallel"
    headless = one(objects, "Service", nats["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    (container,) = nats["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    assert args[args.index("--config") + 1] == "/etc/nats/cluster.conf"
    routes = args[args.index("--routes") + 1].split(",")
    assert routes == [f"nats://tfpool-nats-{i}.tfpool-nats-cluster.{NAMESPACE}.svc:6222" for i in range(3)]
    config = one(objects, "ConfigMap", "tfpool-nats-config")["data"]
    assert config["cluster.conf"] == (REPO_ROOT / "deploy" / "nats" / "cluster.conf").read_text()
    assert "sync_interval: always" in config["cluster.conf"]
    assert "include ./nats.conf" in config["cluster.conf"]
    assert one(objects, "PodDisruptionBudget", "tfpool-nats")["spec"]["maxUnavailable"] == 1
    for name, spec in pod_specs(objects).items():
        env = {item["name"]: item.get("value") for item in spec["containers"][0].get("env", [])}
        if "TF_NATS_URL" in env and env.get("TF_NATS_USER") != "nats-auth":
            assert env["TF_NATS_STREAM_REPLICAS"] == "3", name


def test_one_bundled_nats_server_runs_unclustered_with_one_replica_streams() -> None:
    objects = template({"nats.replicas": "1", "nats.streamReplicas": "1"})
    nats = one(objects, "StatefulSet", "tfpool-nats")
    assert nats["spec"]["replicas"] == 1
    assert "--routes" not in nats["spec"]["template"]["spec"]["containers"][0]["args"]
    budgets = [obj["metadata"]["name"] for obj in objects if obj["kind"] == "PodDisruptionBudget"]
    assert "tfpool-nats" not in budgets
    scheduler = one(objects, "Deployment", "tfpool-scheduler")["spec"]["template"]["spec"]["containers"][0]
    assert {"name": "TF_NATS_STREAM_REPLICAS", "value": "1"} in scheduler["env"]


def test_agent_namespace_holds_only_the_agents_own_credentials() -> None:
    objects = template()
    nats = one(objects, "Secret", "tfpool-nats", AGENT_NAMESPACE)
    assert set(nats["data"]) == {"url"}, (
        "an agent proves its node with its own pod's token, no shared password"
    )
    in_agent_namespace = {
        obj["metadata"]["name"]
        for obj in objects
        if obj["kind"] == "Secret" and obj["metadata"].get("namespace") == AGENT_NAMESPACE
    }
    assert "tfpool-database" not in in_agent_namespace, "the node agent holds no database credential"
    agent = one(objects, "DaemonSet", "tfpool-node-agent", AGENT_NAMESPACE)["spec"]["template"]["spec"]
    for container in (*agent["containers"], *agent.get("initContainers", [])):
        names = {item["name"] for item in container.get("env", [])}
        assert not any("DATABASE" in name for name in names), container["name"]


def test_configuration_is_valid_and_automatic_migration_follows_its_switch() -> None:
    for enabled in (False, True):
        objects = template({"autoMigration.enabled": str(enabled).lower()})
        for namespace in (NAMESPACE, AGENT_NAMESPACE):
            config = parse_config(
                one(objects, "ConfigMap", "tfpool-config", namespace)["data"]["config.yaml"]
            )
            assert config.dynamic_config.auto_migration.enable is enabled


@pytest.mark.parametrize(
    "switch",
    [
        "autoMigration.enabled",
        "dynamicConfig.autoMigration.enable",
        "config.dynamicConfig.autoMigration.enable",
    ],
)
def test_the_guides_dynamic_config_values_switch_automatic_migration_on_like_our_own(switch: str) -> None:
    objects = template(
        {switch: "true", "dynamicConfig.autoMigration.scope.includes.namespaceNames[0]": "ml-team-a"}
    )
    config = parse_config(one(objects, "ConfigMap", "tfpool-config", NAMESPACE)["data"]["config.yaml"])
    assert config.dynamic_config.auto_migration.enable is True
    assert config.dynamic_config.auto_migration.scope is not None
    assert config.dynamic_config.auto_migration.scope.includes is not None
    assert config.dynamic_config.auto_migration.scope.includes.namespace_names == ("ml-team-a",)
    webhook = one(objects, "MutatingWebhookConfiguration", "tfpool-webhook")["webhooks"][0]
    assert [condition["name"] for condition in webhook["matchConditions"]] == [
        "not-opted-out",
        "opted-in-or-native-gpu",
    ]


def test_automatic_migration_narrows_the_webhook_with_match_conditions() -> None:
    off = one(template(), "MutatingWebhookConfiguration", "tfpool-webhook")["webhooks"][0]
    assert off["objectSelector"]["matchExpressions"][0]["key"] == "tensor-fusion.ai/enabled"
    assert "matchConditions" not in off
    on = one(template({"autoMigration.enabled": "true"}), "MutatingWebhookConfiguration", "tfpool-webhook")[
        "webhooks"
    ][0]
    assert "objectSelector" not in on
    names = [condition["name"] for condition in on["matchConditions"]]
    assert names == ["not-opted-out", "opted-in-or-native-gpu"]
    for resource in DEFAULT_NATIVE_GPU_RESOURCES:
        assert f"'{resource}'" in on["matchConditions"][1]["expression"]


def test_configured_native_resources_are_the_ones_the_match_conditions_name() -> None:
    on = one(
        template(
            {"autoMigration.enabled": "true", "config.nativeGpuResourceNames[0]": "example.com/accelerator"}
        ),
        "MutatingWebhookConfiguration",
        "tfpool-webhook",
    )["webhooks"][0]
    expression = on["matchConditions"][1]["expression"]
    assert "['example.com/accelerator']" in expression
    assert "nvidia.com/gpu" not in expression


def test_monitoring_is_off_by_default_and_renders_the_base_alerts_when_on() -> None:
    kinds = {obj["kind"] for obj in template()}
    assert not kinds & {"ServiceMonitor", "PrometheusRule"}
    objects = template({"monitoring.enabled": "true", "monitoring.labels.release": "prometheus"})
    rule = one(objects, "PrometheusRule", "tfpool-default-alerts")
    base = yaml.safe_load((REPO_ROOT / "k8s" / "base" / "monitoring" / "prometheusrule.yaml").read_text())
    assert rule["spec"] == base["spec"]
    assert one(objects, "ServiceMonitor", "tfpool-metrics")["metadata"]["labels"]["release"] == "prometheus"
    assert (
        one(objects, "ConfigMap", "tfpool-grafana-dashboard")["metadata"]["labels"]["grafana_dashboard"]
        == "1"
    )


def test_chart_and_kustomize_component_send_the_webhook_the_same_pods(tmp_path: Path) -> None:
    relative = Path(os.path.relpath(REPO_ROOT / "k8s", tmp_path))
    tmp_path.joinpath("kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "resources": [str(relative / "base")],
                "components": [str(relative / "components" / "auto-migration")],
            }
        )
    )
    component = objects_of_kind(render_kustomization(tmp_path), "MutatingWebhookConfiguration")[
        "tfpool-webhook"
    ]
    chart = one(template({"autoMigration.enabled": "true"}), "MutatingWebhookConfiguration", "tfpool-webhook")
    assert "objectSelector" not in component["webhooks"][0]
    assert component["webhooks"][0]["matchConditions"] == chart["webhooks"][0]["matchConditions"]
