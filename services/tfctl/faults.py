"""Fault campaigns on the local stack: load, faults in turn, then the ledger invariants.

`run_fault_campaign(duration_s, seed)` starts its own stack (a three-server NATS JetStream cluster,
`tfctl.fault_nats`, with every stream on all three servers; embedded Postgres; the five services as
`tfctl serve` children with simulated GPUs, each given the three NATS URLs), drives submissions of
every QoS (the `critical` ones preempt) and releases through the webhook and the scheduler's HTTP API
while it SIGKILLs each service (and restarts it), restarts all three NATS servers at once, SIGKILLs
the server leading `TF_EVENTS` (down a few seconds, then started again on its store), restarts
Postgres (immediate shutdown, a crash for the database), SIGSTOPs each service past its timeouts and (as
root, `tfctl.fault_network`) partitions the last node agent from everything, slows its link, and cuts
the scheduler from the three NATS servers alone and from Postgres alone (`fault_plan` lists every
fault). Every
call is recorded as ok / fail / unknown. After the faults stop it checks the invariants of
`tfctl.fault_checks` and returns a report whose `violations` must be empty. A service that exits on its
own during an outage is restarted, as a container runtime would, and counted in `self_exits`.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import partial
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID, uuid4

import httpx
import nats
import nats.errors
import sqlalchemy as sa
from nats.aio.client import Client as NatsClient
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool
from tfcommon import pod_spec, subjects
from tfcommon.bus import NatsEventBus, UnroutableSubjectError, cloudevent_headers
from tfcommon.config import TfConfig
from tfcommon.deadletter import discard_dead_letter, list_dead_letters
from tfcommon.events import StartDefragCampaign, WorkloadRef
from tfcommon.infra import EmbeddedPostgres, die_with_parent
from tfcommon.ledger import tables
from tfcommon.ledger.migrate import upgrade_head
from tfcommon.ledger.urls import ledger_url
from tfcommon.tls import ensure_self_signed
from tfmetrics.billing_api import pool_pricing
from tfmetrics.core.billing import BillableShare, compute_bill
from tfscheduler.core.view import allocation_id_for
from tfwebhook.testing import a_pod, a_review, apply

from tfctl.commands.submit import submission_for
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
from tfctl.fault_deadletters import StalledConsumer
from tfctl.fault_nats import NatsCluster, until_jetstream_answers
from tfctl.fault_network import NetworkCell
from tfctl.history_check import (
    BillPeriod,
    BusEvent,
    HistoryFigures,
    count_view_differences,
    history_figures,
)
from tfctl.stack import Child, StackOptions, plan_children

log = logging.getLogger("tfctl.faults")
T = TypeVar("T")
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
SNAPSHOT_S = 60.0
"""How long the checker reads the ledger, the scheduler and the bus again until no allocation changed
while it read them (each read takes seconds: the bus read waits a second per subject)."""
WEBHOOK_SHARE = 0.5
"""Share of submissions admitted through the webhook's `POST /mutate-v1-pod` first (the pod it
mutates is then submitted as `tfctl submit` does); the others go to the scheduler's API directly."""
QOS_SHARES = (("low", 0.25), ("medium", 0.3), ("high", 0.3), ("critical", 0.15))
"""The QoS each submission asks for (`tensor-fusion.ai/qos` through the webhook, `request.qos` with the
priority of its PriorityClass, `tfcommon.pod_spec.priority_of`, straight to the scheduler): `low` and
`medium` (priority 0, medium first), `high` (10,000) and `critical` (100,000)."""
PREEMPTOR_TFLOPS_MILLI = 250_000
PREEMPTOR_VRAM_GIB = 40
"""What a `critical` submission asks for: half a card, so that once the GPUs are full it fits only by
preempting lower-priority workloads (every campaign must report `preemptions` above 0)."""
PROTECTED_SHARE = 0.3
PROTECTION_S = 4
DEFRAG_EVERY_S = 4.0
DEFRAG_WINDOW_MS = 20_000
"""Each requested campaign's window; the pool's `maxDuration` (1 s) is also the age under which the
planner leaves a workload alone (`fresh-worker`), so that the load's workloads can be moved."""
"""Share of submissions asking for eviction protection, and how long (billed at the surcharge)."""
SETTLE_TIMEOUT_S = 60.0
BILL_QUANTUM = Decimal("0.000001")
ALLOCATION_CONSUMER_PREFIXES = (
    "metrics-count-events",
    "node-agent-track",
)


DEFRAG_EVERY_NODE = {
    "enabled": True,
    "timezone": "UTC",
    "maxDuration": "1s",
    "utilizationThresholdPercent": 100,
}
DEFRAG_CONFIG = {
    "gpuPools": [
        {
            "name": "default",
            "isDefault": True,
            "specTemplate": {"nodeManagerConfig": {"nodeCompaction": {"defrag": DEFRAG_EVERY_NODE}}},
        }
    ]
}
"""The pool `default` with defrag on every node (threshold 100%): the campaigns the load asks for
move workloads while the faults run."""


def _budgets() -> list[dict[str, Any]]:
    """One PodDisruptionBudget per namespace over the load's workloads (`app: serve`): one away at a time."""
    return [
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "serve", "namespace": namespace},
            "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {"app": "serve"}}},
        }
        for namespace in NAMESPACES
    ]


class FaultCampaignError(RuntimeError):
    """The campaign could not run (the stack did not start); the message says where its logs are."""


HISTORY_FIGURES = ("acknowledged_operations", "lost", "doubled", "phantom", "bill_difference", "self_exits")
"""The history checker's figures the report prints (and `fault_kinds`); all but the first must be 0."""
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
    """The campaign's own stack: a three-server NATS cluster, embedded Postgres and every service child."""

    state_dir: Path
    nats: NatsCluster
    postgres: EmbeddedPostgres
    children: dict[str, ManagedChild] = field(default_factory=dict)
    cell: NetworkCell | None = None
    """Where the last node agent runs, cut off by the partition faults (None: not possible here)."""
    scheduler_cell: NetworkCell | None = None
    """Where the scheduler runs, cut from NATS alone and from Postgres alone (None: not possible here)."""

    @property
    def scheduler_url(self) -> str:
        return self.children["scheduler"].child.url

    @property
    def metrics_url(self) -> str:
        return self.children["metrics"].child.url

    def agents(self) -> list[Child]:
        return [managed.child for managed in self.children.values() if managed.child.service == "node-agent"]

    async def start(self) -> None:
        await self.nats.start()
        await asyncio.to_thread(self.postgres.prepare)
        self.postgres.launch()
        await asyncio.to_thread(self.postgres.wait_until_ready)
        await asyncio.to_thread(upgrade_head, self.postgres.url)
        await asyncio.to_thread(ensure_self_signed, self.state_dir / "certs")
        environment = {key: value for key, value in os.environ.items() if not key.startswith("TF_")}
        environment |= {
            "TF_NATS_URL": self.nats.url,
            "TF_NATS_STREAM_REPLICAS": str(NATS_REPLICAS),
            "TF_DATABASE_URL": self.postgres.url,
            "TF_API_TOKEN": API_TOKEN,
            "TF_HEARTBEAT_INTERVAL_S": str(HEARTBEAT_INTERVAL_S),
            "TF_LOG_LEVEL": "WARNING",
            "TF_CONFIG_FILE": str(self._write_json("config.yaml", DEFRAG_CONFIG)),
            "TF_DEFRAG_PDB_FILE": str(self._write_json("pdb.yaml", *_budgets())),
        }
        options = StackOptions(state_dir=self.state_dir, nodes=NODES, auto_ports=True)
        for child in plan_children(options):
            self.children[child.name] = ManagedChild(child, environment | child.environment)
        if self.cell is not None:
            await self._move_into_cell(self.cell, self.agents()[-1], environment)
        if self.scheduler_cell is not None:
            await self._move_into_cell(self.scheduler_cell, self.children["scheduler"].child, environment)
        await asyncio.gather(*(self.spawn(name) for name in self.children))
        await self.wait_ready(SETTLE_TIMEOUT_S)

    async def _move_into_cell(self, cell: NetworkCell, child: Child, environment: dict[str, str]) -> None:
        """Run `child` inside `cell`, reaching the three NATS servers and Postgres through its veth pair;
        a child given its URL (the defrag planner is given the scheduler's) gets its address in the cell
        instead."""
        for port in (*self.nats.ports, self.postgres.port):
            await cell.forward(port)
        self.children[child.name].environment = (
            environment
            | child.environment
            | {
                "TF_NATS_URL": ",".join(f"nats://{cell.host_ip}:{port}" for port in self.nats.ports),
                "TF_DATABASE_URL": self.postgres.url.replace(f"@{self.postgres.host}:", f"@{cell.host_ip}:"),
            }
        )
        child.argv = cell.wrap(child.argv)
        moved_from, child.url = child.url, child.url.replace(f"//{self.nats.host}:", f"//{cell.cell_ip}:")
        for managed in self.children.values():
            for key, value in managed.environment.items():
                if value == moved_from:
                    managed.environment[key] = child.url

    def _write_json(self, name: str, *documents: Any) -> Path:
        """YAML documents (JSON is YAML) in the stack's folder."""
        path = self.state_dir / name
        path.write_text("\n---\n".join(json.dumps(document) for document in documents))
        return path

    async def spawn(self, name: str) -> None:
        managed = self.children[name]
        managed.child.log_path.parent.mkdir(parents=True, exist_ok=True)
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
        # Only now: until the new process is in place the supervisor must not take the one the
        # campaign killed for an exit of its own (and start a second copy that finds its port taken).
        managed.expected_exit = False

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
        """SIGKILL all three NATS servers, then start them again on their stores: the whole bus away."""
        await self.nats.restart_all()

    async def kill_nats_leader(self, chaos: Chaos) -> None:
        """SIGKILL the server leading `TF_EVENTS` (`cluster.leader` of its stream info), keep it down
        until the other two have elected a new leader and at least `LEADER_DOWN_S`, then start it again
        on its store; the seconds to the new leader go to `chaos.leader_elections_s`."""
        leader = await _retried(lambda: self.nats.leader_of(subjects.EVENTS_STREAM))
        server = self.nats.by_name(leader) if leader is not None else self.nats.servers[0]
        killed_at = time.monotonic()
        await self.nats.kill(server)
        deadline = killed_at + SETTLE_TIMEOUT_S
        while time.monotonic() < deadline:
            with contextlib.suppress(nats.errors.Error, OSError, TimeoutError):
                if await self.nats.leader_of(subjects.EVENTS_STREAM) not in (None, server.name):
                    chaos.leader_elections_s.append(round(time.monotonic() - killed_at, 2))
                    break
            await asyncio.sleep(0.2)
        # The rest of the outage is the fault itself, not a synchronisation.
        await asyncio.sleep(max(killed_at + LEADER_DOWN_S - time.monotonic(), 0.0))
        self.nats.launch(server)
        await self.nats.wait_ready()

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
        for cell in (self.cell, self.scheduler_cell):
            if cell is not None:
                await cell.close()


async def _retried(read: Callable[[], Any], timeout_s: float = SETTLE_TIMEOUT_S) -> Any:
    """`await read()`, asked again while NATS does not answer (a cluster still electing a leader)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await read()
        except (nats.errors.Error, OSError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.25)


def _signal_group(process_group: int, signal_number: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process_group, signal_number)


@dataclass
class Generator:
    """Submits and releases workloads through the scheduler's API and records every call."""

    url: str
    rng: random.Random
    webhook_url: str | None = None
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
        qos = self.rng.choices([qos for qos, _ in QOS_SHARES], [share for _, share in QOS_SHARES])[0]
        if qos == "critical":
            tflops, vram = PREEMPTOR_TFLOPS_MILLI, PREEMPTOR_VRAM_GIB * GIB
        body: dict[str, Any] = {
            "workload": {"namespace": namespace, "name": name, "uid": uid},
            "request": {
                "pool": "default",
                "tflops_request_milli": tflops,
                "tflops_limit_milli": tflops,
                "vram_request_bytes": vram,
                "vram_limit_bytes": vram,
                "qos": qos,
            },
            "priority": pod_spec.priority_of(qos),
            "labels": {"app": "serve"},
        }
        if self.rng.random() < PROTECTED_SHARE:
            body["eviction_protection_s"] = PROTECTION_S
        return (namespace, name, uid), body

    async def _through_webhook(
        self, client: httpx.AsyncClient, workload: WorkloadKey, body: dict[str, Any]
    ) -> dict[str, Any] | str:
        """The submission the webhook's mutation of a pod for `body` yields, or why there is none."""
        namespace, name, uid = workload
        request = body["request"]
        pod = a_pod(
            namespace=namespace,
            name=name,
            labels={pod_spec.ENABLED: "true", **body["labels"]},
            annotations={
                pod_spec.TFLOPS_REQUEST: str(request["tflops_request_milli"] // 1000),
                pod_spec.VRAM_REQUEST: f"{request['vram_request_bytes'] // GIB}Gi",
                pod_spec.QOS: request["qos"],
            },
            containers=[{"name": "app", "image": "img"}],
        )
        pod["metadata"]["uid"] = uid
        try:
            answer = await client.post(
                f"{self.webhook_url}/mutate-v1-pod",
                content=a_review(pod, uid=uid, namespace=namespace),
                headers={"content-type": "application/json"},
            )
        except httpx.HTTPError as error:
            return f"webhook: {type(error).__name__}"
        if answer.status_code != 200:
            return f"webhook: HTTP {answer.status_code}"
        response = answer.json()["response"]
        if not response.get("allowed"):
            return f"webhook denied: {response.get('status')}"
        patch = json.loads(base64.b64decode(response["patch"])) if response.get("patch") else []
        submission = submission_for(apply(pod, patch), namespace, None)
        if isinstance(submission, str):
            return f"webhook: {submission}"
        if "eviction_protection_s" in body:
            submission["eviction_protection_s"] = body["eviction_protection_s"]
        return submission

    async def submit(self, client: httpx.AsyncClient) -> None:
        workload, body = self._new_submission()
        invoked = time.monotonic()
        if self.webhook_url is not None and self.rng.random() < WEBHOOK_SHARE:
            mutated = await self._through_webhook(client, workload, body)
            if isinstance(mutated, str):
                # Nothing reached the scheduler: surely not done.
                self._record("submit", workload, "fail", invoked, detail=mutated)
                return
            body = mutated
        self.submitted[workload] = body
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
        # verify=False: the webhook's certificate is the campaign's own self-signed one.
        async with httpx.AsyncClient(timeout=CLIENT_TIMEOUT_S, headers=headers, verify=False) as client:

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


@dataclass
class Chaos:
    """What the campaign did to the stack besides its load: the faults in order and what each left for
    the checker (the stream sequences republished on purpose) and the report."""

    injected: list[str] = field(default_factory=list)
    republished: list[int] = field(default_factory=list)
    backends_terminated: int = 0
    poison_published: int = 0
    poison_terminated: int = 0
    poison_dead_lettered: int = 0
    """Dead letters (reason `poison`) the consumers left for the poison messages, each then discarded."""
    stalled_dead_lettered: int = 0
    stalled_replayed: int = 0
    """Dead letters of the consumer stalled past `max_deliver`, and those replayed (`fault_deadletters`)."""
    defrag_requests: int = 0
    disk_full_servers: list[str] = field(default_factory=list)
    """The NATS server whose store each disk-full fault filled (the `TF_EVENTS` leader then)."""
    leader_elections_s: list[float] = field(default_factory=list)
    """Seconds from each SIGKILL of the `TF_EVENTS` leader to the new leader the other two elected."""
    events_replicas: int = 0
    """`TF_EVENTS`'s replicas at the end (3: the services' `TF_NATS_STREAM_REPLICAS`, never lowered)."""
    partition_drops: dict[str, int] = field(default_factory=dict)
    """Packets the kernel dropped in each per-port partition (`partition scheduler from nats 5s`...),
    summed over its runs: 0 would mean the cut hit no traffic."""
    slow_link: dict[str, int] = field(default_factory=dict)
    """What the kernel did to the slowed agent's packets over every slow-link fault: `passed` (through
    the token bucket), `dropped_at_random` (the 5% random loss), `dropped_on_overflow` (queue full)."""
    evictions: dict[str, int] = field(default_factory=dict)
    """`tf.evt.pod.evicted` in the stream at the end, by what evicted (defrag, preemption)."""
    not_run: dict[str, str] = field(default_factory=dict)
    unsettled_snapshot: bool = False
    """True when the ledger still changed while the checker read its last snapshot (`SNAPSHOT_S`): its
    figures may then count work that landed between two of its reads."""


TERMINATE_BACKENDS = sa.text(
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE datname = current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'"
)
TERMINATE_ROUNDS = 5
"""`pg_terminate_backend` rounds, 0.2 s apart, so that some land in the middle of a transaction."""
SHORT_DUPLICATE_WINDOW_S = 1.0
DISK_FULL_S = 3.0
JETSTREAM_STORE_BYTES = 256 * 1024 * 1024
"""The size of the tmpfs each NATS server's JetStream store lives on (as root); the disk-full fault
fills the one of the server leading `TF_EVENTS`."""
NATS_REPLICAS = 3
"""`TF_NATS_STREAM_REPLICAS` of every service: each stream kept on all three servers."""
LEADER_DOWN_S = 3.0
"""How long the killed `TF_EVENTS` leader stays down (past the other two's election, about 2 s)."""
TERMINATED_ADVISORIES = f"$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED.{subjects.EVENTS_STREAM}.>"
POISON_SUBJECTS = (subjects.ALLOCATION_CREATED, subjects.ALLOCATION_RELEASED)


async def _quiet_error(error: Exception) -> None:
    """nats-py's error callback: the campaign expects NATS to be away at times."""


async def _nats(stack: FaultStack) -> NatsClient:
    return await nats.connect(
        stack.nats.urls,
        connect_timeout=2,
        allow_reconnect=False,
        error_cb=_quiet_error,
        name="tfpool-fault-campaign",
    )


async def terminate_backends(stack: FaultStack, chaos: Chaos) -> None:
    """`pg_terminate_backend` every service connection, five times over a second."""
    engine = create_async_engine(ledger_url(stack.postgres.url), poolclass=NullPool)
    try:
        for _ in range(TERMINATE_ROUNDS):
            async with engine.connect() as connection:
                chaos.backends_terminated += (await connection.execute(TERMINATE_BACKENDS)).scalar_one()
            await asyncio.sleep(0.2)
    finally:
        await engine.dispose()


async def republish_after_window(stack: FaultStack, chaos: Chaos) -> None:
    """Shrink the events stream's duplicate window to 1 s, wait past it, and publish the `allocation.created`
    of the last released allocation whose creation is among the last 500 events of its kind (a long-lived
    one's may be older) again with its original event id (stored again: past the window
    JetStream cannot know it), as a redelivery after its release; then restore the window. Consumers
    must stay idempotent: an agent that started that allocation again fails the views check."""
    outbox = tables.outbox.c
    engine = create_async_engine(ledger_url(stack.postgres.url), poolclass=NullPool)
    try:
        async with engine.connect() as connection:
            rows = (
                await connection.execute(
                    sa.select(tables.outbox)
                    .where(outbox.subject.in_(POISON_SUBJECTS), outbox.published_at.is_not(None))
                    .order_by(outbox.id.desc())
                    .limit(500)
                )
            ).all()
    finally:
        await engine.dispose()
    created_by_allocation = {
        row.payload.get("allocation_id"): row for row in rows if row.subject == subjects.ALLOCATION_CREATED
    }
    created = next(
        (
            created_by_allocation[row.payload.get("allocation_id")]
            for row in rows
            if row.subject == subjects.ALLOCATION_RELEASED
            and row.payload.get("allocation_id") in created_by_allocation
        ),
        None,
    )
    if created is None:
        return
    connection_ = await _nats(stack)
    try:
        js = connection_.jetstream()
        config = (await until_jetstream_answers(lambda: js.stream_info(subjects.EVENTS_STREAM))).config
        short = replace(config, duplicate_window=SHORT_DUPLICATE_WINDOW_S)
        await until_jetstream_answers(lambda: js.update_stream(short))
        try:
            await asyncio.sleep(SHORT_DUPLICATE_WINDOW_S * 2)
            headers = cloudevent_headers(
                event_id=str(created.event_id),
                event_type=created.event_type,
                source="fault-campaign",
                occurred_at=created.occurred_at,
            )
            ack = await until_jetstream_answers(
                lambda: js.publish(
                    created.subject,
                    json.dumps(created.payload).encode(),
                    headers={**created.headers, **headers},
                )
            )
            if not ack.duplicate:
                chaos.republished.append(ack.seq)
        finally:
            await until_jetstream_answers(lambda: js.update_stream(config))
    finally:
        await connection_.close()


async def publish_poison(stack: FaultStack, chaos: Chaos) -> None:
    """A malformed message on each subject the allocation consumers read; every consumer must end it
    (JetStream's `MSG_TERMINATED` advisory, counted), dead-letter it (counted) and go on with the next
    message. The poison dead letters are then discarded, as an operator would (`tfctl deadletters
    discard`): replayed, they would only be dead-lettered again."""
    connection_ = await _nats(stack)
    try:
        advisories = await connection_.subscribe(TERMINATED_ADVISORIES)
        js = connection_.jetstream()
        sent = {f"poison-{uuid4()}" for _ in POISON_SUBJECTS}
        for subject, message_id in zip(POISON_SUBJECTS, sorted(sent), strict=True):
            await until_jetstream_answers(
                partial(js.publish, subject, b"{not json", headers={"Nats-Msg-Id": message_id})
            )
            chaos.poison_published += 1
        deadline = time.monotonic() + 5.0
        while time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                await advisories.next_msg(timeout=max(deadline - time.monotonic(), 0.01))
                chaos.poison_terminated += 1
        for letter in await until_jetstream_answers(lambda: list_dead_letters(js)):
            if letter.event_id in sent and letter.reason == "poison":
                chaos.poison_dead_lettered += 1
                await until_jetstream_answers(partial(discard_dead_letter, js, letter.sequence))
    finally:
        await connection_.close()


def mount_jetstream_stores(store_dirs: list[Path]) -> str | None:
    """Mount a tmpfs of `JETSTREAM_STORE_BYTES` on each of `store_dirs` (so that one can be filled);
    None when done, else why not (not root, or a mount was refused, the others then unmounted)."""
    if os.geteuid() != 0:
        return "not root: the JetStream store cannot get a file system of its own to fill"
    mounted: list[Path] = []
    for store_dir in store_dirs:
        store_dir.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={JETSTREAM_STORE_BYTES}", "tmpfs", str(store_dir)],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            unmount_jetstream_stores(mounted)
            return f"mount -t tmpfs refused: {done.stderr.strip()}"
        mounted.append(store_dir)
    return None


def unmount_jetstream_stores(store_dirs: list[Path]) -> None:
    for store_dir in store_dirs:
        subprocess.run(["umount", "--lazy", str(store_dir)], check=False)


async def fill_disk(stack: FaultStack, chaos: Chaos) -> None:
    """Fill the JetStream store's file system of the server leading `TF_EVENTS` for `DISK_FULL_S`, free
    it, then restart that server (one that hit ENOSPC disables JetStream until it restarts, as an
    operator would do); the other two hold a quorum meanwhile."""
    leader = await _retried(lambda: stack.nats.leader_of(subjects.EVENTS_STREAM))
    server = stack.nats.by_name(leader) if leader is not None else stack.nats.servers[0]
    chaos.disk_full_servers.append(server.name)
    filler = server.store_dir / "disk-full.bin"
    await asyncio.to_thread(_fill, filler)
    try:
        await asyncio.sleep(DISK_FULL_S)  # the fault itself is the full disk, not a synchronisation
    finally:
        filler.unlink()
    await stack.nats.restart(server)
    await stack.nats.wait_ready()


def _fill(path: Path) -> None:
    chunk = b"\0" * (1024 * 1024)
    with path.open("wb", buffering=0) as sink, contextlib.suppress(OSError):
        while True:
            sink.write(chunk)


def fault_plan(stack: FaultStack, chaos: Chaos, consumer: StalledConsumer | None = None) -> list[Fault]:
    """Every fault once, in this order: SIGKILL each service, restart NATS (all three servers), SIGKILL
    the NATS server leading `TF_EVENTS` (down `LEADER_DOWN_S`, then back), restart Postgres, pause
    each service (SIGSTOP), `pg_terminate_backend`, a republish after the duplicate window, a poison
    message, (with `consumer`) a consumer stalled past `max_deliver`, then reconciled, (when the store
    could be mounted) a full JetStream disk (the `TF_EVENTS` leader's), (when the last node agent runs
    in its own network namespace) a partition and a slow link between it and everything, (when the
    scheduler runs in one and `tc` can cut a port) a partition between the scheduler and the three NATS
    servers alone, then between it and Postgres alone, then two pairs at once:
    SIGKILL the scheduler while backends are terminated, restart NATS while the planner is killed."""

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

    def partition_from(cell: NetworkCell, service: str, server: str, ports: list[int]) -> Fault:
        name = f"partition {service} from {server} {PAUSE_S:.0f}s"

        async def inject(_: FaultStack) -> None:
            dropped = await cell.partition_from(ports, PAUSE_S)
            chaos.partition_drops[name] = chaos.partition_drops.get(name, 0) + dropped

        return Fault(name, inject)

    async def slow_link(cell: NetworkCell) -> None:
        stats = await cell.slow_link(PAUSE_S)
        for name, count in asdict(stats).items():
            chaos.slow_link[name] = chaos.slow_link.get(name, 0) + count

    def with_chaos(name: str, action: Callable[[FaultStack, Chaos], Any]) -> Fault:
        async def inject(stack: FaultStack) -> None:
            await action(stack, chaos)

        return Fault(name, inject)

    plan = [kill(name) for name in stack.children]
    plan.append(Fault("restart nats", FaultStack.restart_nats))
    plan.append(with_chaos("nats leader killed", FaultStack.kill_nats_leader))
    plan.append(Fault("restart postgres", FaultStack.restart_postgres))
    plan += [pause(name) for name in stack.children]
    plan.append(with_chaos("pg_terminate_backend", terminate_backends))
    plan.append(with_chaos("republish after duplicate window", republish_after_window))
    plan.append(with_chaos("poison message", publish_poison))
    if consumer is not None:
        stalled = consumer
        plan.append(
            with_chaos("stalled consumer", lambda stack, chaos: stall_consumer(stack, chaos, stalled))
        )
    if "disk full" not in chaos.not_run:
        plan.append(with_chaos("disk full", fill_disk))
    cell = stack.cell
    if cell is not None:
        cut_off = stack.agents()[-1].name
        plan.append(Fault(f"partition {cut_off} {PAUSE_S:.0f}s", lambda _: cell.partition(PAUSE_S)))
        plan.append(Fault(f"slow-link {cut_off} {PAUSE_S:.0f}s", lambda _: slow_link(cell)))
    scheduler_cell = stack.scheduler_cell
    if scheduler_cell is not None:
        plan.append(partition_from(scheduler_cell, "scheduler", "nats", stack.nats.ports))
        plan.append(partition_from(scheduler_cell, "scheduler", "postgres", [stack.postgres.port]))
    plan.append(overlapping(kill("scheduler"), with_chaos("pg_terminate_backend", terminate_backends)))
    plan.append(overlapping(Fault("restart nats", FaultStack.restart_nats), kill("defrag-planner")))
    return plan


async def stall_consumer(stack: FaultStack, chaos: Chaos, consumer: StalledConsumer) -> None:
    """The campaign's consumer stalled past `max_deliver`, then its dead letters replayed."""
    connection_ = await _nats(stack)
    try:
        before = (consumer.dead_lettered, consumer.replayed)
        await consumer.stall(connection_.jetstream(timeout=5))
        chaos.stalled_dead_lettered += consumer.dead_lettered - before[0]
        chaos.stalled_replayed += consumer.replayed - before[1]
    finally:
        await connection_.close()


def overlapping(*faults: Fault) -> Fault:
    """The faults at once: `a + b`."""

    async def inject(stack: FaultStack) -> None:
        await asyncio.gather(*(fault.inject(stack) for fault in faults))

    return Fault(" + ".join(fault.name for fault in faults), inject)


@dataclass
class CampaignReport:
    """What a campaign did and found; `violations` maps each invariant to its failures (all empty:
    pass); `figures` holds the history checker's seven figures (`tfctl.history_check`)."""

    seed: int
    duration_s: float
    operations: dict[str, int]
    faults: list[str]
    self_exits: dict[str, int]
    self_exit_logs: dict[str, list[str]]
    converged_after_s: float | None
    violations: dict[str, list[str]]
    figures: dict[str, Any]
    chaos: dict[str, Any]
    state_dir: str

    @property
    def violation_count(self) -> int:
        return sum(len(found) for found in self.violations.values())

    def as_dict(self) -> dict[str, Any]:
        report = asdict(self)
        report["self_exits_by_service"] = report.pop("self_exits")
        figures = {key: value for key, value in self.figures.items() if key != "examples"}
        return {**report, **figures, "violation_count": self.violation_count}


async def _campaign(duration_s: float, seed: int, state_dir: Path) -> CampaignReport:
    chaos = Chaos()
    cluster = NatsCluster(state_dir / "nats")
    stores = [server.store_dir for server in cluster.servers]
    reason = await asyncio.to_thread(mount_jetstream_stores, stores)
    if reason is not None:
        chaos.not_run["disk full"] = reason
    cell = await asyncio.to_thread(NetworkCell.create, 0)
    if isinstance(cell, str):
        chaos.not_run["partition"] = chaos.not_run["slow-link"] = cell
    scheduler_cell = await asyncio.to_thread(NetworkCell.create, 1)
    if not isinstance(scheduler_cell, str):
        refused = await asyncio.to_thread(scheduler_cell.link_cut_refused)
        if refused is not None:
            await scheduler_cell.close()
            scheduler_cell = refused
    if isinstance(scheduler_cell, str):
        chaos.not_run["partition from nats"] = chaos.not_run["partition from postgres"] = scheduler_cell
    stack = FaultStack(
        state_dir=state_dir,
        nats=cluster,
        postgres=EmbeddedPostgres(data_dir=state_dir / "postgres", die_with_parent=True),
        cell=None if isinstance(cell, str) else cell,
        scheduler_cell=None if isinstance(scheduler_cell, str) else scheduler_cell,
    )
    try:
        await stack.start()
        log.info("stack ready in %s", state_dir)
        started_at = datetime.now(UTC)
        generator = Generator(stack.scheduler_url, random.Random(seed), stack.children["webhook"].child.url)
        stop_load, stop_supervisor, stop_consumer = asyncio.Event(), asyncio.Event(), asyncio.Event()
        supervisor = asyncio.create_task(stack.supervise(stop_supervisor))
        consumer, consumer_ready = StalledConsumer(), asyncio.Event()
        consuming = asyncio.create_task(consumer.run(stack.nats.url, stop_consumer, consumer_ready))
        await asyncio.wait_for(consumer_ready.wait(), SETTLE_TIMEOUT_S)
        load = asyncio.create_task(generator.run(stop_load))
        defrag = asyncio.create_task(_request_defrag(stack, stop_load, chaos))
        await _inject_faults(stack, duration_s, chaos, consumer)
        stop_load.set()
        await asyncio.gather(load, defrag)
        log.info("load stopped after %d operations; settling", len(generator.operations))
        await stack.wait_ready(SETTLE_TIMEOUT_S)
        stop_supervisor.set()
        await supervisor
        engine = create_async_engine(ledger_url(stack.postgres.url))
        try:
            converged_after_s, view_violations, views = await _converge(stack, engine)
            log.info("views converged: %s; checking the invariants", converged_after_s)
            violations, figures = await _check_everything(stack, engine, generator, started_at, chaos, views)
        finally:
            await engine.dispose()
        violations["views agree within 10 s"] = view_violations
        violations["dead letters reconciled, none lost"] = await _unreconciled(stack, consumer)
        chaos.events_replicas = await stack.nats.replicas_of(subjects.EVENTS_STREAM)
        stop_consumer.set()
        await consuming
        (state_dir / "operations.json").write_text(
            json.dumps([asdict(operation) for operation in generator.operations], default=str, indent=1)
        )
        return CampaignReport(
            seed=seed,
            duration_s=duration_s,
            operations=_count_operations(generator.operations),
            faults=chaos.injected,
            self_exits={
                name: managed.self_exits for name, managed in stack.children.items() if managed.self_exits
            },
            self_exit_logs={
                name: managed.exit_logs for name, managed in stack.children.items() if managed.exit_logs
            },
            converged_after_s=converged_after_s,
            violations=violations,
            figures=figures.as_dict(),
            chaos={
                key: value for key, value in asdict(chaos).items() if key not in ("injected", "republished")
            }
            | {"republished": len(chaos.republished)},
            state_dir=str(state_dir),
        )
    finally:
        await stack.stop()
        if reason is None:
            await asyncio.to_thread(unmount_jetstream_stores, stores)


async def _unreconciled(stack: FaultStack, consumer: StalledConsumer) -> list[str]:
    """The stalled consumer's dead letters left, and its subject's messages it never handled."""
    connection_ = await _nats(stack)
    try:
        js = connection_.jetstream(timeout=5)
        return await consumer.unreconciled(js, await read_stream_events(js, subjects.POD_ADMITTED))
    finally:
        await connection_.close()


async def _inject_faults(
    stack: FaultStack, duration_s: float, chaos: Chaos, consumer: StalledConsumer | None = None
) -> None:
    plan = fault_plan(stack, chaos, consumer)
    gap_s = max(duration_s / (len(plan) + 1), 0.5)
    deadline = time.monotonic() + duration_s
    index = 0
    while time.monotonic() < deadline or index < len(plan):
        await asyncio.sleep(min(gap_s, max(deadline - time.monotonic(), 0.5)))
        fault = plan[index % len(plan)]
        log.info("injecting %s", fault.name)
        await fault.inject(stack)
        chaos.injected.append(fault.name)
        index += 1
        await stack.wait_ready(SETTLE_TIMEOUT_S)


async def _request_defrag(stack: FaultStack, stop: asyncio.Event, chaos: Chaos) -> None:
    """Ask the defrag planner for a campaign on the default pool every `DEFRAG_EVERY_S` (on NATS, as
    `tfctl defrag run --now` does) while the load runs; a request NATS does not take is skipped."""
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=DEFRAG_EVERY_S)
            return
        try:
            connection_ = await _nats(stack)
        except (nats.errors.Error, OSError, TimeoutError):
            continue
        try:
            bus = NatsEventBus(connection_, connection_.jetstream(timeout=2.0), "fault-campaign")
            await bus.publish(
                StartDefragCampaign(
                    event_id=uuid4(),
                    occurred_at=datetime.now(UTC),
                    pool="default",
                    max_duration_ms=DEFRAG_WINDOW_MS,
                )
            )
            chaos.defrag_requests += 1
        except (nats.errors.Error, OSError, TimeoutError, UnroutableSubjectError):
            pass  # UnroutableSubjectError: the stream has no leader while the cluster elects one
        finally:
            with contextlib.suppress(nats.errors.Error):
                await connection_.close()


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


@dataclass
class Views:
    """The open allocations as the ledger, the scheduler and the node agents last saw them."""

    ledger: set[UUID] = field(default_factory=set)
    scheduler: set[UUID] = field(default_factory=set)
    agents: set[UUID] = field(default_factory=set)


async def _converge(stack: FaultStack, engine: AsyncEngine) -> tuple[float | None, list[str], Views]:
    started = time.monotonic()
    found: list[str] = []
    async with httpx.AsyncClient(timeout=2.0) as client:
        while True:
            views = Views(ledger=await _open_allocations(engine))
            complete = True
            with contextlib.suppress(httpx.HTTPError):
                answer = await client.get(f"{stack.scheduler_url}/api/v1/allocations")
                views.scheduler = {UUID(item["id"]) for item in answer.json()}
            for agent in stack.agents():
                try:
                    answer = await client.get(f"{agent.url}/api/v1/workers")
                    views.agents |= {UUID(worker["worker_uid"]) for worker in answer.json()["data"]}
                except httpx.HTTPError:
                    complete = False
            found = check_views_agree(views.ledger, views.scheduler, views.agents, complete)
            elapsed = time.monotonic() - started
            if not found:
                return round(elapsed, 2), [], views
            if elapsed > CONVERGENCE_S:
                return None, found, views
            await asyncio.sleep(0.25)


async def _check_everything(
    stack: FaultStack,
    engine: AsyncEngine,
    generator: Generator,
    started_at: datetime,
    chaos: Chaos,
    views: Views,
) -> tuple[dict[str, list[str]], HistoryFigures]:
    deadline = time.monotonic() + SNAPSHOT_S
    mark = await _history_mark(engine)
    while True:  # one snapshot: read again while pending work still lands meanwhile
        pending = await _pending_lineages(stack)
        history = await read_history(engine)
        gpus = await _gpus(engine)
        finals, allocated = await _finals(stack, engine, generator)
        bus, events = await _bus_events(stack, engine, frozenset(chaos.republished))
        bill, period = await _bill_violations(stack, engine, started_at - timedelta(minutes=1))
        marked, mark = mark, await _history_mark(engine)
        if mark == marked:
            break
        if time.monotonic() > deadline:
            log.warning("the ledger kept changing for %.0f s; checking the last snapshot", SNAPSHOT_S)
            chaos.unsettled_snapshot = True
            break
    violations = {
        "gpu over capacity": check_capacity(history, gpus),
        "pod with two active allocations": check_single_active(history),
        "submission outcome": check_submissions(generator.operations, finals, allocated),
        "bus exactly once": bus,
        "bill conserves": bill,
    }
    figures = history_figures(
        generator.operations,
        generator.submitted,
        history,
        events,
        pending,
        period or BillPeriod(started_at, started_at, BILL_QUANTUM, Decimal(0)),
        republished=frozenset(chaos.republished),
        final_states={workload: final.state for workload, final in finals.items()},
        self_exits=sum(managed.self_exits for managed in stack.children.values()),
        faults=chaos.injected,
    )
    if period is None:
        figures.count("lost", "the metrics service answered no bill")
    evicted = [event.evicted_by or "?" for event in events if event.subject == subjects.POD_EVICTED]
    chaos.evictions = {by: evicted.count(by) for by in sorted(set(evicted))}
    count_view_differences(figures, views.ledger, views.scheduler, views.agents)
    return violations, figures


async def _history_mark(engine: AsyncEngine) -> tuple[int, int | None]:
    """How many `allocation_history` rows there are and the newest id: unchanged means no allocation
    changed in between (the count sees a transaction that took a lower id but committed later)."""
    history = tables.allocation_history.c
    async with engine.connect() as connection:
        row = (await connection.execute(sa.select(sa.func.count(), sa.func.max(history.id)))).one()
    return int(row[0]), row[1]


async def _pending_lineages(stack: FaultStack) -> dict[tuple[str, str], str | None]:
    """The workloads the scheduler holds pending now, by namespace and name."""
    async with httpx.AsyncClient(timeout=5.0) as client:
        answer = await client.get(f"{stack.scheduler_url}/api/v1/workloads", params={"state": "pending"})
    answer.raise_for_status()
    return {(item["namespace"], item["name"]): item.get("reason") for item in answer.json()}


async def read_history(engine: AsyncEngine) -> list[HistoryRow]:
    """The ledger's whole `allocation_history` in id order, each row with its allocation's workload."""
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
            history.reason,
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
            reason=row.reason,
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


async def _bus_events(
    stack: FaultStack, engine: AsyncEngine, republished: frozenset[int]
) -> tuple[list[str], list[BusEvent]]:
    """The bus invariants' violations, and every stored message on the subjects the outbox wrote to
    (and `tf.evt.pod.evicted`), read back from the stream."""
    outbox = tables.outbox.c
    async with engine.connect() as connection:
        rows = (
            await connection.execute(sa.select(outbox.event_id, outbox.published_at, outbox.subject))
        ).all()
    published = {row.event_id: row.published_at for row in rows}
    connection_ = await nats.connect(stack.nats.urls)
    try:
        js = connection_.jetstream()
        events: list[BusEvent] = []
        for subject in sorted({row.subject for row in rows} | {subjects.POD_EVICTED}):
            events += await read_stream_events(js, subject)
        backlogs = await _consumer_backlogs(js)
    finally:
        await connection_.close()
    message_ids = [event.message_id for event in events if event.sequence not in republished]
    return check_bus(published, message_ids, backlogs), events


async def read_stream_events(js: Any, subject: str) -> list[BusEvent]:
    """Every message on `subject` stored in `TF_EVENTS` so far (new ones are not waited for)."""
    last = (await until_jetstream_answers(lambda: js.stream_info(subjects.EVENTS_STREAM))).state.last_seq
    subscription = await until_jetstream_answers(
        lambda: js.pull_subscribe(
            subject,
            durable=None,
            stream=subjects.EVENTS_STREAM,
            config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL),
        )
    )
    events: list[BusEvent] = []
    try:
        while True:
            try:
                batch = await until_jetstream_answers(lambda: subscription.fetch(batch=500, timeout=1.0))
            except TimeoutError:  # nats.errors.TimeoutError, or asyncio's when the deadline ran out first
                return events
            for message in batch:
                events.append(
                    BusEvent(
                        sequence=message.metadata.sequence.stream,
                        subject=message.subject,
                        message_id=(message.headers or {}).get("Nats-Msg-Id", ""),
                        allocation_id=_field_of(message.data, "allocation_id", UUID),
                        evicted_by=_field_of(message.data, "by", str),
                    )
                )
                if message.metadata.sequence.stream >= last:
                    return events
    finally:
        await subscription.unsubscribe()


def _field_of(payload: bytes, name: str, kind: Callable[[Any], T]) -> T | None:
    """`kind(payload[name])`, or None when the payload is not JSON or has no such field."""
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        value = json.loads(payload).get(name)
        return None if value is None else kind(value)
    return None


async def _consumer_backlogs(js: Any) -> dict[str, tuple[int, int]]:
    """Per consumer of allocation events: messages it should have had delivered but has not, and
    messages delivered but not acknowledged."""
    deadline = time.monotonic() + CONVERGENCE_S
    while True:
        backlogs: dict[str, tuple[int, int]] = {}
        for info in await until_jetstream_answers(lambda: js.consumers_info(subjects.EVENTS_STREAM)):
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


async def _bill_violations(
    stack: FaultStack, engine: AsyncEngine, start: datetime
) -> tuple[list[str], BillPeriod | None]:
    """The bill checked against the billing core over the history (`check_bill`), and the period and
    total the metrics service billed (None when it did not answer) for the independent oracle."""
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
        return [f"GET /api/v1/billing answered {answer.status_code}: {answer.text[:300]}"], None
    billed = answer.json()
    billed_hours = {group["key"]: group["gpuHours"] for group in billed["groups"]}
    period = BillPeriod(start, end, BILL_QUANTUM, Decimal(billed["cost"]))
    return check_bill(str(expected.cost), billed["cost"], seconds, billed_hours), period


def run_fault_campaign(duration_s: float, seed: int, state_dir: Path | None = None) -> dict[str, Any]:
    """Run one campaign of about `duration_s` seconds of load and faults (every fault at least once)
    on a fresh local stack and return its report: `operations`, `faults`, `violations` (each
    invariant's failures; all empty means nothing was lost), `violation_count`, `converged_after_s`.

    The stack lives in `state_dir` (a new temporary folder if None, removed afterwards when the
    campaign did not fail (`campaign_failed`), kept for its logs otherwise).
    """
    own_folder = state_dir is None
    folder = Path(tempfile.mkdtemp(prefix="tfpool-faults-")) if state_dir is None else state_dir
    report = asyncio.run(_campaign(duration_s, seed, folder / "state"))
    result = report.as_dict()
    if own_folder and not campaign_failed(result):
        shutil.rmtree(folder, ignore_errors=True)
    return result


FAILING_FIGURES = ("lost", "doubled", "phantom", "bill_difference", "self_exits")
"""The history checker's figures that fail a campaign when not 0."""


def campaign_failed(report: dict[str, Any]) -> bool:
    """An invariant was violated, or one of `FAILING_FIGURES` is not 0."""
    return bool(report["violation_count"]) or any(Decimal(str(report[key])) for key in FAILING_FIGURES)


def print_report(report: dict[str, Any], json_output: bool) -> None:
    """The report as one JSON document, or a short human summary."""
    if json_output:
        print(json.dumps(report, default=str), flush=True)
        return
    operations = report["operations"]
    outcomes = ", ".join(f"{kind} {count}" for kind, count in operations.items() if kind != "total")
    print(f"operations: {operations['total']} ({outcomes})")
    print(f"faults injected: {len(report['faults'])} ({', '.join(report['faults'])})")
    exits = report["self_exits_by_service"]
    print(f"services that exited on their own and were restarted: {exits or 'none'}")
    for name, logs in report.get("self_exit_logs", {}).items():
        for exit_log in logs:
            print(f"{name}: {exit_log}")
    print(f"converged after: {report['converged_after_s']} s")
    print(f"violations: {report['violation_count']}")
    print(
        "history: "
        + ", ".join(f"{key} {report[key]}" for key in HISTORY_FIGURES)
        + f"; fault kinds: {', '.join(report['fault_kinds'])}"
    )
    print(f"evictions: {report['evictions']} (preemptions {report['preemptions']})")
    print(f"chaos: {json.dumps(report['chaos'])}")
    for figure_name, examples in report["figures"]["examples"].items():
        for example in examples:
            print(f"  {figure_name}: {example}")
    for invariant, found in report["violations"].items():
        for violation in found[:10]:
            print(f"  {invariant}: {violation}")
    sys.stdout.flush()
