"""Alembic revisions, one file each, named `NNNN_slug.py` with revision id `NNNN_slug`."""
