"""`tfctl run` workers on this node: start the command with its GPUs, stream its output, release at the end.

`POST /api/v1/workers` starts a command for an allocation the scheduler placed here and answers with a
stream of NDJSON frames (`started`, `output` with base64 data, `exited`) for as long as it runs.
`POST /api/v1/workers/{id}/signal` forwards a signal to the command's process group. When the command
ends, or the streaming connection drops (tfctl was killed: the agent stops the command, SIGTERM then
SIGKILL after the grace period), the agent releases the allocation through the scheduler's API. Both
endpoints need `Authorization: Bearer <TF_API_TOKEN>`.

A worker's environment is the caller's (`env`: the user's shell, as `tfctl run` sends it) plus what its
grant sets; nothing of the agent's own environment (its token, its NATS password) reaches it. When the
agent stops, it stops its workers (SIGTERM, SIGKILL after the grace period) and releases them; each
running worker is written in a journal (`tfagent.adapters.worker_journal`), so what an agent that died
left behind is stopped and released when it starts again (`WorkerRunner.recover`). Decisions on the
environment live in `tfagent.core.worker_env`; this module only runs processes and talks HTTP.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import logging
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import httpx
from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, SecretStr
from tfcommon.events import AllocationReleased, IsolationMode
from tfcommon.infra import die_with_parent

from tfagent.adapters.worker_journal import JournalEntry, WorkerJournal, process_start_time
from tfagent.auth import RefusingRoute, bearer_token
from tfagent.core.worker_env import WorkerLimits, worker_env

log = logging.getLogger(__name__)

OUTPUT_CHUNK_BYTES = 64 * 1024
BUFFERED_FRAMES = 256
EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND = 126, 127
RELEASE_ATTEMPTS = 5
RELEASE_FIRST_RETRY_S = 0.5
RECOVERY_RETRY_MAX_S = 5.0
STOPPING_GRACE_MAX_S = 10.0
NDJSON = "application/x-ndjson"

Release = Callable[[str], Awaitable[bool]]
"""Closes a worker's allocation once the worker has ended; given the reason, in words. True once the
allocation is closed (or was already), False when it could not be released now."""

LedgerRelease = Callable[[UUID, str], Awaitable[bool]]
"""Closes an allocation in the ledger through the scheduler (for workers started by a bus command);
True once the release is asked for (stored in the commands stream)."""


class RunWorkerRequest(BaseModel):
    """What `tfctl run` asks the agent to start: the placed allocation, its GPUs, limits and command."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    allocation_id: UUID = Field(description="the ledger allocation (the id POST /api/v1/workloads returned)")
    gpu_uuids: tuple[str, ...] = Field(min_length=1, description="the allocated GPUs, in order")
    argv: tuple[str, ...] = Field(min_length=1, description="the command and its arguments")
    env: dict[str, str] = Field(default_factory=dict, description="extra environment variables")
    working_dir: str | None = Field(default=None, description="working directory; the agent's if unset")
    tflops_limit_milli: int = Field(default=0, ge=0, description="compute limit per GPU, TFLOPS x 1000")
    vram_limit_bytes: int = Field(default=0, ge=0, description="VRAM limit per GPU")
    isolation: IsolationMode = Field(default="soft", description="shared, soft or hard")
    scheduler_url: str | None = Field(
        default=None, description="scheduler API base URL the agent releases the allocation through"
    )
    grace_s: float = Field(default=10.0, ge=0, le=600, description="SIGTERM to SIGKILL wait when stopping")


class SignalRequest(BaseModel):
    """A signal to forward to a worker's process group (e.g. 2 for SIGINT, 15 for SIGTERM)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    signal: int = Field(ge=1, le=64, description="POSIX signal number")


class WorkerLaunchError(Exception):
    """The command could not be started; `exit_code` is the shell's (126 not executable, 127 not found)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass
class Worker:
    """One running (or just ended) `tfctl run` command and the frames not yet streamed to tfctl."""

    request: RunWorkerRequest
    process: asyncio.subprocess.Process
    started_at: datetime
    env: Mapping[str, str]
    frames: asyncio.Queue[bytes] = field(default_factory=lambda: asyncio.Queue(BUFFERED_FRAMES))
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    exit_code: int | None = None
    stop_reason: str | None = None
    detached: bool = False
    final_frame: bytes | None = None
    release: Release | None = None
    log_output: bool = False

    async def emit(self, frame: bytes) -> None:
        """Queue a frame for tfctl; a slow reader slows the command down (its pipe fills), a gone one
        gets nothing."""
        if not self.detached:
            await self.frames.put(frame)

    def detach(self) -> None:
        """Nobody reads the frames any more: drop what is queued and unblock a waiting writer."""
        self.detached = True
        while not self.frames.empty():
            self.frames.get_nowait()

    @property
    def pid(self) -> int:
        return self.process.pid

    def describe(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "argv": list(self.request.argv),
            "started_at": self.started_at.isoformat(),
            "running": not self.ended.is_set(),
            "exit_code": self.exit_code,
            "visible_devices": self.env.get("CUDA_VISIBLE_DEVICES"),
            "limits": {name: value for name, value in self.env.items() if name != "CUDA_VISIBLE_DEVICES"},
        }


def _frame(**fields: Any) -> bytes:
    return (json.dumps(fields, separators=(",", ":")) + "\n").encode()


def exit_code_of(returncode: int) -> int:
    """The shell's convention: a command killed by signal N exits 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


class WorkerRunner:
    """Starts and supervises this node's `tfctl run` workers; releases each allocation once it ends.

    `capacity_milli` gives each local GPU's TFLOPS capacity (for the compute-percent limit);
    `on_started` / `on_ended` tell the process-owner registry which pid belongs to which allocation.
    """

    def __init__(
        self,
        node: str,
        api_token: SecretStr | None,
        capacity_milli: Callable[[], Mapping[str, int]],
        *,
        limiter_library: str | None = None,
        on_started: Callable[[int, UUID], None] | None = None,
        on_ended: Callable[[int], None] | None = None,
        journal: WorkerJournal | None = None,
    ) -> None:
        self.node = node
        self._journal = journal
        self._api_token = api_token
        self._capacity_milli = capacity_milli
        self._limiter_library = limiter_library
        self._on_started = on_started
        self._on_ended = on_ended
        self._workers: dict[UUID, Worker] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def worker(self, allocation_id: UUID) -> Worker | None:
        return self._workers.get(allocation_id)

    def workers(self) -> tuple[Worker, ...]:
        return tuple(self._workers.values())

    def describe(self, allocation_id: UUID) -> dict[str, Any] | None:
        """The worker process of `allocation_id` for the hypervisor API, None when none runs here."""
        worker = self._workers.get(allocation_id)
        return None if worker is None else worker.describe()

    async def start(
        self, request: RunWorkerRequest, *, release: Release | None = None, log_output: bool = False
    ) -> Worker:
        """Start the command of `request`. By default its output streams to the HTTP caller and the
        allocation is released through `request.scheduler_url`; a worker started by a bus command
        passes its own `release` and `log_output=True` (nobody streams it, so its output is logged)."""
        unknown = [uuid for uuid in request.gpu_uuids if uuid.lower() not in self._capacity_milli()]
        if unknown:
            raise ValueError(
                f"gpu_uuids: {', '.join(unknown)} not on node {self.node}; GET /api/v1/devices lists its GPUs"
            )
        if request.allocation_id in self._workers:
            raise FileExistsError(f"a worker for allocation {request.allocation_id} already runs here")
        limits = WorkerLimits(
            gpu_uuids=tuple(uuid.lower() for uuid in request.gpu_uuids),
            isolation=request.isolation,
            vram_limit_bytes=request.vram_limit_bytes,
            tflops_limit_milli=request.tflops_limit_milli,
        )
        granted = worker_env(limits, self._capacity_milli(), self._limiter_library)
        environment = {**request.env, **granted}
        try:
            process = await asyncio.create_subprocess_exec(
                *request.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=environment,
                cwd=request.working_dir,
                start_new_session=True,
                preexec_fn=die_with_parent(signal.SIGTERM),
            )
        except FileNotFoundError as error:
            self._in_background(self._release(request) if release is None else release("command not found"))
            missing = request.argv[0] if error.filename in (None, request.argv[0]) else error.filename
            raise WorkerLaunchError(
                f"{missing}: command or working directory not found", EXIT_NOT_FOUND
            ) from None
        except (PermissionError, OSError) as error:
            self._in_background(
                self._release(request) if release is None else release("command not runnable")
            )
            raise WorkerLaunchError(
                f"{request.argv[0]}: cannot run: {error.strerror}", EXIT_NOT_EXECUTABLE
            ) from None
        worker = Worker(request, process, datetime.now(UTC), granted, release=release, log_output=log_output)
        self._workers[request.allocation_id] = worker
        if self._journal is not None:
            self._journal.record(
                JournalEntry(
                    allocation_id=request.allocation_id,
                    pid=process.pid,
                    process_started=process_start_time(process.pid),
                    argv0=request.argv[0],
                    scheduler_url=request.scheduler_url if release is None else None,
                    grace_s=request.grace_s,
                )
            )
        if self._on_started is not None:
            self._on_started(process.pid, request.allocation_id)
        worker.frames.put_nowait(
            _frame(
                event="started",
                allocation_id=str(request.allocation_id),
                node=self.node,
                pid=process.pid,
                env=granted,
            )
        )
        if log_output:
            worker.detach()
        self._in_background(self._supervise(worker))
        log.info("worker %s started: pid %d, %s", request.allocation_id, process.pid, request.argv[0])
        return worker

    def stop_if_released(self, message: object) -> None:
        """Stop the worker of an allocation closed elsewhere (deleted, evicted): its GPUs are not its own."""
        if isinstance(message, AllocationReleased) and (worker := self._workers.get(message.allocation_id)):
            self.stop_in_background(worker, f"its allocation was released ({message.reason})")

    def send_signal(self, worker: Worker, signal_number: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(worker.pid, signal_number)

    def stop_in_background(
        self,
        worker: Worker,
        reason: str,
        *,
        signal_number: int = signal.SIGTERM,
        grace_s: float | None = None,
    ) -> None:
        """Stop `worker` (`signal_number`, then SIGKILL after the grace period) without waiting for it."""
        if not worker.ended.is_set():
            self._in_background(self.stop(worker, reason, signal_number=signal_number, grace_s=grace_s))

    async def stop(
        self,
        worker: Worker,
        reason: str,
        *,
        signal_number: int = signal.SIGTERM,
        grace_s: float | None = None,
    ) -> None:
        """Send `signal_number` (SIGTERM), then SIGKILL after `grace_s` (the request's grace period)."""
        if worker.ended.is_set():
            return
        worker.stop_reason = worker.stop_reason or reason
        log.info("stopping worker %s: %s", worker.request.allocation_id, reason)
        self.send_signal(worker, signal_number)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                worker.ended.wait(), timeout=worker.request.grace_s if grace_s is None else grace_s
            )
            return
        self.send_signal(worker, signal.SIGKILL)
        await worker.ended.wait()

    async def close(self) -> None:
        """Stop every worker (the agent is shutting down: SIGTERM, SIGKILL after its grace period, at most
        `STOPPING_GRACE_MAX_S`) and wait until their allocations are released. Called as soon as the agent
        begins to stop, before the HTTP server waits for the workers' streams to end."""
        await asyncio.gather(
            *(
                self.stop(
                    worker,
                    "the node agent is stopping",
                    grace_s=min(worker.request.grace_s, STOPPING_GRACE_MAX_S),
                )
                for worker in self.workers()
            )
        )
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def recover(self, release_in_ledger: LedgerRelease, stopping: asyncio.Event) -> int:
        """Stop and release what a previous agent left in the journal (it died, or the scheduler was gone
        when it released). Retries a release that fails until it succeeds or the agent stops; returns how
        many allocations were released."""
        if self._journal is None:
            return 0
        entries = self._journal.entries()
        if entries:
            log.warning(
                "%d worker(s) left by the previous agent run; stopping them and releasing their allocations",
                len(entries),
                extra={"event": "agent.worker_recovery", "outcome": "started"},
            )
        released = await asyncio.gather(
            *(self._recover_one(entry, release_in_ledger, stopping) for entry in entries)
        )
        return sum(released)

    async def _recover_one(
        self, entry: JournalEntry, release_in_ledger: LedgerRelease, stopping: asyncio.Event
    ) -> bool:
        await _stop_left_over(entry)
        reason = "worker gone: the node agent stopped before it ended"
        delay = RELEASE_FIRST_RETRY_S
        while not stopping.is_set():
            if entry.scheduler_url is None:
                done = await release_in_ledger(entry.allocation_id, reason)
            else:
                done = await self._release_through(entry.scheduler_url, entry.allocation_id, attempts=1)
            if done:
                self._journal_forget(entry.allocation_id)
                log.info(
                    "released allocation %s of %s, left by the previous agent run",
                    entry.allocation_id,
                    entry.argv0,
                    extra={"event": "agent.worker_recovery", "outcome": "released"},
                )
                return True
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), timeout=delay)
            delay = min(delay * 2, RECOVERY_RETRY_MAX_S)
        return False

    def _journal_forget(self, allocation_id: UUID) -> None:
        if self._journal is not None:
            self._journal.forget(allocation_id)

    def _in_background(self, work: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _supervise(self, worker: Worker) -> None:
        process = worker.process
        assert process.stdout is not None
        assert process.stderr is not None
        pumps = asyncio.gather(
            self._pump(worker, "stdout", process.stdout), self._pump(worker, "stderr", process.stderr)
        )
        await _until_exited(process)
        # Children that outlived the command (and may hold its pipes open) go with it.
        self.send_signal(worker, signal.SIGKILL)
        await pumps
        returncode = await process.wait()
        worker.exit_code = exit_code_of(returncode)
        worker.final_frame = _frame(
            event="exited",
            exit_code=worker.exit_code,
            signal=-returncode if returncode < 0 else None,
            reason=worker.stop_reason,
        )
        await worker.emit(worker.final_frame)
        worker.ended.set()
        if self._on_ended is not None:
            self._on_ended(process.pid)
        log.info("worker %s ended with exit code %d", worker.request.allocation_id, worker.exit_code)
        try:
            if worker.release is None:
                released = await self._release(worker.request)
            elif worker.stop_reason:
                released = await worker.release(f"worker stopped: {worker.stop_reason}")
            else:
                released = await worker.release(f"worker exited with code {worker.exit_code}")
            if released:
                self._journal_forget(worker.request.allocation_id)
        finally:
            self._workers.pop(worker.request.allocation_id, None)

    @staticmethod
    async def _pump(worker: Worker, stream: str, reader: asyncio.StreamReader) -> None:
        while chunk := await reader.read(OUTPUT_CHUNK_BYTES):
            if worker.log_output:
                log.info(
                    "worker %s %s: %s",
                    worker.request.allocation_id,
                    stream,
                    chunk.decode(errors="replace").rstrip("\n"),
                    extra={"event": "worker.output", "allocation_id": str(worker.request.allocation_id)},
                )
            await worker.emit(_frame(event="output", stream=stream, data=base64.b64encode(chunk).decode()))

    async def _release(self, request: RunWorkerRequest) -> bool:
        if request.scheduler_url is None:
            log.warning("worker %s ended; no scheduler_url to release it through", request.allocation_id)
            return True
        return await self._release_through(request.scheduler_url, request.allocation_id, RELEASE_ATTEMPTS)

    async def _release_through(self, scheduler_url: str, allocation_id: UUID, attempts: int) -> bool:
        """`DELETE /api/v1/workloads/{id}` on the scheduler with this agent's token; True once released
        (200) or already gone (404)."""
        url = f"{scheduler_url.rstrip('/')}/api/v1/workloads/{allocation_id}"
        headers = (
            {}
            if self._api_token is None
            else {"Authorization": f"Bearer {self._api_token.get_secret_value()}"}
        )
        delay = RELEASE_FIRST_RETRY_S
        async with httpx.AsyncClient(timeout=10.0) as client:
            for attempt in range(1, attempts + 1):
                try:
                    answer = await client.delete(url, headers=headers)
                except httpx.HTTPError as error:
                    problem = f"{type(error).__name__}: {error}"
                else:
                    if answer.status_code in (200, 404):
                        return True
                    problem = f"HTTP {answer.status_code}: {answer.text[:200]}"
                log.warning("releasing %s failed (attempt %d): %s", allocation_id, attempt, problem)
                if attempt < attempts:
                    await asyncio.sleep(delay)
                    delay *= 2
        if attempts > 1:
            log.error(
                "allocation %s not released now; the agent releases it when it next starts, or run: "
                "tfctl delete workload %s",
                allocation_id,
                allocation_id,
            )
        return False


async def _stop_left_over(entry: JournalEntry) -> None:
    """SIGTERM the process group of a journal entry whose process still runs (the same pid and start
    time), SIGKILL after its grace period."""
    if entry.process_started is None or process_start_time(entry.pid) != entry.process_started:
        return
    log.warning(
        "stopping %s (pid %d), a worker left by the previous agent run",
        entry.argv0,
        entry.pid,
        extra={"event": "agent.worker_recovery", "outcome": "stopping"},
    )
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(entry.pid, signal.SIGTERM)
    deadline = asyncio.get_running_loop().time() + min(entry.grace_s, STOPPING_GRACE_MAX_S)
    while process_start_time(entry.pid) == entry.process_started:
        if asyncio.get_running_loop().time() >= deadline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(entry.pid, signal.SIGKILL)
            return
        await asyncio.sleep(0.05)


async def _until_exited(process: asyncio.subprocess.Process) -> None:
    """Return once the command itself has exited, even while its children keep its pipes open (which
    `Process.wait()` waits for). Uses a pidfd; without one, falls back to `Process.wait()`."""
    try:
        pidfd = os.pidfd_open(process.pid)
    except ProcessLookupError:
        return
    except OSError:
        await process.wait()
        return
    loop = asyncio.get_running_loop()
    exited: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not exited.done():
            exited.set_result(None)

    loop.add_reader(pidfd, wake)
    try:
        await exited
    finally:
        loop.remove_reader(pidfd)
        os.close(pidfd)


def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


def build_workers_router(runner: WorkerRunner, api_token: SecretStr | None) -> APIRouter:
    """`POST /api/v1/workers` (start and stream) and `POST /api/v1/workers/{id}/signal` (token needed).

    The token is a router dependency, checked before the path and body are validated: a request without
    it gets 401 whatever its body (only a body that is not JSON at all is refused earlier, with 422).
    """

    require_token = bearer_token(
        api_token,
        disabled="workers are disabled: set TF_API_TOKEN on the agent and send it as a bearer token",
    )

    router = APIRouter(
        prefix="/api/v1",
        tags=["workers"],
        dependencies=[Depends(require_token)],
        route_class=RefusingRoute,
    )

    @router.post("/workers", response_model=None)
    async def run_worker(request: RunWorkerRequest) -> StreamingResponse | JSONResponse:
        try:
            worker = await runner.start(request)
        except ValueError as error:
            return _error(422, str(error))
        except FileExistsError as error:
            return _error(409, str(error))
        except WorkerLaunchError as error:
            return _error(422, str(error), exit_code=error.exit_code)
        return StreamingResponse(_stream(runner, worker), media_type=NDJSON)

    @router.post("/workers/{worker_id}/signal", response_model=None)
    async def signal_worker(worker_id: UUID, body: SignalRequest) -> dict[str, Any] | JSONResponse:
        worker = runner.worker(worker_id)
        if worker is None or worker.ended.is_set():
            return _error(404, f"no running worker {worker_id} on node {runner.node}; GET /api/v1/workers")
        runner.send_signal(worker, body.signal)
        return {"data": {"worker_uid": str(worker_id), "pid": worker.pid, "signal": body.signal}}

    return router


async def _stream(runner: WorkerRunner, worker: Worker) -> AsyncIterator[bytes]:
    delivered = False
    try:
        while True:
            frame = await worker.frames.get()
            yield frame
            if frame is worker.final_frame:
                delivered = True
                return
    finally:
        if not delivered:
            # The connection dropped before the command ended: tfctl is gone, so the command goes too.
            worker.detach()
            runner.stop_in_background(worker, "the tfctl run connection dropped")
