"""Helpers for tests that start the whole local stack with `tfctl up --json`."""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import pytest
from tfcommon.events import Message, decode

T = TypeVar("T")

DEFRAG_EVERY_SECOND = {
    "gpuPools": [
        {
            "name": "default",
            "specTemplate": {
                "nodeManagerConfig": {
                    "nodeCompaction": {
                        "defrag": {
                            "enabled": True,
                            "timezone": "UTC",
                            "maxDuration": "1s",
                            "utilizationThresholdPercent": 100,
                        }
                    }
                }
            },
        }
    ]
}
"""A configuration whose pool `default` lets the defrag planner drain any node (threshold 100%) of
workloads older than a second."""


def serve_budget(namespace: str) -> dict[str, Any]:
    """A PodDisruptionBudget for the workloads labelled `app: serve`: one of them may be away at a time."""
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "serve", "namespace": namespace},
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "serve"}}},
    }


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


@contextlib.contextmanager
def running_stack(
    arguments: list[str], environment: dict[str, str], timeout_s: float = 120
) -> Iterator[dict[str, Any]]:
    """`tfctl up --ports auto --json ARGUMENTS` with `environment` until the block ends (then Ctrl-C);
    yields its ready summary."""
    command = [sys.executable, "-m", "tfctl.main", "up", "--ports", "auto", "--json", *arguments]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment
    )
    try:
        yield read_summary(process, timeout_s=timeout_s)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            process.communicate(timeout=60)


def poll(read: Callable[[], T], done: Callable[[T], bool], timeout_s: float, what: str) -> T:
    """`read()` until `done` says so; fails the test with the last value after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    value = read()
    while not done(value):
        if time.monotonic() > deadline:
            pytest.fail(f"{what} within {timeout_s}s; last: {json.dumps(value, indent=1, default=str)}")
        time.sleep(0.2)
        value = read()
    return value


async def bus_events(nats_url: str) -> list[Message]:
    """Every event the stack's `TF_EVENTS` stream holds now, oldest first."""
    import nats

    connection = await nats.connect(nats_url)
    try:
        subscription = await connection.jetstream().subscribe("tf.evt.>", ordered_consumer=True)
        events: list[Message] = []
        while True:
            try:
                message = await subscription.next_msg(timeout=1.0)
            except nats.errors.TimeoutError:
                return events
            events.append(decode(message.subject, message.data))
    finally:
        await connection.close()
