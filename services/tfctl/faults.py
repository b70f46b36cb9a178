"""Fault campaigns on the local stack: load, faults in turn, then the ledger invariants.

`run_fault_campaign(duration_s, seed)` starts its own stack (embedded NATS and Postgres, the five
services as `tfctl serve` children with simulated GPUs), drives submissions and releases through the
scheduler's HTTP API while it SIGKILLs each service (and restarts it), restarts NATS, restarts
Postgres (immediate shutdown, a crash for the database) and SIGSTOPs a service past its timeouts. Every
call is recorded as ok / fail / unknown. After the faults stop it checks the invariants of
`tfctl.fault_checks` and returns a report whose `violations` must be empty. A service that exits on its
own during an outage is restarted, as a container runtime would, and counted in `self_exits`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import nats
import sqlalchemy as sa
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from tfcommon import subjects
from tfcommon.config import TfConfig
from tfcommon.events import WorkloadRef
from tfcommon.infra import EmbeddedNats, EmbeddedPostgres, die_with_parent
from tfcommon.ledger import tables
from tfcommon.ledger.migrate import upgrade_head
from tfcommon.ledger.urls import ledger_url
from tfcommon.tls import ensure_self_signed
from tfmetrics.billing_api import pool_pricing
from tfmetrics.core.billing import BillableShare, compute_bill
from tfscheduler.core.view import allocation_id_for

from tfctl.fault_checks import (
    FinalStatus,
    GpuCapacity,
    HistoryRow,
    Operation,
    WorkloadKey,
    check_bill,
    check_bus,
    check_capacity,
    check_single_active,
    check_submissions,
    check_views_agree,
)
from tfctl.stack import Child, StackOptions, plan_children

log = logging.getLogger("tfctl.faults")
NODES = ("H100:2", "A100-80G:2")
API_TOKEN = "fault-campaign-token"
NAMESPACES = ("team-a", "team-b")
GIB = 1024**3
CLIENT_TIMEOUT_S = 3.0
HEARTBEAT_INTERVAL_S = 1.0
PAUSE_S = 5.0
"""SIGSTOP length: past the client timeout, the scheduler's heartbeat timeout (3 heartbeats) and
JetStream's first redelivery delay (1 s)."""
CONVERGENCE_S = 10.0
SETTLE_TIMEOUT_S = 60.0
BILL_QUANTUM = Decimal("0.000001")
ALLOCATION_CONSUMER_PREFIXES = (
    "metrics-count-events",
    "node-agent-track",
)


class FaultCampaignError(RuntimeError):
    """The campaign could not run (the stack did not start); the message says where its logs are."""


SELF_EXIT_LOG_LINES = 30
"""Lines of a child's log kept in the report when it exits on its own."""


@dataclass
class ManagedChild:
    """A service child the campaign can kill and start again."""

    child: Child
    environment: dict[str, str]
    process: asyncio.subprocess.Process | None = None
    expected_exit: bool = False
    self_exits: int = 0
    exit_logs: list[str] = field(default_factory=list)


@dataclass
class FaultStack:
    """The campaign's own stack: embedded NATS and Postgres plus every service child."""

    state_dir: Path
    nats: EmbeddedNats
    postgres: EmbeddedPostgres
    children: dict[str, ManagedChild] = field(default_factory=dict)

    @property
    def scheduler_url(self) -> str:
        return self.children["scheduler"].child.url

    @property
    def metrics_url(self) -> str:
        return self.children["metrics"].child.url

    def agents(self) -> list[Child]:
        return [managed.child for managed in self.children.values() if managed.child.service == "node-agent"]

    async def start(self) -> None:
        self.nats.launch()
        await asyncio.to_thread(self.nats.wait_until_ready)
        await asyncio.to_thread(self.postgres.prepare)
        self.postgres.launch()
        await asyncio.to_thread(self.postgres.wait_until_ready)
        await asyncio.to_thread(upgrade_head, self.postgres.url)
        await asyncio.to_thread(ensure_self_signed, self.state_dir / "certs")
        environment = {key: value for key, value in os.environ.items() if not key.startswith("TF_")}
        environment |= {
            "TF_NATS_URL": self.nats.url,
            "TF_DATABASE_URL": self.postgres.url,
            "TF_API_TOKEN": API_TOKEN,
            "TF_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_INTERVAL_S),
            "TF_LOG_LEVEL": "WARNING",
        }
        options = StackOptions(state_dir=self.state_dir, nodes=NODES, auto_ports=True)
        for child in plan_children(options):
            self.children[child.name] = ManagedChild(child, environment)
        await asyncio.gather(*(self.spawn(name) for name in self.children))
        await self.wait_ready(SETTLE_TIMEOUT_S)

    async def spawn(self, name: str) -> None:
        managed = self.children[name]
        managed.child.log_path.parent.mkdir(parents=True, exist_ok=True)
        managed.expected_exit = False
        with managed.child.log_path.open("ab") as log:
            managed.process = await asyncio.create_subprocess_exec(
                *managed.child.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                env=managed.environment,
                start_new_session=True,
                preexec_fn=die_with_parent(signal.SIGTERM),
            )

    async def kill(self, name: str) -> None:
        managed = self.children[name]
        assert managed.process is not None
        managed.expected_exit = True
        _signal_group(managed.process.pid, signal.SIGKILL)
        await managed.process.wait()

    def pause(self, name: str, paused: bool) -> None:
        process = self.children[name].process
        assert process is not None
        _signal_group(process.pid, signal.SIGSTOP if paused else signal.SIGCONT)

    async def restart_nats(self) -> None:
        assert self.nats.process is not None
        self.nats.process.kill()
        await asyncio.to_thread(self.nats.process.wait)
        self.nats.launch()
        await asyncio.to_thread(self.nats.wait_until_ready)

    async def restart_postgres(self) -> None:
        assert self.postgres.process is not None
        # SIGQUIT is Postgres' immediate shutdown: no checkpoint, crash recovery on the next start.
        self.postgres.process.send_signal(signal.SIGQUIT)
        await asyncio.to_thread(self.postgres.process.wait)
        self.postgres.launch()
        await asyncio.to_thread(self.postgres.wait_until_ready)

    async def supervise(self, stop: asyncio.Event) -> None:
        """Restart a child that exited without being killed by the campaign."""
        while not stop.is_set():
            for name, managed in self.children.items():
                process = managed.process
                if process is not None and process.returncode is not None and not managed.expected_exit:
                    managed.self_exits += 1
                    tail = managed.child.log_tail(SELF_EXIT_LOG_LINES)
                    managed.exit_logs.append(f"exit status {process.returncode}; last log lines:\n{tail}")
                    await self.spawn(name)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=0.5)

    async def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        async with httpx.AsyncClient(verify=False, timeout=2.0) as client:
            pending = list(self.children.values())
            while pending:
                answers = await asyncio.gather(
                    *(client.get(f"{managed.child.url}/readyz") for managed in pending),
                    return_exceptions=True,
                )
                pending = [
                    managed
                    for managed, answer in zip(pending, answers, strict=True)
                    if not isinstance(answer, httpx.Response) or answer.status_code != 200
                ]
                if pending and time.monotonic() > deadline:
                    names = ", ".join(managed.child.name for managed in pending)
                    raise FaultCampaignError(
                        f"{names} not ready within {timeout_s:.0f}s (logs: {self.state_dir})"
                    )
                if pending:
                    await asyncio.sleep(0.2)

    async def stop(self) -> None:
        for managed in self.children.values():
            if managed.process is not None and managed.process.returncode is None:
                managed.expected_exit = True
                _signal_group(managed.process.pid, signal.SIGCONT)
                _signal_group(managed.process.pid, signal.SIGTERM)
        for managed in self.children.values():
            if managed.process is not None:
                try:
                    await asyncio.wait_for(managed.process.wait(), timeout=10.0)
                except TimeoutError:
                    _signal_group(managed.process.pid, signal.SIGKILL)
                    await managed.process.wait()
        await asyncio.to_thread(self.nats.stop)
        await asyncio.to_thread(self.postgres.stop)


def _signal_group(process_group: int, signal_number: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process_group, signal_number)


@dataclass
class Generator:
    """Submits and releases workloads through the scheduler's API and records every call."""

    url: str
    rng: random.Random
    operations: list[Operation] = field(default_factory=list)
    live: list[tuple[WorkloadKey, UUID | None]] = field(default_factory=list)
    submitted: dict[WorkloadKey, dict[str, Any]] = field(default_factory=dict)
    counter: int = 0

    def _new_submission(self) -> tuple[WorkloadKey, dict[str, Any]]:
        self.counter += 1
        namespace = self.rng.choice(NAMESPACES)
        name = f"fault-{self.counter:05d}"
        uid = f"{self.rng.getrandbits(64):016x}"
        tflops = self.rng.choice((50_000, 100_000, 200_000))
        vram = self.rng.choice((8, 16, 24)) * GIB
        body = {
            "workload": {"namespace": namespace, "name": name, "uid": uid},
            "request": {
                "pool": "default",
                "tflops_request_milli": tflops,
                "tflops_limit_milli": tflops,
                "vram_request_bytes": vram,
                "vram_limit_bytes": vram,
            },
        }
        return (namespace, name, uid), body

    async def submit(self, client: httpx.AsyncClient) -> None:
        workload, body = self._new_submission()
        self.submitted[workload] = body
        invoked = time.monotonic()
        try:
            answer = await client.post(f"{self.url}/api/v1/workloads", json=body)
        except (httpx.ConnectError, httpx.ConnectTimeout) as error:
            self._record("submit", workload, "fail", invoked, detail=type(error).__name__)
            return
        except httpx.HTTPError as error:
            self._record("submit", workload, "unknown", invoked, detail=type(error).__name__)
            self.live.append((workload, None))
            return
        if answer.status_code in (201, 202):
            status = answer.json()
            allocation_id = UUID(status["id"])
            self._record(
                "submit", workload, "ok", invoked, allocation_id=allocation_id, state=status["state"]
            )
            self.live.append((workload, allocation_id))
        elif answer.status_code == 422:
            self._record("submit", workload, "ok", invoked, state="refused", detail=answer.text[:200])
        else:
            self._record("submit", workload, "unknown", invoked, detail=f"HTTP {answer.status_code}")
            self.live.append((workload, None))

    async def release(self, client: httpx.AsyncClient) -> None:
        candidates = [(workload, allocation) for workload, allocation in self.live if allocation is not None]
        if not candidates:
            return
        workload, allocation_id = self.rng.choice(candidates)
        invoked = time.monotonic()
        try:
            answer = await client.delete(f"{self.url}/api/v1/workloads/{allocation_id}")
        except (httpx.ConnectError, httpx.ConnectTimeout) as error:
            self._record("release", workload, "fail", invoked, allocation_id=allocation_id, detail=str(error))
            return
        except httpx.HTTPError as error:
            self._record(
                "release", workload, "unknown", invoked, allocation_id=allocation_id, detail=str(error)
            )
            return
        if answer.status_code == 200:
            state = "released" if answer.json().get("released") else "already-released"
            self._record("release", workload, "ok", invoked, allocation_id=allocation_id, state=state)
            if (workload, allocation_id) in self.live:
                self.live.remove((workload, allocation_id))
        else:
            outcome = "unknown" if answer.status_code >= 500 else "fail"
            self._record(
                "release",
                workload,
                outcome,
                invoked,
                allocation_id=allocation_id,
                detail=f"HTTP {answer.status_code}",
            )

    def _record(
        self,
        kind: str,
        workload: WorkloadKey,
        outcome: str,
        invoked: float,
        *,
        allocation_id: UUID | None = None,
        state: str | None = None,
        detail: str | None = None,
    ) -> None:
        self.operations.append(
            Operation(
                kind=kind,  # type: ignore[arg-type]
                workload=workload,
                outcome=outcome,  # type: ignore[arg-type]
                invoked_at=invoked,
                completed_at=time.monotonic(),
                allocation_id=allocation_id,
                state=state,
                detail=detail,
            )
        )

    async def run(self, stop: asyncio.Event, workers: int = 3) -> None:
        headers = {"Authorization": f"Bearer {API_TOKEN}"}
        async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S, headers=headers) as client:

            async def work() -> None:
                while not stop.is_set():
                    if self.rng.random() < 0.6:
                        await self.submit(client)
                    else:
                        await self.release(client)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), timeout=self.rng.uniform(0.05, 0.25))

            await asyncio.gather(*(work() for _ in range(workers)))


@dataclass(frozen=True)
class Fault:
    """One fault: its name and what it does to the stack."""

    name: str
    inject: Callable[[FaultStack], Any]


def fault_plan(stack: FaultStack) -> list[Fault]:
    """Every fault once, in this order: SIGKILL each service, restart NATS, restart Postgres, pause."""

    def kill(name: str) -> Fault:
        async def inject(stack: FaultStack) -> None:
            await stack.kill(name)
            await stack.spawn(name)

        return Fault(f"sigkill {name}", inject)

    def pause(name: str) -> Fault:
        async def inject(stack: FaultStack) -> None:
            stack.pause(name, True)
            try:
                await asyncio.sleep(PAUSE_S)  # the fault itself is the pause, not a synchronisation
            finally:
                stack.pause(name, False)

        return Fault(f"sigstop {name} {PAUSE_S:.0f}s", inject)

    agents = [child.name for child in stack.agents()]
    plan = [kill(name) for name in stack.children]
    plan.append(Fault("restart nats", FaultStack.restart_nats))
    plan.append(Fault("restart postgres", FaultStack.restart_postgres))
    plan.append(pause("scheduler"))
    plan.append(pause(agents[0]))
    return plan


@dataclass
class CampaignReport:
    """What a campaign did and found; `violations` maps each invariant to its failures (all empty: pass)."""

    seed: int
    duration_s: float
    operations: dict[str, int]
    faults: list[str]
    self_exits: dict[str, int]
    self_exit_logs: dict[str, list[str]]
    converged_after_s: float | None
    violations: dict[str, list[str]]
    state_dir: str

    @property
    def violation_count(self) -> int:
        return sum(len(found) for found in self.violations.values())

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "violation_count": self.violation_count}


async def _campaign(duration_s: float, seed: int, state_dir: Path) -> CampaignReport:
    stack = FaultStack(
        state_dir=state_dir,
        nats=EmbeddedNats(store_dir=state_dir / "nats", die_with_parent=True),
        postgres=EmbeddedPostgres(data_dir=state_dir / "postgres", die_with_parent=True),
    )
    try:
        await stack.start()
        log.info("stack ready in %s", state_dir)
        started_at = datetime.now(UTC)
        generator = Generator(stack.scheduler_url, random.Random(seed))
        stop_load, stop_supervisor = asyncio.Event(), asyncio.Event()
        supervisor = asyncio.create_task(stack.supervise(stop_supervisor))
        load = asyncio.create_task(generator.run(stop_load))
        injected = await _inject_faults(stack, duration_s)
        stop_load.set()
        await load
        log.info("load stopped after %d operations; settling", len(generator.operations))
        await stack.wait_ready(SETTLE_TIMEOUT_S)
        stop_supervisor.set()
        await supervisor
        engine = create_async_engine(ledger_url(stack.postgres.url))
        try:
            converged_after_s, view_violations = await _converge(stack, engine)
            log.info("views converged: %s; checking the invariants", converged_after_s)
            violations = await _check_everything(stack, engine, generator, started_at)
        finally:
            await engine.dispose()
        violations["views agree within 10 s"] = view_violations
        (state_dir / "operations.json").write_text(
            json.dumps([asdict(operation) for operation in generator.operations], default=str, indent=1)
        )
        return CampaignReport(
            seed=seed,
            duration_s=duration_s,
            operations=_count_operations(generator.operations),
            faults=injected,
            self_exits={
                name: managed.self_exits for name, managed in stack.children.items() if managed.self_exits
            },
            self_exit_logs={
                name: managed.exit_logs for name, managed in stack.children.items() if managed.exit_logs
            },
            converged_after_s=converged_after_s,
            violations=violations,
            state_dir=str(state_dir),
        )
    finally:
        await stack.stop()


async def _inject_faults(stack: FaultStack, duration_s: float) -> list[str]:
    plan = fault_plan(stack)
    gap_s = max(duration_s / (len(plan) + 1), 0.5)
    deadline = time.monotonic() + duration_s
    injected: list[str] = []
    index = 0
    while time.monotonic() < deadline or index < len(plan):
        await asyncio.sleep(min(gap_s, max(deadline - time.monotonic(), 0.5)))
        fault = plan[index % len(plan)]
        log.info("injecting %s", fault.name)
        await fault.inject(stack)
        injected.append(fault.name)
        index += 1
        await stack.wait_ready(SETTLE_TIMEOUT_S)
    return injected


def _count_operations(operations: list[Operation]) -> dict[str, int]:
    counts: dict[str, int] = {"total": len(operations)}
    for operation in operations:
        key = f"{operation.kind}-{operation.outcome}"
        counts[key] = counts.get(key, 0) + 1
    return counts


async def _open_allocations(engine: AsyncEngine) -> set[UUID]:
    allocation = tables.allocation.c
    async with engine.connect() as connection:
        rows = await connection.execute(
            sa.select(allocation.allocation_id).where(allocation.state != "released").distinct()
        )
        return {row.allocation_id for row in rows}


async def _converge(stack: FaultStack, engine: AsyncEngine) -> tuple[float | None, list[str]]:
    started = time.monotonic()
    found: list[str] = []
    async with httpx.AsyncClient(timeout=2.0) as client:
        while True:
            ledger = await _open_allocations(engine)
            scheduler: set[UUID] = set()
            agents: set[UUID] = set()
            complete = True
            with contextlib.suppress(httpx.HTTPError):
                answer = await client.get(f"{stack.scheduler_url}/api/v1/allocations")
                scheduler = {UUID(item["id"]) for item in answer.json()}
            for agent in stack.agents():
                try:
                    answer = await client.get(f"{agent.url}/api/v1/workers")
                    agents |= {UUID(worker["worker_uid"]) for worker in answer.json()["data"]}
                except httpx.HTTPError:
                    complete = False
            found = check_views_agree(ledger, scheduler, agents, complete)
            elapsed = time.monotonic() - started
            if not found:
                return round(elapsed, 2), []
            if elapsed > CONVERGENCE_S:
                return None, found
            await asyncio.sleep(0.25)


async def _check_everything(
    stack: FaultStack, engine: AsyncEngine, generator: Generator, started_at: datetime
) -> dict[str, list[str]]:
    history = await _history(engine)
    gpus = await _gpus(engine)
    finals, allocated = await _finals(stack, engine, generator)
    bus = await _bus_violations(stack, engine)
    bill = await _bill_violations(stack, engine, started_at - timedelta(minutes=1))
    return {
        "gpu over capacity": check_capacity(history, gpus),
        "pod with two active allocations": check_single_active(history),
        "submission outcome": check_submissions(generator.operations, finals, allocated),
        "bus exactly once": bus,
        "bill conserves": bill,
    }


async def _history(engine: AsyncEngine) -> list[HistoryRow]:
    history, allocation = tables.allocation_history.c, tables.allocation.c
    query = (
        sa.select(
            history.id,
            history.allocation_id,
            history.gpu_uuid,
            history.kind,
            history.tflops_milli,
            history.vram_bytes,
            history.occurred_at,
            allocation.workload_namespace,
            allocation.workload_name,
            allocation.workload_uid,
        )
        .join(
            tables.allocation,
            sa.and_(
                allocation.allocation_id == history.allocation_id, allocation.gpu_uuid == history.gpu_uuid
            ),
        )
        .order_by(history.id)
    )
    async with engine.connect() as connection:
        rows = (await connection.execute(query)).all()
    return [
        HistoryRow(
            id=row.id,
            allocation_id=row.allocation_id,
            gpu_uuid=row.gpu_uuid,
            kind=row.kind,
            tflops_milli=row.tflops_milli,
            vram_bytes=row.vram_bytes,
            workload=(row.workload_namespace, row.workload_name, row.workload_uid or ""),
            occurred_at=row.occurred_at,
        )
        for row in rows
    ]


async def _gpus(engine: AsyncEngine) -> dict[str, GpuCapacity]:
    async with engine.connect() as connection:
        rows = (await connection.execute(sa.select(tables.gpu))).all()
    return {
        row.uuid: GpuCapacity(
            row.uuid,
            row.capacity_tflops_milli,
            row.capacity_vram_bytes,
            row.used_tflops_milli,
            row.used_vram_bytes,
        )
        for row in rows
    }


async def _ledger_allocations(engine: AsyncEngine) -> dict[WorkloadKey, dict[UUID, bool]]:
    """Each workload's allocations in the ledger, with whether each is still open."""
    allocation = tables.allocation.c
    async with engine.connect() as connection:
        rows = (
            await connection.execute(
                sa.select(
                    allocation.allocation_id,
                    allocation.state,
                    allocation.workload_namespace,
                    allocation.workload_name,
                    allocation.workload_uid,
                )
            )
        ).all()
    held: dict[WorkloadKey, dict[UUID, bool]] = {}
    for row in rows:
        key = (row.workload_namespace, row.workload_name, row.workload_uid or "")
        shares = held.setdefault(key, {})
        shares[row.allocation_id] = shares.get(row.allocation_id, False) or row.state != "released"
    return held


async def _finals(
    stack: FaultStack, engine: AsyncEngine, generator: Generator
) -> tuple[dict[WorkloadKey, FinalStatus], set[WorkloadKey]]:
    """Every submitted workload's state in the scheduler beside its allocations in the ledger, read
    again until the ledger did not change while the states were read (pending work may still land)."""
    deadline = time.monotonic() + CONVERGENCE_S
    while True:
        before = await _ledger_allocations(engine)
        states = await _scheduler_states(stack, generator)
        held = await _ledger_allocations(engine)
        if held == before or time.monotonic() > deadline:
            break
    finals = {
        workload: FinalStatus(state=state, reason=reason, allocations=held.get(workload, {}))
        for workload, (state, reason) in states.items()
    }
    return finals, set(held)


async def _scheduler_states(
    stack: FaultStack, generator: Generator
) -> dict[WorkloadKey, tuple[str | None, str | None]]:
    refusals = {op.workload: op.detail for op in generator.operations if op.state == "refused"}
    states: dict[WorkloadKey, tuple[str | None, str | None]] = {}
    async with httpx.AsyncClient(timeout=5.0) as client:
        for workload, body in generator.submitted.items():
            if workload in refusals:
                states[workload] = ("refused", refusals[workload])
                continue
            allocation_id = allocation_id_for(WorkloadRef.model_validate(body["workload"]))
            answer = await client.get(f"{stack.scheduler_url}/api/v1/workloads/{allocation_id}")
            status = answer.json() if answer.status_code == 200 else {}
            states[workload] = (status.get("state"), status.get("reason"))
    return states


async def _bus_violations(stack: FaultStack, engine: AsyncEngine) -> list[str]:
    outbox = tables.outbox.c
    async with engine.connect() as connection:
        rows = (
            await connection.execute(sa.select(outbox.event_id, outbox.published_at, outbox.subject))
        ).all()
    published = {row.event_id: row.published_at for row in rows}
    connection_ = await nats.connect(stack.nats.url)
    try:
        js = connection_.jetstream()
        message_ids: list[str] = []
        for subject in sorted({row.subject for row in rows}):
            message_ids += await _stream_message_ids(js, subject)
        backlogs = await _consumer_backlogs(js)
    finally:
        await connection_.close()
    return check_bus(published, message_ids, backlogs)


async def _stream_message_ids(js: Any, subject: str) -> list[str]:
    """The `Nats-Msg-Id` of every message on `subject` stored so far (new ones are not waited for)."""
    last = (await js.stream_info(subjects.EVENTS_STREAM)).state.last_seq
    subscription = await js.pull_subscribe(
        subject,
        durable=None,
        stream=subjects.EVENTS_STREAM,
        config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL),
    )
    message_ids: list[str] = []
    try:
        while True:
            try:
                batch = await subscription.fetch(batch=500, timeout=1.0)
            except TimeoutError:  # nats.errors.TimeoutError, or asyncio's when the deadline ran out first
                return message_ids
            for message in batch:
                message_ids.append((message.headers or {}).get("Nats-Msg-Id", ""))
                if message.metadata.sequence.stream >= last:
                    return message_ids
    finally:
        await subscription.unsubscribe()


async def _consumer_backlogs(js: Any) -> dict[str, tuple[int, int]]:
    """Per consumer of allocation events: messages it should have had delivered but has not, and
    messages delivered but not acknowledged."""
    deadline = time.monotonic() + CONVERGENCE_S
    while True:
        backlogs: dict[str, tuple[int, int]] = {}
        for info in await js.consumers_info(subjects.EVENTS_STREAM):
            name = info.name or ""
            if not name.startswith(ALLOCATION_CONSUMER_PREFIXES):
                continue
            backlogs[name] = (info.num_pending or 0, info.num_ack_pending or 0)
        if (
            not any(pending or unacked for pending, unacked in backlogs.values())
            or time.monotonic() > deadline
        ):
            return backlogs
        await asyncio.sleep(0.25)


async def _bill_violations(stack: FaultStack, engine: AsyncEngine, start: datetime) -> list[str]:
    end = datetime.now(UTC)
    history, allocation, gpu = tables.allocation_history.c, tables.allocation.c, tables.gpu.c
    query = sa.select(
        history.allocation_id,
        history.gpu_uuid,
        history.kind,
        history.occurred_at,
        allocation.workload_namespace,
        allocation.workload_name,
        allocation.workload_owner,
        allocation.qos,
        allocation.pool_name,
        allocation.request_tflops_milli,
        allocation.request_vram_bytes,
        allocation.limit_tflops_milli,
        allocation.limit_vram_bytes,
        allocation.eviction_protection_s,
        gpu.model,
    ).select_from(
        tables.allocation_history.join(
            tables.allocation,
            sa.and_(
                allocation.allocation_id == history.allocation_id, allocation.gpu_uuid == history.gpu_uuid
            ),
        ).join(tables.gpu, gpu.uuid == history.gpu_uuid)
    )
    async with engine.connect() as connection:
        rows = (await connection.execute(query.order_by(history.id))).all()
    opened: dict[tuple[UUID, str], Any] = {}
    closed: dict[tuple[UUID, str], datetime] = {}
    for row in rows:
        key = (row.allocation_id, row.gpu_uuid)
        if row.kind == "opened":
            opened[key] = row
        elif row.kind in ("released", "evicted"):
            closed[key] = row.occurred_at
    shares = []
    seconds: dict[str, float] = {}
    for key, row in opened.items():
        held_from, held_until = max(row.occurred_at, start), min(closed.get(key, end), end)
        pod = f"{row.workload_namespace}/{row.workload_name}"
        seconds[pod] = seconds.get(pod, 0.0) + max((held_until - held_from).total_seconds(), 0.0)
        protection = row.eviction_protection_s
        shares.append(
            BillableShare(
                allocation_id=str(key[0]),
                gpu_uuid=key[1],
                namespace=row.workload_namespace,
                pod=row.workload_name,
                workload=row.workload_owner or row.workload_name,
                qos=row.qos,
                pool=row.pool_name,
                gpu_model=row.model,
                request_tflops_milli=row.request_tflops_milli,
                request_vram_bytes=row.request_vram_bytes,
                limit_tflops_milli=row.limit_tflops_milli,
                limit_vram_bytes=row.limit_vram_bytes,
                start=row.occurred_at,
                end=closed.get(key),
                protected_until=row.occurred_at + timedelta(seconds=protection) if protection else None,
            )
        )
    expected = compute_bill(
        shares,
        pool_pricing(TfConfig(), {share.pool for share in shares}),
        {},
        start=start,
        end=end,
        group_by="pod",
        quantum=BILL_QUANTUM,
    )
    params = {
        "from": start.isoformat(),
        "to": end.isoformat(),
        "groupBy": "pod",
        "quantum": str(BILL_QUANTUM),
    }
    async with httpx.AsyncClient(timeout=10.0) as client:
        answer = await client.get(f"{stack.metrics_url}/api/v1/billing", params=params)
    if answer.status_code != 200:
        return [f"GET /api/v1/billing answered {answer.status_code}: {answer.text[:300]}"]
    billed = answer.json()
    billed_hours = {group["key"]: group["gpuHours"] for group in billed["groups"]}
    return check_bill(str(expected.cost), billed["cost"], seconds, billed_hours)


def run_fault_campaign(duration_s: float, seed: int, state_dir: Path | None = None) -> dict[str, Any]:
    """Run one campaign of about `duration_s` seconds of load and faults (every fault at least once)
    on a fresh local stack and return its report: `operations`, `faults`, `violations` (each
    invariant's failures; all empty means nothing was lost), `violation_count`, `converged_after_s`.

    The stack lives in `state_dir` (a new temporary folder if None, removed afterwards when the
    campaign found no violation and no service exited on its own, kept for its logs otherwise).
    """
    own_folder = state_dir is None
    folder = Path(tempfile.mkdtemp(prefix="tfpool-faults-")) if state_dir is None else state_dir
    report = asyncio.run(_campaign(duration_s, seed, folder / "state"))
    if own_folder and report.violation_count == 0 and not report.self_exits:
        shutil.rmtree(folder, ignore_errors=True)
    return report.as_dict()


def print_report(report: dict[str, Any], json_output: bool) -> None:
    """The report as one JSON document, or a short human summary."""
    if json_output:
        print(json.dumps(report, default=str), flush=True)
        return
    operations = report["operations"]
    outcomes = ", ".join(f"{kind} {count}" for kind, count in operations.items() if kind != "total")
    print(f"operations: {operations['total']} ({outcomes})")
    print(f"faults injected: {len(report['faults'])} ({', '.join(report['faults'])})")
    print(f"services that exited on their own and were restarted: {report['self_exits'] or 'none'}")
    for name, logs in report.get("self_exit_logs", {}).items():
        for exit_log in logs:
            print(f"{name}: {exit_log}")
    print(f"converged after: {report['converged_after_s']} s")
    print(f"violations: {report['violation_count']}")
    for invariant, found in report["violations"].items():
        for violation in found[:10]:
            print(f"  {invariant}: {violation}")
    sys.stdout.flush()
