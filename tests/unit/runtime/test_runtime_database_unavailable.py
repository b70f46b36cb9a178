"""A request that finds the ledger database unreachable gets 503 with a message and `Retry-After`, never a
500: a client (tfctl, the fault campaign, a user's script) can tell "retry later" from a bug."""

from __future__ import annotations

import httpx
from fastapi import APIRouter
from sqlalchemy.exc import OperationalError
from tfcommon.runtime import UNAVAILABLE_RETRY_AFTER_S, build_app


def router_failing_with(error: Exception) -> APIRouter:
    router = APIRouter()

    @router.post("/api/v1/workloads")
    async def submit() -> dict[str, str]:
        raise error

    return router


async def post(router: APIRouter) -> httpx.Response:
    app = build_app("scheduler", [router], {})
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, raise_app_exceptions=False), base_url="http://scheduler"
    ) as client:
        return await client.post("/api/v1/workloads", json={})


async def test_an_unreachable_database_is_a_503_with_retry_after() -> None:
    refused = OSError("connection to server at 127.0.0.1, port 5432 failed: Connection refused")

    answer = await post(router_failing_with(OperationalError("connect", {}, refused)))

    assert answer.status_code == 503
    assert answer.headers["retry-after"] == str(UNAVAILABLE_RETRY_AFTER_S)
    assert "database (Postgres) is unavailable" in answer.json()["detail"]
    assert "5432" not in answer.text, "connection details stay in the log"


async def test_any_other_failure_is_still_reported_as_the_server_error_it_is() -> None:
    answer = await post(router_failing_with(RuntimeError("a bug")))

    assert answer.status_code == 500
