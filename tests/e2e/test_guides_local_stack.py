"""The operator guides' local-stack commands, exactly as written, on one real `tfctl up`.

The stack is started with the guide's own `tfctl up` command plus `--ports auto` (tests share the
machine), so the commands find it through `TF_SCHEDULER_URL`, `TF_DEFRAG_URL` and `TF_NATS_URL`, the
way `tfctl` finds a stack on the fixed ports; curl commands have the fixed port replaced by the
service's. Every `tfctl` command then runs from the repository root, in reading order, through
`tfctl`'s entry point, and must exit with the code the guide documents.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from tfctl.main import main as tfctl_main

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "docs"))
from guide_commands import LOCAL_STACK_PORTS, REPO_ROOT, local_stack_port, of_rule
from stack_up import read_summary, stack_environment

pytestmark = pytest.mark.e2e

TOKEN = "guides-token"


@dataclass(frozen=True)
class GuideStack:
    environment: dict[str, str]
    urls: dict[str, str]

    def run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            argv, capture_output=True, text=True, env=self.environment, cwd=REPO_ROOT, timeout=60, check=False
        )


@pytest.fixture(scope="module")
def stack() -> Iterator[GuideStack]:
    [up] = of_rule("tfctl up")
    folder = Path(tempfile.mkdtemp(prefix="tfpool-guides-"))
    clean = stack_environment(TF_API_TOKEN=TOKEN)
    argv = [sys.executable, "-m", "tfctl.main", *up.argv[1:]]
    argv += ["--ports", "auto", "--json", "--state-dir", str(folder / "state")]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=clean)
    try:
        summary = read_summary(process, timeout_s=90)
        urls = {service["service"]: service["url"] for service in summary["services"]}
        nats = next(item["url"] for item in summary["infrastructure"] if item["name"] == "nats")
        environment = {
            **clean,
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{clean.get('PATH', '')}",
            "TF_SCHEDULER_URL": urls["scheduler"],
            "TF_DEFRAG_URL": urls["defrag-planner"],
            "TF_NATS_URL": nats,
        }
        yield GuideStack(environment, urls)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            process.communicate(timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


def test_every_tfctl_command_of_the_guides_exits_as_documented(
    stack: GuideStack, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each command runs through `tfctl`'s own entry point, in this process (a process per command
    would cost two seconds of imports each), with the environment a user's shell would have."""
    commands = of_rule("tfctl on the local stack")
    assert len(commands) >= 10
    for key in [key for key in os.environ if key.startswith("TF_")]:
        monkeypatch.delenv(key)
    for key, value in stack.environment.items():
        if key.startswith("TF_"):
            monkeypatch.setenv(key, value)
    monkeypatch.chdir(REPO_ROOT)
    failures = []
    for command in commands:
        exit_code = tfctl_main(command.argv[1:])
        printed = capsys.readouterr()
        if exit_code != command.expected_exit:
            failures.append(
                f"{command.where}\n  exit {exit_code}, the guide says {command.expected_exit}\n"
                f"  stdout: {printed.out[-800:]}\n  stderr: {printed.err[-800:]}"
            )
    assert failures == [], "\n".join(failures)


def test_every_curl_command_of_the_guides_reads_the_running_stack(stack: GuideStack) -> None:
    commands = of_rule("curl on the local stack")
    assert commands
    for command in commands:
        port = local_stack_port(command)
        assert port is not None
        text = command.text.replace(f"http://127.0.0.1:{port}", stack.urls[LOCAL_STACK_PORTS[port]])
        deadline = time.monotonic() + 20
        result = stack.run(["bash", "-o", "pipefail", "-c", text])
        while result.returncode != command.expected_exit and time.monotonic() < deadline:
            time.sleep(0.5)  # the metrics service reads the ledger every TF_REFRESH_INTERVAL_S
            result = stack.run(["bash", "-o", "pipefail", "-c", text])
        assert result.returncode == command.expected_exit, f"{command.where}: {result.stderr}"
        assert result.stdout.strip(), f"{command.where} printed nothing"
