"""`tfctl run` end to end: the real CLI against a scheduler and a node agent over real NATS and Postgres.

Each test runs `tfctl run ... -- python script.py` as a subprocess and checks what a user relies on:
the command's output and exit code come back, it sees its GPUs and limits, signals reach it, and the
allocation is released in the ledger within a few seconds however the run ends.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
import signal
import sys
import textwrap
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import httpx
import pytest
from run_services import TOKEN, RunStack

pytestmark = pytest.mark.integration

RELEASE_WITHIN_S = 5.0
RUN_TIMEOUT_S = 90.0
ALLOCATION_LINE = re.compile(r"as allocation ([0-9a-f-]{36})")


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / f"cmd-{uuid4().hex[:6]}.py"
    path.write_text(textwrap.dedent(body))
    return path


def _sleeper(tmp_path: Path, pid_file: Path) -> Path:
    """A command that writes its pid to `pid_file`, then sleeps for two minutes."""
    return _script(
        tmp_path,
        f"""
        import os, time
        with open({str(pid_file)!r}, "w") as f:
            f.write(f"{{os.getpid()}}\\n")
        time.sleep(120)
        """,
    )


async def _start_run(
    stack: RunStack,
    script: Path,
    *options: str,
    tflops: str = "20",
    vram: str = "16Gi",
    environment: dict[str, str] | None = None,
) -> asyncio.subprocess.Process:
    argv = [sys.executable, "-m", "tfctl.main", "run", "--tflops", tflops, "--vram", vram]
    argv += ["--pool", stack.pool, "--scheduler-url", stack.scheduler_url]
    argv += ["--agent-url", f"{stack.node}={stack.agent_url}", *options, "--", sys.executable, str(script)]
    return await asyncio.create_subprocess_exec(
        *argv,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "TF_API_TOKEN": TOKEN} if environment is None else environment,
        cwd=script.parent,
    )


async def _finish(process: asyncio.subprocess.Process) -> tuple[int, str, str]:
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=RUN_TIMEOUT_S)
    assert process.returncode is not None
    return process.returncode, stdout.decode(), stderr.decode()


async def _eventually(check: Callable[[], Awaitable[bool]], what: str, timeout_s: float) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, f"{what} not within {timeout_s}s"
        await asyncio.sleep(0.05)


def _complete_line(path: Path) -> str | None:
    text = path.read_text() if path.exists() else ""
    return text.strip() if text.endswith("\n") else None


async def _until_file(path: Path) -> str:
    async def written() -> bool:
        return _complete_line(path) is not None

    await _eventually(written, f"{path.name} written by the command", RUN_TIMEOUT_S)
    line = _complete_line(path)
    assert line is not None
    return line


def _allocation_id(stderr: str) -> UUID:
    found = ALLOCATION_LINE.search(stderr)
    assert found is not None, f"no allocation id in tfctl's stderr:\n{stderr}"
    return UUID(found.group(1))


async def _assert_released_soon(stack: RunStack, allocation_id: UUID) -> None:
    async def released() -> bool:
        record = await stack.ledger.get_allocation(allocation_id)
        assert record is not None, f"allocation {allocation_id} never reached the ledger"
        return bool(record.state == "released")

    await _eventually(released, f"release of {allocation_id} in the ledger", RELEASE_WITHIN_S)


async def _allocation_named(stack: RunStack, name: str) -> UUID:
    found: list[UUID] = []

    async def active() -> bool:
        found[:] = [
            r.allocation_id for r in await stack.ledger.active_allocations() if r.workload.name == name
        ]
        return bool(found)

    await _eventually(active, f"an active allocation for {name}", RUN_TIMEOUT_S)
    return found[0]


def _gone(pid: int) -> bool:
    """True when `pid` no longer runs; a zombie waiting for a reaper that is not ours counts as gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return True
    return stat.rpartition(")")[2].split()[0] == "Z"


async def test_streams_output_returns_the_exit_code_and_releases_the_allocation(
    run_stack: RunStack, tmp_path: Path
) -> None:
    script = _script(
        tmp_path,
        """
        import sys
        print("hello from stdout", flush=True)
        print("hello from stderr", file=sys.stderr, flush=True)
        sys.exit(7)
        """,
    )

    exit_code, stdout, stderr = await _finish(await _start_run(run_stack, script))

    assert exit_code == 7, stderr
    assert stdout == "hello from stdout\n"
    assert "hello from stderr\n" in stderr
    await _assert_released_soon(run_stack, _allocation_id(stderr))


async def test_large_output_arrives_byte_for_byte(run_stack: RunStack, tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        import sys
        for line in range(200_000):
            sys.stdout.write(f"line {line:06d} \\u20ac\\n")
        """,
    )

    exit_code, stdout, stderr = await _finish(await _start_run(run_stack, script))

    assert exit_code == 0, stderr
    assert stdout == "".join(f"line {line:06d} \u20ac\n" for line in range(200_000))


async def test_the_run_ends_with_the_command_even_if_its_children_hold_the_output_open(
    run_stack: RunStack, tmp_path: Path
) -> None:
    child_pid_file = tmp_path / "child.pid"
    script = _script(
        tmp_path,
        f"""
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        with open({str(child_pid_file)!r}, "w") as f:
            f.write(f"{{child.pid}}\\n")
        print("parent done", flush=True)
        """,
    )
    started = asyncio.get_running_loop().time()

    exit_code, stdout, stderr = await _finish(await _start_run(run_stack, script))

    assert exit_code == 0, stderr
    assert stdout == "parent done\n"
    assert asyncio.get_running_loop().time() - started < 60, "the run waited for the command's child"
    child_pid = int(await _until_file(child_pid_file))

    async def child_gone() -> bool:
        return _gone(child_pid)

    await _eventually(child_gone, "the leftover child stopped", RELEASE_WITHIN_S)
    await _assert_released_soon(run_stack, _allocation_id(stderr))


async def test_the_command_sees_its_gpus_and_limits(run_stack: RunStack, tmp_path: Path) -> None:
    script = _script(
        tmp_path,
        """
        import json, os
        names = ("CUDA_VISIBLE_DEVICES", "TF_CUDA_MEMORY_LIMIT", "TF_GPU_MEMORY_LIMIT",
                 "TF_CUDA_SM_PERCENT_LIMIT", "CUDA_DEVICE_MEMORY_LIMIT", "RUN_TEST_EXTRA")
        print(json.dumps({name: os.environ.get(name) for name in names}))
        """,
    )

    exit_code, stdout, stderr = await _finish(
        await _start_run(run_stack, script, "--gpus", "2", "-e", "RUN_TEST_EXTRA=yes")
    )

    assert exit_code == 0, stderr
    seen = json.loads(stdout)
    node_gpus = {f"GPU-{str(gpu['uuid'])[4:]}" for gpu in run_stack.gpus}
    assert set(seen["CUDA_VISIBLE_DEVICES"].split(",")) == node_gpus
    assert seen["TF_CUDA_MEMORY_LIMIT"] == str(16 * 1024)
    assert seen["TF_GPU_MEMORY_LIMIT"] == str(16 * 1024**3)
    assert seen["CUDA_DEVICE_MEMORY_LIMIT"] == "16384m"
    capacity = min(int(gpu["capacity"]["tflops_milli"]) for gpu in run_stack.gpus)
    assert seen["TF_CUDA_SM_PERCENT_LIMIT"] == str(math.ceil(20_000 * 100 / capacity))
    assert seen["RUN_TEST_EXTRA"] == "yes"
    await _assert_released_soon(run_stack, _allocation_id(stderr))


ENVIRONMENT_PRINTER = """
import json, os
print(json.dumps(dict(os.environ)))
"""
GRANTED = {"CUDA_VISIBLE_DEVICES", "NVIDIA_VISIBLE_DEVICES", "TF_GPU_MEMORY_LIMIT", "TF_CUDA_MEMORY_LIMIT"}
GRANTED |= {"CUDA_DEVICE_MEMORY_LIMIT", "TF_CUDA_SM_PERCENT_LIMIT", "CUDA_DEVICE_SM_LIMIT"}
PYTHON_SETS = {"LC_CTYPE"}  # Python's C-locale coercion (PEP 538) sets it in a bare environment


async def test_no_inherit_env_gives_the_command_only_its_grant_and_its_e_variables(
    run_stack: RunStack, tmp_path: Path
) -> None:
    script = _script(tmp_path, ENVIRONMENT_PRINTER)

    exit_code, stdout, stderr = await _finish(
        await _start_run(run_stack, script, "--no-inherit-env", "-e", "RUN_TEST_EXTRA=yes")
    )

    assert exit_code == 0, stderr
    seen = set(json.loads(stdout)) - PYTHON_SETS
    assert seen == GRANTED | {"RUN_TEST_EXTRA"}, "the agent's own environment reached the command"


async def test_the_agents_secrets_never_reach_the_command(
    run_stack: RunStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The agent runs in this process: what is in os.environ now is the agent's environment.
    monkeypatch.setenv("TF_DATABASE_URL", "postgresql://postgres:superuser-secret@127.0.0.1/tfpool")
    monkeypatch.setenv("AGENT_ONLY_SECRET", "agent-secret")
    users_shell = {
        key: value for key, value in os.environ.items() if key not in ("TF_DATABASE_URL", "AGENT_ONLY_SECRET")
    }
    users_shell |= {"TF_API_TOKEN": TOKEN, "USERS_OWN": "kept"}
    script = _script(tmp_path, ENVIRONMENT_PRINTER)

    exit_code, stdout, stderr = await _finish(await _start_run(run_stack, script, environment=users_shell))

    assert exit_code == 0, stderr
    seen = json.loads(stdout)
    assert "TF_API_TOKEN" not in seen
    assert "TF_DATABASE_URL" not in seen
    assert "AGENT_ONLY_SECRET" not in seen
    assert seen["USERS_OWN"] == "kept"
    assert seen["PATH"] == users_shell["PATH"]


async def test_the_release_command_tfctl_run_prints_works_as_printed(
    run_stack: RunStack, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tfctl.commands.run import release_command

    name = f"by-hand-{uuid4().hex[:6]}"
    submission = {
        "workload": {"namespace": "default", "name": name, "uid": str(uuid4())},
        "request": {
            "pool": run_stack.pool,
            "gpu_count": 1,
            "tflops_request_milli": 1000,
            "tflops_limit_milli": 1000,
            "vram_request_bytes": 1024**3,
            "vram_limit_bytes": 1024**3,
        },
    }
    async with httpx.AsyncClient(base_url=run_stack.scheduler_url, timeout=10) as client:
        placed = await client.post(
            "/api/v1/workloads", json=submission, headers={"Authorization": f"Bearer {TOKEN}"}
        )
    assert placed.status_code in (200, 201, 202), placed.text
    allocation_id = UUID(placed.json()["id"])
    url = f"{run_stack.scheduler_url}/api/v1/workloads/{allocation_id}"

    (tmp_path / "api-token").write_text(TOKEN + "\n")
    monkeypatch.delenv("TF_API_TOKEN", raising=False)
    from_file = release_command(url, tmp_path)
    monkeypatch.setenv("TF_API_TOKEN", TOKEN)
    from_environment = release_command(url, tmp_path)

    assert TOKEN not in from_file, "the token itself is never printed"
    assert TOKEN not in from_environment, "the token itself is never printed"
    ran = await asyncio.create_subprocess_exec(
        "bash", "-c", from_file, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    _, errors = await asyncio.wait_for(ran.communicate(), timeout=30)
    assert ran.returncode == 0, errors.decode()
    await _assert_released_soon(run_stack, allocation_id)
    again = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        from_environment,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "TF_API_TOKEN": TOKEN},
    )
    _, errors = await asyncio.wait_for(again.communicate(), timeout=30)
    assert again.returncode == 0, errors.decode()


async def test_a_command_killed_with_sigkill_returns_137_and_is_released(
    run_stack: RunStack, tmp_path: Path
) -> None:
    pid_file = tmp_path / "cmd.pid"
    script = _sleeper(tmp_path, pid_file)
    process = await _start_run(run_stack, script)

    os.kill(int(await _until_file(pid_file)), signal.SIGKILL)
    exit_code, _, stderr = await _finish(process)

    assert exit_code == 128 + signal.SIGKILL
    assert "killed by signal 9" in stderr
    await _assert_released_soon(run_stack, _allocation_id(stderr))


async def test_killing_tfctl_stops_the_command_and_releases_the_allocation(
    run_stack: RunStack, tmp_path: Path
) -> None:
    pid_file, name = tmp_path / "cmd.pid", f"killed-{uuid4().hex[:6]}"
    script = _sleeper(tmp_path, pid_file)
    process = await _start_run(run_stack, script, "--name", name)
    command_pid = int(await _until_file(pid_file))
    allocation_id = await _allocation_named(run_stack, name)
    async with httpx.AsyncClient(base_url=run_stack.agent_url, timeout=5) as client:
        workers: list[dict[str, Any]] = []

        async def listed() -> bool:
            workers[:] = (await client.get("/api/v1/workers")).json()["data"]
            return any(w["worker_uid"] == str(allocation_id) and "process" in w for w in workers)

        await _eventually(listed, "the worker on GET /api/v1/workers", RUN_TIMEOUT_S)

    process.kill()
    await process.wait()

    await _assert_released_soon(run_stack, allocation_id)
    assert _gone(command_pid), "the command outlived tfctl run"
    worker = next(w for w in workers if w["worker_uid"] == str(allocation_id))
    assert worker["process"]["pid"] == command_pid
    assert worker["devices"]


async def test_deleting_the_workload_stops_the_command(run_stack: RunStack, tmp_path: Path) -> None:
    pid_file, name = tmp_path / "cmd.pid", f"deleted-{uuid4().hex[:6]}"
    script = _sleeper(tmp_path, pid_file)
    process = await _start_run(run_stack, script, "--name", name)
    command_pid = int(await _until_file(pid_file))
    allocation_id = await _allocation_named(run_stack, name)

    async with httpx.AsyncClient(base_url=run_stack.scheduler_url, timeout=5) as client:
        deleted = await client.delete(
            f"/api/v1/workloads/{allocation_id}", headers={"Authorization": f"Bearer {TOKEN}"}
        )
    exit_code, _, stderr = await _finish(process)

    assert deleted.status_code == 200
    assert exit_code == 128 + signal.SIGTERM
    assert "its allocation was released" in stderr
    assert _gone(command_pid)


async def test_sigint_is_forwarded_to_the_command(run_stack: RunStack, tmp_path: Path) -> None:
    ready_file = tmp_path / "ready"
    script = _script(
        tmp_path,
        f"""
        import signal, sys, time
        def stop(number, frame):
            print("got SIGINT", flush=True)
            sys.exit(42)
        signal.signal(signal.SIGINT, stop)
        with open({str(ready_file)!r}, "w") as f:
            f.write("ready\\n")
        time.sleep(120)
        """,
    )
    process = await _start_run(run_stack, script)
    await _until_file(ready_file)

    process.send_signal(signal.SIGINT)
    exit_code, stdout, stderr = await _finish(process)

    assert exit_code == 42, stderr
    assert stdout == "got SIGINT\n"
    await _assert_released_soon(run_stack, _allocation_id(stderr))


async def test_an_unschedulable_request_exits_3_with_the_schedulers_reason(
    run_stack: RunStack, tmp_path: Path
) -> None:
    script = _script(tmp_path, "print('must not run')\n")
    whole_node = {
        "workload": {"namespace": "default", "name": f"holder-{uuid4().hex[:6]}", "uid": str(uuid4())},
        "request": {
            "pool": run_stack.pool,
            "gpu_count": 2,
            "tflops_request_milli": 1000,
            "tflops_limit_milli": 1000,
            "vram_request_bytes": 80 * 1024**3,
            "vram_limit_bytes": 80 * 1024**3,
        },
    }
    auth = {"Authorization": f"Bearer {TOKEN}"}
    async with httpx.AsyncClient(base_url=run_stack.scheduler_url, timeout=5) as client:
        holder = await client.post("/api/v1/workloads", json=whole_node, headers=auth)
        assert holder.status_code == 201, holder.text
        try:
            exit_code, stdout, stderr = await _finish(await _start_run(run_stack, script, "--wait", "1"))
        finally:
            await client.delete(f"/api/v1/workloads/{holder.json()['id']}", headers=auth)

        assert exit_code == 3
        assert stdout == ""
        assert "unschedulable after" in stderr
        assert "VRAM" in stderr
        status = (await client.get(f"/api/v1/workloads/{_allocation_id(stderr)}")).json()
    assert status["state"] == "ended"


async def test_a_command_that_does_not_exist_exits_127_and_is_released(
    run_stack: RunStack, tmp_path: Path
) -> None:
    argv = [
        sys.executable,
        "-m",
        "tfctl.main",
        "run",
        "--tflops",
        "1",
        "--vram",
        "1Gi",
        "--pool",
        run_stack.pool,
    ]
    argv += [
        "--scheduler-url",
        run_stack.scheduler_url,
        "--agent-url",
        f"{run_stack.node}={run_stack.agent_url}",
    ]
    process = await asyncio.create_subprocess_exec(
        *argv,
        "--",
        str(tmp_path / "no-such-command"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "TF_API_TOKEN": TOKEN},
    )

    exit_code, _, stderr = await _finish(process)

    assert exit_code == 127
    assert "no-such-command: command or working directory not found" in stderr
    await _assert_released_soon(run_stack, _allocation_id(stderr))


async def test_worker_endpoints_need_the_bearer_token(run_stack: RunStack) -> None:
    body = {"allocation_id": str(uuid4()), "gpu_uuids": [run_stack.gpus[0]["uuid"]], "argv": ["true"]}
    async with httpx.AsyncClient(base_url=run_stack.agent_url, timeout=5) as client:
        start = await client.post("/api/v1/workers", json=body)
        wrong = await client.post(
            f"/api/v1/workers/{uuid4()}/signal", json={"signal": 2}, headers={"Authorization": "Bearer no"}
        )

    assert start.status_code == 401
    assert wrong.status_code == 401
    assert "TF_API_TOKEN" in start.json()["error"]
