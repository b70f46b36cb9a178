"""Fixtures for the scheduler's Kubernetes mode: a migrated database per test, the session's NATS, and a
stateful API server (kmock plus `tests/integration/cluster/cluster_apiserver.py`) reached over HTTP."""

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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))


def _conninfo(database_url: str) -> str:
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture
def database_url(postgres_server_url: str) -> Iterator[str]:
    name = f"scheduler_k8s_{uuid4().hex[:12]}"
    with psycopg.connect(_conninfo(postgres_server_url), autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    url = make_url(postgres_server_url).set(database=name).render_as_string(hide_password=False)
    upgrade_head(url)
    try:
        yield url
    finally:
        with psycopg.connect(_conninfo(postgres_server_url), autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
async def ledger(database_url: str) -> AsyncIterator[SqlLedger]:
    sql_ledger = SqlLedger.create(database_url, pool_size=5)
    try:
        yield sql_ledger
    finally:
        await sql_ledger.close()


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[NatsEventBus]:
    nats_bus = await NatsEventBus.connect(nats_url, service="scheduler-k8s-test")
    await subjects.provision(nats_bus.js)
    try:
        yield nats_bus
    finally:
        await nats_bus.close()
