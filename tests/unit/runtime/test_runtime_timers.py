"""The runtime's timers (`tfcommon.runtime.run_timer`, `Components.timers`): periodic work that runs
again and again, survives a failed round, stops promptly, and shares names with no other task.

A failed round surviving was found by the fault campaign: a Postgres restart made the scheduler's
periodic node check raise, and the failed task stopped the whole scheduler (and `tfctl up`)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest
from tfcommon import subjects
from tfcommon.events import Message
from tfcommon.runtime import Components, Consume, ServiceContext, Timer, background_tasks, run_timer


async def test_a_timer_runs_its_work_every_interval_until_stopped() -> None:
    stop = asyncio.Event()
    rounds: list[float] = []

    async def work() -> None:
        rounds.append(time.monotonic())
        if len(rounds) == 3:
            stop.set()

    started = time.monotonic()
    await asyncio.wait_for(run_timer("work", (0.05, work), stop), timeout=10)
    assert len(rounds) == 3
    assert rounds[0] - started >= 0.045, "without at_start the first round waits one interval"
    assert all(later - earlier >= 0.045 for earlier, later in itertools.pairwise(rounds))


async def test_a_timer_at_start_runs_its_first_round_at_once() -> None:
    stop = asyncio.Event()
    rounds: list[float] = []

    async def work() -> None:
        rounds.append(time.monotonic())
        stop.set()

    started = time.monotonic()
    await asyncio.wait_for(run_timer("work", Timer(60.0, work, at_start=True), stop), timeout=10)
    assert len(rounds) == 1
    assert rounds[0] - started < 1.0


async def test_a_failed_round_is_logged_and_the_next_round_runs(caplog: pytest.LogCaptureFixture) -> None:
    stop = asyncio.Event()
    rounds: list[str] = []

    async def check_nodes() -> None:
        rounds.append("round")
        if len(rounds) == 1:
            raise ConnectionError("the database system is starting up")
        stop.set()

    with caplog.at_level(logging.ERROR, logger="tfcommon.runtime"):
        await asyncio.wait_for(run_timer("check-nodes", Timer(0.01, check_nodes), stop), timeout=10)
    assert rounds == ["round", "round"]
    [failed] = [
        record for record in caplog.records if getattr(record, "event", None) == "service.timer_failed"
    ]
    assert failed.__dict__["task"] == "check-nodes"
    assert "the database system is starting up" in failed.__dict__["reason"]
    assert failed.exc_info is not None, "the traceback is logged"


async def test_a_timer_stops_promptly_when_stopped_between_rounds() -> None:
    stop = asyncio.Event()
    rounds: list[str] = []

    async def work() -> None:
        rounds.append("round")

    timer = asyncio.create_task(run_timer("slow", Timer(3600.0, work, at_start=True), stop))
    await asyncio.sleep(0.05)
    started = time.monotonic()
    stop.set()
    await asyncio.wait_for(timer, timeout=5)
    assert time.monotonic() - started < 1.0
    assert rounds == ["round"]


async def test_a_round_in_flight_when_stopped_is_finished_and_no_other_starts() -> None:
    stop = asyncio.Event()
    finished: list[str] = []

    async def work() -> None:
        stop.set()
        await asyncio.sleep(0.05)
        finished.append("round")

    await asyncio.wait_for(run_timer("work", Timer(0.0, work, at_start=True), stop), timeout=5)
    assert finished == ["round"]


def _context(stopping: asyncio.Event, name: str = "scheduler") -> ServiceContext[Any]:
    return ServiceContext(
        name=name,
        settings=None,
        nats=SimpleNamespace(js=None),  # type: ignore[arg-type]
        stopping=stopping,
        cleanup=None,  # type: ignore[arg-type]
        ssl_context=None,
    )


async def test_timers_and_tasks_become_named_background_tasks() -> None:
    stopping = asyncio.Event()

    async def work() -> None:
        stopping.set()

    async def other() -> None:
        await stopping.wait()

    tasks = background_tasks(
        _context(stopping), Components(timers={"refresh-view": Timer(0.0, work)}, tasks={"other": other})
    )
    assert sorted(tasks) == ["other", "refresh-view"]
    await asyncio.wait_for(asyncio.gather(*(task() for task in tasks.values())), timeout=5)


def test_a_timer_and_a_task_of_the_same_name_are_refused() -> None:
    async def work() -> None:
        return None

    with pytest.raises(ValueError, match="named twice: tick"):
        background_tasks(
            _context(asyncio.Event()), Components(timers={"tick": (1.0, work)}, tasks={"tick": work})
        )


async def _ignore(message: Message) -> list[Message]:
    return []


def test_handlers_are_named_after_their_durable_without_service_or_node() -> None:
    tasks = background_tasks(
        _context(asyncio.Event(), "node-agent"),
        Components(
            handlers={
                subjects.node_agent_track_allocations("gpu-node-1"): _ignore,
                subjects.node_agent_run_commands("gpu-node-1"): Consume(_ignore, batch=4, concurrent=True),
            }
        ),
    )
    assert sorted(tasks) == ["run-commands", "track-allocations"]
    loop = tasks["run-commands"]
    assert isinstance(loop, partial)
    assert loop.keywords["batch"] == 4
    assert loop.keywords["concurrent"] is True
    assert loop.keywords["service"] == "node-agent"
    assert loop.args[1] == subjects.node_agent_run_commands("gpu-node-1")
