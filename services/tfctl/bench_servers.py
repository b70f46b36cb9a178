"""Servers for the benchmarks that need Postgres or NATS: the configured ones, or embedded ones.

`postgres_server(url)` and `nats_server(url)` yield the given URL, or that of a child process started
with the launchers `tfctl up` uses (stopped and deleted afterwards).
`scratch_database(server_url, prefix)` creates a uniquely named, migrated database on that server and
drops it afterwards, so a benchmark never touches an existing ledger. Setup only: nothing is measured here.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import psycopg
from sqlalchemy.engine import make_url
from tfcommon.infra import EmbeddedNats, EmbeddedPostgres
from tfcommon.ledger.migrate import upgrade_head


@contextlib.contextmanager
def postgres_server(database_url: str | None) -> Iterator[str]:
    """`database_url` itself, or the URL of an embedded Postgres started for the block."""
    if database_url is not None:
        yield database_url
        return
    root = Path(tempfile.mkdtemp(prefix="tf-bench-pg-"))
    server = EmbeddedPostgres(data_dir=root / "data")
    try:
        yield server.start()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def nats_server(nats_url: str | None) -> Iterator[str]:
    """`nats_url` itself, or the URL of an embedded NATS JetStream started for the block."""
    if nats_url is not None:
        yield nats_url
        return
    root = Path(tempfile.mkdtemp(prefix="tf-bench-nats-"))
    server = EmbeddedNats(store_dir=root)
    try:
        yield server.start()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def _conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@contextlib.contextmanager
def scratch_database(server_url: str, prefix: str) -> Iterator[str]:
    """A new database `<prefix>_<random>` on the server of `server_url`, at the latest migration."""
    name = f"{prefix}_{uuid4().hex[:10]}"
    with psycopg.connect(_conninfo(server_url), autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{name}"')
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade_head(url)
        yield url
    finally:
        with psycopg.connect(_conninfo(server_url), autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
