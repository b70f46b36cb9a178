"""The admission route served ahead of FastAPI: only `POST /mutate-v1-pod` bypasses the app."""

from __future__ import annotations

import json

import httpx
from starlette.types import Receive, Scope, Send
from tfcommon.config_source import ConfigSource
from tfcommon.runtime import build_app, with_front_routes
from tfwebhook.http import MUTATE_PATH, AdmissionService, build_router, front_routes
from tfwebhook.testing import a_gpu_container, a_pod, a_review


async def test_the_admission_route_is_answered_ahead_of_the_app_and_the_rest_by_the_app() -> None:
    service = AdmissionService(config=ConfigSource(None))
    app = build_app("webhook", [build_router(service)], {})
    reached_app: list[str] = []

    async def recording_app(scope: Scope, receive: Receive, send: Send) -> None:
        reached_app.append(f"{scope['method']} {scope['path']}")
        await app(scope, receive, send)

    served = with_front_routes(recording_app, front_routes(service))
    pod = a_pod(
        labels={"tensor-fusion.ai/enabled": "true"},
        annotations={"tensor-fusion.ai/isolation": "shared"},
        containers=[a_gpu_container()],
    )
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=served), base_url="http://webhook"
    ) as client:
        admitted = await client.post(MUTATE_PATH, content=a_review(pod))
        healthy = await client.get("/healthz")
        wrong_method = await client.get(MUTATE_PATH)
    assert admitted.status_code == 200
    response = json.loads(admitted.content)["response"]
    assert (response["allowed"], response["patchType"]) == (True, "JSONPatch")
    assert healthy.json()["status"] == "alive"
    assert wrong_method.status_code == 405
    assert reached_app == ["GET /healthz", f"GET {MUTATE_PATH}"]
