"""Fixtures for the webhook's integration tests: a migrated ledger database of their own, TLS files."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from support.scratch_database import scratch_database
from tfcommon.ledger.urls import ledger_url
from tfcommon.tls import TlsFiles, generate_self_signed


@pytest.fixture(scope="module")
def webhook_database_url(postgres_server_url: str) -> Iterator[str]:
    with scratch_database(postgres_server_url, "webhook") as url:
        yield url


@pytest.fixture(scope="module")
async def webhook_engine(webhook_database_url: str) -> AsyncIterator[AsyncEngine]:
    engine = create_async_engine(ledger_url(webhook_database_url), pool_size=20, max_overflow=20)
    try:
        yield engine
    finally:
        await engine.dispose()


CertificateWriter = Callable[[Path], TlsFiles]


def _write_certificate(directory: Path) -> TlsFiles:
    """A fresh self-signed pair for 127.0.0.1 in `directory` (overwrites, as a rotated Secret does)."""
    certificate, key = generate_self_signed(["127.0.0.1", "localhost"], datetime.now(UTC))
    files = TlsFiles(directory / "tls.crt", directory / "tls.key")
    staged_cert, staged_key = directory / "tls.crt.new", directory / "tls.key.new"
    staged_cert.write_bytes(certificate)
    staged_key.write_bytes(key)
    staged_key.replace(files.key_file)
    staged_cert.replace(files.cert_file)
    return files


@pytest.fixture(scope="session")
def write_certificate() -> CertificateWriter:
    """Writes a fresh self-signed pair for 127.0.0.1 into a folder, replacing any pair there."""
    return _write_certificate
