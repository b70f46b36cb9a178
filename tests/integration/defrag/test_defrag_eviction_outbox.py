"""A defrag eviction announced while NATS is down is not lost (issue 20): the campaign records the move as
evicted and writes its `tf.evt.pod.evicted` to the ledger outbox in one transaction, so the event reaches
the bus once NATS is back, even though the campaign stopped and resumed meanwhile.

Real Postgres and a NATS server of the test's own, stopped the moment the cluster accepts the first
eviction and started again before the campaign resumes; the outbox relay then delivers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from uuid import uuid5

import pytest
from defrag_scenario import CONFIG, LocalSeed, StandInScheduler, build_scenario, running
from tfcommon.bus import NatsEventBus
from tfcommon.cluster import Evicted, EvictionResult
from tfcommon.cluster.local import LocalCluster
from tfcommon.events import PodEvicted
from tfcommon.infra import EmbeddedNats
from tfcommon.ledger.sql import SqlLedger
from tfcommon.ledger.testing import relayed_events
from tfdefrag.campaign import CampaignResult

pytestmark = pytest.mark.integration
BusOf = Callable[[str], contextlib.AbstractAsyncContextManager[NatsEventBus]]


class NatsDiesAtFirstEviction(LocalCluster):
    """The local cluster, whose first accepted eviction also stops the NATS server (a bus outage)."""

    def __init__(self, inner: LocalCluster, server: EmbeddedNats) -> None:
        self.__dict__.update(inner.__dict__)
        self.server = server
        self.stopped = False

    async def evict_pod(self, namespace: str, name: str) -> EvictionResult:
        result = await super().evict_pod(namespace, name)
        if isinstance(result, Evicted) and not self.stopped:
            self.stopped = True
            self.server.stop()
        return result


async def test_an_eviction_while_nats_is_down_is_announced_once_after_the_campaign_resumes(
    ledger: SqlLedger, own_nats: EmbeddedNats, own_nats_bus: BusOf
) -> None:
    cluster = LocalCluster()
    seed = LocalSeed(cluster)
    scenario = await build_scenario(ledger, cluster, seed)
    dying = NatsDiesAtFirstEviction(cluster, own_nats)
    seed.cluster = scenario.cluster = dying
    async with running(StandInScheduler(scenario, seed)) as scheduler:
        async with own_nats_bus("defrag-planner") as bus:
            # A later progress event (published directly) may stop this run while NATS is down.
            [first] = await asyncio.gather(
                scenario.executor(publish=bus.publish).run(scenario.pool, CONFIG, trigger="manual"),
                return_exceptions=True,
            )
        assert isinstance(first, CampaignResult | TimeoutError), repr(first)
        assert dying.stopped
        own_nats.start()  # the planner restarts with a new connection and resumes its campaign
        async with own_nats_bus("defrag-planner") as bus:
            result = await scenario.executor(publish=bus.publish).run(scenario.pool, CONFIG, trigger="manual")
            delivered = await relayed_events(ledger, bus, PodEvicted.subject)
    campaign = result.campaign
    assert sorted(scheduler.placed) == ["w1", "w2"]
    assert campaign.pods_evicted == 2

    moves = {move.pod_name: move for move in await scenario.store.moves(campaign.id)}
    evictions = [
        (message_id, event)
        for message_id, event in delivered
        if isinstance(event, PodEvicted) and event.campaign_id == campaign.id
    ]
    assert sorted((event.workload.name, message_id) for message_id, event in evictions) == [
        (name, str(uuid5(campaign.id, f"evicted/{moves[name].pod_uid}"))) for name in ("w1", "w2")
    ], "each defrag eviction reaches the bus once"
    assert {(event.by, event.node) for _message_id, event in evictions} == {("defrag", scenario.source)}
