"""Compaction, the marker TTL sweep and the manual trigger through the service shell, on the ledger and
a cluster."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from uuid import uuid4

import pytest
from defrag_scenario import LocalSeed, Scenario, build_scenario, node_manifest, register_node
from tfcommon.cluster.local import LocalCluster
from tfcommon.config_source import ConfigSource
from tfcommon.events import StartDefragCampaign
from tfcommon.ledger.sql import SqlLedger
from tfdefrag.core.config import CompactionConfig, DefragConfig
from tfdefrag.service import DefragService

pytestmark = pytest.mark.integration


async def test_an_empty_node_gets_should_delete_and_a_stale_source_marker_expires(
    ledger: SqlLedger, tmp_path: Path
) -> None:
    cluster = LocalCluster()
    seed = LocalSeed(cluster)
    scenario = await build_scenario(ledger, cluster, seed)
    empty = f"{scenario.source}-empty"
    await register_node(ledger, scenario.pool, empty)
    seed.put_node(node_manifest(empty))
    stale = node_manifest(f"{scenario.source}-stale")
    stale["metadata"] = {
        "name": f"{scenario.source}-stale",
        "labels": {"tensor-fusion.ai/defrag-source": "true"},
        "annotations": {
            "tensor-fusion.ai/defrag-source-since": "2026-01-01T00:00:00Z",
            "tensor-fusion.ai/defrag-source-pool": scenario.pool,
        },
    }
    seed.put_node(stale)
    service = _service(scenario, tmp_path)

    marked = await service.compact(scenario.pool)
    await service.expire_markers(scenario.pool, CompactionConfig(pool=scenario.pool, defrag=DefragConfig()))

    assert marked == [empty]
    for name, expected in ((empty, "true"), (scenario.source, None), (scenario.target, None)):
        node = await cluster.get_node(name)
        assert node is not None
        assert node.labels.get("tensor-fusion.ai/should-delete") == expected
    cleared = await cluster.get_node(f"{scenario.source}-stale")
    assert cleared is not None
    assert "tensor-fusion.ai/defrag-source" not in cleared.labels
    assert "tensor-fusion.ai/defrag-source-since" not in cleared.annotations


async def test_a_manual_request_while_the_pool_has_a_campaign_running_says_it_starts_nothing(
    ledger: SqlLedger, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cluster = LocalCluster()
    scenario = await build_scenario(ledger, cluster, LocalSeed(cluster))
    service = _service(scenario, tmp_path)
    request = StartDefragCampaign(event_id=uuid4(), occurred_at=datetime.now(UTC), pool=scenario.pool)

    try:
        with caplog.at_level(logging.INFO, logger="tfdefrag.service"):
            await service.start_from_command(request)
            first = service.campaigns[scenario.pool]
            await service.start_from_command(request.model_copy(update={"event_id": uuid4()}))
    finally:
        await service.stop_campaigns()

    assert service.campaigns[scenario.pool] is first, "the running campaign is kept, not replaced"
    busy = [record for record in caplog.records if getattr(record, "event", None) == "defrag.campaign_busy"]
    assert [record.levelno for record in busy] == [logging.WARNING]
    assert f"already runs for pool {scenario.pool}" in busy[0].getMessage()


def _service(scenario: Scenario, tmp_path: Path) -> DefragService:
    """The planner's service shell on the scenario's ledger and cluster, its pool configured (defaults)."""
    config = tmp_path / "config.yaml"
    config.write_text(f"gpuPools:\n  - name: {scenario.pool}\n", encoding="utf-8")
    return DefragService(deps=scenario.executor().deps, config=ConfigSource(config))
