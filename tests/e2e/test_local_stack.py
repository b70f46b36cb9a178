"""Test 7: `tfctl up` end to end as a user runs it: every service ready, and nothing left behind.

Each test starts its own stack (embedded NATS and Postgres in a temporary state dir, free ports) as a
subprocess and stops it with a signal or a crash, then looks for survivors by process tree and by
command line.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil  # type: ignore[import-untyped]
import pytest
from stack_up import read_summary, stack_environment

pytestmark = pytest.mark.e2e

SERVICES = {"webhook", "scheduler", "defrag-planner", "metrics", "node-agent"}
ORPHAN_DEADLINE_S = 10.0


def survivors(state_dir: Path, processes: list[psutil.Process]) -> list[str]:
    alive = [
        f"{p.pid} {command_line(p)}"
        for p in processes
        if p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    ]
    for candidate in psutil.process_iter(["pid", "cmdline", "status"]):
        cmdline = " ".join(candidate.info["cmdline"] or [])
        if str(state_dir) in cmdline and candidate.info["status"] != psutil.STATUS_ZOMBIE:
            alive.append(f"{candidate.info['pid']} {cmdline}")
    return alive


def command_line(process: psutil.Process) -> str:
    """The process's command line; empty for one that has exited (a zombie not yet reaped by its
    parent, e.g. a Postgres worker between its exit and the postmaster's wait)."""
    try:
        return " ".join(process.cmdline())
    except (psutil.ZombieProcess, psutil.NoSuchProcess):
        return ""


@pytest.fixture
def state_dir() -> Iterator[Path]:
    # Not under pytest's tmp_path: as root, Postgres runs as another user that must traverse the
    # path, and concurrent pytest sessions reset /tmp/pytest-of-<user> to mode 0700.
    folder = Path(tempfile.mkdtemp(prefix="tfpool-e2e-"))
    try:
        yield folder / "state"
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def stack(state_dir: Path) -> Iterator[tuple[subprocess.Popen[str], dict[str, Any], Path]]:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfctl.main",
            "up",
            "--ports",
            "auto",
            "--json",
            "--state-dir",
            str(state_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=stack_environment(),
    )
    try:
        yield process, read_summary(process, timeout_s=60), state_dir
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            process.communicate(timeout=60)


def test_up_serves_every_service_ready_and_sigint_leaves_no_process(
    stack: tuple[subprocess.Popen[str], dict[str, Any], Path],
) -> None:
    process, summary, state_dir = stack
    services = summary["services"]
    assert {service["service"] for service in services} == SERVICES
    assert len([s for s in services if s["service"] == "node-agent"]) == 2, "two simulated nodes by default"
    trust = ssl.create_default_context(cafile=str(state_dir / "certs" / "tls.crt"))
    with httpx.Client(verify=trust, timeout=5) as client:
        for service in services:
            response = client.get(f"{service['url']}/readyz")
            assert response.status_code == 200, f"{service['name']}: {response.text}"
            assert response.json()["status"] == "ready"
    assert next(s for s in services if s["service"] == "webhook")["url"].startswith("https://")
    tree = psutil.Process(process.pid).children(recursive=True)
    commands = " ".join(command_line(child) for child in tree)
    assert "nats-server" in commands
    assert "postgres" in commands

    process.send_signal(signal.SIGINT)
    _, errors = process.communicate(timeout=60)

    assert process.returncode == 0, errors
    assert survivors(state_dir, tree) == []


def test_a_crashed_service_stops_the_stack_with_a_report_and_an_error_exit(
    stack: tuple[subprocess.Popen[str], dict[str, Any], Path],
) -> None:
    process, summary, state_dir = stack
    scheduler = next(s for s in summary["services"] if s["service"] == "scheduler")
    tree = psutil.Process(process.pid).children(recursive=True)

    os.kill(scheduler["pid"], signal.SIGKILL)
    _, errors = process.communicate(timeout=60)

    assert process.returncode == 1
    assert f"scheduler (pid {scheduler['pid']}) exited with code -9" in errors
    assert survivors(state_dir, tree) == []


def test_a_sigkilled_tfctl_up_takes_every_child_with_it_within_seconds(
    stack: tuple[subprocess.Popen[str], dict[str, Any], Path],
) -> None:
    process, _, state_dir = stack
    tree = psutil.Process(process.pid).children(recursive=True)
    commands = " ".join(command_line(child) for child in tree)
    assert "nats-server" in commands
    assert "postgres" in commands
    assert len([child for child in tree if "tfctl.main serve" in command_line(child)]) == 6

    process.kill()
    process.communicate(timeout=30)
    killed_at = time.monotonic()
    left = survivors(state_dir, tree)
    while left and time.monotonic() - killed_at < ORPHAN_DEADLINE_S:
        time.sleep(0.1)
        left = survivors(state_dir, tree)

    for orphan in left:  # a failing run must not leave them to the next test
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(orphan.split()[0]), signal.SIGKILL)
    assert left == [], f"still running {ORPHAN_DEADLINE_S:.0f}s after SIGKILL of tfctl up"


def test_up_rejects_an_unknown_fake_gpu_model_naming_it(tmp_path: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "tfctl.main",
            "up",
            "--fake-gpus",
            "H100:2,X9000:4",
            "--state-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        env=stack_environment(),
        timeout=60,
    )
    assert result.returncode == 2
    assert "unknown GPU model 'X9000'" in result.stderr
    assert "H100" in result.stderr


def test_serve_without_nats_and_database_urls_names_both_variables() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "tfctl.main", "serve", "scheduler"],
        capture_output=True,
        text=True,
        env=stack_environment(),
        timeout=60,
    )
    assert result.returncode == 2
    assert "TF_NATS_URL and TF_DATABASE_URL not set" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_plain_up_runs_work_with_its_generated_token_and_ctrl_c_stops_and_releases_a_running_command(
    stack: tuple[subprocess.Popen[str], dict[str, Any], Path], tmp_path: Path
) -> None:
    process, summary, state_dir = stack
    token_file = state_dir / "api-token"
    assert summary["api_token"] == {"source": "generated", "file": str(token_file)}
    assert token_file.stat().st_mode & 0o777 == 0o600
    scheduler = next(s for s in summary["services"] if s["service"] == "scheduler")
    pid_file = tmp_path / "cmd.pid"
    script = tmp_path / "sleeper.py"
    script.write_text(
        f"import os, time\nopen({str(pid_file)!r}, 'w').write(f'{{os.getpid()}}\\n')\ntime.sleep(300)\n"
    )
    run = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tfctl.main",
            "run",
            "--tflops",
            "10",
            "--vram",
            "4Gi",
            "--state-dir",
            str(state_dir),
            "--scheduler-url",
            scheduler["url"],
            "--",
            sys.executable,
            str(script),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=stack_environment(),  # no TF_API_TOKEN: tfctl reads the stack's token file
    )
    deadline = time.monotonic() + 60
    while not (pid_file.exists() and pid_file.read_text().endswith("\n")):
        assert run.poll() is None, run.communicate()[1]
        assert time.monotonic() < deadline, "the command did not start within 60s"
        time.sleep(0.1)
    command_pid = int(pid_file.read_text())
    journals = state_dir / "agent" / "workers"
    assert len(list(journals.glob("*/*.json"))) == 1

    stopping_at = time.monotonic()
    process.send_signal(signal.SIGINT)
    _, errors = process.communicate(timeout=60)
    stopped_after_s = time.monotonic() - stopping_at
    _, run_errors = run.communicate(timeout=30)

    assert process.returncode == 0, errors
    assert stopped_after_s < 30, f"tfctl up took {stopped_after_s:.0f}s to stop"
    assert not psutil.pid_exists(command_pid) or psutil.Process(command_pid).status() == psutil.STATUS_ZOMBIE
    assert run.returncode == 128 + signal.SIGTERM, run_errors
    assert "the node agent is stopping" in run_errors
    assert list(journals.glob("*/*.json")) == [], "a worker's allocation was not released before the stop"
