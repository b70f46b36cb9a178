"""`kubectl cordon` reaches placement in Kubernetes mode: a cordoned node takes no new pod until it is
uncordoned; a cordon set in the ledger by other means is not undone while the node's flag is unchanged."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from cluster_apiserver import ApiServerState
from k8s_scheduler_support import (
    Running,
    api_server,
    eventually,
    eventually_async,
    gpu_pod,
    install_once,
    register_gpus,
    start_scheduler,
)
from tfcommon.bus import NatsEventBus
from tfcommon.ledger.sql import SqlLedger

pytestmark = pytest.mark.integration
NODES = "/v1/nodes"


@pytest.fixture
async def running(ledger: SqlLedger, bus: NatsEventBus) -> AsyncIterator[Running]:
    async with api_server() as (state, scaffold, url):
        install_once(scaffold, state)
        process = await start_scheduler(state, url, ledger, bus)
        yield process
        await process.stop()


def put_node(state: ApiServerState, name: str, *, unschedulable: bool) -> None:
    state.put(
        NODES,
        {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": name},
            "spec": {"unschedulable": unschedulable},
            "status": {"conditions": [{"type": "Ready", "status": "True"}]},
        },
    )


async def one_gpu_node(running: Running, ledger: SqlLedger, name: str) -> None:
    await register_gpus(ledger, name, 1)
    put_node(running.state, name, unschedulable=False)


def placements(running: Running) -> set[str | None]:
    return {(running.pod(name) or {}).get("spec", {}).get("nodeName") for name in ("first", "second")}


async def ledger_cordoned(ledger: SqlLedger, name: str) -> bool:
    return next(node.cordoned for node in await ledger.list_nodes() if node.name == name)


async def test_a_cordoned_node_takes_no_new_pod_until_uncordoned(running: Running, ledger: SqlLedger) -> None:
    for name in ("node-a", "node-b"):
        await register_gpus(ledger, name, 1)
        put_node(running.state, name, unschedulable=False)
    await running.scheduler.start()

    put_node(running.state, "node-a", unschedulable=True)
    await eventually_async(lambda: ledger_cordoned(ledger, "node-a"), what="node-a cordoned in the ledger")
    running.put(gpu_pod("first", tflops="60", vram="60Gi"))
    running.put(gpu_pod("second", tflops="60", vram="60Gi"))

    await eventually(lambda: "node-b" in placements(running), what="one pod bound to node-b")
    await running.mode.drain()
    assert placements(running) == {"node-b", None}, "node-a is cordoned: the other pod waits"

    put_node(running.state, "node-a", unschedulable=False)

    async def uncordoned() -> bool:
        return not await ledger_cordoned(ledger, "node-a")

    await eventually_async(uncordoned, what="node-a uncordoned in the ledger")
    await eventually(
        lambda: placements(running) == {"node-a", "node-b"}, what="the waiting pod placed on node-a"
    )


async def test_a_ledger_cordon_stays_while_the_node_flag_is_unchanged(
    running: Running, ledger: SqlLedger
) -> None:
    await one_gpu_node(running, ledger, "node-c")
    await running.mode.sync_cordons()
    await ledger.set_node_cordoned("node-c", True)

    assert await running.mode.sync_cordons() == 0
    assert await ledger_cordoned(ledger, "node-c") is True


async def test_a_pod_created_right_after_kubectl_cordon_is_not_placed_on_the_node(
    running: Running, ledger: SqlLedger
) -> None:
    await one_gpu_node(running, ledger, "node-d")
    await running.scheduler.start()
    await running.mode.cordons_listed_after(time.monotonic())

    put_node(running.state, "node-d", unschedulable=True)
    running.put(gpu_pod("replacement", tflops="10", vram="8Gi"))

    def reported() -> bool:
        conditions = (running.pod("replacement") or {}).get("status", {}).get("conditions") or []
        return any(c.get("type") == "PodScheduled" and c.get("status") == "False" for c in conditions)

    await eventually(lambda: reported() or bool(placements_of(running, "replacement")), what="a verdict")
    assert placements_of(running, "replacement") == set(), "the only node was cordoned before the pod came"


def placements_of(running: Running, name: str) -> set[str]:
    node = (running.pod(name) or {}).get("spec", {}).get("nodeName")
    return {node} if node else set()
