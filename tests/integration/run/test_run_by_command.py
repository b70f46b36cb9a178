"""Workers started and stopped over the bus: `StartWorker` and `StopWorker` on a node agent's command
consumer, with a real scheduler and agent over real NATS JetStream and Postgres.

The allocation is reserved through the scheduler's API (as `tfctl run` does); the command then runs on
its GPUs, the allocation is released in the ledger when the command ends, a repeated start starts
nothing new, and a stop ends a long-running command. The agent holds no database credential: it reads
the allocation from the scheduler, which answers with the agent's own node's allocations only (one on
another node is refused), and the release goes through the scheduler (`tf.evt.allocation.released`).
"""

from __future__ import annotations

import asyncio
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import httpx
import pytest
from nats.aio.msg import Msg
from run_services import NODE_GPUS, TOKEN, RunStack
from tfcommon import subjects
from tfcommon.bus import NatsEventBus
from tfcommon.events import (
    AllocationReleased,
    DiscoverGpus,
    GpuDiscovered,
    NodeRegistered,
    StartWorker,
    StopWorker,
    WorkloadRef,
    decode,
)
from tfcommon.gpu_models import GIB
from tfcommon.ledger.records import GpuSpec, NodeSpec, ReservationRequest, Reserved, ShareRequest

pytestmark = pytest.mark.integration

WITHIN_S = 30.0
RELEASE_WITHIN_S = 5.0


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[NatsEventBus]:
    connection = await NatsEventBus.connect(nats_url, service="tfctl")
    try:
        yield connection
    finally:
        await connection.close()


async def _eventually(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = WITHIN_S) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"{what} not within {timeout_s}s"
        await asyncio.sleep(0.05)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def _placed(stack: RunStack, name: str) -> dict[str, Any]:
    """Reserve one GPU share through the scheduler, as `tfctl run` does, and wait for its placement."""
    submission = {
        "workload": {"namespace": "default", "name": name, "uid": str(uuid4())},
        "request": {
            "pool": stack.pool,
            "gpu_count": 1,
            "tflops_request_milli": 10_000,
            "tflops_limit_milli": 10_000,
            "vram_request_bytes": 4 << 30,
            "vram_limit_bytes": 4 << 30,
            "qos": "medium",
            "isolation": "soft",
        },
    }
    headers = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=stack.scheduler_url, timeout=5, headers=headers) as client:
        answer = await client.post("/api/v1/workloads", json=submission)
        assert answer.status_code in (200, 201, 202), answer.text
        status: dict[str, Any] = answer.json()
        while status["state"] == "pending":
            await asyncio.sleep(0.1)
            status = (await client.get(f"/api/v1/workloads/{status['id']}")).json()
    assert status["state"] == "placed", status
    assert status["node"] == stack.node
    return status


def _start_worker(stack: RunStack, status: dict[str, Any], argv: list[str]) -> StartWorker:
    return StartWorker(
        event_id=uuid4(),
        occurred_at=datetime.now(UTC),
        node=stack.node,
        allocation_id=UUID(status["id"]),
        workload=WorkloadRef(namespace="default", name=status["workload"]["name"]),
        gpu_uuids=tuple(status["gpu_uuids"]),
        argv=tuple(argv),
        tflops_limit_milli=10_000,
        vram_limit_bytes=4 << 30,
    )


async def _published_and_handled(
    bus: NatsEventBus, stack: RunStack, command: StartWorker | StopWorker
) -> None:
    """Publish `command` and wait until the agent's command consumer has acknowledged it."""
    await bus.publish(command)
    last = (await bus.js.stream_info(subjects.COMMANDS_STREAM)).state.last_seq
    durable = subjects.node_agent_run_commands(stack.node).durable

    async def handled() -> bool:
        info = await bus.js.consumer_info(subjects.COMMANDS_STREAM, durable)
        return info.num_pending == 0 and info.num_ack_pending == 0 and info.ack_floor.stream_seq >= last

    await _eventually(handled, f"{type(command).__name__} handled by the agent")


async def _released_with(stack: RunStack, allocation_id: UUID) -> str:
    async def released() -> bool:
        record = await stack.ledger.get_allocation(allocation_id)
        return record is not None and record.state == "released"

    await _eventually(released, f"release of {allocation_id} in the ledger", RELEASE_WITHIN_S + WITHIN_S)
    record = await stack.ledger.get_allocation(allocation_id)
    assert record is not None
    assert record.release_reason is not None
    return record.release_reason


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


async def test_start_worker_runs_the_command_on_its_gpus_releases_at_exit_and_runs_once(
    run_stack: RunStack, bus: NatsEventBus, tmp_path: Path
) -> None:
    seen = tmp_path / "visible-devices.txt"
    script = tmp_path / "write_devices.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os
            with open({str(seen)!r}, "a") as f:
                f.write(os.environ["CUDA_VISIBLE_DEVICES"] + "\\n")
            """
        )
    )
    status = await _placed(run_stack, f"by-command-{uuid4().hex[:6]}")
    command = _start_worker(run_stack, status, [sys.executable, str(script)])
    announced: list[AllocationReleased] = []

    async def on_released(msg: Msg) -> None:
        message = decode(msg.subject, msg.data)
        if isinstance(message, AllocationReleased) and message.allocation_id == command.allocation_id:
            announced.append(message)

    subscription = await bus.nc.subscribe(AllocationReleased.subject, cb=on_released)
    try:
        await _published_and_handled(bus, run_stack, command)
        reason = await _released_with(run_stack, command.allocation_id)

        async def released_on_the_bus() -> bool:
            return bool(announced)

        await _eventually(released_on_the_bus, "tf.evt.allocation.released on the bus", 10.0)
    finally:
        await subscription.unsubscribe()

    assert _lines(seen) == [",".join(f"GPU-{uuid[4:]}" for uuid in status["gpu_uuids"])]
    assert reason == "worker exited with code 0"
    assert [(m.node, m.reason, m.cause) for m in announced] == [
        (run_stack.node, "worker exited with code 0", command.event_id)
    ]

    redelivered = command.model_copy(update={"event_id": uuid4()})
    await _published_and_handled(bus, run_stack, redelivered)

    assert len(_lines(seen)) == 1
    history = await run_stack.ledger.history(command.allocation_id)
    assert [entry.kind for entry in history].count("released") == 1


async def test_stop_worker_stops_a_long_running_command_and_a_second_start_does_not_start_another(
    run_stack: RunStack, bus: NatsEventBus, tmp_path: Path
) -> None:
    pids = tmp_path / "pids.txt"
    script = tmp_path / "sleeper.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import os, time
            with open({str(pids)!r}, "a") as f:
                f.write(f"{{os.getpid()}}\\n")
            time.sleep(120)
            """
        )
    )
    status = await _placed(run_stack, f"sleeper-{uuid4().hex[:6]}")
    command = _start_worker(run_stack, status, [sys.executable, str(script)])
    await _published_and_handled(bus, run_stack, command)

    async def started() -> bool:
        return len(_lines(pids)) == 1

    await _eventually(started, "the sleeper started")
    pid = int(_lines(pids)[0])
    await _published_and_handled(bus, run_stack, command.model_copy(update={"event_id": uuid4()}))
    assert _lines(pids) == [str(pid)]
    assert not _gone(pid)
    record = await run_stack.ledger.get_allocation(command.allocation_id)
    assert record is not None
    assert record.state != "released"

    stop = StopWorker(
        event_id=uuid4(),
        occurred_at=datetime.now(UTC),
        node=run_stack.node,
        allocation_id=command.allocation_id,
        grace_ms=2_000,
        reason="the operator needs the GPU",
    )
    await _published_and_handled(bus, run_stack, stop)

    async def stopped() -> bool:
        return _gone(pid)

    await _eventually(stopped, f"the sleeper (pid {pid}) stopped", 10.0)
    assert (
        await _released_with(run_stack, command.allocation_id) == "worker stopped: the operator needs the GPU"
    )
    assert len(_lines(pids)) == 1


async def test_discover_gpus_announces_the_node_and_each_gpu_again(
    run_stack: RunStack, bus: NatsEventBus
) -> None:
    announced: list[NodeRegistered | GpuDiscovered] = []

    async def on_message(msg: Msg) -> None:
        message = decode(msg.subject, msg.data)
        if isinstance(message, NodeRegistered | GpuDiscovered) and message.node == run_stack.node:
            announced.append(message)

    subscription = await bus.nc.subscribe("tf.evt.>", cb=on_message)
    try:
        await _published_and_handled(
            bus, run_stack, DiscoverGpus(event_id=uuid4(), occurred_at=datetime.now(UTC), node=run_stack.node)
        )

        async def all_announced() -> bool:
            return len(announced) == 1 + NODE_GPUS

        await _eventually(all_announced, "the node and its GPUs announced again", 10.0)
    finally:
        await subscription.unsubscribe()

    assert isinstance(announced[0], NodeRegistered)
    assert {m.gpu_uuid for m in announced if isinstance(m, GpuDiscovered)} == {
        str(gpu["uuid"]) for gpu in run_stack.gpus
    }


async def _reserved_on_another_node(stack: RunStack) -> UUID:
    """An allocation the ledger holds on a node of its own (no agent runs there)."""
    node, pool = f"elsewhere-{uuid4().hex[:6]}", f"elsewhere-pool-{uuid4().hex[:6]}"
    await stack.ledger.upsert_pool(pool)
    await stack.ledger.upsert_node(NodeSpec(name=node, pool=pool))
    gpu = f"gpu-{uuid4()}"
    await stack.ledger.upsert_gpu(GpuSpec(gpu, node, 0, "H100", "NVIDIA", 989_000, 80 * GIB))
    allocation_id = uuid4()
    result = await stack.ledger.reserve(
        ReservationRequest(
            allocation_id=allocation_id,
            workload=WorkloadRef(namespace="default", name=f"elsewhere-{allocation_id.hex[:6]}"),
            pool=pool,
            node=node,
            shares=(ShareRequest(gpu, 10_000, 4 * GIB),),
        ),
        commit=True,
    )
    assert isinstance(result, Reserved)
    return allocation_id


async def test_a_start_for_an_allocation_on_another_node_is_refused_and_releases_nothing(
    run_stack: RunStack, bus: NatsEventBus, tmp_path: Path
) -> None:
    marker = tmp_path / "started"
    elsewhere = await _reserved_on_another_node(run_stack)
    command = StartWorker(
        event_id=uuid4(),
        occurred_at=datetime.now(UTC),
        node=run_stack.node,
        allocation_id=elsewhere,
        workload=WorkloadRef(namespace="default", name="elsewhere"),
        gpu_uuids=(str(run_stack.gpus[0]["uuid"]),),
        argv=(sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"),
        tflops_limit_milli=10_000,
        vram_limit_bytes=4 << 30,
    )

    await _published_and_handled(bus, run_stack, command)
    await asyncio.sleep(1.0)

    assert not marker.exists(), "a worker started for another node's allocation"
    record = await run_stack.ledger.get_allocation(elsewhere)
    assert record is not None
    assert record.state == "committed"
