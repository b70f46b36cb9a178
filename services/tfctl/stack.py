"""The local stack behind `tfctl up`: infrastructure, migrations, five services, one agent per node.

Order of start: embedded NATS and Postgres (only when `TF_NATS_URL` / `TF_DATABASE_URL` are unset),
`alembic upgrade head`, then every service as a `tfctl serve` child process (in parallel, each in its
own process group, output to `<state dir>/logs/<name>.log`), then wait for every `/readyz`. Every child
inherits the environment and runs with one API token: `TF_API_TOKEN` when set, else the one in
`<state dir>/api-token` (generated on first start, mode 0600; every `tfctl` command reads it). The
defrag planner also gets the scheduler's URL; each node agent journals its workers in `<state dir>/agent`
and gets no `TF_DATABASE_URL` (it asks the scheduler over NATS for what it needs from the ledger).
Order of stop (Ctrl-C, SIGTERM, or a child that exits on its own): the node agents first (they stop
their `tfctl run` workers and release them while the scheduler still answers), then SIGTERM to every
other service's process group so it drains, SIGKILL to whatever is left after a timeout, then NATS,
then Postgres. A child that
exits while the stack runs is reported (name, exit code, last log lines) and makes `tfctl up` exit 1.
If `tfctl up` itself dies without stopping them (SIGKILL, a crash), every child still stops: each is
started from the main thread with a parent-death signal (SIGTERM; SIGINT, fast shutdown, for Postgres).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import signal
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
from tfcommon.gpu_models import GPU_MODELS_BY_NAME
from tfcommon.infra import EmbeddedNats, EmbeddedPostgres, InfrastructureError, die_with_parent, free_port
from tfcommon.ledger.migrate import upgrade_head
from tfcommon.ledger.urls import ledger_url
from tfcommon.tls import ensure_self_signed

from tfctl.local_state import TokenSource, ensure_api_token, token_path

DEFAULT_NODES = ("H100:4", "A100-80G:4")
MAX_GPUS_PER_MODEL = 64
DEFAULT_PORTS = {"webhook": 9443, "scheduler": 8080, "defrag-planner": 8070, "metrics": 8090}
FIRST_AGENT_PORT = 8001
LOG_TAIL_LINES = 20
READY_POLL_S = 0.2
ENDPOINTS_FILE = "endpoints.json"


class StackError(RuntimeError):
    """`tfctl up` cannot go on; the message says what failed and where its log is."""


def parse_fake_gpus(value: str) -> str:
    """Check one node's `MODEL:N[,MODEL:N]` and return it normalised; the error names the bad part."""
    parts = [part.strip() for part in value.split(",")]
    known = ", ".join(GPU_MODELS_BY_NAME)
    for part in parts:
        model, separator, count = part.partition(":")
        if not separator or not model or not count:
            raise ValueError(f"--fake-gpus {value!r}: {part!r} is not MODEL:N (e.g. H100:4)")
        if model not in GPU_MODELS_BY_NAME:
            raise ValueError(f"--fake-gpus {value!r}: unknown GPU model {model!r}; known models: {known}")
        if not count.isdigit() or not 1 <= int(count) <= MAX_GPUS_PER_MODEL:
            raise ValueError(
                f"--fake-gpus {value!r}: count {count!r} for {model} must be a whole number "
                f"from 1 to {MAX_GPUS_PER_MODEL}"
            )
    return ",".join(parts)


@dataclass(frozen=True)
class StackOptions:
    """What `tfctl up` was asked for. Each entry of `nodes` is one simulated node's `MODEL:N[,...]`."""

    state_dir: Path
    nodes: Sequence[str] = DEFAULT_NODES
    auto_ports: bool = False
    host: str = "127.0.0.1"
    json_output: bool = False
    ready_timeout_s: float = 60.0
    stop_timeout_s: float = 15.0


@dataclass
class Child:
    """One `tfctl serve` child process and where it listens."""

    name: str
    service: str
    url: str
    argv: list[str]
    log_path: Path
    node: str | None = None
    environment: dict[str, str] = field(default_factory=dict)
    process: asyncio.subprocess.Process | None = field(default=None, repr=False)
    exited: asyncio.Task[int] | None = field(default=None, repr=False)

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"


def plan_children(options: StackOptions) -> list[Child]:
    """The service children to start, with their ports (free ones with `auto_ports`) and arguments."""
    logs = options.state_dir / "logs"
    children: list[Child] = []

    def add(name: str, service: str, port: int, *extra: str, node: str | None = None) -> None:
        scheme = "https" if service == "webhook" else "http"
        argv = [sys.executable, "-m", "tfctl.main", "serve", service, "--port", str(port)]
        argv += ["--host", options.host, "--state-dir", str(options.state_dir), *extra]
        url = f"{scheme}://{options.host}:{port}"
        children.append(Child(name, service, url, argv, logs / f"{name}.log", node=node))

    for service, port in DEFAULT_PORTS.items():
        add(service, service, free_port(options.host) if options.auto_ports else port)
    for index, gpus in enumerate(options.nodes, start=1):
        node = f"sim-node-{index}"
        port = free_port(options.host) if options.auto_ports else FIRST_AGENT_PORT + index - 1
        add(f"node-agent-{node}", "node-agent", port, "--node-name", node, "--fake-gpus", gpus, node=node)
    scheduler_url = next(child.url for child in children if child.service == "scheduler")
    for child in children:
        if child.service == "defrag-planner":  # local mode: it lists and evicts workloads there
            child.environment["TF_DEFRAG_SCHEDULER_URL"] = scheduler_url
    return children


def child_environment(
    base: Mapping[str, str],
    child: Child,
    *,
    nats_url: str,
    database_url: str,
    api_token: str,
    agent_state_dir: Path,
) -> dict[str, str]:
    """The environment a service child runs with: `base` (the user's), the stack's NATS, ledger and
    token, then the child's own. A node agent gets no `TF_DATABASE_URL`, even one the user set: it holds
    no database credential and asks the scheduler over NATS for what it needs from the ledger."""
    environment = {
        **base,
        "TF_NATS_URL": nats_url,
        "TF_DATABASE_URL": database_url,
        "TF_API_TOKEN": api_token,
        "TF_AGENT_STATE_DIR": str(agent_state_dir),
        **child.environment,
    }
    if child.service == "node-agent":
        del environment["TF_DATABASE_URL"]
    return environment


@contextlib.contextmanager
def state_dir_lock(state_dir: Path) -> Iterator[None]:
    """Hold an exclusive lock on `state_dir` so two stacks never share one NATS store or data folder."""
    state_dir.mkdir(parents=True, exist_ok=True)
    lock_path = state_dir / "up.lock"
    with lock_path.open("a+") as lock_file:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock_file.seek(0)
            holder = lock_file.read().strip() or "another process"
            raise StackError(
                f"{state_dir} is in use by a running tfctl up (pid {holder}); stop it or pass --state-dir"
            ) from None
        lock_file.truncate(0)
        lock_file.write(str(os.getpid()))
        lock_file.flush()
        try:
            yield
        finally:
            fcntl.flock(lock_file, fcntl.LOCK_UN)


def _say(message: str) -> None:
    print(f"tfctl up: {message}", file=sys.stderr, flush=True)


class Stack:
    """Starts, supervises and stops one local stack. `run()` returns the process exit code."""

    def __init__(self, options: StackOptions, out: IO[str]) -> None:
        self.options = options
        self.out = out
        self.nats: EmbeddedNats | None = None
        self.postgres: EmbeddedPostgres | None = None
        self.nats_url = ""
        self.database_url = ""
        self.children: list[Child] = []
        self.stop_requested = asyncio.Event()
        self.crashed: Child | None = None
        self.api_token = ""
        self.token_source: TokenSource = "environment"

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        for signal_number in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signal_number, self.stop_requested.set)
        exit_code = 1
        try:
            exit_code = await self._start_and_supervise()
        except (StackError, InfrastructureError) as error:
            _say(f"error: {error}")
        finally:
            clean = await self._stop_children()
            await self._stop_infrastructure()
            for signal_number in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(signal_number)
        if exit_code == 0 and not clean:
            exit_code = 1
        _say("stopped" if exit_code == 0 else f"stopped with exit code {exit_code}")
        return exit_code

    async def _start_and_supervise(self) -> int:
        started_at = time.monotonic()
        await self._start_infrastructure()
        if self.stop_requested.is_set():
            return 0
        _say("migrating the ledger (alembic upgrade head)")
        try:
            await asyncio.to_thread(upgrade_head, self.database_url)
        except Exception as error:
            raise StackError(f"alembic upgrade head failed: {error}") from error
        if self.stop_requested.is_set():
            return 0
        await asyncio.to_thread(ensure_self_signed, self.options.state_dir / "certs")
        self.api_token, self.token_source = ensure_api_token(self.options.state_dir)
        self.children = await self._plan_children()
        await asyncio.gather(*(self._spawn(child) for child in self.children))
        _say(f"started {len(self.children)} services; waiting for /readyz")
        if not await self._wait_until_ready():
            return 0 if self.crashed is None and self.stop_requested.is_set() else 1
        self._print_summary(time.monotonic() - started_at)
        await self._supervise()
        return 1 if self.crashed else 0

    async def _plan_children(self) -> list[Child]:
        """The children to start (a subclass prepares what they need first)."""
        return plan_children(self.options)

    def _summary_extra(self) -> dict[str, Any]:
        """Entries a subclass adds to the `--json` summary (and prints as `key: value` lines)."""
        return {}

    async def _start_infrastructure(self) -> None:
        state_dir = self.options.state_dir
        starts: list[asyncio.Future[str]] = []
        nats_url = os.environ.get("TF_NATS_URL")
        database_url = os.environ.get("TF_DATABASE_URL")
        if nats_url:
            self.nats_url = nats_url
        else:
            self.nats = EmbeddedNats(store_dir=state_dir / "nats", die_with_parent=True)
            starts.append(asyncio.ensure_future(self._start_nats(self.nats)))
        if database_url:
            self.database_url = database_url
        else:
            self.postgres = EmbeddedPostgres(data_dir=state_dir / "postgres", die_with_parent=True)
            starts.append(asyncio.ensure_future(self._start_postgres(self.postgres)))
        if starts:
            _say(
                "starting embedded "
                + " and ".join(
                    name for name, server in (("NATS", self.nats), ("Postgres", self.postgres)) if server
                )
            )
        results = await asyncio.gather(*starts, return_exceptions=True)
        errors = [result for result in results if isinstance(result, BaseException)]
        if errors:
            raise StackError("; ".join(str(error) for error in errors))
        if self.nats:
            self.nats_url = self.nats.url
        if self.postgres:
            self.database_url = self.postgres.url

    @staticmethod
    async def _start_nats(nats: EmbeddedNats) -> str:
        # Launched on this (the main) thread: the parent-death signal follows the launching thread.
        nats.launch()
        return await asyncio.to_thread(nats.wait_until_ready)

    @staticmethod
    async def _start_postgres(postgres: EmbeddedPostgres) -> str:
        await asyncio.to_thread(postgres.prepare)
        postgres.launch()
        return await asyncio.to_thread(postgres.wait_until_ready)

    async def _spawn(self, child: Child) -> None:
        child.log_path.parent.mkdir(parents=True, exist_ok=True)
        environment = child_environment(
            os.environ,
            child,
            nats_url=self.nats_url,
            database_url=self.database_url,
            api_token=self.api_token,
            agent_state_dir=self.options.state_dir / "agent",
        )
        with child.log_path.open("wb") as log:
            child.process = await asyncio.create_subprocess_exec(
                *child.argv,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log,
                stderr=asyncio.subprocess.STDOUT,
                env=environment,
                start_new_session=True,
                preexec_fn=die_with_parent(signal.SIGTERM),
            )
        child.exited = asyncio.create_task(child.process.wait(), name=f"{child.name}-exit")

    def _exit_watches(self) -> dict[asyncio.Task[int], Child]:
        return {child.exited: child for child in self.children if child.exited is not None}

    async def _wait_until_ready(self) -> bool:
        """True once every child answers 200 on /readyz; False on stop, a crash or the deadline."""
        ready = asyncio.create_task(self._poll_ready())
        stop = asyncio.create_task(self.stop_requested.wait())
        watches = self._exit_watches()
        await asyncio.wait({ready, stop, *watches}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if ready.done():
            not_ready = ready.result()
            if not not_ready:
                return True
            for child in not_ready:
                _say(f"{child.name} not ready within {self.options.ready_timeout_s:.0f}s ({child.log_path}):")
                print(child.log_tail(), file=sys.stderr, flush=True)
            return False
        ready.cancel()
        await asyncio.gather(ready, return_exceptions=True)
        self._report_crash(watches)
        return False

    async def _poll_ready(self) -> list[Child]:
        deadline = time.monotonic() + self.options.ready_timeout_s
        # Readiness of our own children on loopback; the webhook's certificate may be an operator's.
        async with httpx.AsyncClient(verify=False, timeout=2.0) as client:
            pending = list(self.children)
            while pending and time.monotonic() < deadline:
                answers = await asyncio.gather(
                    *(client.get(f"{child.url}/readyz") for child in pending), return_exceptions=True
                )
                pending = [
                    child
                    for child, answer in zip(pending, answers, strict=True)
                    if not isinstance(answer, httpx.Response) or answer.status_code != 200
                ]
                if pending:
                    await asyncio.sleep(READY_POLL_S)
            return pending

    def _report_crash(self, watches: dict[asyncio.Task[int], Child]) -> None:
        for watch, child in watches.items():
            if watch.done() and self.crashed is None:
                self.crashed = child
                _say(
                    f"{child.name} (pid {child.pid}) exited with code {watch.result()}; last log lines "
                    f"({child.log_path}):"
                )
                print(child.log_tail(), file=sys.stderr, flush=True)
                _say("stopping the stack")

    async def _supervise(self) -> None:
        stop = asyncio.create_task(self.stop_requested.wait())
        watches = self._exit_watches()
        await asyncio.wait({stop, *watches}, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        if self.stop_requested.is_set():
            _say("stopping (services drain first, then NATS and Postgres)")
        else:
            self._report_crash(watches)

    def _print_summary(self, elapsed_s: float) -> None:
        database = ledger_url(self.database_url).render_as_string(hide_password=True)
        infrastructure = [
            {
                "name": "nats",
                "url": self.nats_url,
                "embedded": self.nats is not None,
                "pid": self.nats.process.pid if self.nats and self.nats.process else None,
            },
            {
                "name": "postgres",
                "url": database,
                "embedded": self.postgres is not None,
                "pid": self.postgres.process.pid if self.postgres and self.postgres.process else None,
            },
        ]
        services = [
            {
                "name": child.name,
                "service": child.service,
                "url": child.url,
                "node": child.node,
                "pid": child.pid,
                "log": str(child.log_path),
            }
            for child in self.children
        ]
        write_endpoints(
            self.options.state_dir, services, nats={"url": self.nats_url, "embedded": self.nats is not None}
        )
        token_file = token_path(self.options.state_dir)
        if self.options.json_output:
            summary: dict[str, Any] = {
                "status": "ready",
                "state_dir": str(self.options.state_dir),
                "ready_after_s": round(elapsed_s, 2),
                "infrastructure": infrastructure,
                "services": services,
                "api_token": {
                    "source": self.token_source,
                    "file": None if self.token_source == "environment" else str(token_file),
                },
                **self._summary_extra(),
            }
            print(json.dumps(summary), file=self.out, flush=True)
            return
        rows = [("SERVICE", "URL", "PID")]
        rows += [(str(s["name"]), str(s["url"]), str(s["pid"])) for s in services]
        rows += [
            (str(i["name"]), str(i["url"]), "embedded" if i["embedded"] else "external")
            for i in infrastructure
        ]
        widths = [max(len(row[column]) for row in rows) for column in range(3)]
        print(
            f"tfpool is up after {elapsed_s:.1f}s (state and logs in {self.options.state_dir})", file=self.out
        )
        for row in rows:
            print(
                "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(),
                file=self.out,
            )
        if self.token_source == "environment":
            print("API token: TF_API_TOKEN from this shell (tfctl uses it when it is set)", file=self.out)
        else:
            made = "generated" if self.token_source == "generated" else "kept from the last start"
            print(
                f"API token: {token_file} ({made}, mode 0600); tfctl run from this folder reads it, "
                f"elsewhere: export TF_API_TOKEN=$(cat {token_file})",
                file=self.out,
            )
        for key, value in self._summary_extra().items():
            print(f"{key}: {value}", file=self.out)
        print("Ctrl-C stops everything.", file=self.out, flush=True)

    async def _stop_children(self) -> bool:
        """Stop the node agents first (they release their workers through the scheduler), then every
        other child. True when every child exited 0 on SIGTERM in time."""
        agents = [child for child in self.children if child.service == "node-agent"]
        others = [child for child in self.children if child.service != "node-agent"]
        clean = await self._stop_group(agents)
        clean = await self._stop_group(others) and clean
        for child in self.children:
            # Anything the child left behind in its process group goes with it.
            if child.process is not None:
                _signal_group(child.pid, signal.SIGKILL)
        return clean

    async def _stop_group(self, children: list[Child]) -> bool:
        """SIGTERM each child's process group, SIGKILL what is left after the timeout."""
        running = [child for child in children if child.exited is not None and not child.exited.done()]
        for child in running:
            _signal_group(child.pid, signal.SIGTERM)
        watches = {child.exited: child for child in running if child.exited is not None}
        clean = True
        if watches:
            _, late = await asyncio.wait(watches, timeout=self.options.stop_timeout_s)
            for watch in late:
                child = watches[watch]
                _say(f"{child.name} did not stop within {self.options.stop_timeout_s:.0f}s; killing it")
                _signal_group(child.pid, signal.SIGKILL)
                clean = False
            await asyncio.gather(*watches)
            for watch, child in watches.items():
                if watch.result() != 0:
                    clean = False
                    if watch not in late:
                        code = watch.result()
                        _say(f"{child.name} exited with code {code} while stopping ({child.log_path})")
        return clean

    async def _stop_infrastructure(self) -> None:
        if self.nats is not None:
            await asyncio.to_thread(self.nats.stop)
        if self.postgres is not None:
            await asyncio.to_thread(self.postgres.stop)


def write_endpoints(
    state_dir: Path, services: list[dict[str, Any]], *, nats: dict[str, Any] | None = None
) -> None:
    """Record where each service of the running stack listens (`tfctl run` finds node agents here) and
    its NATS (`tfctl events tail` and `tfctl defrag run` use it when `TF_NATS_URL` is unset)."""
    endpoints: dict[str, Any] = (
        {"services": services} if nats is None else {"services": services, "nats": nats}
    )
    (state_dir / ENDPOINTS_FILE).write_text(json.dumps(endpoints, indent=2) + "\n")


def _signal_group(process_group: int, signal_number: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process_group, signal_number)


def run(options: StackOptions, out: IO[str] = sys.stdout) -> int:
    """Run the stack in the foreground until Ctrl-C / SIGTERM or a crash; returns the exit code."""
    try:
        with state_dir_lock(options.state_dir):
            return asyncio.run(Stack(options, out).run())
    except StackError as error:
        _say(f"error: {error}")
        return 1
