"""Shared test fixtures: real NATS JetStream and real Postgres for the whole session.

`TF_NATS_URL` / `TF_DATABASE_URL` point the tests at existing servers; when unset (CI, a fresh clone)
the tests start their own with the same launchers `tfctl up` uses, in a temporary folder.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from tfcommon.infra import EmbeddedNats, EmbeddedPostgres


@pytest.fixture(scope="session")
def nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    configured = os.environ.get("TF_NATS_URL")
    if configured:
        yield configured
        return
    server = EmbeddedNats(store_dir=tmp_path_factory.mktemp("nats"))
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def postgres_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a Postgres server's maintenance database; tests create their own databases on it."""
    configured = os.environ.get("TF_DATABASE_URL")
    if configured:
        yield configured
        return
    server = EmbeddedPostgres(data_dir=Path(tmp_path_factory.mktemp("pg")) / "data")
    try:
        yield server.start()
    finally:
        server.stop()
