"""The migration story on the local stack, as far as local mode goes: `tfctl up` with simulated GPUs,
`tfctl submit -f pod.yaml` (the webhook's admission, then the scheduler), `tfctl get ... --json`.

Local mode has no controllers, so `enabled-replicas` and rolling updates are the Kubernetes scenario's;
here each step submits the pod the guide shows and checks what `tfctl get` says.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "e2e"))
from stack_up import read_summary, stack_environment

pytestmark = pytest.mark.e2e

TOKEN = "scenario-token"
GIB = 1024**3
H100_TFLOPS_MILLI = 989_400
H100_VRAM = 80 * GIB
AUTO_MIGRATION = {
    "dynamicConfig": {
        "autoMigration": {
            "enable": True,
            "scope": {
                "includes": {"namespaceNames": ["ml-team-a"]},
                "excludes": {"podSelector": {"matchLabels": {"gpu-migration": "skip"}}},
            },
        }
    }
}


@dataclass
class LocalStack:
    scheduler_url: str
    folder: Path

    def tfctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        environment = {key: value for key, value in os.environ.items() if not key.startswith("TF_")}
        environment.update(TF_API_TOKEN=TOKEN, TF_SCHEDULER_URL=self.scheduler_url)
        return subprocess.run(
            [sys.executable, "-m", "tfctl.main", *args],
            capture_output=True,
            text=True,
            env=environment,
            timeout=60,
            check=False,
        )

    def submit(self, pod: dict[str, Any], *extra: str) -> subprocess.CompletedProcess[str]:
        path = self.folder / f"{pod['metadata']['namespace']}-{pod['metadata']['name']}.yaml"
        path.write_text(yaml.safe_dump(pod))
        return self.tfctl("submit", "-f", str(path), *extra)

    def get(self, what: str) -> list[dict[str, Any]]:
        result = self.tfctl("get", what, "--json")
        assert result.returncode == 0, result.stderr
        listed: list[dict[str, Any]] = json.loads(result.stdout)
        return listed


def a_pod(
    name: str,
    namespace: str = "ml-serving",
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    native_gpus: int | None = 1,
) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": native_gpus}} if native_gpus else {}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "labels": {"app": name, **(labels or {})},
            "annotations": dict(annotations or {}),
        },
        "spec": {"containers": [{"name": "app", "image": "vllm", "resources": resources}]},
    }


@pytest.fixture(scope="module")
def local() -> Iterator[LocalStack]:
    """`tfctl up` with two simulated nodes of two H100 each, on free ports, in its own state folder."""
    folder = Path(tempfile.mkdtemp(prefix="tfpool-scenario-"))
    environment = stack_environment(TF_API_TOKEN=TOKEN)
    command = [sys.executable, "-m", "tfctl.main", "up", "--ports", "auto", "--json"]
    command += ["--state-dir", str(folder / "state"), "--fake-gpus", "H100:2", "--fake-gpus", "H100:2"]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment
    )
    try:
        summary = read_summary(process, timeout_s=90)
        scheduler = next(s["url"] for s in summary["services"] if s["service"] == "scheduler")
        yield LocalStack(scheduler, folder)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            process.communicate(timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


def gpu(stack: LocalStack, uuid: str) -> dict[str, Any]:
    return next(listed for listed in stack.get("gpus") if listed["uuid"] == uuid)


def allocation(stack: LocalStack, namespace: str, name: str) -> dict[str, Any]:
    [found] = [a for a in stack.get("allocations") if (a["namespace"], a["name"]) == (namespace, name)]
    return found


def test_step_1_a_native_gpu_pod_is_left_to_the_device_plugin(local: LocalStack) -> None:
    result = local.submit(a_pod("llm-native"))

    assert result.returncode == 1
    assert "nothing to schedule" in result.stderr
    assert local.get("allocations") == []


def test_step_2_a_pod_handed_over_with_isolation_shared_gets_a_whole_gpu(local: LocalStack) -> None:
    pod = a_pod(
        "llm-whole",
        labels={"tensor-fusion.ai/enabled": "true"},
        annotations={"tensor-fusion.ai/isolation": "shared"},
    )

    result = local.submit(pod)

    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("placed ml-serving/llm-whole on sim-node-")
    [share] = allocation(local, "ml-serving", "llm-whole")["shares"]
    assert (share["tflops_milli"], share["vram_bytes"]) == (H100_TFLOPS_MILLI, H100_VRAM)
    held = gpu(local, share["gpu_uuid"])
    assert (held["available_tflops_milli"], held["available_vram_bytes"]) == (0, 0), "zero available"


def test_step_5_pods_shrunk_to_tflops_and_vram_share_a_card(local: LocalStack) -> None:
    fraction = {
        "tensor-fusion.ai/tflops-request": "30",
        "tensor-fusion.ai/tflops-limit": "60",
        "tensor-fusion.ai/vram-request": "8Gi",
        "tensor-fusion.ai/vram-limit": "8Gi",
    }
    for name in ("llm-small-1", "llm-small-2"):
        pod = a_pod(name, labels={"tensor-fusion.ai/enabled": "true"}, annotations=fraction, native_gpus=None)
        result = local.submit(pod)
        assert result.returncode == 0, result.stderr

    [first] = allocation(local, "ml-serving", "llm-small-1")["shares"]
    [second] = allocation(local, "ml-serving", "llm-small-2")["shares"]
    assert first["gpu_uuid"] == second["gpu_uuid"], "several pods share one card"
    assert (first["tflops_milli"], first["vram_bytes"]) == (30_000, 8 * GIB)
    shared = gpu(local, first["gpu_uuid"])
    assert shared["available_tflops_milli"] == H100_TFLOPS_MILLI - 60_000
    assert shared["available_vram_bytes"] == H100_VRAM - 16 * GIB


def test_automatic_migration_converts_only_pods_in_scope(local: LocalStack) -> None:
    config = local.folder / "tensor-fusion.yaml"
    config.write_text(yaml.safe_dump(AUTO_MIGRATION))
    with_scope = ("--config", str(config))

    converted = local.submit(a_pod("embedder", "ml-team-a"), *with_scope)
    other_namespace = local.submit(a_pod("ranker", "ml-team-b"), *with_scope)
    excluded = local.submit(a_pod("batch", "ml-team-a", labels={"gpu-migration": "skip"}), *with_scope)
    opted_out = local.submit(
        a_pod("pinned", "ml-team-a", labels={"tensor-fusion.ai/enabled": "false"}), *with_scope
    )

    assert converted.returncode == 0, converted.stderr
    [share] = allocation(local, "ml-team-a", "embedder")["shares"]
    assert share["tflops_milli"] == H100_TFLOPS_MILLI, "converted as in step 2: a whole GPU"
    for left_alone in (other_namespace, excluded, opted_out):
        assert left_alone.returncode == 1
        assert "nothing to schedule" in left_alone.stderr
    assert sorted((a["namespace"], a["name"]) for a in local.get("allocations")) == [
        ("ml-serving", "llm-small-1"),
        ("ml-serving", "llm-small-2"),
        ("ml-serving", "llm-whole"),
        ("ml-team-a", "embedder"),
    ]
