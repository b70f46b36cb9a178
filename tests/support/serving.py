"""A service run in the test's event loop: `serving(spec)` starts `serve(spec)` and yields its URL once
`/readyz` answers 200; `wait_until_ready` is that wait alone, for a test that starts `serve` itself."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from tfcommon.runtime import ServiceSpec, serve


def service_url(spec: ServiceSpec[Any]) -> str:
    """Where `spec` answers on loopback (HTTPS when it has TLS files)."""
    return f"{'https' if spec.tls else 'http'}://127.0.0.1:{spec.port}"


async def wait_until_ready(
    url: str, service: asyncio.Task[None], *, timeout_s: float = 30.0, every_s: float = 0.05
) -> None:
    """Poll `url/readyz` until it answers 200; fail with the last answer when `timeout_s` passes, and
    with the service's own error (or saying it stopped) when `service` ends first."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    async with httpx.AsyncClient(verify=False, timeout=5) as client:
        while True:
            if service.done():
                service.result()
                raise AssertionError(f"{url} stopped while starting")
            try:
                response = await client.get(f"{url}/readyz")
                if response.status_code == 200:
                    return
                last = response.text
            except httpx.TransportError as error:
                last = type(error).__name__
            if time.monotonic() > deadline:
                raise AssertionError(f"{url} not ready within {timeout_s}s: {last}")
            await asyncio.sleep(every_s)


@dataclass(frozen=True)
class Served:
    """A running service: its base URL and the task running `serve`."""

    url: str
    task: asyncio.Task[None]


@contextlib.asynccontextmanager
async def serving(
    spec: ServiceSpec[Any],
    *,
    ready_within_s: float = 30.0,
    every_s: float = 0.05,
    stop_within_s: float = 30.0,
) -> AsyncIterator[Served]:
    """Run `serve(spec)` in this event loop and yield it once ready (polled every `every_s`); on exit
    ask it to stop and give it `stop_within_s` to return."""
    stop = asyncio.Event()
    task = asyncio.create_task(serve(spec, stop=stop))
    url = service_url(spec)
    try:
        await wait_until_ready(url, task, timeout_s=ready_within_s, every_s=every_s)
        yield Served(url, task)
    finally:
        stop.set()
        await asyncio.wait({task}, timeout=stop_within_s)
