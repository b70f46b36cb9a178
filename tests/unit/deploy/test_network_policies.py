"""NetworkPolicies of k8s/base and charts/tfpool: only the flows tfpool uses get through.

The rendered policies are read with NetworkPolicy's own rules (`deploy_support.ingress_admitted`): the
webhook port from anywhere (the API server is not a pod), the services' HTTP ports from monitoring
namespaces, NATS and Postgres from tfpool's pods, NATS's routes between its servers, and nothing else.
Their validity is checked with every other object (`kubernetes-validate --strict`); the real API
server stores them in tests/integration/deploy/test_helm_release.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from deploy_support import REPO_ROOT, Peer, ingress_admitted, render_kustomization
from test_helm_chart import EXTERNAL, template
from test_helm_chart import NAMESPACE as RELEASE_NAMESPACE

NAMESPACE = "tfpool-system"
AGENTS = f"{RELEASE_NAMESPACE}-node-agent"
WORKLOAD_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "Job"}
API_SERVER = Peer("kube-system", {"component": "kube-apiserver"})
PROMETHEUS = Peer("monitoring", {"app.kubernetes.io/name": "prometheus"})
USER_POD = Peer("ml-team", {"app": "trainer"})


def policies_of(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [obj for obj in objects if obj["kind"] == "NetworkPolicy"]


def pods_of(objects: list[dict[str, Any]]) -> dict[str, tuple[str, dict[str, str], list[int]]]:
    """Each workload by component: its namespace, its pods' labels and their container ports."""
    pods = {}
    for obj in objects:
        if obj["kind"] in WORKLOAD_KINDS:
            template_ = obj["spec"]["template"]
            labels = template_["metadata"]["labels"]
            ports = [
                port["containerPort"]
                for container in template_["spec"]["containers"]
                for port in container.get("ports", [])
            ]
            pods[labels["app.kubernetes.io/component"]] = (
                obj["metadata"].get("namespace", NAMESPACE),
                labels,
                ports,
            )
    return pods


def evaluation() -> list[dict[str, Any]]:
    return render_kustomization(REPO_ROOT / "k8s" / "evaluation")


def chart() -> list[dict[str, Any]]:
    return list(template())


def admitted(objects: list[dict[str, Any]], component: str, port: int, source: Peer) -> bool:
    namespace, labels, _ = pods_of(objects)[component]
    return ingress_admitted(
        policies_of(objects), namespace=namespace, pod_labels=labels, port=port, source=source
    )


def tfpool_pod(objects: list[dict[str, Any]], component: str) -> Peer:
    namespace, labels, _ = pods_of(objects)[component]
    return Peer(namespace, labels)


def test_the_base_holds_the_policies() -> None:
    base = render_kustomization(REPO_ROOT / "k8s" / "base")
    assert {policy["metadata"]["name"] for policy in policies_of(base)} == {
        "tfpool-default-deny-ingress",
        "tfpool-webhook-from-api-server",
        "tfpool-scrapes-from-monitoring",
        "tfpool-nats-from-tfpool",
        "tfpool-postgres-from-tfpool",
    }
    assert all(policy["metadata"]["namespace"] == NAMESPACE for policy in policies_of(base))


@pytest.mark.parametrize("render", [evaluation, chart], ids=["kustomize", "chart"])
def test_the_webhook_port_is_open_to_the_api_server_and_only_that_port(render: Any) -> None:
    objects = render()
    assert admitted(objects, "webhook", 9443, API_SERVER)
    assert admitted(objects, "webhook", 9443, USER_POD)
    assert not admitted(objects, "webhook", 8080, USER_POD)


@pytest.mark.parametrize("render", [evaluation, chart], ids=["kustomize", "chart"])
@pytest.mark.parametrize(
    ("component", "port"),
    [("scheduler", 8080), ("defrag-planner", 8070), ("metrics", 8090), ("node-agent", 8001), ("nats", 8222)],
)
def test_scrape_ports_are_open_to_monitoring_namespaces_only(render: Any, component: str, port: int) -> None:
    objects = render()
    assert admitted(objects, component, port, PROMETHEUS)
    assert not admitted(objects, component, port, USER_POD)
    assert not admitted(objects, component, port, Peer("monitoring-not", PROMETHEUS.pod_labels))


@pytest.mark.parametrize("render", [evaluation, chart], ids=["kustomize", "chart"])
@pytest.mark.parametrize(("component", "port"), [("nats", 4222), ("postgres", 5432)])
def test_nats_and_postgres_take_connections_from_tfpool_pods_only(
    render: Any, component: str, port: int
) -> None:
    objects = render()
    for client in ("webhook", "scheduler", "defrag-planner", "metrics", "node-agent"):
        if component == "postgres" and client == "node-agent":
            assert not admitted(objects, component, port, tfpool_pod(objects, client)), (
                "the node agent holds no database credential and does not reach Postgres"
            )
            continue
        assert admitted(objects, component, port, tfpool_pod(objects, client)), client
    namespace, labels, _ = pods_of(objects)["scheduler"]
    assert not admitted(objects, component, port, Peer(namespace, {"app": "debug-shell"}))
    assert not admitted(objects, component, port, Peer("ml-team", labels)), (
        "tfpool's labels in another namespace"
    )
    assert not admitted(objects, component, port, PROMETHEUS)


def test_the_migration_reaches_postgres_and_nothing_reaches_the_migration() -> None:
    objects = evaluation()
    assert admitted(objects, "postgres", 5432, tfpool_pod(objects, "migrate"))
    assert not admitted(objects, "migrate", 8080, tfpool_pod(objects, "scheduler"))


@pytest.mark.parametrize("render", [evaluation, chart], ids=["kustomize", "chart"])
def test_every_container_port_is_admitted_from_the_source_it_serves(render: Any) -> None:
    """Default-deny must not cut a port silently: each listens for the API server, a scrape or tfpool."""
    objects = render()
    sources = [API_SERVER, PROMETHEUS] + [tfpool_pod(objects, name) for name in pods_of(objects)]
    for component, (_, _, ports) in pods_of(objects).items():
        for port in ports:
            if port == 6222:  # NATS routes: only from NATS itself
                assert admitted(objects, component, port, tfpool_pod(objects, "nats"))
                continue
            assert any(admitted(objects, component, port, source) for source in sources), (
                f"{component}:{port}"
            )


def test_chart_nats_routes_connect_the_release_s_nats_servers_only() -> None:
    objects = chart()
    nats = tfpool_pod(objects, "nats")
    assert admitted(objects, "nats", 6222, nats)
    assert not admitted(objects, "nats", 6222, tfpool_pod(objects, "scheduler"))
    other_release = Peer(nats.namespace, {**nats.pod_labels, "app.kubernetes.io/instance": "other"})
    assert not admitted(objects, "nats", 6222, other_release)
    assert not admitted(objects, "nats", 4222, other_release)


def test_chart_fences_the_agent_namespace_too() -> None:
    objects = chart()
    names = {(p["metadata"]["namespace"], p["metadata"]["name"]) for p in policies_of(objects)}
    assert {(AGENTS, "tfpool-default-deny-ingress"), (AGENTS, "tfpool-scrapes-from-monitoring")} <= names
    assert pods_of(objects)["node-agent"][0] == AGENTS
    assert not admitted(objects, "nats", 4222, Peer(AGENTS, {"app": "debug-shell"}))


def test_chart_monitoring_namespaces_come_from_values() -> None:
    objects = list(
        template(
            {"networkPolicies.monitoringNamespaceSelector.matchLabels.kubernetes\\.io/metadata\\.name": "obs"}
        )
    )
    assert admitted(objects, "metrics", 8090, Peer("obs", {}))
    assert not admitted(objects, "metrics", 8090, PROMETHEUS)


def test_chart_policies_can_be_turned_off() -> None:
    assert policies_of(list(template({"networkPolicies.enabled": "false"}))) == []


def test_chart_leaves_out_the_policies_of_infrastructure_it_does_not_run() -> None:
    objects = list(template(EXTERNAL))
    names = {policy["metadata"]["name"] for policy in policies_of(objects)}
    assert not names & {"tfpool-nats-from-tfpool", "tfpool-postgres-from-tfpool", "tfpool-nats-routes"}
