"""Database URL checks: every ledger entry point accepts the same forms and names a bad one clearly.

Pure: parses text only, opens no connection.
"""

from __future__ import annotations

from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError

DRIVER_SCHEME = "postgresql+psycopg"
ACCEPTED_SCHEMES = ("postgresql+psycopg", "postgresql", "postgres")


class DatabaseUrlError(ValueError):
    """The database URL is missing or not a Postgres URL; the message says what to set instead."""


def ledger_url(database_url: str) -> URL:
    """Parse `database_url` into the psycopg 3 form the ledger uses (sync and async engines alike).

    `postgresql://` and `postgres://` are accepted and mapped to `postgresql+psycopg://`.
    """
    if not database_url or not database_url.strip():
        raise DatabaseUrlError(
            "database URL: empty; set TF_DATABASE_URL or pass --database-url, "
            "e.g. postgresql+psycopg://postgres@127.0.0.1:5432/tfpool"
        )
    try:
        url = make_url(database_url.strip())
    except ArgumentError as error:
        raise DatabaseUrlError(
            "database URL: not a URL; expected postgresql+psycopg://USER[:PASSWORD]@HOST:PORT/DATABASE"
        ) from error
    if url.drivername not in ACCEPTED_SCHEMES:
        raise DatabaseUrlError(
            f"database URL: scheme {url.drivername!r} is not supported; "
            f"use postgresql+psycopg://USER[:PASSWORD]@HOST:PORT/DATABASE"
        )
    if not url.database:
        raise DatabaseUrlError(
            "database URL: no database name; append it, e.g. postgresql+psycopg://postgres@127.0.0.1:5432/tfpool"
        )
    return url.set(drivername=DRIVER_SCHEME)
