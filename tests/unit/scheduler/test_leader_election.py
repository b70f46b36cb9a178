"""`LeaderElector` on the in-memory Lease store: a leader cut off from the API server steps down by the renew
deadline, before its Lease expires; a failure of the leader's work still releases the Lease."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from tfcommon.cluster import ClusterError
from tfcommon.cluster.memory import InMemoryCluster
from tfcommon.cluster.model import LeaseRecord, PatchResult
from tfscheduler.core.leader import ElectionTimings
from tfscheduler.leader_election import LeaderElector, default_identity, default_namespace

TIMINGS = ElectionTimings(lease_duration_s=2, renew_deadline_s=0.5, retry_period_s=0.05)


class Partitioned:
    """The fake's Leases behind a link that can be cut: every call fails while `cut`."""

    def __init__(self, store: InMemoryCluster) -> None:
        self.store = store
        self.cut = False

    def _check(self) -> None:
        if self.cut:
            raise ClusterError(0, "Unreachable", "connection refused")

    async def get_lease(self, namespace: str, name: str) -> LeaseRecord | None:
        self._check()
        return await self.store.get_lease(namespace, name)

    async def create_lease(self, namespace: str, name: str, record: LeaseRecord) -> PatchResult:
        self._check()
        return await self.store.create_lease(namespace, name, record)

    async def update_lease(self, namespace: str, name: str, record: LeaseRecord) -> PatchResult:
        self._check()
        return await self.store.update_lease(namespace, name, record)


async def until(condition: Callable[[], bool], within: float = 5.0) -> float:
    deadline = time.monotonic() + within
    while not condition():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.01)
    return time.monotonic()


async def test_a_leader_that_cannot_renew_stops_its_work_by_the_renew_deadline() -> None:
    link = Partitioned(InMemoryCluster())
    elector = LeaderElector(link, namespace="ns", name="lease", identity="a", timings=TIMINGS)
    stop, ended = asyncio.Event(), asyncio.Event()

    async def lead(term_over: asyncio.Event) -> None:
        await term_over.wait()
        ended.set()

    running = asyncio.create_task(elector.run(stop, lead))
    await until(lambda: elector.is_leader)
    link.cut = True
    cut_at = time.monotonic()

    stepped_down = await until(ended.is_set)

    assert not elector.is_leader
    assert stepped_down - cut_at < TIMINGS.lease_duration_s  # before anyone else may take the Lease
    assert stepped_down - cut_at >= TIMINGS.renew_deadline_s - TIMINGS.retry_period_s - 0.02
    link.cut = False
    await until(lambda: elector.is_leader)  # still its own Lease: it leads again once the link is back
    stop.set()
    await running
    released = await link.store.get_lease("ns", "lease")
    assert released is not None
    assert released.holder_identity == ""


async def test_a_failure_of_the_leaders_work_is_raised_after_the_lease_is_released() -> None:
    store = InMemoryCluster()
    elector = LeaderElector(store, namespace="ns", name="lease", identity="a", timings=TIMINGS)

    async def lead(term_over: asyncio.Event) -> None:
        raise RuntimeError("pod watch broke")

    with pytest.raises(RuntimeError, match="pod watch broke"):
        await elector.run(asyncio.Event(), lead)

    lease = await store.get_lease("ns", "lease")
    assert lease is not None
    assert lease.holder_identity == ""
    assert not elector.is_leader


def test_the_lease_namespace_is_the_setting_then_pod_namespace_then_the_service_account(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    account = tmp_path / "namespace"
    account.write_text("tfpool-system\n", encoding="utf-8")
    monkeypatch.delenv("POD_NAMESPACE", raising=False)

    assert default_namespace(None, account) == "tfpool-system"
    assert default_namespace(None, tmp_path / "missing") == "default"
    monkeypatch.setenv("POD_NAMESPACE", "from-downward-api")
    assert default_namespace(None, account) == "from-downward-api"
    assert default_namespace("configured", account) == "configured"


def test_the_identity_is_the_pod_name_when_the_downward_api_gives_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POD_NAME", "tfpool-scheduler-7d9f-abcde")
    assert default_identity() == "tfpool-scheduler-7d9f-abcde"
    monkeypatch.delenv("POD_NAME")
    assert default_identity().endswith(f"_{os.getpid()}")
