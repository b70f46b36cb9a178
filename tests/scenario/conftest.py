"""Fixtures for the user's-story scenarios: one database, one NATS connection, one API server and one
scheduler per story (module), shared by its steps, which run in file order."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from uuid import uuid4

import psycopg
import pytest
from sqlalchemy.engine import make_url
from tfcommon import subjects
from tfcommon.bus import NatsEventBus
from tfcommon.ledger.migrate import upgrade_head
from tfcommon.ledger.sql import SqlLedger

INTEGRATION = Path(__file__).resolve().parents[1] / "integration"
for helper_dir in ("cluster", "scheduler_k8s", "agent"):
    sys.path.insert(0, str(INTEGRATION / helper_dir))

from cluster_apiserver import install  # noqa: E402
from k8s_scheduler_support import api_server, start_scheduler  # noqa: E402
from scenario_kube import KubeStack  # noqa: E402
from tfcommon.cluster.kubernetes import KubernetesCluster  # noqa: E402


def _conninfo(database_url: str) -> str:
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(scope="module")
def story_database_url(postgres_server_url: str) -> Iterator[str]:
    name = f"scenario_{uuid4().hex[:12]}"
    with psycopg.connect(_conninfo(postgres_server_url), autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    url = make_url(postgres_server_url).set(database=name).render_as_string(hide_password=False)
    upgrade_head(url)
    try:
        yield url
    finally:
        with psycopg.connect(_conninfo(postgres_server_url), autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


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
