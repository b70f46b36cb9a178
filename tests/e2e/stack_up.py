"""Helpers for tests that start the whole local stack with `tfctl up --json`."""

from __future__ import annotations

import json
import os
import select
import subprocess
import time
from typing import Any

import pytest


def stack_environment(**settings: str) -> dict[str, str]:
    """This process's environment without any `TF_*` variable (the stack starts its own NATS and
    Postgres), with fsync off for speed, plus `settings`."""
    environment = {key: value for key, value in os.environ.items() if not key.startswith("TF_")}
    environment["TF_POSTGRES_FSYNC"] = "off"
    environment.update(settings)
    return environment


def read_summary(process: subprocess.Popen[str], timeout_s: float) -> dict[str, Any]:
    """The JSON line `tfctl up --json` prints once every service is ready; fails the test with the
    stack's stderr when it is not ready in time."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        readable, _, _ = select.select([process.stdout], [], [], deadline - time.monotonic())
        if readable:
            line = process.stdout.readline()
            if line:
                summary: dict[str, Any] = json.loads(line)
                return summary
            break
    process.kill()
    _, errors = process.communicate(timeout=30)
    pytest.fail(f"tfctl up was not ready within {timeout_s}s (exit {process.returncode}):\n{errors}")
