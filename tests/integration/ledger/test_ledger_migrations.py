"""The ledger's Alembic migrations on a real, empty Postgres database: up, down and up again."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, Table, create_engine, inspect, pool
from tfcommon.ledger import tables
from tfcommon.ledger.migrate import current_revision, downgrade_base, head_revision, upgrade_head
from tfcommon.ledger.urls import ledger_url
from tfctl.main import main as tfctl

pytestmark = pytest.mark.integration

LEDGER_TABLES = {"pool", "node", "gpu", "allocation", "allocation_history", "outbox"}


def table_names(database_url: str) -> set[str]:
    engine = create_engine(ledger_url(database_url), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            return set(inspect(connection).get_table_names())
    finally:
        engine.dispose()


def test_upgrade_downgrade_and_upgrade_again_on_an_empty_database(empty_database_url: str) -> None:
    assert current_revision(empty_database_url) is None

    upgrade_head(empty_database_url)
    assert current_revision(empty_database_url) == head_revision()
    assert table_names(empty_database_url) >= LEDGER_TABLES

    downgrade_base(empty_database_url)
    assert current_revision(empty_database_url) is None
    assert table_names(empty_database_url) & LEDGER_TABLES == set()

    upgrade_head(empty_database_url)
    assert current_revision(empty_database_url) == head_revision()
    assert table_names(empty_database_url) >= LEDGER_TABLES


def test_upgrading_twice_changes_nothing(ledger_database_url: str) -> None:
    upgrade_head(ledger_database_url)
    assert current_revision(ledger_database_url) == head_revision()


def test_first_revision_is_0001_initial() -> None:
    from alembic.script import ScriptDirectory
    from tfcommon.ledger.migrate import MIGRATIONS_DIR

    scripts = ScriptDirectory(str(MIGRATIONS_DIR))
    assert [script.revision for script in scripts.walk_revisions()][-1] == "0001_initial"


def test_migrated_schema_matches_the_declared_tables(ledger_database_url: str) -> None:
    engine = create_engine(ledger_url(ledger_database_url), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            context = MigrationContext.configure(
                connection,
                opts={
                    "compare_type": True,
                    "include_name": lambda name, type_, _: type_ != "table" or name in tables.metadata.tables,
                },
            )
            differences = compare_metadata(context, tables.metadata)
    finally:
        engine.dispose()
    assert differences == []


def declared_constraint_names(table: Table) -> set[str]:
    names = {str(constraint.name) for constraint in table.constraints}
    return names | {str(index.name) for index in table.indexes}


def reflected_constraint_names(connection: Connection, table_name: str) -> set[str]:
    inspector = inspect(connection)
    names = {str(inspector.get_pk_constraint(table_name)["name"])}
    names |= {str(check["name"]) for check in inspector.get_check_constraints(table_name)}
    names |= {str(unique["name"]) for unique in inspector.get_unique_constraints(table_name)}
    names |= {str(foreign["name"]) for foreign in inspector.get_foreign_keys(table_name)}
    return names | {
        str(index["name"])
        for index in inspector.get_indexes(table_name)
        if "duplicates_constraint" not in index
    }


def test_migrated_constraints_carry_the_declared_names(ledger_database_url: str) -> None:
    engine = create_engine(ledger_url(ledger_database_url), poolclass=pool.NullPool)
    try:
        with engine.connect() as connection:
            for table in tables.metadata.sorted_tables:
                assert reflected_constraint_names(connection, table.name) == declared_constraint_names(table)
    finally:
        engine.dispose()


def test_tfctl_migrate_brings_a_database_to_head(
    empty_database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    downgrade_base(empty_database_url)

    assert tfctl(["migrate", "--database-url", empty_database_url]) == 0

    assert current_revision(empty_database_url) == head_revision()
    assert f"ledger revision: {head_revision()}" in capsys.readouterr().out


def test_tfctl_migrate_reports_an_unreachable_database(capsys: pytest.CaptureFixture[str]) -> None:
    unreachable = "postgresql+psycopg://postgres@127.0.0.1:1/tfpool?connect_timeout=2"

    assert tfctl(["migrate", "--database-url", unreachable]) == 1

    assert "cannot reach the database" in capsys.readouterr().err


def test_tfctl_migrate_show_reports_the_revision_without_migrating(
    empty_database_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    downgrade_base(empty_database_url)

    assert tfctl(["migrate", "--show", "--database-url", empty_database_url]) == 0

    assert current_revision(empty_database_url) is None
    assert f"ledger revision: none (empty database) (newest: {head_revision()})" in capsys.readouterr().out
