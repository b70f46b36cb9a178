"""The node agent's `tfctl run` endpoints check the bearer token before anything else: a request without
it gets 401 naming TF_API_TOKEN whatever its body or path, so a caller learns it is unauthenticated
rather than being told how to fix a body it may not send anyway."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from pydantic import SecretStr
from tfagent.workers import WorkerRunner, build_workers_router
from tfcommon.runtime import build_app

TOKEN = "worker-token"
NO_SUCH_WORKER = "00000000-0000-4000-8000-0000000000ff"

INVALID_REQUESTS = [
    ("/api/v1/workers", {}),
    ("/api/v1/workers", {"allocation_id": "not-a-uuid", "gpu_uuids": [], "argv": [], "grace_s": -1}),
    (f"/api/v1/workers/{NO_SUCH_WORKER}/signal", {"signal": 0}),
    ("/api/v1/workers/not-a-uuid/signal", {"unexpected": True}),
]
INVALID_IDS = ["empty start", "start with bad fields", "signal out of range", "bad worker id and body"]


async def _post(
    path: str, body: dict[str, Any], authorization: str | None, *, token: str | None
) -> httpx.Response:
    api_token = None if token is None else SecretStr(token)
    runner = WorkerRunner("node-a", api_token, lambda: {})
    app = build_app("node-agent", [build_workers_router(runner, api_token)], {})
    headers = {} if authorization is None else {"Authorization": authorization}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as client:
        return await client.post(path, json=body, headers=headers)


@pytest.mark.parametrize(("path", "body"), INVALID_REQUESTS, ids=INVALID_IDS)
@pytest.mark.parametrize("authorization", [None, "Bearer wrong-token", TOKEN, "Basic eDp5"])
async def test_an_invalid_request_without_the_token_gets_401_not_422(
    path: str, body: dict[str, Any], authorization: str | None
) -> None:
    answer = await _post(path, body, authorization, token=TOKEN)

    assert answer.status_code == 401, answer.text
    assert answer.headers["WWW-Authenticate"] == "Bearer"
    assert "Authorization: Bearer <TF_API_TOKEN>" in answer.json()["error"]


@pytest.mark.parametrize(("path", "body"), INVALID_REQUESTS, ids=INVALID_IDS)
async def test_an_agent_without_a_token_refuses_any_request_with_401_saying_to_set_it(
    path: str, body: dict[str, Any]
) -> None:
    answer = await _post(path, body, f"Bearer {TOKEN}", token=None)

    assert answer.status_code == 401, answer.text
    assert "set TF_API_TOKEN on the agent" in answer.json()["error"]


@pytest.mark.parametrize(("path", "body"), INVALID_REQUESTS, ids=INVALID_IDS)
async def test_with_the_token_an_invalid_request_is_still_a_422(path: str, body: dict[str, Any]) -> None:
    answer = await _post(path, body, f"Bearer {TOKEN}", token=TOKEN)

    assert answer.status_code == 422, answer.text


async def test_with_the_token_a_signal_reaches_the_handler() -> None:
    answer = await _post(
        f"/api/v1/workers/{NO_SUCH_WORKER}/signal", {"signal": 15}, f"Bearer {TOKEN}", token=TOKEN
    )

    assert answer.status_code == 404
    assert f"no running worker {NO_SUCH_WORKER} on node node-a" in answer.json()["error"]
