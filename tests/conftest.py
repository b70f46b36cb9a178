"""Shared test fixtures: real NATS JetStream and real Postgres for the whole session.

`TF_NATS_URL` / `TF_DATABASE_URL` point the tests at existing servers; when unset (CI, a fresh clone)
the tests start their own with the same launchers `tfctl up` uses, in a temporary folder.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from tfcommon.infra import EmbeddedNats, EmbeddedPostgres


@pytest.fixture(scope="session")
def nats_url() -> Iterator[str]:
    configured = os.environ.get("TF_NATS_URL")
    if configured:
        yield configured
        return
    store_dir = Path(tempfile.mkdtemp(prefix="tfpool-test-nats-"))
    server = EmbeddedNats(store_dir=store_dir, die_with_parent=True)  # nothing left if pytest is killed
    try:
        yield server.start()
    finally:
        server.stop()
        shutil.rmtree(store_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server_url() -> Iterator[str]:
    """URL of a Postgres server; tests create their own databases on it.

    The data lives outside pytest's temporary folders, which another pytest session may prune.
    """
    configured = os.environ.get("TF_DATABASE_URL")
    if configured:
        yield configured
        return
    root = Path(tempfile.mkdtemp(prefix="tfpool-test-pg-"))
    server = EmbeddedPostgres(
        data_dir=root / "data", die_with_parent=True
    )  # nothing left if pytest is killed
    try:
        yield server.start()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)
