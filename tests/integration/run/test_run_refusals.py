"""`tfctl run` refused at once (exit 3, nothing submitted, the command never started): a pool the scheduler
does not know, and a request no node of the pool could ever hold, named with the largest that fits."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from run_services import NODE_GPUS, TOKEN, RunStack

pytestmark = pytest.mark.integration


async def _run(stack: RunStack, tmp_path: Path, *options: str) -> tuple[int, str, str]:
    marker = tmp_path / "started"
    script = tmp_path / "cmd.py"
    script.write_text(f"open({str(marker)!r}, 'w').close()\n")
    argv = [
        sys.executable,
        "-m",
        "tfctl.main",
        "run",
        "--tflops",
        "20",
        "--scheduler-url",
        stack.scheduler_url,
    ]
    argv += ["--agent-url", f"{stack.node}={stack.agent_url}", "--wait", "30", *options, "--"]
    process = await asyncio.create_subprocess_exec(
        *argv,
        sys.executable,
        str(script),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env={**os.environ, "TF_API_TOKEN": TOKEN},
        cwd=tmp_path,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), timeout=20)
    assert process.returncode is not None
    assert not marker.exists(), "the command must not run"
    return process.returncode, stdout.decode(), stderr.decode()


async def _workload_names(stack: RunStack) -> set[str]:
    return {record.workload.name for record in await stack.ledger.active_allocations()}


async def test_an_unknown_pool_is_refused_as_tfctl_submit_refuses_it(
    run_stack: RunStack, tmp_path: Path
) -> None:
    code, stdout, stderr = await _run(
        run_stack, tmp_path, "--pool", "nosuch", "--vram", "16Gi", "--name", "nopool"
    )

    assert (code, stdout) == (3, "")
    assert "unknown pool 'nosuch'; known pools: " in stderr
    assert run_stack.pool in stderr.split("known pools: ", 1)[1]
    assert "submitted" not in stderr
    assert "nopool" not in await _workload_names(run_stack)


@pytest.mark.parametrize(
    ("options", "reason"),
    [
        pytest.param(
            ["--vram", "4096Gi"],
            "vram-request 4Ti exceeds every GPU of pool {pool} (largest: 80Gi)",
            id="vram",
        ),
        pytest.param(
            ["--vram", "16Gi", "--gpus", str(NODE_GPUS + 1)],
            f"gpu-count {NODE_GPUS + 1} exceeds every node of pool {{pool}} "
            f"(largest: {NODE_GPUS} GPUs on one node)",
            id="gpus",
        ),
    ],
)
async def test_a_request_no_node_could_ever_hold_exits_3_at_once_with_the_largest_that_fits(
    run_stack: RunStack, tmp_path: Path, options: list[str], reason: str
) -> None:
    code, stdout, stderr = await _run(run_stack, tmp_path, "--pool", run_stack.pool, *options)

    assert (code, stdout) == (3, "")
    assert reason.format(pool=run_stack.pool) in stderr
    assert "submitted" not in stderr
    assert "waiting for placement" not in stderr
