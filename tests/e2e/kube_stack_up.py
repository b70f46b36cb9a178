"""Helpers for tests that start `tfctl up --kubernetes` and drive it with kubectl as a user types it.

`running_kube_stack()` starts one stack (a real control plane from the built binaries, KWOK nodes, the
five services in Kubernetes mode with their own service accounts) in a temporary state dir (or the one
given, which it keeps) on free ports and stops it with SIGINT; `kubectl()` runs the real kubectl against
its admin kubeconfig.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from stack_up import read_summary, stack_environment
from support.polling import wait_for

T = TypeVar("T")

KUBECTL = str(Path(sys.executable).parent / "kubectl")
UP = (sys.executable, "-m", "tfctl.main", "up", "--kubernetes", "--ports", "auto", "--json")
SERVICE_ACCOUNT_PREFIX = "system:serviceaccount:tfpool-system:"
READY_LIMIT_S = 150
"""How long a stack may take to print its summary: the issue asks for 60 s on an idle machine; CI shares two
cores with the rest of the suite, where kube-apiserver alone has taken 19 s to start."""


@dataclass
class KubeStack:
    """One running `tfctl up --kubernetes`: its process, the JSON summary it printed, its state dir, and
    how long it took from start to printing the summary (every service ready)."""

    process: subprocess.Popen[str]
    summary: dict[str, Any]
    state_dir: Path
    ready_s: float

    @property
    def kubeconfig(self) -> str:
        return str(self.summary["kubeconfig"])

    @property
    def audit_log(self) -> Path:
        return self.state_dir / "kubernetes" / "logs" / "audit.log"

    def kubectl(self, *arguments: str, stdin: str | None = None, check: bool = True) -> str:
        return kubectl(self.kubeconfig, *arguments, stdin=stdin, check=check)

    def kubectl_json(self, *arguments: str) -> dict[str, Any]:
        return kubectl_json(self.kubeconfig, *arguments)

    def apply(self, manifest: dict[str, Any] | str) -> str:
        text = manifest if isinstance(manifest, str) else json.dumps(manifest)
        return self.kubectl("apply", "-f", "-", stdin=text)


def kubectl(
    kubeconfig: str, *arguments: str, stdin: str | None = None, check: bool = True, timeout_s: float = 30
) -> str:
    """Run kubectl; with `check`, fail the test with kubectl's stderr when it exits non-zero. Without it,
    return stdout and stderr together (for a command the test expects to be refused)."""
    result = subprocess.run(
        [KUBECTL, f"--kubeconfig={kubeconfig}", *arguments],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if check:
        assert result.returncode == 0, f"kubectl {' '.join(arguments)}: {result.stderr}"
        return result.stdout
    return result.stdout + result.stderr


def kubectl_json(kubeconfig: str, *arguments: str) -> dict[str, Any]:
    decoded: dict[str, Any] = json.loads(kubectl(kubeconfig, *arguments, "-o", "json"))
    return decoded


eventually = functools.partial(wait_for, within_s=30.0, every_s=0.5)
"""`eventually(what, check, within_s=...)`: poll `check` every half second until it returns something
truthy; fail naming `what` after `within_s` (30 s unless given)."""


@contextlib.contextmanager
def running_kube_stack(
    extra_arguments: Sequence[str] = (), state_dir: Path | None = None, **settings: str
) -> Iterator[KubeStack]:
    """Start `tfctl up --kubernetes` with `extra_arguments` and `TF_*` `settings`; SIGINT it on exit. In
    `state_dir` when given (kept afterwards), else in a temporary one (removed)."""
    folder = Path(tempfile.mkdtemp(prefix="tfpool-e2e-k8s-"))
    state_dir = state_dir or folder / "state"
    started = time.monotonic()
    process = subprocess.Popen(
        [*UP, "--state-dir", str(state_dir), *extra_arguments],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=stack_environment(**settings),
    )
    try:
        summary = read_summary(process, timeout_s=READY_LIMIT_S)
        yield KubeStack(process, summary, state_dir, time.monotonic() - started)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            process.communicate(timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


def create_namespace(stack: KubeStack, name: str, labels: dict[str, str] | None = None) -> None:
    """Create a namespace and wait for its default service account (pods are refused before it)."""
    manifest: dict[str, Any] = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    if labels:
        manifest["metadata"]["labels"] = labels
    stack.apply(manifest)
    eventually(
        f"namespace {name}'s default service account",
        lambda: "default" in stack.kubectl("get", "serviceaccount", "-n", name, "-o", "name", check=False),
    )


def dry_run(stack: KubeStack, manifest: dict[str, Any]) -> str:
    """A server-side dry run of creating `manifest` (through the webhook): its JSON when admitted,
    kubectl's error when denied."""
    return stack.kubectl(
        "create", "--dry-run=server", "-o", "json", "-f", "-", stdin=json.dumps(manifest), check=False
    )


def audited_requests(audit_log: Path) -> tuple[set[str], list[str]]:
    """Our service accounts seen in the API server's audit log, and (user, verb, resource) of each of
    their requests it refused (403)."""
    users: set[str] = set()
    denied = []
    for line in audit_log.read_text().splitlines():
        event = json.loads(line)
        user = event["user"]["username"]
        if not user.startswith(SERVICE_ACCOUNT_PREFIX):
            continue
        users.add(user.removeprefix(SERVICE_ACCOUNT_PREFIX))
        if event["responseStatus"]["code"] == 403:
            target = event.get("objectRef", {})
            denied.append(f"{user} {event['verb']} {target.get('resource')}/{target.get('subresource', '')}")
    return users, denied
