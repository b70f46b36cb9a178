"""Fixtures for the defrag executor: a fresh migrated ledger per test module, on the session's Postgres."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from uuid import uuid4

import psycopg
import pytest
from sqlalchemy.engine import make_url
from tfcommon.ledger.migrate import upgrade_head
from tfcommon.ledger.sql import SqlLedger

# The Kubernetes API test server of the cluster suite (tests/integration/cluster/cluster_apiserver.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))


def _conninfo(database_url: str) -> str:
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture(scope="module")
def defrag_database_url(postgres_server_url: str) -> Iterator[str]:
    name = f"defrag_{uuid4().hex[:12]}"
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
async def ledger(defrag_database_url: str) -> AsyncIterator[SqlLedger]:
    sql_ledger = SqlLedger.create(defrag_database_url, pool_size=10)
    try:
        yield sql_ledger
    finally:
        await sql_ledger.close()
