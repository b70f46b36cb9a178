"""Fixtures for the defrag executor: a fresh migrated ledger per test module, on the session's Postgres."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from support.scratch_database import scratch_database
from tfcommon.ledger.sql import SqlLedger

# The Kubernetes API test server of the cluster suite (tests/integration/cluster/cluster_apiserver.py).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cluster"))


@pytest.fixture(scope="module")
def defrag_database_url(postgres_server_url: str) -> Iterator[str]:
    with scratch_database(postgres_server_url, "defrag") as url:
        yield url


@pytest.fixture(scope="module")
async def ledger(defrag_database_url: str) -> AsyncIterator[SqlLedger]:
    sql_ledger = SqlLedger.create(defrag_database_url, pool_size=10)
    try:
        yield sql_ledger
    finally:
        await sql_ledger.close()
