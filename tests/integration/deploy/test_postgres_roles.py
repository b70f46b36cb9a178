"""deploy/postgres/roles.sql on a real Postgres: only `tfpool_migrate` can change the schema.

The real Alembic migrations run as `tfpool_migrate`; the services' role `tfpool_app` then reads and
writes every ledger table but cannot create, alter or drop anything.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url
from support.scratch_database import libpq_conninfo, scratch_database
from tfcommon.ledger.migrate import current_revision, head_revision, upgrade_head

pytestmark = pytest.mark.integration

ROLES_SQL = Path(__file__).resolve().parents[3] / "deploy" / "postgres" / "roles.sql"
PASSWORDS = {"migrate": "migrate-secret", "app": "app-secret"}


def as_role(database_url: str, role: str) -> str:
    return (
        make_url(database_url)
        .set(username=role, password=PASSWORDS[role.removeprefix("tfpool_")])
        .render_as_string(hide_password=False)
    )


def apply_roles(database_url: str) -> None:
    with psycopg.connect(libpq_conninfo(database_url), autocommit=True) as connection:
        connection.execute("SELECT set_config('tfpool.migrate_password', %s, false)", [PASSWORDS["migrate"]])
        connection.execute("SELECT set_config('tfpool.app_password', %s, false)", [PASSWORDS["app"]])
        connection.execute(ROLES_SQL.read_text())


@pytest.fixture(scope="module")
def roles_database_url(postgres_server_url: str) -> Iterator[str]:
    with scratch_database(postgres_server_url, "deploy_roles", migrated=False) as url:
        apply_roles(url)
        upgrade_head(as_role(url, "tfpool_migrate"))
        yield url


def ledger_tables(database_url: str) -> list[str]:
    with psycopg.connect(libpq_conninfo(database_url)) as connection:
        rows = connection.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
        ).fetchall()
    return [row[0] for row in rows]


def test_migrate_role_brings_the_schema_to_the_newest_revision(roles_database_url: str) -> None:
    assert current_revision(as_role(roles_database_url, "tfpool_migrate")) == head_revision()
    assert ledger_tables(roles_database_url)


def test_services_role_reads_and_writes_every_ledger_table(roles_database_url: str) -> None:
    tables = ledger_tables(roles_database_url)
    with psycopg.connect(libpq_conninfo(as_role(roles_database_url, "tfpool_app"))) as connection:
        for table in tables:
            for privilege in ("SELECT", "INSERT", "UPDATE", "DELETE"):
                row = connection.execute(
                    "SELECT has_table_privilege(current_user, %s, %s)", [f"public.{table}", privilege]
                ).fetchone()
                assert row == (True,), f"{privilege} on {table}"
            connection.execute(f'SELECT count(*) FROM "{table}"')


@pytest.mark.parametrize(
    "statement",
    [
        "CREATE TABLE intruder (id int)",
        "CREATE SCHEMA intruder",
        "ALTER TABLE alembic_version ADD COLUMN intruder int",
        "DROP TABLE alembic_version",
        "TRUNCATE alembic_version",
    ],
)
def test_services_role_cannot_change_the_schema(roles_database_url: str, statement: str) -> None:
    with (
        psycopg.connect(libpq_conninfo(as_role(roles_database_url, "tfpool_app"))) as connection,
        pytest.raises(psycopg.errors.InsufficientPrivilege),
    ):
        connection.execute(statement)


def test_roles_script_can_run_again(roles_database_url: str) -> None:
    apply_roles(roles_database_url)
    assert current_revision(as_role(roles_database_url, "tfpool_app")) == head_revision()
