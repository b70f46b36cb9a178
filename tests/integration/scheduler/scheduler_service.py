"""Runs `tfctl serve scheduler` as real processes for the service tests, runs `tfctl`, and polls with
deadlines."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import TypeVar

import httpx
from tfcommon.infra import EmbeddedNats, free_port

TOKEN = "scheduler-test-token"
TFCTL = str(Path(sys.executable).with_name("tfctl"))
T = TypeVar("T")


@contextlib.contextmanager
def private_nats(store_dir: Path) -> Iterator[str]:
    """A NATS server of its own: the scheduler's durable consumers see no other test's events."""
    server = EmbeddedNats(store_dir=store_dir, die_with_parent=True)  # nothing left if pytest is killed
    try:
        yield server.start()
    finally:
        server.stop()


def service_environment(database_url: str, nats_url: str, **extra: str) -> dict[str, str]:
    environment = {key: value for key, value in os.environ.items() if not key.startswith("TF_")}
    environment.update(
        TF_DATABASE_URL=database_url,
        TF_NATS_URL=nats_url,
        TF_API_TOKEN=TOKEN,
        TF_BIND_HOST="127.0.0.1",
        TF_LOG_LEVEL="WARNING",
        **extra,
    )
    return environment


async def run_tfctl(
    *args: str, environment: dict[str, str], stdin: bytes | None = None
) -> tuple[int, str, str]:
    """Run `tfctl ARGS` in `environment`; its exit code, stdout and stderr."""
    process = await asyncio.create_subprocess_exec(
        TFCTL,
        *args,
        env=environment,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(stdin), timeout=60)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def eventually(check: Callable[[], Awaitable[T | None]], timeout_s: float = 20.0) -> T:
    """Poll `check` until it returns something other than None (or fail at the deadline)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = await check()
        if found is not None:
            return found
        assert time.monotonic() < deadline, f"condition not met within {timeout_s} s"
        await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def scheduler_processes(
    count: int, environment: dict[str, str], logs: Path
) -> AsyncIterator[list[str]]:
    """`count` scheduler processes on free ports; yields their base URLs once each answers `/readyz`."""
    ports = [free_port() for _ in range(count)]
    processes: list[subprocess.Popen[bytes]] = []
    try:
        for port in ports:
            with (logs / f"scheduler-{port}.log").open("ab") as log:
                processes.append(
                    subprocess.Popen(  # noqa: ASYNC220 - starting a process does not block
                        [TFCTL, "serve", "scheduler", "--port", str(port)],
                        env=environment,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        async with httpx.AsyncClient(timeout=5) as client:
            for url, process, port in zip(urls, processes, ports, strict=True):

                async def ready(
                    url: str = url, process: subprocess.Popen[bytes] = process, port: int = port
                ) -> bool | None:
                    log = (logs / f"scheduler-{port}.log").read_text(errors="replace")
                    assert process.poll() is None, f"scheduler exited early:\n{log[-3000:]}"
                    with contextlib.suppress(httpx.TransportError):
                        if (await client.get(f"{url}/readyz")).status_code == 200:
                            return True
                    return None

                await eventually(ready, timeout_s=60)
        yield urls
    finally:
        for process in processes:
            if process.poll() is None:
                process.terminate()
        for process in processes:
            try:
                process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
