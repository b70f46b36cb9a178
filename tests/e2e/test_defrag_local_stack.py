"""Issue #7 in local mode: `tfctl defrag run --pool default --now` under `tfctl up` really moves workloads.

Two simulated nodes with one H100 each. The workloads are submitted with `tfctl submit` and shaped by
deleting placeholders, so the layout does not depend on the placement policy: one node holds `serve-1`
and `serve-2` (covered by a PodDisruptionBudget from `TF_DEFRAG_PDB_FILE`, maxUnavailable 1), the other
holds `solo` (no budget). The campaign drains the first node one workload at a time through the
scheduler's eviction API; `solo` stays, and `tfctl defrag plan` says why.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
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

import httpx
import pytest
import yaml
from stack_up import DEFRAG_EVERY_SECOND, bus_events, poll, read_summary, serve_budget, stack_environment
from tfcommon.events import (
    AllocationCreated,
    AllocationReleased,
    DefragCampaignFinished,
    NodeDrained,
    PodEvicted,
)
from tfctl.main import main as tfctl_main

pytestmark = pytest.mark.e2e

TOKEN = "defrag-e2e-token"
NAMESPACE = "ml-serving"


@dataclass(frozen=True)
class Ran:
    returncode: int
    stdout: str
    stderr: str


@dataclass
class Stack:
    scheduler_url: str
    defrag_url: str
    nats_url: str
    folder: Path

    def tfctl(self, *args: str) -> Ran:
        """`tfctl ARGS` as a user runs it against this stack (in this process: a new interpreter per
        command costs seconds on a loaded machine)."""
        environment = {
            "TF_API_TOKEN": TOKEN,
            "TF_SCHEDULER_URL": self.scheduler_url,
            "TF_DEFRAG_URL": self.defrag_url,
            "TF_NATS_URL": self.nats_url,
        }
        out, err = io.StringIO(), io.StringIO()
        saved = dict(os.environ)
        os.environ.update(environment)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = tfctl_main(list(args))
        finally:
            os.environ.clear()
            os.environ.update(saved)
        return Ran(code, out.getvalue(), err.getvalue())

    def submit(self, name: str, app: str, vram_gib: int) -> str:
        """Submit a pod asking `vram_gib` of one GPU; returns the node it was placed on."""
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": name,
                "namespace": NAMESPACE,
                "labels": {"app": app, "tensor-fusion.ai/enabled": "true"},
                "annotations": {
                    "tensor-fusion.ai/tflops-request": "10",
                    "tensor-fusion.ai/tflops-limit": "10",
                    "tensor-fusion.ai/vram-request": f"{vram_gib}Gi",
                    "tensor-fusion.ai/vram-limit": f"{vram_gib}Gi",
                },
            },
            "spec": {"containers": [{"name": "app", "image": "vllm"}]},
        }
        path = self.folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump(pod))
        result = self.tfctl("submit", "-f", str(path), "--json")
        assert result.returncode == 0, result.stderr
        answer = json.loads(result.stdout)
        assert answer["state"] == "placed", answer
        return str(answer["node"])

    def workloads(self) -> dict[str, dict[str, Any]]:
        listed = httpx.get(f"{self.scheduler_url}/api/v1/workloads", timeout=10).json()
        return {item["name"]: item for item in listed}

    def delete(self, name: str) -> None:
        workload_id = self.workloads()[name]["id"]
        answer = httpx.delete(
            f"{self.scheduler_url}/api/v1/workloads/{workload_id}",
            headers={"Authorization": f"Bearer {TOKEN}"},
            timeout=10,
        )
        assert answer.status_code == 200, answer.text

    def plan(self) -> dict[str, Any]:
        result = self.tfctl("defrag", "plan", "--pool", "default", "--json")
        assert result.returncode == 0, result.stderr
        plan: dict[str, Any] = json.loads(result.stdout)
        return plan


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    """`tfctl up` with two one-H100 nodes, the defrag configuration and the budget file."""
    folder = Path(tempfile.mkdtemp(prefix="tfpool-defrag-e2e-"))
    (folder / "tensor-fusion.yaml").write_text(yaml.safe_dump(DEFRAG_EVERY_SECOND))
    (folder / "pdb.yaml").write_text(yaml.safe_dump(serve_budget(NAMESPACE)))
    environment = stack_environment(
        TF_API_TOKEN=TOKEN,
        TF_CONFIG_FILE=str(folder / "tensor-fusion.yaml"),
        TF_DEFRAG_PDB_FILE=str(folder / "pdb.yaml"),
    )
    command = [sys.executable, "-m", "tfctl.main", "up", "--ports", "auto", "--json"]
    command += ["--state-dir", str(folder / "state"), "--fake-gpus", "H100:1", "--fake-gpus", "H100:1"]
    process = subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment
    )
    try:
        summary = read_summary(process, timeout_s=90)
        url = {s["service"]: s["url"] for s in summary["services"]}
        nats = next(i["url"] for i in summary["infrastructure"] if i["name"] == "nats")
        yield Stack(url["scheduler"], url["defrag-planner"], nats, folder)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
            process.communicate(timeout=60)
        shutil.rmtree(folder, ignore_errors=True)


def test_a_campaign_drains_a_node_one_workload_at_a_time_and_leaves_the_one_without_budget(
    stack: Stack,
) -> None:
    source = stack.submit("serve-1", "serve", 20)
    target = stack.submit("wall", "placeholder", 80)
    assert target != source
    assert stack.submit("serve-2", "serve", 20) == source
    assert stack.submit("block", "placeholder", 40) == source
    stack.delete("wall")
    assert stack.submit("solo", "solo", 20) == target
    stack.delete("block")
    before = stack.workloads()
    assert before["serve-1"]["labels"]["app"] == "serve", "the scheduler keeps the pod's labels"

    def settled(plan: dict[str, Any]) -> bool:  # every workload older than maxDuration (1s)
        return all(skip["reason"] != "fresh-worker" for skip in plan["skipped"]) and bool(plan["drains"])

    plan = poll(stack.plan, settled, 30, "the plan never drained the source node")
    [drain] = plan["drains"]
    assert drain["node"] == source
    assert sorted(move["pod"] for move in drain["moves"]) == [f"{NAMESPACE}/serve-1", f"{NAMESPACE}/serve-2"]
    assert {move["to"] for move in drain["moves"]} == {target}
    [kept] = [skip for skip in plan["skipped"] if skip["node"] == target]
    assert kept["reason"] == "missing-pdb"
    assert f"{NAMESPACE}/solo" in kept["message"]
    rendered = stack.tfctl("defrag", "plan", "--pool", "default")
    assert f"{target}  missing-pdb: worker {NAMESPACE}/solo" in rendered.stdout

    started = stack.tfctl("defrag", "run", "--pool", "default", "--now", "--max-duration-minutes", "2")
    assert started.returncode == 0, started.stderr

    def moved(workloads: dict[str, dict[str, Any]]) -> bool:
        return all(
            workloads.get(name, {}).get("node") == target and workloads[name]["uid"] != before[name]["uid"]
            for name in ("serve-1", "serve-2")
        )

    after = poll(stack.workloads, moved, 40, "serve-1 and serve-2 were not moved to the target")
    assert sorted(after) == ["serve-1", "serve-2", "solo"]
    assert all(workload["state"] == "placed" for workload in after.values())
    assert after["solo"]["uid"] == before["solo"]["uid"], "the workload without a budget stays"
    assert after["solo"]["node"] == target
    assert after["serve-1"]["labels"] == before["serve-1"]["labels"], "the replacement keeps the labels"
    left = [a for a in httpx.get(f"{stack.scheduler_url}/api/v1/allocations").json() if a["node"] == source]
    assert left == [], "the source node is empty"

    events = poll(
        lambda: asyncio.run(bus_events(stack.nats_url)),
        lambda events: any(isinstance(e, DefragCampaignFinished) for e in events),
        30,
        "the campaign did not finish",
    )
    [finished] = [e for e in events if isinstance(e, DefragCampaignFinished)]
    assert (finished.outcome, finished.nodes_drained) == ("completed", 1)
    [drained] = [e for e in events if isinstance(e, NodeDrained)]
    assert (drained.node, drained.pods_moved) == (source, 2)
    evictions = [e for e in events if isinstance(e, PodEvicted)]
    assert sorted(e.workload.name for e in evictions) == ["serve-1", "serve-2"], "each evicted once"
    assert {(e.by, e.node) for e in evictions} == {("defrag", source)}
    first, second = sorted(evictions, key=lambda e: e.occurred_at)
    replaced_first = next(
        e
        for e in events
        if isinstance(e, AllocationCreated)
        and e.workload.name == first.workload.name
        and e.workload.uid == after[first.workload.name]["uid"]
    )
    assert replaced_first.node == target
    assert replaced_first.occurred_at <= second.occurred_at, (
        "one at a time: replaced before the next eviction"
    )
    claimed = {e.reason for e in events if isinstance(e, AllocationReleased)}
    assert {
        f"defrag hold claimed by {NAMESPACE}/serve-1",
        f"defrag hold claimed by {NAMESPACE}/serve-2",
    } <= claimed
