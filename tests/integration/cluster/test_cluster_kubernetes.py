"""Kubernetes-only behaviour of `KubernetesCluster` over HTTP against kmock: requests, failures, watches."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass

import kmock
import pytest
from cluster_apiserver import ApiServerState, install
from cluster_harness import SCHEDULER, a_budget, a_node, a_pod, next_event, summary
from tfcommon.cluster import ClusterError, CustomResource, PodWatch
from tfcommon.cluster.kubernetes import KubernetesCluster
from tfcommon.cluster.rbac import REQUIRED_RBAC

pytestmark = pytest.mark.integration


@dataclass
class Api:
    state: ApiServerState
    scaffold: kmock.KubernetesScaffold
    url: str
    cluster: KubernetesCluster


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    state = ApiServerState()
    async with kmock.KubernetesScaffold() as scaffold, kmock.Server(scaffold) as server:
        url = str(server.url).rstrip("/")
        cluster = KubernetesCluster.for_url(url, token="sa-token", watch_timeout_s=30)
        yield Api(state, scaffold, url, cluster)
        state.stopping = True
        cluster.close()


def installed(api: Api) -> Api:
    if not api.state.installed:
        install(api.scaffold, api.state)
        api.state.installed = True
    return api


def requests_to(api: Api, path: str) -> list[kmock.Request]:
    return [r for r in api.scaffold if r.url.path == path]


async def test_pending_pods_are_filtered_by_the_server_and_the_token_is_sent(api: Api) -> None:
    installed(api).state.put("/v1/pods", a_pod("waiting"))

    await api.cluster.list_pending_pods(SCHEDULER)

    [request] = requests_to(api, "/api/v1/pods")
    selector = request.params["fieldSelector"].split(",")
    assert f"spec.schedulerName={SCHEDULER}" in selector
    assert "spec.nodeName=" in selector
    assert request.headers["Authorization"] == "Bearer sa-token"


async def test_a_refusal_by_the_server_raises_cluster_error_with_status_and_message(api: Api) -> None:
    api.scaffold["get /api/v1/nodes"] << kmock.KubernetesError(
        status=403, reason="Forbidden", message='nodes is forbidden: User "system:serviceaccount:tf:x"'
    )

    with pytest.raises(ClusterError) as raised:
        await api.cluster.list_nodes()

    assert raised.value.status == 403
    assert "nodes is forbidden" in str(raised.value)


async def test_an_unreachable_server_raises_cluster_error() -> None:
    cluster = KubernetesCluster.for_url("http://127.0.0.1:9", request_timeout_s=2)
    try:
        with pytest.raises(ClusterError) as raised:
            await cluster.get_pod("default", "p")
    finally:
        cluster.close()

    assert raised.value.status == 0
    assert "Unreachable" in str(raised.value)


async def watch_started(api: Api, *names: str) -> PodWatch:
    watch = api.cluster.watch_pods(SCHEDULER)
    assert sorted([summary(await next_event(watch)) for _ in names]) == [("ADDED", n) for n in sorted(names)]
    return watch


async def test_a_broken_watch_reconnects_from_its_version_and_misses_nothing(api: Api) -> None:
    installed(api).state.put("/v1/pods", a_pod("a"))
    watch = await watch_started(api, "a")
    try:
        api.state.stall_watches()
        api.state.put("/v1/pods", a_pod("during-outage"))
        api.state.break_watches()
        reconnected = await next_event(watch)
        api.state.put("/v1/pods", a_pod("sentinel"))
        after = await next_event(watch)
    finally:
        await watch.aclose()

    assert summary(reconnected) == ("ADDED", "during-outage")
    assert summary(after) == ("ADDED", "sentinel")


async def test_a_live_watch_that_gets_410_gone_relists_and_delivers_each_change_once(api: Api) -> None:
    for name in ("a", "b"):
        installed(api).state.put("/v1/pods", a_pod(name))
    watch = await watch_started(api, "a", "b")
    try:
        api.state.stall_watches()
        api.state.put("/v1/pods", {**a_pod("a"), "spec": {**a_pod("a")["spec"], "nodeName": "node-1"}})
        api.state.delete("/v1/pods", "default", "b")
        api.state.compact()
        api.state.break_watches()
        missed = [summary(await next_event(watch)) for _ in range(2)]
        api.state.put("/v1/pods", a_pod("sentinel"))
        after = await next_event(watch)
    finally:
        await watch.aclose()

    assert missed == [("DELETED", "b"), ("MODIFIED", "a")]
    assert summary(after) == ("ADDED", "sentinel")
    relists = [r for r in requests_to(api, "/api/v1/pods") if r.params.get("watch") != "true"]
    assert len(relists) == 2


def _rule_for(method: str, path: str, watching: bool) -> tuple[str, str, str]:
    """(api group, resource[/subresource], RBAC verb) of one request the adapter made."""
    match = re.match(r"^/(?:api/v1|apis/(?P<group>[^/]+)/[^/]+)(?:/namespaces/[^/]+)?/(?P<rest>.+)$", path)
    assert match is not None, path
    parts = match["rest"].split("/")
    resource = parts[0] if len(parts) < 3 else f"{parts[0]}/{parts[2]}"
    named = len(parts) >= 2
    verb = {
        "GET": "get" if named else "watch" if watching else "list",
        "PATCH": "patch",
        "POST": "create",
    }[method]
    return match["group"] or "", resource, verb


async def test_every_request_the_adapter_makes_is_granted_by_required_rbac(api: Api) -> None:
    state = installed(api).state
    state.put("/v1/pods", a_pod("p", labels={"app": "web"}))
    state.put("/v1/pods", a_pod("q", labels={"app": "web"}))
    state.put("/v1/nodes", a_node("n"))
    state.put("policy/v1/poddisruptionbudgets", a_budget("pdb", "web", allowed=1))
    state.put("tensor-fusion.ai/v1/gpupools", {"metadata": {"name": "pool-a"}, "spec": {}})
    state.put("tensor-fusion.ai/v1/gpunodes", {"metadata": {"name": "n"}, "spec": {}})
    cluster = api.cluster
    pod = await cluster.get_pod("default", "p")
    assert pod is not None
    await cluster.list_pending_pods(SCHEDULER)
    await cluster.list_pods(node_name="n")
    await cluster.patch_pod_metadata("default", "p", annotations={"a": "b"})
    await cluster.bind_pod("default", "p", "n")
    await cluster.report_unschedulable(pod, "no GPU fits", reporter=SCHEDULER)
    await cluster.evict_pod("default", "q")
    await cluster.get_node("n")
    await cluster.list_nodes()
    await cluster.patch_node_metadata("n", labels={"tensor-fusion.ai/defrag-source": "true"})
    await cluster.list_disruption_budgets()
    await cluster.get_custom_object(CustomResource.GPU_NODE, "n")
    await cluster.list_custom_objects(CustomResource.GPU_POOL)
    await cluster.patch_custom_status(CustomResource.GPU_POOL, "pool-a", {"phase": "Running"})
    watch = cluster.watch_pods(SCHEDULER)
    try:
        await next_event(watch)
        state.put("/v1/pods", a_pod("r"))
        await next_event(watch)
    finally:
        await watch.aclose()

    granted = {
        (rule.api_group, resource, verb)
        for rules in REQUIRED_RBAC.values()
        for rule in rules
        for resource in rule.resources
        for verb in rule.verbs
    }
    made = {_rule_for(str(r.method.value), r.url.path, r.params.get("watch") == "true") for r in api.scaffold}
    assert ("", "pods", "watch") in made
    assert made <= granted, sorted(made - granted)


async def test_an_empty_name_is_refused_before_any_request(api: Api) -> None:
    with pytest.raises(ValueError, match=r"metadata\.name"):
        await api.cluster.get_pod("default", "")

    assert list(api.scaffold) == []
