"""The campaign executor on real Postgres: one pod at a time, PDB refusals, replacements that never
come, a restart in the middle, one campaign per pool across replicas, and the anchor."""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import pytest
from defrag_scenario import CONFIG, LocalSeed, Scenario, StandInScheduler, build_scenario, running, utc_now
from support.polling import eventually
from tfcommon.cluster import Evicted, EvictionResult
from tfcommon.cluster.local import LocalCluster
from tfcommon.ledger.sql import SqlLedger
from tfdefrag.store import CampaignBusyError

pytestmark = pytest.mark.integration

EVICTED = "tf.evt.pod.evicted"


async def local_scenario(ledger: SqlLedger, **kwargs: Any) -> tuple[Scenario, LocalSeed]:
    cluster = LocalCluster()
    seed = LocalSeed(cluster)
    return await build_scenario(ledger, cluster, seed, **kwargs), seed


async def node_labels(scenario: Scenario, node: str) -> dict[str, str]:
    kube = await scenario.cluster.get_node(node)
    assert kube is not None
    return dict(kube.labels)


async def test_a_campaign_drains_the_node_one_pod_at_a_time(ledger: SqlLedger) -> None:
    scenario, seed = await local_scenario(ledger)

    async with running(StandInScheduler(scenario, seed)) as scheduler:
        result = await scenario.executor().run(scenario.pool, CONFIG, trigger="manual")

    campaign = result.campaign
    assert (campaign.outcome, campaign.drained_nodes, campaign.pods_evicted) == (
        "completed",
        (scenario.source,),
        2,
    )
    assert campaign.stranded_pods == 0
    assert sorted(scheduler.placed) == ["w1", "w2"]
    assert scheduler.pending_peak == 1
    # While the node drains, the scheduler's own rule refuses it as a target for the replacements.
    assert (
        scheduler.source_refusals
        == ["node being drained by the defrag planner (tensor-fusion.ai/defrag-source)"] * 2
    )
    assert await scenario.events() == [
        "tf.evt.defrag-campaign.started",
        EVICTED,
        EVICTED,
        "tf.evt.node.drained",
        "tf.evt.defrag-campaign.finished",
    ]
    assert "tensor-fusion.ai/defrag-source" not in await node_labels(scenario, scenario.source)
    assert [node.labels for node in await ledger.list_nodes() if node.name == scenario.source] == [{}]
    moves = await scenario.store.moves(campaign.id)
    assert {(m.pod_name, m.state, m.placed_on, m.hold_released) for m in moves} == {
        ("w1", "placed", scenario.target, True),
        ("w2", "placed", scenario.target, True),
    }
    holds = [a for a in await ledger.active_allocations() if a.workload.namespace == "tfpool-defrag"]
    assert holds == []


async def test_an_eviction_refused_by_a_pdb_stops_that_node_and_marks_it(ledger: SqlLedger) -> None:
    scenario, seed = await local_scenario(ledger, budget_allowed=1)

    async with running(StandInScheduler(scenario, seed, restore_budget=False)):
        result = await scenario.executor(replacement_timeout_s=1.0).run(
            scenario.pool, CONFIG, trigger="manual"
        )

    campaign = result.campaign
    assert campaign.outcome == "completed"
    assert campaign.drained_nodes == ()
    assert campaign.pods_evicted == 1
    assert "refused" in campaign.failed_nodes[scenario.source]
    labels = await node_labels(scenario, scenario.source)
    assert labels.get("tensor-fusion.ai/defrag-evict-skip") == "true"
    assert "tensor-fusion.ai/defrag-source" not in labels
    kube = await scenario.cluster.get_node(scenario.source)
    assert kube is not None
    assert "disruption budget" in kube.annotations["tensor-fusion.ai/defrag-evict-skip-reason"]
    assert kube.annotations["tensor-fusion.ai/defrag-evict-skip-pool"] == scenario.pool
    assert [a for a in await ledger.active_allocations() if a.workload.namespace == "tfpool-defrag"] == []
    skipped = [m.decoded() for m in scenario.bus.stored if m.subject == "tf.evt.node.defrag-skipped"]
    assert any(scenario.source == getattr(event, "node", None) for event in skipped)


async def test_a_replacement_that_is_never_placed_fails_the_node_and_counts_as_stranded(
    ledger: SqlLedger,
) -> None:
    scenario, _seed = await local_scenario(ledger, workers=("w1",))

    result = await scenario.executor(replacement_timeout_s=0.5).run(scenario.pool, CONFIG, trigger="manual")

    campaign = result.campaign
    assert campaign.stranded_pods == 1
    assert campaign.failed_nodes == {
        scenario.source: f"replacement for {scenario.namespace}/w1 was not placed in time"
    }
    assert (await node_labels(scenario, scenario.source)).get("tensor-fusion.ai/defrag-evict-skip") == "true"
    assert [a for a in await ledger.active_allocations() if a.workload.namespace == "tfpool-defrag"] == []


class CrashAfterFirstEviction(LocalCluster):
    """Dies (raises) right after the API server accepted the first eviction, like a killed process."""

    def __init__(self, inner: LocalCluster) -> None:
        self.__dict__.update(inner.__dict__)
        self.crashed = False

    async def evict_pod(self, namespace: str, name: str) -> EvictionResult:
        result = await super().evict_pod(namespace, name)
        if isinstance(result, Evicted) and not self.crashed:
            self.crashed = True
            raise RuntimeError("planner killed")
        return result


async def test_a_restart_in_the_middle_resumes_the_campaign_without_repeating(ledger: SqlLedger) -> None:
    scenario, seed = await local_scenario(ledger)
    assert isinstance(scenario.cluster, LocalCluster)
    crashing = CrashAfterFirstEviction(scenario.cluster)
    seed.cluster = crashing
    scenario.cluster = crashing
    tick = utc_now() - timedelta(minutes=1)

    async with running(StandInScheduler(scenario, seed)) as scheduler:
        with pytest.raises(RuntimeError, match="planner killed"):
            await scenario.executor().run(
                scenario.pool, CONFIG, trigger="cron", window_start=tick, deadline=tick + timedelta(hours=2)
            )
        interrupted = await scenario.store.running_campaign(scenario.pool)
        assert interrupted is not None
        assert interrupted.current_node == scenario.source

        result = await scenario.executor().run(scenario.pool, CONFIG, trigger="cron", window_start=tick)

    assert result.campaign.id == interrupted.id
    assert result.campaign.drained_nodes == (scenario.source,)
    assert sorted(scheduler.placed) == ["w1", "w2"]
    assert len(await scenario.store.list_campaigns(scenario.pool)) == 1
    assert await scenario.store.last_defrag_time(scenario.pool) == tick
    assert (await scenario.events()).count("tf.evt.defrag-campaign.started") == 1


async def test_two_replicas_never_run_one_pool_at_once(ledger: SqlLedger) -> None:
    scenario, seed = await local_scenario(ledger, workers=("w1",))
    first = asyncio.create_task(
        scenario.executor(replacement_timeout_s=30).run(scenario.pool, CONFIG, trigger="manual")
    )
    await eventually(lambda: scenario.store.running_campaign(scenario.pool), every_s=0.02)

    with pytest.raises(CampaignBusyError, match=scenario.pool):
        await scenario.executor().run(scenario.pool, CONFIG, trigger="manual")

    async with running(StandInScheduler(scenario, seed)):
        result = await asyncio.wait_for(first, timeout=30)
    assert result.campaign.drained_nodes == (scenario.source,)
