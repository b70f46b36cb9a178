"""`tfctl migrate`: bring the ledger's schema to the newest Alembic revision (or show where it is).

Runs before any service starts (the one-shot `migrate` step of docker-compose, the Kubernetes Job).
Never starts infrastructure: it needs `--database-url` or `TF_DATABASE_URL`.
"""

from __future__ import annotations

import argparse
import os
import sys

USAGE_ERROR = 2
FAILURE = 1


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "migrate",
        help="apply the ledger's database migrations (alembic upgrade head)",
        description="Apply the ledger's Alembic migrations to the database, or show its revision.",
    )
    parser.add_argument(
        "--database-url",
        help="postgresql+psycopg://USER[:PASSWORD]@HOST:PORT/DATABASE (default: TF_DATABASE_URL)",
    )
    parser.add_argument(
        "--show", action="store_true", help="print the current and the newest revision; change nothing"
    )
    parser.set_defaults(handler=handle)


def handle(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import OperationalError
    from tfcommon.ledger.migrate import current_revision, head_revision, upgrade_head
    from tfcommon.ledger.urls import DatabaseUrlError, ledger_url

    database_url = args.database_url or os.environ.get("TF_DATABASE_URL")
    if not database_url:
        print(
            "tfctl migrate: no database; pass --database-url or set TF_DATABASE_URL "
            "(e.g. postgresql+psycopg://postgres@127.0.0.1:5432/tfpool)",
            file=sys.stderr,
        )
        return USAGE_ERROR
    try:
        ledger_url(database_url)
    except DatabaseUrlError as error:
        print(f"tfctl migrate: {error}", file=sys.stderr)
        return USAGE_ERROR
    try:
        if not args.show:
            upgrade_head(database_url)
        current = current_revision(database_url)
    except OperationalError as error:
        reason = str(error.orig).strip().splitlines()[0] if error.orig else "connection failed"
        print(f"tfctl migrate: cannot reach the database: {reason}", file=sys.stderr)
        return FAILURE
    head = head_revision()
    print(f"ledger revision: {current or 'none (empty database)'} (newest: {head})")
    return 0
