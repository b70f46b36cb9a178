"""The node agent's command handler: `StartWorker`, `StopWorker` and `DiscoverGpus` addressed to this node.

Read from the agent's durable consumer `node-agent-run-commands-<node>` by the shared consumer loop, which
terminates malformed messages. Workers run through the same `WorkerRunner` as `POST /api/v1/workers`;
one started by a command logs its output and, when it ends, asks the scheduler to release its allocation
(`ReleaseAllocation`). The agent holds no database credential: it reads the allocation a start names from
the scheduler (`tfagent.scheduler_ledger`); no scheduler answering is a `TransientError`, so the command
is retried with the consumer's backoff. Every handler is idempotent under redelivery: a start for an
allocation whose worker runs or ran starts nothing, a stop for a worker that ended does nothing. Whether
a start may happen is decided by `tfagent.core.commands`.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from uuid import UUID

from tfcommon.consumer import TransientError
from tfcommon.events import DiscoverGpus, Message, StartWorker, StopWorker

from tfagent.agent import NodeAgent
from tfagent.core.commands import LedgerAllocation, start_refusal
from tfagent.scheduler_ledger import LedgerUnavailableError, SchedulerLedger
from tfagent.workers import Release, RunWorkerRequest, WorkerLaunchError, WorkerRunner

log = logging.getLogger("tfagent.commands")


class NodeCommands:
    """Handles the commands of one node's agent (`handle` is the pull consumer's handler)."""

    def __init__(self, node: str, agent: NodeAgent, runner: WorkerRunner, ledger: SchedulerLedger) -> None:
        self.node = node
        self._agent = agent
        self._runner = runner
        self._ledger = ledger

    async def handle(self, message: Message) -> Sequence[Message]:
        if isinstance(message, StartWorker):
            await self.start_worker(message)
        elif isinstance(message, StopWorker):
            self.stop_worker(message)
        elif isinstance(message, DiscoverGpus):
            change = await self._agent.reregister()
            log.info(
                "rediscovered GPUs on command %s: %d present, %d appeared, %d missing, %d removed",
                message.event_id,
                len(change.inventory.gpus),
                len(change.appeared),
                len(change.went_missing),
                len(change.removed),
                extra={"event": "command.discover-gpus", "outcome": "done"},
            )
        return ()

    async def start_worker(self, command: StartWorker) -> None:
        allocation_id = command.allocation_id
        if self._runner.worker(allocation_id) is not None:
            self._refused(
                command,
                f"a worker for allocation {allocation_id} already runs here",
                "duplicate",
                logging.INFO,
            )
            return
        if self._agent.inventory is None:
            raise TransientError("this node's GPUs are not discovered yet; the command is retried")
        try:
            record = await self._ledger.allocation(allocation_id)
        except LedgerUnavailableError as error:
            raise TransientError(f"cannot read allocation {allocation_id}: {error}") from error
        allocation = (
            None
            if record is None
            else LedgerAllocation(
                allocation_id,
                record.state,
                record.node,
                tuple(share.gpu_uuid for share in record.shares),
            )
        )
        refusal = start_refusal(allocation_id, command.gpu_uuids, allocation, self.node)
        if refusal is not None:
            self._refused(command, refusal, "refused")
            return
        request = RunWorkerRequest(
            allocation_id=allocation_id,
            gpu_uuids=command.gpu_uuids,
            argv=command.argv,
            env=command.env,
            working_dir=command.working_dir,
            tflops_limit_milli=command.tflops_limit_milli,
            vram_limit_bytes=command.vram_limit_bytes,
            isolation=command.isolation,
        )
        try:
            await self._runner.start(request, release=self._release(allocation_id, command), log_output=True)
        except ValueError as error:
            self._refused(command, str(error), "refused")
        except WorkerLaunchError as error:
            self._refused(command, f"{error}; its allocation is released", "launch-failed")

    def stop_worker(self, command: StopWorker) -> None:
        worker = self._runner.worker(command.allocation_id)
        if worker is None or worker.ended.is_set():
            log.info(
                "no running worker for allocation %s on node %s; nothing to stop",
                command.allocation_id,
                self.node,
                extra={"event": "command.stop-worker", "outcome": "not-running"},
            )
            return
        self._runner.stop_in_background(
            worker, command.reason, signal_number=command.signal, grace_s=command.grace_ms / 1000
        )

    def _release(self, allocation_id: UUID, command: StartWorker) -> Release:
        async def release(reason: str) -> bool:
            return await self.release_in_ledger(allocation_id, reason, command.event_id)

        return release

    async def release_in_ledger(self, allocation_id: UUID, reason: str, cause: UUID | None = None) -> bool:
        """Ask the scheduler to close a bus-started worker's allocation in the ledger (`ReleaseAllocation`
        through JetStream, kept while no scheduler runs); True once the request is stored."""
        return await self._ledger.release(allocation_id, reason, cause)

    def _refused(self, command: StartWorker, reason: str, outcome: str, level: int = logging.ERROR) -> None:
        log.log(
            level,
            "start-worker %s not run: %s",
            command.event_id,
            reason,
            extra={"event": "command.start-worker", "outcome": outcome},
        )
