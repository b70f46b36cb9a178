"""`tfctl migrate`: bring the ledger's schema to the newest Alembic revision (or show where it is).

Runs before any service starts (the one-shot `migrate` step of docker-compose, the Kubernetes Job).
`--wait` changes nothing: it waits until the schema is at this release's newest revision (what each
service's init container runs in the Helm chart, so that a service starts once the migration Job is
done instead of restarting until then). Never starts infrastructure: it needs `--database-url` or
`TF_DATABASE_URL`.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

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
    parser.add_argument(
        "--wait",
        action="store_true",
        help="change nothing; wait until the schema is at the newest revision (exit 1 after --timeout)",
    )
    parser.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="how long --wait waits for the schema (default 600)",
    )
    parser.add_argument(
        "--interval", type=float, default=2.0, metavar="SECONDS", help="how often --wait looks (default 2)"
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
    if args.wait and args.show:
        print("tfctl migrate: --wait and --show cannot be combined; pass one of them", file=sys.stderr)
        return USAGE_ERROR
    if args.wait:
        return _wait_for_schema(database_url, args.timeout, args.interval)
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


def _wait_for_schema(database_url: str, timeout: float, interval: float) -> int:
    """Poll the ledger's revision until it is this release's head; 0 then, 1 after `timeout` seconds."""
    from sqlalchemy.exc import OperationalError, ProgrammingError
    from tfcommon.ledger.migrate import current_revision, head_revision

    if timeout <= 0 or interval <= 0:
        print("tfctl migrate: --timeout and --interval must be positive seconds", file=sys.stderr)
        return USAGE_ERROR
    head = head_revision()
    deadline = time.monotonic() + timeout
    last_seen = "not looked yet"
    while True:
        try:
            current = current_revision(database_url)
            last_seen = f"revision {current or 'none (empty database)'}"
        except (OperationalError, ProgrammingError) as error:
            current = None
            reason = str(error.orig).strip().splitlines()[0] if error.orig else "connection failed"
            last_seen = f"cannot read the revision: {reason}"
        if current == head:
            print(f"ledger revision: {current} (newest: {head}): the schema is ready")
            return 0
        if time.monotonic() >= deadline:
            print(
                f"tfctl migrate: the schema did not reach revision {head} within {timeout:g}s "
                f"(last seen: {last_seen}); is the migration Job (tfctl migrate) done?",
                file=sys.stderr,
            )
            return FAILURE
        print(f"waiting for the schema (newest: {head}); {last_seen}", flush=True)
        time.sleep(interval)
