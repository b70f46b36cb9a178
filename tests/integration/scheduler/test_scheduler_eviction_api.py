"""The scheduler's local Eviction API and the defrag planner's local cluster over it (issue #7).

A real scheduler service (runtime, HTTP, Postgres, NATS) with two registered nodes; the planner's
`SchedulerApiCluster` lists the workloads as pods, computes budgets from a PodDisruptionBudget file and
evicts through `POST /api/v1/workloads/{id}/eviction`: the workload is released as evicted in the
ledger and recreated with the same name and labels, a new uid, and placed again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from uuid import UUID

import httpx
import pytest
import sqlalchemy as sa
import yaml
from pydantic import SecretStr
from scheduler_builders import GIB, a_submission, register_named_node
from scheduler_service import TOKEN, eventually
from tfcommon.cluster import Evicted, EvictionBlocked, NotFound
from tfcommon.infra import free_port
from tfcommon.ledger import tables
from tfcommon.ledger.sql import SqlLedger
from tfcommon.runtime import serve
from tfcommon.settings import DatabaseSettings, NatsSettings, SchedulerSettings
from tfdefrag.adapters.scheduler_api import SchedulerApiCluster
from tfscheduler.app import build

pytestmark = pytest.mark.integration
AUTH = {"Authorization": f"Bearer {TOKEN}"}


def budget(amount: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "serve", "namespace": "team-a"},
        "spec": {"selector": {"matchLabels": {"app": "serve"}}, **amount},
    }


@contextlib.asynccontextmanager
async def running_scheduler(
    database_url: str, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[str]:
    monkeypatch.setenv("TF_SCHEDULER_HEARTBEAT_TIMEOUT_S", "3600")
    port = free_port()
    settings = SchedulerSettings(
        nats=NatsSettings(url=nats_url),
        database=DatabaseSettings(url=database_url),
        api_token=SecretStr(TOKEN),
        port=port,
        bind_host="127.0.0.1",
    )
    stop = asyncio.Event()
    service = asyncio.create_task(serve(build(settings), stop=stop))
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(timeout=5) as client:

            async def ready() -> bool | None:
                assert not service.done(), service
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get(f"{url}/readyz")).status_code == 200:
                        return True
                return None

            await eventually(ready, timeout_s=30)
        yield url
    finally:
        stop.set()
        await asyncio.wait_for(service, timeout=30)


async def history(ledger: SqlLedger, allocation_id: str) -> list[str]:
    async with ledger.engine.connect() as connection:
        rows = await connection.execute(
            sa.select(tables.allocation_history.c.kind).where(
                tables.allocation_history.c.allocation_id == UUID(allocation_id)
            )
        )
        return sorted({str(kind) for (kind,) in rows})


async def test_evicting_through_the_local_cluster_recreates_the_workload_and_honours_budgets(
    tmp_path: Path, database_url: str, ledger: SqlLedger, nats_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    await register_named_node(ledger, "node-a", 1)
    await register_named_node(ledger, "node-b", 1)
    allowing, strict = tmp_path / "allowing.yaml", tmp_path / "strict.yaml"
    allowing.write_text(yaml.safe_dump(budget({"maxUnavailable": 1})))
    strict.write_text(yaml.safe_dump(budget({"minAvailable": "100%"})))
    async with (
        running_scheduler(database_url, nats_url, monkeypatch) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        placed = {}
        for name in ("serve-1", "serve-2"):
            body = a_submission(name=name, vram_bytes=16 * GIB).model_copy(
                update={"labels": {"app": "serve"}}
            )
            answer = await client.post("/api/v1/workloads", json=body.model_dump(mode="json"), headers=AUTH)
            assert answer.status_code == 201, answer.text
            placed[name] = answer.json()
        # 64Gi fills the GPU with the most room, so a 70Gi request fits a card but none has room now
        # (a request above every card would be refused outright).
        filler = a_submission(name="filler", vram_bytes=64 * GIB).model_dump(mode="json")
        assert (await client.post("/api/v1/workloads", json=filler, headers=AUTH)).status_code == 201
        pending = a_submission(name="too-big", vram_bytes=70 * GIB).model_dump(mode="json")
        waiting = (await client.post("/api/v1/workloads", json=pending, headers=AUTH)).json()

        cluster = SchedulerApiCluster(url, api_token=TOKEN, pdb_file=allowing)
        blocked_cluster = SchedulerApiCluster(url, api_token=TOKEN, pdb_file=strict)
        try:
            pods = {pod.name: pod for pod in await cluster.list_pods(namespace="team-a")}
            assert pods["serve-1"].labels == {"app": "serve"}
            assert pods["serve-1"].node_name == placed["serve-1"]["node"]
            assert pods["serve-1"].uid == placed["serve-1"]["workload"]["uid"]
            assert pods["too-big"].node_name is None
            assert pods["too-big"].phase == "Pending"
            [allowed] = await cluster.list_disruption_budgets()
            assert (allowed.current_healthy, allowed.desired_healthy, allowed.disruptions_allowed) == (
                2,
                1,
                1,
            )
            assert {node.name for node in await cluster.list_nodes()} == {"node-a", "node-b"}

            refused = await blocked_cluster.evict_pod("team-a", "serve-1")
            assert isinstance(refused, EvictionBlocked)
            assert "disruption budget serve needs 2 healthy pods and has 2" in refused.reason

            eviction = f"/api/v1/workloads/{placed['serve-1']['id']}/eviction"
            assert (await client.post(eviction)).status_code == 401
            assert await cluster.evict_pod("team-a", "serve-1") == Evicted()

            replacement = await cluster.get_pod("team-a", "serve-1")
            assert replacement is not None
            assert replacement.node_name is not None
            assert replacement.uid != placed["serve-1"]["workload"]["uid"]
            assert replacement.labels == {"app": "serve"}
            assert "evicted" in await history(ledger, placed["serve-1"]["id"])
            again = await client.post(eviction, headers=AUTH)
            assert again.status_code == 200
            assert again.json()["replacement"]["workload"]["uid"] == replacement.uid, "evicting twice: one"

            not_placed = await client.post(f"/api/v1/workloads/{waiting['id']}/eviction", headers=AUTH)
            assert not_placed.status_code == 409
            assert "pending, not placed" in not_placed.json()["detail"]
            assert await cluster.evict_pod("team-a", "too-big") == NotFound('pods "too-big" not found')
            unknown = await client.post(
                "/api/v1/workloads/00000000-0000-0000-0000-000000000000/eviction", headers=AUTH
            )
            assert unknown.status_code == 404
        finally:
            await cluster.aclose()
            await blocked_cluster.aclose()
