"""`tfctl migrate --wait` (the chart's init containers): returns once the schema is at the newest revision,
fails with a clear message when it never gets there, and changes nothing itself."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from support.scratch_database import create_database, drop_database
from tfcommon.ledger.migrate import current_revision, head_revision, upgrade_head
from tfctl.main import main as tfctl

pytestmark = pytest.mark.integration


@pytest.fixture
def fresh_database_url(postgres_server_url: str) -> Iterator[str]:
    url = create_database(postgres_server_url, "migrate_wait")
    try:
        yield url
    finally:
        drop_database(postgres_server_url, url)


def test_wait_returns_once_the_migration_has_run(
    fresh_database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    migrator = threading.Timer(1.5, upgrade_head, args=(fresh_database_url,))
    started = time.monotonic()
    migrator.start()
    try:
        code = tfctl(["migrate", "--wait", "--database-url", fresh_database_url, "--interval", "0.2"])
    finally:
        migrator.join()
    assert code == 0
    assert time.monotonic() - started >= 1.5
    assert f"ledger revision: {head_revision()}" in capsys.readouterr().out


def test_wait_gives_up_after_its_timeout_and_migrates_nothing(
    fresh_database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = tfctl(
        ["migrate", "--wait", "--database-url", fresh_database_url, "--timeout", "1", "--interval", "0.2"]
    )
    assert code == 1
    error = capsys.readouterr().err
    assert f"did not reach revision {head_revision()} within 1s" in error
    assert "none (empty database)" in error
    assert current_revision(fresh_database_url) is None


def test_wait_on_an_unreachable_database_names_the_cause(capsys: pytest.CaptureFixture[str]) -> None:
    url = "postgresql+psycopg://tfpool_app:x@127.0.0.1:1/tfpool"
    code = tfctl(["migrate", "--wait", "--database-url", url, "--timeout", "0.5", "--interval", "0.2"])
    assert code == 1
    assert "cannot read the revision" in capsys.readouterr().err


def test_wait_and_show_together_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    url = "postgresql+psycopg://tfpool_app:x@127.0.0.1:1/tfpool"
    assert tfctl(["migrate", "--wait", "--show", "--database-url", url]) == 2
    assert "--wait and --show cannot be combined" in capsys.readouterr().err
