"""Issue #18, items 5 and 9, on one real `tfctl up`: the "by hand" part of the live-migration guide in
local mode, and `do-not-disrupt` honoured by the defrag planner.

Two simulated nodes with one H100 each; `tfctl` runs in this process as a user's shell would have it:
no `TF_API_TOKEN` and no `TF_NATS_URL`, only `TF_STATE_DIR` pointing at the stack's state folder, so
the token comes from `STATE_DIR/api-token` and the NATS URL from `STATE_DIR/endpoints.json`.
- cordon the node of a workload a ReplicaSet owns, delete the workload, the replacement lands on the
  other node, uncordon;
- label both nodes `tensor-fusion.ai/do-not-disrupt=true`: the plan drains neither and a campaign
  started with `tfctl defrag run` finishes with nothing drained; remove the label from one and the
  plan drains that one only.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from stack_up import DEFRAG_EVERY_SECOND, bus_events, poll, running_stack, serve_budget, stack_environment
from tfcommon.events import DefragCampaignFinished
from tfctl.main import main as tfctl_main

pytestmark = pytest.mark.e2e

NAMESPACE = "ml-serving"
DO_NOT_DISRUPT = "tensor-fusion.ai/do-not-disrupt"


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str


@dataclass
class Stack:
    urls: dict[str, str]
    nats_url: str
    state: Path
    folder: Path

    def tfctl(self, *argv: str) -> Ran:
        """`tfctl ARGV` with the stack's URLs and its state folder, and no token or NATS URL set."""
        saved = dict(os.environ)
        for key in [key for key in os.environ if key.startswith("TF_")]:
            del os.environ[key]
        os.environ.update(
            TF_STATE_DIR=str(self.state),
            TF_SCHEDULER_URL=self.urls["scheduler"],
            TF_DEFRAG_URL=self.urls["defrag-planner"],
        )
        out, err = io.StringIO(), io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                code = tfctl_main(list(argv))
        finally:
            os.environ.clear()
            os.environ.update(saved)
        return Ran(code, out.getvalue(), err.getvalue())

    def ok(self, *argv: str) -> str:
        ran = self.tfctl(*argv)
        assert ran.code == 0, f"tfctl {' '.join(argv)}: {ran.err}"
        return ran.out

    def read(self, *argv: str) -> Any:
        return json.loads(self.ok(*argv, "--json"))

    def workloads(self) -> dict[str, dict[str, Any]]:
        return {w["name"]: w for w in self.read("get", "workloads", "-n", NAMESPACE)}

    def submit(self, name: str, *, app: str, vram_gib: int, owner: str | None = None) -> dict[str, Any]:
        metadata: dict[str, Any] = {
            "name": name,
            "namespace": NAMESPACE,
            "labels": {"app": app, "tensor-fusion.ai/enabled": "true"},
            "annotations": {
                "tensor-fusion.ai/tflops-request": "10",
                "tensor-fusion.ai/tflops-limit": "10",
                "tensor-fusion.ai/vram-request": f"{vram_gib}Gi",
                "tensor-fusion.ai/vram-limit": f"{vram_gib}Gi",
            },
        }
        if owner is not None:
            metadata["ownerReferences"] = [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": owner,
                    "uid": "rs-1",
                    "controller": True,
                }
            ]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": metadata,
            "spec": {"containers": [{"name": "app"}]},
        }
        path = self.folder / f"{name}.yaml"
        path.write_text(yaml.safe_dump(pod))
        answer: dict[str, Any] = self.read("submit", "-f", str(path))
        assert answer["state"] == "placed", answer
        return answer


@pytest.fixture(scope="module")
def stack() -> Iterator[Stack]:
    folder = Path(tempfile.mkdtemp(prefix="tfpool-moves-e2e-"))
    (folder / "tensor-fusion.yaml").write_text(yaml.safe_dump(DEFRAG_EVERY_SECOND))
    (folder / "pdb.yaml").write_text(yaml.safe_dump(serve_budget(NAMESPACE)))
    environment = stack_environment(
        TF_CONFIG_FILE=str(folder / "tensor-fusion.yaml"), TF_DEFRAG_PDB_FILE=str(folder / "pdb.yaml")
    )
    arguments = ["--state-dir", str(folder / "state"), "--fake-gpus", "H100:1", "--fake-gpus", "H100:1"]
    try:
        with running_stack(arguments, environment) as summary:
            urls = {service["service"]: service["url"] for service in summary["services"]}
            nats = next(item["url"] for item in summary["infrastructure"] if item["name"] == "nats")
            yield Stack(urls, nats, folder / "state", folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def test_the_stack_records_its_nats_for_tfctl(stack: Stack) -> None:
    endpoints = json.loads((stack.state / "endpoints.json").read_text())

    assert endpoints["nats"] == {"url": stack.nats_url, "embedded": True}


def test_cordon_delete_the_replacement_lands_on_the_other_node_uncordon(stack: Stack) -> None:
    name = "llm-7c9d8f6b5-x2x7q"
    placed = stack.submit(name, app="llm", vram_gib=20, owner="llm-7c9d8f6b5")
    source = placed["node"]
    nodes = {node["name"] for node in stack.read("get", "nodes")}
    [other] = nodes - {source}

    assert stack.ok("cordon", source) == f"node/{source} cordoned\n"
    listed = stack.ok("get", "workloads", "-n", NAMESPACE)
    assert any(line.split()[1:4] == [name, "placed", source] for line in listed.splitlines()[1:])
    deleted = stack.ok("delete", "workload", name, "-n", NAMESPACE)

    replacement = stack.workloads()[name]
    assert (replacement["state"], replacement["node"]) == ("placed", other)
    assert replacement["uid"] != placed["workload"]["uid"]
    assert f"deleted from {source}; its controller recreated it: placed on {other}" in deleted
    [row] = [line for line in stack.ok("get", "workloads", "-n", NAMESPACE).splitlines() if name in line]
    assert row.split()[2:6] == ["placed", other, "1", replacement["gpu_uuids"][0]]

    assert stack.ok("uncordon", source) == f"node/{source} uncordoned\n"
    schedulable = {node["name"]: node["schedulable"] for node in stack.read("get", "nodes")}
    assert schedulable == {source: True, other: True}
    stack.ok("delete", "workload", name, "-n", NAMESPACE, "--no-replace")
    assert stack.workloads() == {}


def test_do_not_disrupt_keeps_the_defrag_planner_off_a_node(stack: Stack) -> None:
    first = stack.submit("serve-1", app="serve", vram_gib=20)["node"]
    stack.ok("cordon", first)
    second = stack.submit("serve-2", app="serve", vram_gib=20)["node"]
    stack.ok("uncordon", first)
    assert second != first

    def plan() -> dict[str, Any]:
        document: dict[str, Any] = stack.read("defrag", "plan", "--pool", "default")
        return document

    def settled(document: dict[str, Any]) -> bool:  # every workload older than maxDuration (1s)
        return all(skip["reason"] != "fresh-worker" for skip in document["skipped"])

    drains = poll(plan, lambda p: settled(p) and bool(p["drains"]), 30, "the plan never drained a node")
    assert len(drains["drains"]) == 1, "unlabelled, one of the two nodes would be drained"

    for node in (first, second):
        assert stack.ok("label", "node", node, f"{DO_NOT_DISRUPT}=true") == f"node/{node} labeled\n"
    kept = poll(plan, settled, 30, "the plan kept skipping fresh workers")
    assert kept["drains"] == []
    assert {(skip["node"], skip["reason"]) for skip in kept["skipped"]} == {
        (first, "do-not-disrupt"),
        (second, "do-not-disrupt"),
    }

    before = stack.workloads()
    started = stack.tfctl("defrag", "run", "--pool", "default", "--now", "--max-duration-minutes", "1")
    assert started.code == 0, started.err
    events = poll(
        lambda: asyncio.run(bus_events(stack.nats_url)),
        lambda events: any(isinstance(e, DefragCampaignFinished) for e in events),
        40,
        "the campaign started through endpoints.json's NATS URL did not finish",
    )
    [finished] = [e for e in events if isinstance(e, DefragCampaignFinished)]
    assert finished.nodes_drained == 0
    after = stack.workloads()
    assert {name: w["uid"] for name, w in after.items()} == {name: w["uid"] for name, w in before.items()}

    assert stack.ok("label", "gpunode", first, f"{DO_NOT_DISRUPT}-") == f"node/{first} unlabeled\n"
    [drain] = poll(plan, lambda p: bool(p["drains"]), 30, "the unlabelled node was not planned")["drains"]
    assert drain["node"] == first
    assert [(skip["node"], skip["reason"]) for skip in plan()["skipped"]] == [(second, "do-not-disrupt")]
