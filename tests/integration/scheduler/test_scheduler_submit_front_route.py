"""`POST /api/v1/workloads` served ahead of FastAPI (`tfscheduler.api.SubmitEndpoint`): a valid submission
with its uid is answered there, as the FastAPI route answers it (201, 202, 422 with the same detail),
and every other request reaches the FastAPI route with its body and gets exactly its answer."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from scheduler_builders import GIB, a_submission, register_named_node
from starlette.types import ASGIApp, Receive, Scope, Send
from tfcommon.bus import NatsEventBus
from tfcommon.ledger.sql import SqlLedger
from tfcommon.runtime import build_app, with_front_routes
from tfscheduler.api import build_router, front_routes
from tfscheduler.engine import Scheduler

pytestmark = pytest.mark.integration
TOKEN = "front-route-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class CountingApp:
    """The FastAPI app, counting the requests that reach it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.requests = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.requests += 1
        await self.app(scope, receive, send)


@pytest.fixture
async def clients(
    ledger: SqlLedger, bus: NatsEventBus
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient, CountingApp]]:
    await register_named_node(ledger, "front-node", 2, tflops_milli=100_000, vram_bytes=80 * GIB)
    scheduler = Scheduler(ledger, bus, heartbeat_timeout=timedelta(hours=1), name="front-route-test")
    await scheduler.start()
    fastapi = CountingApp(build_app("scheduler", [build_router(scheduler, SecretStr(TOKEN))], {}))
    front = with_front_routes(fastapi, front_routes(scheduler, SecretStr(TOKEN), "scheduler"))
    async with (
        httpx.AsyncClient(transport=httpx.ASGITransport(app=front), base_url="http://front") as through_front,
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app=fastapi), base_url="http://fastapi"
        ) as fastapi_only,
    ):
        yield through_front, fastapi_only, fastapi


def comparable(answer: httpx.Response) -> tuple[int, Any]:
    body = answer.json()
    if isinstance(body, dict):
        body = {
            key: value for key, value in body.items() if key not in ("id", "workload", "gpu_uuids", "node")
        }
    return answer.status_code, body


async def test_a_valid_submission_is_answered_ahead_of_fastapi_as_fastapi_answers_it(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient, CountingApp],
) -> None:
    through_front, fastapi_only, fastapi = clients
    cases = [
        a_submission(tflops_milli=40_000, vram_bytes=10 * GIB),  # placed
        a_submission(tflops_milli=100_000, vram_bytes=80 * GIB, gpu_count=2),  # pending: the GPUs are in use
        a_submission(gpu_count=3),  # refused: no node has three GPUs
    ]
    answers = []
    for case in cases:
        front_answer = await through_front.post(
            "/api/v1/workloads",
            content=case.model_dump_json(),
            headers=AUTH | {"content-type": "application/json"},
        )
        twin = a_submission(
            tflops_milli=case.request.tflops_request_milli,
            vram_bytes=case.request.vram_request_bytes,
            gpu_count=case.request.gpu_count,
        )
        fastapi_answer = await fastapi_only.post(
            "/api/v1/workloads", json=twin.model_dump(mode="json"), headers=AUTH
        )
        answers.append((front_answer, fastapi_answer))

    assert fastapi.requests == 3  # the three sent to FastAPI directly: none of the others reached it
    assert [front.status_code for front, _ in answers] == [201, 202, 422]
    for front, through_fastapi in answers:
        assert comparable(front) == comparable(through_fastapi)
        assert front.headers["content-type"] == "application/json"
    assert set(answers[0][0].json()) == set(answers[0][1].json())


async def test_every_other_request_gets_the_fastapi_routes_answer(
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient, CountingApp],
) -> None:
    through_front, fastapi_only, fastapi = clients
    valid = a_submission().model_dump(mode="json")
    no_uid = {**valid, "workload": {"namespace": "team-a", "name": "named-once"}}
    invalid = {**valid, "request": {"pool": "default"}}
    requests: list[tuple[dict[str, str], Any]] = [
        ({}, valid),  # no token
        ({"Authorization": "Bearer wrong"}, valid),
        (AUTH, invalid),
        (AUTH, {"workload": valid["workload"]}),
    ]
    for headers, body in requests:
        front = await through_front.post("/api/v1/workloads", json=body, headers=headers)
        direct = await fastapi_only.post("/api/v1/workloads", json=body, headers=headers)
        assert (front.status_code, front.json()) == (direct.status_code, direct.json())
        assert front.status_code in (401, 422)
    first = await through_front.post("/api/v1/workloads", json=no_uid, headers=AUTH)
    again = await through_front.post("/api/v1/workloads", json=no_uid, headers=AUTH)
    assert (first.status_code, again.status_code) == (201, 200)  # a name without a uid is one workload
    assert first.json()["id"] == again.json()["id"]
    assert fastapi.requests == 2 * len(requests) + 2
