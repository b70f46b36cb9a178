"""The campaign against a Kubernetes API server over HTTP: PDB reads, the Eviction API (200 and 429),
node markers through merge patches, replacements created by a controller and found by owner."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest
from cluster_apiserver import ApiServerState, install
from cluster_harness import KubernetesHarness
from defrag_scenario import CONFIG, Scenario, StandInScheduler, build_scenario, running
from tfcommon.ledger.sql import SqlLedger

pytestmark = pytest.mark.integration

NODES = "v1/nodes"


@pytest.fixture
async def api_server() -> AsyncIterator[KubernetesHarness]:
    state = ApiServerState()
    async with kmock.KubernetesScaffold() as scaffold, kmock.Server(scaffold) as server:
        install(scaffold, state)
        harness = KubernetesHarness(state, str(server.url).rstrip("/"))
        yield harness
        state.stopping = True
        harness.close()


def server_node(harness: KubernetesHarness, name: str) -> dict[str, Any]:
    [node] = [
        obj
        for (resource, _, key), obj in harness.state.objects.items()
        if key == name and resource.endswith(NODES)
    ]
    return dict(node)


async def k8s_scenario(ledger: SqlLedger, harness: KubernetesHarness, **kwargs: Any) -> Scenario:
    return await build_scenario(ledger, harness.cluster, harness, **kwargs)


async def test_a_node_is_drained_through_the_eviction_api(
    ledger: SqlLedger, api_server: KubernetesHarness
) -> None:
    scenario = await k8s_scenario(ledger, api_server)

    async with running(StandInScheduler(scenario, api_server, recreate=True)) as scheduler:
        result = await scenario.executor().run(scenario.pool, CONFIG, trigger="manual")

    assert result.campaign.drained_nodes == (scenario.source,)
    assert sorted(scheduler.placed) == ["w1-r", "w2-r"]
    assert api_server.pod(scenario.namespace, "w1") is None
    replacement = api_server.pod(scenario.namespace, "w1-r")
    assert replacement is not None
    assert replacement["spec"]["nodeName"] == scenario.target
    metadata = server_node(api_server, scenario.source)["metadata"]
    assert "tensor-fusion.ai/defrag-source" not in (metadata.get("labels") or {})
    assert "tensor-fusion.ai/defrag-source-since" not in (metadata.get("annotations") or {})


async def test_a_429_while_the_budget_still_counts_the_last_replacement_is_asked_again(
    ledger: SqlLedger, api_server: KubernetesHarness
) -> None:
    scenario = await k8s_scenario(ledger, api_server, budget_allowed=1)
    stand_in = StandInScheduler(scenario, api_server, recreate=True, budget_restored_after_s=0.5)

    async with running(stand_in) as scheduler:
        result = await scenario.executor().run(scenario.pool, CONFIG, trigger="manual")

    assert result.campaign.drained_nodes == (scenario.source,)
    assert result.campaign.failed_nodes == {}
    assert result.campaign.pods_evicted == 2
    assert sorted(scheduler.placed) == ["w1-r", "w2-r"]


async def test_a_429_from_a_disruption_budget_marks_the_node_evict_skip(
    ledger: SqlLedger, api_server: KubernetesHarness
) -> None:
    scenario = await k8s_scenario(ledger, api_server, budget_allowed=1)

    async with running(StandInScheduler(scenario, api_server, recreate=True, restore_budget=False)):
        result = await scenario.executor(replacement_timeout_s=1.0).run(
            scenario.pool, CONFIG, trigger="manual"
        )

    assert result.campaign.pods_evicted == 1
    assert scenario.source in result.campaign.failed_nodes
    metadata = server_node(api_server, scenario.source)["metadata"]
    assert metadata["labels"]["tensor-fusion.ai/defrag-evict-skip"] == "true"
    assert metadata["annotations"]["tensor-fusion.ai/defrag-evict-skip-pool"] == scenario.pool
    assert "refused" in metadata["annotations"]["tensor-fusion.ai/defrag-evict-skip-reason"]
    assert "tensor-fusion.ai/defrag-source" not in metadata["labels"]
