"""Alembic migrations of the ledger, shipped inside the package so an installed `tfcommon` can migrate."""
