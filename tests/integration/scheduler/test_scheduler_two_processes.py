"""Two schedulers against one ledger, racing for the same pods: 2,000 pods between two independent
`Scheduler` engines (each with its own connection pool), then two `tfctl serve scheduler` processes over
HTTP. No GPU over capacity at any point of the ledger history, no pod with two active allocations, none
lost."""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa
from scheduler_builders import GIB, a_submission, assert_history_never_over_capacity
from scheduler_service import TOKEN, eventually, private_nats, scheduler_processes, service_environment
from tfcommon.bus import NatsEventBus
from tfcommon.ledger.sql import SqlLedger
from tfscheduler.bench import register_simulated_nodes
from tfscheduler.engine import Scheduler
from tfscheduler.submission import Submission, WorkloadStatus

pytestmark = pytest.mark.integration
AUTH = {"Authorization": f"Bearer {TOKEN}"}
LONG = timedelta(hours=1)


@pytest.fixture(scope="module")
def own_nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with private_nats(tmp_path_factory.mktemp("scheduler-nats")) as url:
        yield url


async def _post_all(
    client: httpx.AsyncClient, url: str, bodies: list[dict[str, Any]]
) -> list[httpx.Response]:
    gate = asyncio.Semaphore(32)

    async def one(body: dict[str, Any]) -> httpx.Response:
        async with gate:
            return await client.post(f"{url}/api/v1/workloads", json=body, headers=AUTH)

    return list(await asyncio.gather(*(one(body) for body in bodies)))


async def _workload_states(ledger: SqlLedger) -> Counter[str]:
    async with ledger.engine.connect() as connection:
        rows = await connection.execute(
            sa.text("SELECT state, count(*) AS count FROM scheduler_workload GROUP BY state")
        )
        return Counter({row.state: row.count for row in rows})


async def _assert_one_active_allocation_per_pod(ledger: SqlLedger) -> int:
    active = await ledger.active_allocations()
    per_pod = Counter((a.workload.namespace, a.workload.name, a.workload.uid) for a in active)
    assert max(per_pod.values()) == 1, [pod for pod, count in per_pod.items() if count > 1][:5]
    for gpu in await ledger.list_gpus():
        assert gpu.used_tflops_milli <= gpu.capacity_tflops_milli
        assert gpu.used_vram_bytes <= gpu.capacity_vram_bytes
    return len(active)


async def _submit_all(scheduler: Scheduler, pods: list[Submission]) -> list[WorkloadStatus]:
    gate = asyncio.Semaphore(32)

    async def one(submission: Submission) -> WorkloadStatus:
        async with gate:
            return await scheduler.submit(submission)

    return list(await asyncio.gather(*(one(pod) for pod in pods)))


async def test_two_schedulers_place_2000_pods_without_over_allocation_duplicates_or_loss(
    database_url: str, ledger: SqlLedger, bus: NatsEventBus
) -> None:
    pods, capacity = 2_000, 8 * 8 * 25  # 8 nodes x 8 GPUs x 25 pods of 4 TFLOPS (100 per GPU)
    await register_simulated_nodes(ledger, nodes=8, gpus_per_node=8, prefix="engines")
    second_ledger = SqlLedger.create(database_url, pool_size=5)
    try:
        first = Scheduler(ledger, bus, heartbeat_timeout=LONG)
        second = Scheduler(second_ledger, bus, heartbeat_timeout=LONG)
        await first.start()
        await second.start()
        submissions = [a_submission(tflops_milli=4_000, vram_bytes=3 * GIB) for _ in range(pods)]
        # Every pod goes to both schedulers at once: they race for the same workloads and GPUs.
        answers = await asyncio.gather(_submit_all(first, submissions), _submit_all(second, submissions))
        assert [s.id for s in answers[0]] == [s.id for s in answers[1]]
        for statuses in answers:
            assert Counter(s.state for s in statuses) == {"placed": capacity, "pending": pods - capacity}
        assert await _assert_one_active_allocation_per_pod(ledger) == capacity
        assert await _workload_states(ledger) == {"placed": capacity, "pending": pods - capacity}

        # Free 400 places: the 400 pending pods are placed from the pending queue, none is lost.
        active = await ledger.active_allocations()
        ended = {a.allocation_id for a in active[: pods - capacity]}
        for allocation_id in ended:
            assert await first.release(allocation_id, "workload-ended")
        assert await second.retry_pending() == pods - capacity
        assert await _assert_one_active_allocation_per_pod(ledger) == capacity
        assert {a.allocation_id for a in await ledger.active_allocations()} | ended == {
            s.id for s in answers[0]
        }
        assert await _workload_states(ledger) == {"placed": capacity, "ended": pods - capacity}
        await assert_history_never_over_capacity(ledger)
    finally:
        await second_ledger.close()


async def test_two_scheduler_processes_race_over_http_without_over_allocation_or_loss(
    tmp_path: Path, database_url: str, ledger: SqlLedger, own_nats_url: str
) -> None:
    pods, capacity = 300, 4 * 2 * 25  # 4 nodes x 2 GPUs x 25 pods of 4 TFLOPS
    await register_simulated_nodes(ledger, nodes=4, gpus_per_node=2, prefix="processes")
    environment = service_environment(database_url, own_nats_url, TF_SCHEDULER_HEARTBEAT_TIMEOUT_S="3600")
    bodies = [
        a_submission(tflops_milli=4_000, vram_bytes=3 * GIB).model_dump(mode="json") for _ in range(pods)
    ]
    async with (
        scheduler_processes(2, environment, tmp_path) as (first, second),
        httpx.AsyncClient(timeout=60) as client,
    ):
        # Every pod goes to both processes at once: they race for the same workloads and GPUs.
        answers = await asyncio.gather(_post_all(client, first, bodies), _post_all(client, second, bodies))
        for responses in answers:
            assert Counter(response.status_code for response in responses) == {
                201: capacity,
                202: pods - capacity,
            }
        ids = [[response.json()["id"] for response in responses] for responses in answers]
        assert ids[0] == ids[1], "both schedulers must name each pod's allocation the same"
        assert await _assert_one_active_allocation_per_pod(ledger) == capacity
        assert await _workload_states(ledger) == {"placed": capacity, "pending": pods - capacity}
        pending = [r.json() for r in answers[0] if r.status_code == 202]
        assert all(p["reason"].startswith("0/4 nodes fit: 4 insufficient TFLOPS") for p in pending)

        # Free room for the pending pods: they are placed from the pending queue, none is lost.
        placed_ids = [r.json()["id"] for r in answers[0] if r.status_code == 201]
        ended = placed_ids[: pods - capacity]
        deletions = await asyncio.gather(
            *(client.delete(f"{first}/api/v1/workloads/{workload}", headers=AUTH) for workload in ended)
        )
        assert all(d.status_code == 200 and d.json()["released"] for d in deletions)

        async def all_placed() -> Counter[str] | None:
            states = await _workload_states(ledger)
            return states if states.get("pending", 0) == 0 else None

        assert await eventually(all_placed, timeout_s=30) == {"placed": capacity, "ended": pods - capacity}
    assert await _assert_one_active_allocation_per_pod(ledger) == capacity
    active_ids = {str(a.allocation_id) for a in await ledger.active_allocations()}
    assert active_ids | set(ended) == set(ids[0])
    await assert_history_never_over_capacity(ledger)
