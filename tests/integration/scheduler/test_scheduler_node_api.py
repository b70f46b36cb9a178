"""`tfctl cordon|uncordon`, `tfctl label node`, `tfctl get workloads` and `tfctl delete workload` against a
real scheduler process (`tfctl serve scheduler`, real Postgres and NATS, HTTP): what a user reaches for to
move a workload by hand in local mode (issue #18, item 5)."""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from scheduler_builders import GIB, a_submission, register_named_node
from scheduler_service import TOKEN, eventually, private_nats, scheduler_processes, service_environment
from tfcommon.events import WorkloadRef
from tfcommon.ledger.records import NodeSpec
from tfcommon.ledger.sql import SqlLedger
from tfctl.main import main as tfctl_main

pytestmark = pytest.mark.integration
AUTH = {"Authorization": f"Bearer {TOKEN}"}
DO_NOT_DISRUPT = "tensor-fusion.ai/do-not-disrupt"


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str


@dataclass
class Scheduler:
    url: str
    client: httpx.AsyncClient
    monkeypatch: pytest.MonkeyPatch

    def tfctl(self, *argv: str, token: str | None = TOKEN) -> Ran:
        """`tfctl ARGV --scheduler-url URL` in this process, with `TF_API_TOKEN` set to `token`."""
        if token is None:
            self.monkeypatch.delenv("TF_API_TOKEN", raising=False)
        else:
            self.monkeypatch.setenv("TF_API_TOKEN", token)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = tfctl_main([*argv, "--scheduler-url", self.url])
        return Ran(code, out.getvalue(), err.getvalue())

    async def node(self, name: str) -> dict[str, Any]:
        nodes = (await self.client.get("/api/v1/nodes")).json()
        found: dict[str, Any] = next(node for node in nodes if node["name"] == name)
        return found

    async def submit(self, name: str, vram_gib: int, *, owner: str | None = None) -> dict[str, Any]:
        submission = a_submission(name=name, vram_bytes=vram_gib * GIB)
        if owner is not None:
            workload = WorkloadRef(namespace="team-a", name=name, uid=submission.workload.uid, workload=owner)
            submission = submission.model_copy(update={"workload": workload})
        answer = await self.client.post(
            "/api/v1/workloads", json=submission.model_dump(mode="json"), headers=AUTH
        )
        assert answer.status_code in (201, 202), answer.text
        status: dict[str, Any] = answer.json()
        return status

    async def workloads(self) -> dict[str, dict[str, Any]]:
        return {w["name"]: w for w in (await self.client.get("/api/v1/workloads")).json()}


@pytest.fixture(scope="module")
def own_nats_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with private_nats(tmp_path_factory.mktemp("scheduler-node-api-nats")) as url:
        yield url


@pytest.fixture
async def scheduler(
    tmp_path: Path, database_url: str, ledger: SqlLedger, own_nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Scheduler]:
    await register_named_node(ledger, "node-a", 1)
    await register_named_node(ledger, "node-b", 1)
    monkeypatch.chdir(tmp_path)  # no .tf/api-token of a stack started here
    environment = service_environment(database_url, own_nats_url, TF_SCHEDULER_HEARTBEAT_TIMEOUT_S="3600")
    async with (
        scheduler_processes(1, environment, tmp_path) as (url,),
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        yield Scheduler(url, client, monkeypatch)


async def test_a_cordoned_node_takes_no_new_work_and_uncordoning_places_what_waited(
    scheduler: Scheduler,
) -> None:
    cordoned = scheduler.tfctl("cordon", "node-a")

    assert (cordoned.code, cordoned.out) == (0, "node/node-a cordoned\n")
    node = await scheduler.node("node-a")
    assert (node["cordoned"], node["schedulable"], node["reason"]) == (True, False, "node cordoned")
    first = await scheduler.submit("first", 60)
    assert first["node"] == "node-b"
    waiting = await scheduler.submit("second", 60)
    assert waiting["state"] == "pending"

    listed = scheduler.tfctl("get", "workloads", "-n", "team-a")
    assert listed.code == 0
    header, *rows = listed.out.splitlines()
    assert header.split()[:6] == ["NAMESPACE", "NAME", "STATE", "NODE", "GPUS", "GPU-IDS"]
    by_name = {row.split()[1]: row for row in rows}
    assert by_name["first"].split()[2:6] == ["placed", "node-b", "1", first["gpu_uuids"][0]]
    assert by_name["second"].split()[2:6] == ["pending", "-", "1", "-"]
    assert "node cordoned" in by_name["second"]

    assert scheduler.tfctl("uncordon", "node-a").out == "node/node-a uncordoned\n"

    async def second_placed() -> dict[str, Any] | None:
        second = (await scheduler.workloads()).get("second", {})  # absent while it changes state
        return second if second.get("state") == "placed" else None

    assert (await eventually(second_placed))["node"] == "node-a"
    assert (await scheduler.node("node-a"))["schedulable"] is True


async def test_do_not_disrupt_is_set_kept_across_a_registration_and_removed(
    scheduler: Scheduler, ledger: SqlLedger
) -> None:
    labelled = scheduler.tfctl("label", "node", "node-a", f"{DO_NOT_DISRUPT}=true")

    assert (labelled.code, labelled.out) == (0, "node/node-a labeled\n")
    assert (await scheduler.node("node-a"))["labels"] == {DO_NOT_DISRUPT: "true"}
    await ledger.upsert_node(NodeSpec(name="node-a", pool="default"))  # the agent restarts
    assert (await scheduler.node("node-a"))["labels"] == {DO_NOT_DISRUPT: "true"}

    removed = scheduler.tfctl("label", "gpunode", "node-a", f"{DO_NOT_DISRUPT}-")
    assert (removed.code, removed.out) == (0, "node/node-a unlabeled\n")
    assert (await scheduler.node("node-a"))["labels"] == {}


async def test_wrong_nodes_labels_and_tokens_are_refused_with_the_fix(scheduler: Scheduler) -> None:
    unknown = scheduler.tfctl("cordon", "node-z")
    assert unknown.code == 1
    assert "no node 'node-z'; registered: node-a, node-b" in unknown.err

    other_label = scheduler.tfctl("label", "node", "node-a", "zone=a")
    assert other_label.code == 1
    assert f"'zone' cannot be set on a node in local mode; only {DO_NOT_DISRUPT} can" in other_label.err

    bad_value = scheduler.tfctl("label", "node", "node-a", f"{DO_NOT_DISRUPT}=yes")
    assert bad_value.code == 1
    assert (
        f"labels.{DO_NOT_DISRUPT}: 'yes' must be true or false (or null, to remove the label)"
        in bad_value.err
    )

    without_token = scheduler.tfctl("cordon", "node-a", token=None)
    assert without_token.code == 1
    assert "no API token: set TF_API_TOKEN" in without_token.err
    assert (await scheduler.node("node-a"))["cordoned"] is False
    answer = await scheduler.client.patch("/api/v1/nodes/node-a", json={"cordoned": True})
    assert answer.status_code == 401


async def test_deleting_recreates_a_workload_with_a_controller_elsewhere_and_ends_one_without(
    scheduler: Scheduler,
) -> None:
    owned = await scheduler.submit("serve-7c9d8-x2x7q", 20, owner="serve")
    bare = await scheduler.submit("solo", 20)

    deleted = scheduler.tfctl("delete", "workload", "serve-7c9d8-x2x7q", "-n", "team-a")

    assert deleted.code == 0, deleted.err
    after = await scheduler.workloads()
    replacement = after["serve-7c9d8-x2x7q"]
    assert replacement["uid"] != owned["workload"]["uid"]
    assert replacement["state"] == "placed"
    assert set(replacement["gpu_uuids"]).isdisjoint(owned["gpu_uuids"]), "not back on the GPU it left"
    assert deleted.out == (
        f"workload team-a/serve-7c9d8-x2x7q deleted from {owned['node']}; its controller recreated it: "
        f"placed on {replacement['node']} ({replacement['gpu_uuids'][0]})\n"
    )

    by_id = scheduler.tfctl("delete", "workload", bare["id"], "--json")
    assert by_id.code == 0, by_id.err
    [outcome] = json.loads(by_id.out)
    assert (outcome["action"], outcome["why"]) == ("ended", "no controller owns it: nothing recreates it")
    assert "solo" not in await scheduler.workloads()

    ended = scheduler.tfctl("delete", "workload", "serve-7c9d8-x2x7q", "-n", "team-a", "--no-replace")
    assert ended.out == "workload team-a/serve-7c9d8-x2x7q deleted (--no-replace: nothing recreates it)\n"
    assert await scheduler.workloads() == {}

    missing = scheduler.tfctl("delete", "workload", "solo")
    assert missing.code == 1
    assert "no placed or pending workload default/solo" in missing.err


async def test_a_name_in_another_namespace_is_pointed_at(scheduler: Scheduler) -> None:
    await scheduler.submit("solo", 20)

    missing = scheduler.tfctl("delete", "workload", "solo")

    assert missing.code == 1
    assert (
        "no placed or pending workload default/solo; it is in namespace team-a: pass -n team-a" in missing.err
    )
    assert "solo" in await scheduler.workloads()
