"""Fixtures of the `tfctl run` tests (defined in run_services.py)."""

from run_services import run_database_url, run_stack

__all__ = ["run_database_url", "run_stack"]
