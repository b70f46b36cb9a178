"""charts/tfpool on a real API server (the session's `local_kubernetes`, KWOK nodes): `helm install` into a
namespace that enforces Pod Security `restricted`, `helm upgrade` to a changed value, `helm rollback`;
automatic migration's matchConditions deciding which pods the API server sends to the webhook; and the
migration guide's automatic migration installed as its seed says, by upgrading a release with the scope
in its values.

KWOK runs no container: pods are scheduled, admitted (Pod Security included) and reported Ready, and Job
pods Succeeded, which is what Helm's `--wait` and its hooks wait for.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from tfcommon.kube_local import KWOK_NODE_ANNOTATION, LocalKubernetes
from tfcommon.kube_local.helm import ensure_helm

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[3]
CHART = REPO_ROOT / "charts" / "tfpool"
KUBECTL = Path(sys.executable).parent / "kubectl"
EXTERNAL = [
    "--set",
    "nats.bundled=false",
    "--set",
    "nats.url=nats://nats.example:4222",
    "--set",
    "nats.passwords.webhook=w,nats.passwords.scheduler=s,nats.passwords.defrag-planner=d",
    "--set",
    "nats.passwords.nats-auth=n,nats.passwords.metrics=m",
    "--set",
    "postgres.bundled=false",
    "--set",
    "postgres.appUrl=postgresql+psycopg://tfpool_app:a@db.example:5432/tfpool",
    "--set",
    "postgres.migrateUrl=postgresql+psycopg://tfpool_migrate:m@db.example:5432/tfpool",
    "--set",
    "priorityClasses.create=false",
    "--skip-crds",
]
"""A release against external NATS and Postgres. The session's control plane already holds the CRDs, applied
from k8s/base by `local_kubernetes` (the chart's crds/ are the same files, tests/unit/deploy checks), and
the PriorityClasses, applied by the `cluster` fixture."""


class Cluster:
    """kubectl and helm against the session's control plane."""

    def __init__(self, control_plane: LocalKubernetes) -> None:
        self.kubeconfig = str(control_plane.kubeconfig)
        self.helm_binary = str(ensure_helm(lambda line: print(line, file=sys.stderr, flush=True)))

    def run_kubectl(self, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(KUBECTL), f"--kubeconfig={self.kubeconfig}", *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        result = self.run_kubectl(*args, stdin=stdin)
        assert result.returncode == 0, f"kubectl {' '.join(args)}: {result.stderr}"
        return result.stdout

    def get(self, *args: str) -> dict[str, Any]:
        document: dict[str, Any] = json.loads(self.kubectl("get", *args, "-o", "json"))
        return document

    def helm(self, *args: str) -> str:
        result = subprocess.run(
            [self.helm_binary, f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert result.returncode == 0, f"helm {' '.join(args)}:\n{result.stdout}\n{result.stderr}"
        return result.stdout

    def apply(self, document: dict[str, Any]) -> None:
        self.kubectl("apply", "--server-side", "-f", "-", stdin=json.dumps(document))


@pytest.fixture(scope="module")
def cluster(local_kubernetes: LocalKubernetes) -> Iterator[Cluster]:
    """The control plane with a KWOK GPU node and tfpool's PriorityClasses (cluster-wide, kept)."""
    cluster = Cluster(local_kubernetes)
    node = f"helm-gpu-{uuid.uuid4().hex[:6]}"
    key, value = KWOK_NODE_ANNOTATION
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": node,
                "annotations": {key: value},
                "labels": {"nvidia.com/gpu.present": "true", "type": "kwok", "kubernetes.io/hostname": node},
            },
            "spec": {},
        }
    )
    # Other suites on this control plane apply the same classes under their own field manager.
    classes = str(REPO_ROOT / "k8s" / "base" / "priorityclasses.yaml")
    cluster.kubectl("apply", "--server-side", "--force-conflicts", "-f", classes)
    cluster.kubectl("wait", "--for=condition=Ready", f"node/{node}", "--timeout=60s")
    try:
        yield cluster
    finally:
        cluster.run_kubectl("delete", "node", node, "--wait=false")


@pytest.fixture
def restricted_namespace(cluster: Cluster) -> Iterator[str]:
    name = f"tfpool-helm-{uuid.uuid4().hex[:6]}"
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": {"pod-security.kubernetes.io/enforce": "restricted"}},
        }
    )
    try:
        yield name
    finally:
        cluster.run_kubectl("delete", "namespace", name, f"{name}-node-agent", "--wait=false")


def release_cleanup(cluster: Cluster, release: str, namespace: str) -> None:
    subprocess.run(
        [
            cluster.helm_binary,
            f"--kubeconfig={cluster.kubeconfig}",
            "uninstall",
            release,
            "-n",
            namespace,
            "--wait",
        ],
        capture_output=True,
        timeout=300,
        check=False,
    )


def secret_data(cluster: Cluster, namespace: str, name: str) -> dict[str, str]:
    data = cluster.get("secret", name, "-n", namespace)["data"]
    return {key: base64.b64decode(value).decode() for key, value in data.items()}


def network_policies(cluster: Cluster, namespace: str) -> dict[str, dict[str, Any]]:
    items = cluster.get("networkpolicies", "-n", namespace)["items"]
    return {policy["metadata"]["name"]: policy["spec"] for policy in items}


def assert_release_network_policies(cluster: Cluster, namespace: str, agents: str, release: str) -> None:
    """The release's NetworkPolicies as the API server stored them (external NATS and Postgres: none for
    them). This control plane has no network plugin, so they are not enforced here: what they admit is
    checked in tests/unit/deploy/test_network_policies.py."""
    ours = {"app.kubernetes.io/name": "tfpool", "app.kubernetes.io/instance": release}
    policies = network_policies(cluster, namespace)
    assert set(policies) == {
        "tfpool-default-deny-ingress",
        "tfpool-webhook-from-api-server",
        "tfpool-scrapes-from-monitoring",
    }
    assert policies["tfpool-default-deny-ingress"]["podSelector"] == {}
    assert policies["tfpool-default-deny-ingress"]["policyTypes"] == ["Ingress"]
    webhook = policies["tfpool-webhook-from-api-server"]
    assert webhook["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "webhook"
    assert webhook["ingress"] == [{"ports": [{"port": 9443, "protocol": "TCP"}]}]
    (scrapes,) = policies["tfpool-scrapes-from-monitoring"]["ingress"]
    assert scrapes["from"] == [
        {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    ]
    assert policies["tfpool-scrapes-from-monitoring"]["podSelector"]["matchLabels"] == ours
    agent_policies = network_policies(cluster, agents)
    assert set(agent_policies) == {"tfpool-default-deny-ingress", "tfpool-scrapes-from-monitoring"}
    (agent_scrapes,) = agent_policies["tfpool-scrapes-from-monitoring"]["ingress"]
    assert agent_scrapes["ports"] == [{"port": 8001, "protocol": "TCP"}]


def test_kustomize_network_policies_are_stored_by_the_api_server(
    cluster: Cluster, restricted_namespace: str
) -> None:
    """k8s/base's NetworkPolicies applied to the real API server, read back with their selectors. This
    control plane has no network plugin, so they are stored but not enforced: what they admit is checked
    in tests/unit/deploy/test_network_policies.py."""
    rendered = cluster.kubectl("kustomize", str(REPO_ROOT / "k8s" / "base"))
    policies = [doc for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] == "NetworkPolicy"]
    for policy in policies:
        policy["metadata"]["namespace"] = restricted_namespace
        cluster.apply(policy)
    stored = network_policies(cluster, restricted_namespace)
    assert set(stored) == {policy["metadata"]["name"] for policy in policies}
    assert stored["tfpool-default-deny-ingress"]["podSelector"] == {}
    nats = stored["tfpool-nats-from-tfpool"]
    assert nats["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "nats"
    assert nats["ingress"] == [
        {
            "from": [{"podSelector": {"matchLabels": {"app.kubernetes.io/name": "tfpool"}}}],
            "ports": [{"port": 4222, "protocol": "TCP"}],
        }
    ]
    postgres = stored["tfpool-postgres-from-tfpool"]
    assert postgres["ingress"][0]["ports"] == [{"port": 5432, "protocol": "TCP"}]
    scrape_ports = {
        entry["port"] for entry in stored["tfpool-scrapes-from-monitoring"]["ingress"][0]["ports"]
    }
    assert scrape_ports == {8080, 8070, 8001, 8090, 8222}


def test_install_upgrade_and_rollback_on_a_real_api_server(
    cluster: Cluster, restricted_namespace: str
) -> None:
    namespace, agents = restricted_namespace, f"{restricted_namespace}-node-agent"
    release = "tfpool"
    try:
        cluster.helm("install", release, str(CHART), "-n", namespace, *EXTERNAL, "--wait", "--timeout", "4m")

        for name, replicas in (("webhook", 2), ("scheduler", 2), ("defrag-planner", 1), ("metrics", 1)):
            deployment = cluster.get("deployment", f"tfpool-{name}", "-n", namespace)
            assert deployment["status"].get("readyReplicas") == replicas, name
        agent = cluster.get("daemonset", "tfpool-node-agent", "-n", agents)
        assert agent["status"]["numberReady"] >= 1
        labels = cluster.get("namespace", agents)["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "privileged"
        pods = cluster.get("pods", "-n", namespace, "-l", "app.kubernetes.io/component=scheduler")["items"]
        assert [c["args"][:2] for c in pods[0]["spec"]["initContainers"]] == [["migrate", "--wait"]]
        # The migration hook Job and its URL Secret ran and were removed once they succeeded.
        hook_gone = cluster.run_kubectl("get", "job,secret", "tfpool-migrate", "-n", namespace)
        assert "NotFound" in hook_gone.stderr
        status = json.loads(cluster.helm("status", release, "-n", namespace, "-o", "json"))
        assert status["info"]["status"] == "deployed"
        tls_before = secret_data(cluster, namespace, "tfpool-webhook-tls")
        nats_before = secret_data(cluster, namespace, "tfpool-nats")
        registration = cluster.get("mutatingwebhookconfiguration", f"{release}-webhook")
        assert registration["webhooks"][0]["clientConfig"]["service"]["namespace"] == namespace
        assert_release_network_policies(cluster, namespace, agents, release)

        cluster.helm(
            "upgrade", release, str(CHART), "-n", namespace, *EXTERNAL,
            "--set", "webhook.replicas=1", "--set", "webhook.timeoutSeconds=9", "--wait", "--timeout", "4m",
        )  # fmt: skip
        assert cluster.get("deployment", "tfpool-webhook", "-n", namespace)["spec"]["replicas"] == 1
        registration = cluster.get("mutatingwebhookconfiguration", f"{release}-webhook")
        assert registration["webhooks"][0]["timeoutSeconds"] == 9
        assert secret_data(cluster, namespace, "tfpool-webhook-tls") == tls_before
        assert secret_data(cluster, namespace, "tfpool-nats") == nats_before
        ca_bundle = base64.b64decode(registration["webhooks"][0]["clientConfig"]["caBundle"]).decode()
        assert ca_bundle == tls_before["ca.crt"]

        cluster.helm("rollback", release, "1", "-n", namespace, "--wait", "--timeout", "4m")
        assert cluster.get("deployment", "tfpool-webhook", "-n", namespace)["spec"]["replicas"] == 2
        registration = cluster.get("mutatingwebhookconfiguration", f"{release}-webhook")
        assert registration["webhooks"][0]["timeoutSeconds"] == 5
        history = json.loads(cluster.helm("history", release, "-n", namespace, "-o", "json"))
        assert [entry["revision"] for entry in history] == [1, 2, 3]
        assert history[-1]["status"] == "deployed"
        assert secret_data(cluster, namespace, "tfpool-nats") == nats_before
    finally:
        release_cleanup(cluster, release, namespace)
    assert (
        "NotFound" in cluster.run_kubectl("get", "mutatingwebhookconfiguration", f"{release}-webhook").stderr
    )


def pod(name: str, *, labels: dict[str, str] | None = None, gpus: int = 0) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": gpus}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [container]},
    }


def create_pod(
    cluster: Cluster, namespace: str, document: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    return cluster.run_kubectl("create", "-n", namespace, "-f", "-", stdin=json.dumps(document))


def assert_only_gpu_and_opted_in_pods_reach_the_webhook(cluster: Cluster, apps: str) -> None:
    """The webhook's Service has no serving endpoint (KWOK runs no container), so a pod sent to it is
    refused (failurePolicy Fail): what is admitted was never sent."""
    assert create_pod(cluster, apps, pod("plain")).returncode == 0
    opted_out = pod("opted-out", labels={"tensor-fusion.ai/enabled": "false"}, gpus=1)
    assert create_pod(cluster, apps, opted_out).returncode == 0
    for name, document in (
        ("native-gpu", pod("native-gpu", gpus=1)),
        ("opted-in", pod("opted-in", labels={"tensor-fusion.ai/enabled": "true"})),
    ):
        refused = create_pod(cluster, apps, document)
        assert refused.returncode != 0, name
        assert 'failed calling webhook "mpod.tensor-fusion.ai"' in refused.stderr, refused.stderr


@pytest.fixture
def apps_namespace(cluster: Cluster) -> Iterator[str]:
    name = f"apps-{uuid.uuid4().hex[:6]}"
    cluster.kubectl("create", "namespace", name)
    try:
        yield name
    finally:
        cluster.run_kubectl("delete", "namespace", name, "--wait=false")


def test_chart_automatic_migration_sends_only_gpu_pods_to_the_webhook(
    cluster: Cluster, restricted_namespace: str, apps_namespace: str
) -> None:
    release = "tfpool-auto"
    try:
        cluster.helm(
            "install", release, str(CHART), "-n", restricted_namespace, *EXTERNAL,
            "--set", "autoMigration.enabled=true", "--set", "migration.enabled=false",
        )  # fmt: skip
        assert_only_gpu_and_opted_in_pods_reach_the_webhook(cluster, apps_namespace)
    finally:
        release_cleanup(cluster, release, restricted_namespace)


SEED_SCOPE = {
    "includes": {"namespaceNames": ["ml-team-a"]},
    "excludes": {"podSelector": {"matchLabels": {"gpu-migration": "skip"}}},
}
"""The scope of `seeds/migrate-existing-workload.en.txt`, "Migrate automatically", step 1."""


def test_upgrading_the_release_to_the_guides_automatic_migration_values(
    cluster: Cluster, restricted_namespace: str, apps_namespace: str, tmp_path: Path
) -> None:
    """The seed's step: set the scope in the Helm values, as the guide writes them (a top-level
    `dynamicConfig` with `autoMigration.enable: true`), and upgrade the release."""
    release = "tfpool-upgrade"
    values = tmp_path / "auto-migration.yaml"
    values.write_text(
        yaml.safe_dump({"dynamicConfig": {"autoMigration": {"enable": True, "scope": SEED_SCOPE}}})
    )
    try:
        cluster.helm(
            "install", release, str(CHART), "-n", restricted_namespace, *EXTERNAL,
            "--set", "migration.enabled=false",
        )  # fmt: skip
        native = pod("native-before", gpus=1)
        assert create_pod(cluster, apps_namespace, native).returncode == 0, "off: never sent to the webhook"

        cluster.helm(
            "upgrade", release, str(CHART), "-n", restricted_namespace, "--reuse-values", "-f", str(values)
        )

        data = cluster.get("configmap", "tfpool-config", "-n", restricted_namespace)["data"]
        migration = yaml.safe_load(data["config.yaml"])["dynamicConfig"]["autoMigration"]
        assert migration == {"enable": True, "scope": SEED_SCOPE}
        assert_only_gpu_and_opted_in_pods_reach_the_webhook(cluster, apps_namespace)
        history = json.loads(cluster.helm("history", release, "-n", restricted_namespace, "-o", "json"))
        assert [entry["revision"] for entry in history] == [1, 2]
    finally:
        release_cleanup(cluster, release, restricted_namespace)


def test_kustomize_automatic_migration_component_sends_only_gpu_pods_to_the_webhook(
    cluster: Cluster, apps_namespace: str, tmp_path: Path
) -> None:
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    base = Path(os.path.relpath(REPO_ROOT, overlay))
    overlay.joinpath("kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "kustomize.config.k8s.io/v1beta1",
                "kind": "Kustomization",
                "resources": [str(base / "k8s" / "base")],
                "components": [str(base / "k8s" / "components" / "auto-migration")],
            }
        )
    )
    rendered = cluster.kubectl("kustomize", str(overlay))
    (registration,) = [
        doc for doc in yaml.safe_load_all(rendered) if doc and doc["kind"] == "MutatingWebhookConfiguration"
    ]
    name = f"tfpool-kustomize-{uuid.uuid4().hex[:6]}"
    registration["metadata"] = {"name": name}
    cluster.apply(registration)
    try:
        assert_only_gpu_and_opted_in_pods_reach_the_webhook(cluster, apps_namespace)
    finally:
        cluster.run_kubectl("delete", "mutatingwebhookconfiguration", name)
