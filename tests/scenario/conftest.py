"""Fixtures for the user's-story scenarios: one database, one NATS connection, one API server and one
scheduler per story (module), shared by its steps, which run in file order."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from support.scratch_database import scratch_database
from tfcommon import subjects
from tfcommon.bus import NatsEventBus
from tfcommon.ledger.sql import SqlLedger

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"
for helper_dir in ("cluster", "scheduler_k8s", "agent"):
    sys.path.insert(0, str(INTEGRATION / helper_dir))

from cluster_apiserver import install  # noqa: E402
from k8s_scheduler_support import api_server, start_scheduler  # noqa: E402
from scenario_kube import KubeStack  # noqa: E402
from tfcommon.cluster.kubernetes import KubernetesCluster  # noqa: E402


@pytest.fixture(scope="module")
def story_database_url(postgres_server_url: str) -> Iterator[str]:
    with scratch_database(postgres_server_url, "scenario") as url:
        yield url


@pytest.fixture(scope="module")
async def story_ledger(story_database_url: str) -> AsyncIterator[SqlLedger]:
    ledger = SqlLedger.create(story_database_url, pool_size=5)
    try:
        yield ledger
    finally:
        await ledger.close()


@pytest.fixture(scope="module")
async def story_bus(nats_url: str) -> AsyncIterator[NatsEventBus]:
    bus = await NatsEventBus.connect(nats_url, service="scenario")
    await subjects.provision(bus.js)
    try:
        yield bus
    finally:
        await bus.close()


@pytest.fixture(scope="module")
async def kube(story_ledger: SqlLedger, story_bus: NatsEventBus) -> AsyncIterator[KubeStack]:
    """The cluster of one story: API server, scheduler in Kubernetes mode, and `kubectl`."""
    async with api_server() as (state, scaffold, url):
        install(scaffold, state)
        scheduler = await start_scheduler(state, url, story_ledger, story_bus)
        kubectl = KubernetesCluster.for_url(url, watch_timeout_s=5)
        try:
            yield KubeStack(state, story_ledger, story_bus, scheduler, kubectl)
        finally:
            kubectl.close()
            await scheduler.stop()
