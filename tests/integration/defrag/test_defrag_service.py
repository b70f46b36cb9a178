"""The defrag-planner service end to end on real NATS and Postgres: the plan API (and `tfctl defrag
plan`'s rendering), configuration errors per pool, and `tfctl defrag run --now` over the bus."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from defrag_scenario import LocalSeed, StandInScheduler, build_scenario, running
from support.serving import serving
from tfcommon import subjects
from tfcommon.bus import NatsEventBus
from tfcommon.cluster.local import LocalCluster
from tfcommon.events import DefragCampaignFinished, decode
from tfcommon.infra import free_port
from tfcommon.ledger.sql import SqlLedger
from tfcommon.runtime import ServiceSpec
from tfcommon.settings import DatabaseSettings, DefragSettings, NatsSettings
from tfctl.commands.defrag import _send, render_plan
from tfdefrag.app import SERVICE, make_compose

pytestmark = pytest.mark.integration


def config_text(pool: str) -> str:
    return f"""
gpuPools:
  - name: {pool}
    isDefault: true
    specTemplate:
      nodeManagerConfig:
        nodeCompaction:
          defrag: {{enabled: true, timezone: UTC, schedule: "0 0 1 1 *"}}
  - name: broken
    specTemplate:
      nodeManagerConfig:
        nodeCompaction:
          defrag: {{enabled: true, utilizationThresholdPercent: 400}}
"""


@asynccontextmanager
async def planner(spec: ServiceSpec[DefragSettings]) -> AsyncIterator[str]:
    async with serving(spec) as served:
        yield served.url


async def test_the_plan_api_and_the_manual_trigger(
    ledger: SqlLedger, defrag_database_url: str, nats_url: str, tmp_path: Path
) -> None:
    cluster = LocalCluster()
    seed = LocalSeed(cluster)
    scenario = await build_scenario(ledger, cluster, seed)
    config = tmp_path / "config.yaml"
    config.write_text(config_text(scenario.pool), encoding="utf-8")
    settings = DefragSettings(
        nats=NatsSettings(url=nats_url),
        database=DatabaseSettings(url=defrag_database_url),
        config_file=config,
        tick_interval_s=3600,
        replacement_timeout_s=20,
    )
    spec = ServiceSpec(
        name=SERVICE,
        settings=settings,
        port=free_port(),
        host="127.0.0.1",
        compose=make_compose(lambda: cluster),
    )

    async with planner(spec) as base, httpx.AsyncClient(base_url=base) as client:
        plan = (await client.get("/api/v1/defrag/plan", params={"pool": scenario.pool})).json()
        unknown = await client.get("/api/v1/defrag/plan", params={"pool": "nope"})
        broken = (await client.get("/api/v1/defrag/plan", params={"pool": "broken"})).json()
        missing = await client.get("/api/v1/defrag/plan")

        assert plan["defrag_enabled"] is True
        assert [(d["node"], [m["pod"] for m in d["moves"]]) for d in plan["drains"]] == [
            (scenario.source, [f"{scenario.namespace}/w1", f"{scenario.namespace}/w2"])
        ]
        assert {m["to"] for m in plan["drains"][0]["moves"]} == {scenario.target}
        assert {(s["node"], s["reason"]) for s in plan["skipped"]} == {(scenario.target, "above-threshold")}
        assert f"{scenario.namespace}/w1 -> {scenario.target}" in render_plan(plan)
        assert unknown.status_code == 404
        assert "pool 'nope' is not configured" in unknown.json()["detail"]
        assert broken["defrag_enabled"] is False
        assert broken["config_problems"] == [
            "pool broken: spec.nodeManagerConfig.nodeCompaction.defrag.timezone is None; "
            "set an IANA time zone such as Europe/Berlin or UTC",
            "pool broken: spec.nodeManagerConfig.nodeCompaction.defrag.utilizationThresholdPercent is 400; "
            "use a whole number from 0 to 100",
        ]
        assert missing.status_code == 422

        bus = await NatsEventBus.connect(nats_url, service="defrag-test")
        try:
            await subjects.provision(bus.js)
            finished = await bus.js.subscribe(subjects.DEFRAG_CAMPAIGN_FINISHED, ordered_consumer=True)
            async with running(StandInScheduler(scenario, seed)):
                await _send((nats_url, "TF_NATS_URL"), scenario.pool, None, None, None)
                event = await next_finished(finished, scenario.pool)
        finally:
            await bus.close()

    assert (event.outcome, event.nodes_drained, event.pods_evicted, event.stranded_pods) == (
        "completed",
        1,
        2,
        0,
    )
    [campaign] = await scenario.store.list_campaigns(scenario.pool)
    assert (campaign.trigger, campaign.state) == ("manual", "finished")


async def next_finished(subscription: Any, pool: str) -> DefragCampaignFinished:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        message = await subscription.next_msg(timeout=deadline - time.monotonic())
        event = decode(message.subject, message.data)
        if isinstance(event, DefragCampaignFinished) and event.pool == pool:
            return event
    pytest.fail(f"no campaign finished for pool {pool} within 60s")
