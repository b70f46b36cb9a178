"""A node agent that stops or dies under a running `tfctl run`: the command goes, its GPUs come back.

The agent runs as its own process (`tfctl serve node-agent`, as `tfctl up` starts it) beside the
in-process scheduler of `run_stack`, on a node and pool of its own. A clean stop (SIGTERM, what Ctrl-C on
`tfctl up` sends) must stop the command and release its allocation before the agent exits, and the
agent must exit promptly instead of waiting on the command's open stream. An agent killed outright
leaves its workers in its journal; the next agent on that node stops what still runs and releases it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from uuid import UUID, uuid4

import httpx
import pytest
from run_services import TOKEN, RunStack
from tfcommon.infra import free_port

pytestmark = pytest.mark.integration

WITHIN_S = 30.0
AGENT_STOPS_WITHIN_S = 15.0


@dataclass(frozen=True)
class Agent:
    process: asyncio.subprocess.Process
    url: str
    node: str
    pool: str


async def _eventually(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float = WITHIN_S) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"{what} not within {timeout_s}s"
        await asyncio.sleep(0.1)


def _gone(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


@asynccontextmanager
async def _agent(nats_url: str, state_dir: Path, node: str, pool: str, log: Path) -> AsyncIterator[Agent]:
    """`tfctl serve node-agent` as `tfctl up` starts it: no TF_DATABASE_URL (it asks the scheduler)."""
    port = free_port()
    environment = {
        **{key: value for key, value in os.environ.items() if not key.startswith("TF_")},
        "TF_NATS_URL": nats_url,
        "TF_API_TOKEN": TOKEN,
        "TF_POOL": pool,
        "TF_AGENT_STATE_DIR": str(state_dir),
        "TF_HEARTBEAT_INTERVAL_S": "0.5",
    }
    with log.open("ab") as output:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tfctl.main",
            "serve",
            "node-agent",
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            "--node-name",
            node,
            "--fake-gpus",
            "H100:1",
            stdout=output,
            stderr=asyncio.subprocess.STDOUT,
            env=environment,
        )
    agent = Agent(process, f"http://127.0.0.1:{port}", node, pool)
    try:
        yield agent
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()


def _tail(log: Path) -> str:
    return log.read_text()[-3000:]


def _pid_written(pid_file: Path) -> int | None:
    text = pid_file.read_text() if pid_file.exists() else ""
    return int(text) if text.endswith("\n") else None


async def _until_schedulable(stack: RunStack, agent: Agent, log: Path) -> None:
    async def schedulable() -> bool:
        assert agent.process.returncode is None, f"the agent exited:\n{_tail(log)}"
        async with httpx.AsyncClient(timeout=5) as client:
            nodes = (await client.get(f"{stack.scheduler_url}/api/v1/nodes")).json()
        return any(n["name"] == agent.node and n["schedulable"] for n in nodes)

    await _eventually(schedulable, f"node {agent.node} schedulable", 60.0)


def _sleeper(tmp_path: Path, pid_file: Path, *, ignore_sigterm: bool = False) -> Path:
    path = tmp_path / f"sleeper-{uuid4().hex[:6]}.py"
    path.write_text(
        textwrap.dedent(
            f"""
            import os, signal, time
            {"signal.signal(signal.SIGTERM, signal.SIG_IGN)" if ignore_sigterm else ""}
            with open({str(pid_file)!r}, "w") as f:
                f.write(f"{{os.getpid()}}\\n")
            time.sleep(300)
            """
        )
    )
    return path


async def _run(stack: RunStack, agent: Agent, script: Path, name: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tfctl.main",
        "run",
        "--tflops",
        "10",
        "--vram",
        "4Gi",
        "--pool",
        agent.pool,
        "--name",
        name,
        "--grace",
        "2",
        "--scheduler-url",
        stack.scheduler_url,
        "--agent-url",
        f"{agent.node}={agent.url}",
        "--",
        sys.executable,
        str(script),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "TF_API_TOKEN": TOKEN},
        cwd=script.parent,
    )


async def _command_pid(pid_file: Path) -> int:
    async def written() -> bool:
        return _pid_written(pid_file) is not None

    await _eventually(written, "the command started")
    pid = _pid_written(pid_file)
    assert pid is not None
    return pid


async def _allocation_of(stack: RunStack, name: str) -> UUID:
    records = [r for r in await stack.ledger.active_allocations() if r.workload.name == name]
    assert records, f"no active allocation for {name}"
    return records[0].allocation_id


async def _released(stack: RunStack, allocation_id: UUID) -> bool:
    record = await stack.ledger.get_allocation(allocation_id)
    return record is not None and record.state == "released"


async def test_stopping_the_agent_stops_the_command_releases_it_and_the_agent_exits_promptly(
    run_stack: RunStack, nats_url: str, tmp_path: Path
) -> None:
    node, pool, log = f"stop-node-{uuid4().hex[:6]}", f"stop-pool-{uuid4().hex[:6]}", tmp_path / "agent.log"
    pid_file, name = tmp_path / "cmd.pid", f"stopped-{uuid4().hex[:6]}"
    async with _agent(nats_url, tmp_path / "agent-state", node, pool, log) as agent:
        await _until_schedulable(run_stack, agent, log)
        run = await _run(run_stack, agent, _sleeper(tmp_path, pid_file), name)
        command_pid = await _command_pid(pid_file)
        allocation_id = await _allocation_of(run_stack, name)

        agent.process.send_signal(signal.SIGTERM)
        try:
            agent_exit = await asyncio.wait_for(agent.process.wait(), timeout=AGENT_STOPS_WITHIN_S)
        except TimeoutError:
            pytest.fail(f"the agent did not stop within {AGENT_STOPS_WITHIN_S}s:\n{_tail(log)}")
        _, errors = await asyncio.wait_for(run.communicate(), timeout=WITHIN_S)

    assert agent_exit == 0, _tail(log)
    assert _gone(command_pid), "the command outlived its node agent"
    assert await _released(run_stack, allocation_id), (
        "the allocation stayed committed after the agent stopped"
    )
    assert run.returncode == 128 + signal.SIGTERM, errors.decode()
    assert "the node agent is stopping" in errors.decode()
    assert list((tmp_path / "agent-state" / "workers" / node).glob("*.json")) == []


async def test_an_agent_killed_outright_leaves_a_journal_the_next_agent_stops_and_releases(
    run_stack: RunStack, nats_url: str, tmp_path: Path
) -> None:
    node, pool, log = f"kill-node-{uuid4().hex[:6]}", f"kill-pool-{uuid4().hex[:6]}", tmp_path / "agent.log"
    state_dir, pid_file, name = tmp_path / "agent-state", tmp_path / "cmd.pid", f"orphan-{uuid4().hex[:6]}"
    async with _agent(nats_url, state_dir, node, pool, log) as agent:
        await _until_schedulable(run_stack, agent, log)
        run = await _run(run_stack, agent, _sleeper(tmp_path, pid_file, ignore_sigterm=True), name)
        command_pid = await _command_pid(pid_file)
        allocation_id = await _allocation_of(run_stack, name)

        # Nobody else may release it: tfctl run is frozen (it would release when it loses the agent).
        run.send_signal(signal.SIGSTOP)
        agent.process.kill()
        await agent.process.wait()
    run.kill()
    await run.wait()
    await asyncio.sleep(1.0)
    assert not _gone(command_pid), "the test needs a command that survives its agent (it ignores SIGTERM)"
    assert not await _released(run_stack, allocation_id)
    assert len(list((state_dir / "workers" / node).glob("*.json"))) == 1

    async with _agent(nats_url, state_dir, node, pool, log) as restarted:

        async def recovered() -> bool:
            assert restarted.process.returncode is None, _tail(log)
            journal_empty = not list((state_dir / "workers" / node).glob("*.json"))
            return _gone(command_pid) and await _released(run_stack, allocation_id) and journal_empty

        # The agent forgets the entry once the scheduler has answered its release, a moment after the
        # release is visible: wait for both before the agent is stopped.
        await _eventually(
            recovered, "the left-over command stopped, its allocation released and its journal entry gone"
        )

    assert list((state_dir / "workers" / node).glob("*.json")) == []
    assert "left by the previous agent run" in _tail(log)
